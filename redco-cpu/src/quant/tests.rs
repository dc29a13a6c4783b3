//! The kernels against an f64 product of the dequantized weights with the quantized
//! activations (exact up to f32 rounding), and against the f32 activations (within what
//! quantizing them to bytes costs).

use super::*;
use redco_core::quant::{blocks, quantize};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) as f32 - 0.5
        })
        .collect()
}

/// `y[i][j] = sum_p deq(W)[j][p] * x'[i][p]` in f64, `x'` the activations as the kernels
/// see them (codes times block scale).
fn reference(fmt: QuantFormat, w: &[u8], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let wd = blocks::dequantize(fmt, w, n * k).unwrap();
    let qx = QRows::quantize(x, m, k, fmt);
    let mut y = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] =
                (0..k).map(|p| wd[j * k + p] as f64 * qx.q[i * k + p] as f64 * qx.d[i * k / 32 + p / 32] as f64).sum();
            if fmt == QuantFormat::Q4_1 {
                // the offsets meet the activations' scaled sums, rounded to f16 as Q8_1's
                for b in 0..k / 32 {
                    let blk = &w[(j * k / 32 + b) * 20..];
                    let off = half::f16::from_le_bytes([blk[2], blk[3]]).to_f64();
                    let sum: i32 = qx.q[i * k + 32 * b..i * k + 32 * b + 32].iter().map(|&c| c as i32).sum();
                    let at = i * k / 32 + b;
                    y[i * n + j] += off * (qx.s[at] as f64 - qx.d[at] as f64 * sum as f64);
                }
            }
        }
    }
    y
}

#[test]
fn every_format_and_kernel_matches_the_f64_reference() {
    for fmt in QuantFormat::ALL {
        for (m, n, k) in [(1, 7, 256), (3, 5, 512), (9, 70, 768)] {
            let w = quantize(fmt, &values(n * k, 11 + k as u64)).unwrap();
            let x = values(m * k, 5 + m as u64);
            let want = reference(fmt, &w, &x, m, n, k);
            let spec = QuantMatmulSpec { m, n, k, format: fmt };
            for avx2 in [false, use_avx2()] {
                let got = quant_matmul_with(&HostData::F32(x.clone()), &HostData::U8(w.clone()), &spec, 2, avx2)
                    .unwrap()
                    .to_f64_vec();
                for (g, r) in got.iter().zip(&want) {
                    assert!((g - r).abs() <= 1e-4 * (1.0 + r.abs()), "{fmt} {m}x{n}x{k} avx2={avx2}: {g} vs {r}");
                }
            }
        }
    }
}

#[test]
fn the_product_is_the_float_product_within_the_activation_rounding() {
    let (m, n, k) = (2, 16, 512);
    let x = values(m * k, 3);
    for fmt in QuantFormat::ALL {
        let w = quantize(fmt, &values(n * k, 9)).unwrap();
        let wd = blocks::dequantize(fmt, &w, n * k).unwrap();
        let spec = QuantMatmulSpec { m, n, k, format: fmt };
        let got = quant_matmul(&HostData::F32(x.clone()), &HostData::U8(w), &spec, 2).unwrap().to_f64_vec();
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k).map(|p| wd[j * k + p] as f64 * x[i * k + p] as f64).sum();
                // bytes for the activations: about 0.4% of each term's size, summed at random
                // (a standard deviation near 0.008 here)
                assert!((got[i * n + j] - exact).abs() < 0.04, "{fmt}: {} vs {exact}", got[i * n + j]);
            }
        }
    }
}

#[test]
fn many_rows_go_through_f32_panels_exactly() {
    // at PANEL_ROWS rows and more the activations are not rounded: the product is the
    // dequantized weight's, to f32 accuracy, across several panels
    let (m, k) = (PANEL_ROWS + 3, 256);
    let n = panel_rows(k) * 2 + 5;
    let x = values(m * k, 4);
    for fmt in [QuantFormat::Q8_0, QuantFormat::Q4K, QuantFormat::Q6K] {
        let w = quantize(fmt, &values(n * k, 8)).unwrap();
        let wd = blocks::dequantize(fmt, &w, n * k).unwrap();
        let spec = QuantMatmulSpec { m, n, k, format: fmt };
        let got = quant_matmul(&HostData::F32(x.clone()), &HostData::U8(w), &spec, 2).unwrap().to_f64_vec();
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k).map(|p| wd[j * k + p] as f64 * x[i * k + p] as f64).sum();
                assert!((got[i * n + j] - exact).abs() < 1e-4 * (1.0 + exact.abs()), "{fmt} [{i}, {j}]");
            }
        }
    }
}

#[test]
fn bad_operands_are_refused() {
    let spec = QuantMatmulSpec { m: 1, n: 2, k: 32, format: QuantFormat::Q8_0 };
    let x = HostData::F32(vec![0.0; 32]);
    assert!(quant_matmul(&x, &HostData::U8(vec![0; 67]), &spec, 1).is_err());
    assert!(quant_matmul(&x, &HostData::F32(vec![0.0; 68]), &spec, 1).is_err());
    let spec = QuantMatmulSpec { k: 16, ..spec };
    assert!(quant_matmul(&HostData::F32(vec![0.0; 16]), &HostData::U8(vec![0; 34]), &spec, 1).is_err());
}

#[test]
fn a_nan_or_infinite_activation_reaches_the_product() {
    let (n, k) = (3, 64);
    let w = quantize(QuantFormat::Q8_0, &values(n * k, 1)).unwrap();
    for bad in [f32::NAN, f32::INFINITY] {
        let mut x = values(k, 2);
        x[40] = bad;
        let spec = QuantMatmulSpec { m: 1, n, k, format: QuantFormat::Q8_0 };
        for avx2 in [false, use_avx2()] {
            let y = quant_matmul_with(&HostData::F32(x.clone()), &HostData::U8(w.clone()), &spec, 1, avx2).unwrap();
            assert!(y.to_f64_vec().iter().all(|v| v.is_nan()), "{bad}: {:?}", y.to_f64_vec());
        }
    }
    // a zero-width product is zeros
    let spec = QuantMatmulSpec { m: 2, n: 3, k: 0, format: QuantFormat::Q8_0 };
    let y = quant_matmul(&HostData::F32(vec![]), &HostData::U8(vec![]), &spec, 1).unwrap();
    assert_eq!(y.to_f64_vec(), vec![0.0; 6]);
}

#[test]
fn empty_products_are_empty() {
    let spec = QuantMatmulSpec { m: 0, n: 3, k: 32, format: QuantFormat::Q4_0 };
    let y = quant_matmul(&HostData::BF16(vec![]), &HostData::U8(vec![0; 54]), &spec, 1).unwrap();
    assert_eq!((y.len(), y.dtype()), (0, redco_core::DType::BF16));
}
