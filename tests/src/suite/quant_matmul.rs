//! Products with block-quantized weights (`Tensor::matmul_quant`), per format, against an
//! f64 product of the dequantized weights (`redco_core::quant::blocks`, llama.cpp's
//! layouts) with the activations as stored. A backend may quantize the activations to
//! bytes in blocks of 32 (the CPU's integer dot products do): each value then moves by at
//! most half a step, `max|x_block| / 254`, and the bound allows exactly that.

use crate::check::{check_dtype, tensor, tol, values};
use redco_core::quant::{blocks, quantize, QuantFormat};
use redco_core::{Backend, DType, HostData, Tensor};

fn blocks_of<B: Backend>(b: &B, fmt: QuantFormat, n: usize, k: usize, seed: u64) -> (Tensor<B>, Vec<f64>) {
    let w: Vec<f32> = values(n * k, seed, -0.5, 0.5).iter().map(|&v| v as f32).collect();
    let bytes = quantize(fmt, &w).unwrap();
    let deq = blocks::dequantize(fmt, &bytes, n * k).unwrap().iter().map(|&v| v as f64).collect();
    (Tensor::from_host(b, &HostData::U8(bytes), [n, fmt.row_bytes(k).unwrap()]).unwrap(), deq)
}

/// Every format at decode (one row), a few rows, rows past a block of threads and a
/// prefill's many rows, with
/// `x` in the check dtype and in f32.
pub fn quant_matmul_values<B: Backend>(b: &B) {
    if !b.supports(DType::U8) {
        return; // blocks are bytes; a backend without byte storage cannot hold them
    }
    for dt in [check_dtype(b), DType::F32] {
        for fmt in QuantFormat::ALL {
            for (i, (m, n, k)) in [(1, 5, 256), (4, 3, 512), (9, 70, 768), (20, 9, 256)].into_iter().enumerate() {
                let what = format!("matmul_quant {fmt} [{m}, {k}] x [{n}, {k}] {dt:?}");
                let (wt, w) = blocks_of(b, fmt, n, k, 7 + i as u64);
                let xt = tensor(b, &values(m * k, 3 + i as u64, -1.0, 1.0), [m, k], dt);
                let out = xt.matmul_quant(&wt, fmt).unwrap();
                assert_eq!((out.dims(), out.dtype()), (&[m, n][..], dt), "{what}");
                let (x, got) = (xt.to_vec_f64().unwrap(), out.to_vec_f64().unwrap());
                for r in 0..m {
                    let xr = &x[r * k..(r + 1) * k];
                    // a backend may round the activations to bytes as llama.cpp does: in
                    // blocks of 32 for the 32-value formats, of 256 for the K formats (half
                    // a step, and a scale rounded to f16: 2^-11 of the largest)
                    let group = if fmt.block_values() == 256 { 256 } else { 32 };
                    let half_step: Vec<f64> = xr
                        .chunks(group)
                        .flat_map(|c| {
                            let a = c.iter().fold(0f64, |m, v| m.max(v.abs())) * (1.0 / 254.0 + 1.0 / 2048.0);
                            std::iter::repeat_n(a, c.len())
                        })
                        .collect();
                    for j in 0..n {
                        let wj = &w[j * k..(j + 1) * k];
                        let want: f64 = wj.iter().zip(xr).map(|(a, b)| a * b).sum();
                        let bound: f64 = wj.iter().zip(&half_step).map(|(a, h)| a.abs() * h).sum::<f64>() * 1.001
                            + tol(dt) * (1.0 + want.abs());
                        let g = got[r * n + j];
                        assert!((g - want).abs() <= bound, "{what}: [{r}, {j}] got {g}, want {want} (bound {bound})");
                    }
                }
            }
        }
    }
}

/// The gradient reaches `x` (the blocks are constants): `d sum(x W^T) / dx` = the column
/// sums of the dequantized `W`, on a batched `[2, 3, k]` input.
pub fn quant_matmul_grads<B: Backend>(b: &B) {
    if !b.supports(DType::U8) {
        return;
    }
    let dt = check_dtype(b);
    for fmt in [QuantFormat::Q8_0, QuantFormat::Q4K] {
        let (n, k) = (6, 256);
        let (wt, w) = blocks_of(b, fmt, n, k, 21);
        let xt = tensor(b, &values(6 * k, 22, -1.0, 1.0), [2, 3, k], dt).into_var();
        let y = xt.matmul_quant(&wt, fmt).unwrap();
        assert_eq!(y.dims(), &[2, 3, n]);
        let grads = y.sum_all().unwrap().backward().unwrap();
        let g = grads.get(&xt).unwrap().to_vec_f64().unwrap();
        for (i, gv) in g.iter().enumerate() {
            let want: f64 = (0..n).map(|j| w[j * k + i % k]).sum();
            assert!((gv - want).abs() <= tol(dt) * (1.0 + want.abs()) * 10.0, "{fmt} grad {i}: {gv} vs {want}");
        }
    }
}

/// Blocks that are not bytes, rows that are not whole blocks, and a contracted dimension
/// that disagrees are refused.
pub fn quant_matmul_errors<B: Backend>(b: &B) {
    if !b.supports(DType::U8) {
        return;
    }
    let dt = check_dtype(b);
    let x = tensor(b, &values(64, 1, -1.0, 1.0), [2, 32], dt);
    let floats = tensor(b, &values(68, 2, -1.0, 1.0), [2, 34], dt);
    assert!(x.matmul_quant(&floats, QuantFormat::Q8_0).is_err(), "float blocks");
    let short = Tensor::from_host(b, &HostData::U8(vec![0; 66]), [2, 33]).unwrap();
    assert!(x.matmul_quant(&short, QuantFormat::Q8_0).is_err(), "a row of 33 bytes");
    let wide = Tensor::from_host(b, &HostData::U8(vec![0; 136]), [2, 68]).unwrap();
    let e = x.matmul_quant(&wide, QuantFormat::Q8_0).unwrap_err();
    assert!(e.to_string().contains("64") || e.to_string().contains("32"), "{e}");
}
