//! The block-by-block 16-bit row kernels give the bits of widening the whole input to f32,
//! running the f32 kernel and narrowing its result (what they replace), for bf16 and f16,
//! on shapes whose rows span several blocks, end mid-block, or are longer than a block.

use crate::sgemm::tests::Rng;
use crate::{cross_entropy, norm, rotary, softmax, Cpu, CpuStorage};
use redco_core::backend::RotaryMode;
use redco_core::{DType, HostData, Shape};

/// `n` random values in [-3, 3) as `dt`, and the same values as f32.
fn data(rng: &mut Rng, n: usize, dt: DType) -> (HostData, HostData) {
    let v: Vec<f32> = (0..n).map(|_| 3.0 * rng.next()).collect();
    let h = HostData::from_f32(v, dt);
    let f = HostData::F32(h.to_f32_vec());
    (h, f)
}

/// Asserts that `got` (16-bit) has the bits of `want` (f32) narrowed to `got`'s dtype.
fn same_bits(what: &str, got: &HostData, want: &HostData) {
    let want = HostData::from_f32(want.to_f32_vec(), got.dtype());
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.as_bytes(), want.as_bytes(), "{what}: not the bits of widening first");
}

/// Row lengths: several rows per block, one row spanning most of a block, rows longer
/// than a block (8192 elements), and odd lengths.
const SHAPES: [(usize, usize); 5] = [(37, 64), (5, 5000), (3, 9000), (129, 77), (1, 1)];

#[test]
fn norms_and_their_gradients() {
    let mut rng = Rng(7);
    for dt in [DType::BF16, DType::F16] {
        for (rows, d) in SHAPES {
            let shape = Shape::new([rows, d]);
            let (x, xf) = data(&mut rng, rows * d, dt);
            let (g, gf) = data(&mut rng, rows * d, dt);
            let (w, wf) = data(&mut rng, d, dt);
            let (b, bf) = data(&mut rng, d, dt);
            for center in [false, true] {
                let what = format!("{dt:?} {rows}x{d} center {center}");
                let got = norm::norm(&x, &shape, Some(&w), Some(&b), 1e-5, center).unwrap();
                let want = norm::norm(&xf, &shape, Some(&wf), Some(&bf), 1e-5, center).unwrap();
                same_bits(&format!("norm {what}"), &got, &want);
                let got = norm::norm(&x, &shape, None, None, 1e-5, center).unwrap();
                let want = norm::norm(&xf, &shape, None, None, 1e-5, center).unwrap();
                same_bits(&format!("norm without weight {what}"), &got, &want);
                let got = norm::norm_grad(&x, &shape, Some(&w), &g, 1e-5, center).unwrap();
                let want = norm::norm_grad(&xf, &shape, Some(&wf), &gf, 1e-5, center).unwrap();
                same_bits(&format!("norm gradient {what}"), &got, &want);
            }
        }
    }
}

#[test]
fn softmax_and_log_softmax() {
    let mut rng = Rng(8);
    for dt in [DType::BF16, DType::F16] {
        for (rows, d) in SHAPES {
            let shape = Shape::new([rows, d]);
            let (x, xf) = data(&mut rng, rows * d, dt);
            for log in [false, true] {
                let got = softmax::softmax(&x, &shape, log).unwrap();
                let want = softmax::softmax(&xf, &shape, log).unwrap();
                same_bits(&format!("softmax (log {log}) {dt:?} {rows}x{d}"), &got, &want);
            }
        }
    }
}

#[test]
fn cross_entropy_and_its_gradient_with_ignored_rows() {
    let mut rng = Rng(9);
    let cpu = Cpu::new(2);
    for dt in [DType::BF16, DType::F16] {
        for (rows, v) in SHAPES {
            let shape = Shape::new([rows, v]);
            let (x, xf) = data(&mut rng, rows * v, dt);
            let (g, gf) = data(&mut rng, rows, dt);
            // every third row ignored (-100)
            let t: Vec<i64> = (0..rows).map(|r| if r % 3 == 1 { -100 } else { ((r * 31) % v) as i64 }).collect();
            let t = CpuStorage::new(HostData::I64(t));
            let (x, xf, g, gf) = (CpuStorage::new(x), CpuStorage::new(xf), CpuStorage::new(g), CpuStorage::new(gf));
            let what = format!("{dt:?} {rows}x{v}");
            let got = cross_entropy::forward(&cpu, &x, &shape, &t, -100).unwrap();
            let want = cross_entropy::forward(&cpu, &xf, &shape, &t, -100).unwrap();
            same_bits(&format!("cross-entropy {what}"), got.data(), want.data());
            let got = cross_entropy::backward(&cpu, &x, &shape, &t, -100, &g).unwrap();
            let want = cross_entropy::backward(&cpu, &xf, &shape, &t, -100, &gf).unwrap();
            same_bits(&format!("cross-entropy gradient {what}"), got.data(), want.data());
        }
    }
}

#[test]
fn rotary_with_shared_and_per_batch_tables() {
    let mut rng = Rng(10);
    // [batch, heads, seq, d]: 2 x 3 x 50 x 64 rows span several blocks, a block ending
    // mid-sequence and mid-head
    let (b, h, seq, d, half) = (2, 3, 50, 64, 24);
    let shape = Shape::new([b, h, seq, d]);
    for dt in [DType::BF16, DType::F16] {
        let (x, xf) = data(&mut rng, b * h * seq * d, dt);
        for cs_shape in [Shape::new([seq, half]), Shape::new([b, seq, half])] {
            let n = cs_shape.elem_count();
            let (c, cf) = data(&mut rng, n, dt);
            let (s, sf) = data(&mut rng, n, dt);
            for mode in [RotaryMode::HalfSplit, RotaryMode::Interleaved] {
                let got = rotary::rotary(&x, &shape, &c, &s, &cs_shape, mode).unwrap();
                let want = rotary::rotary(&xf, &shape, &cf, &sf, &cs_shape, mode).unwrap();
                same_bits(&format!("rotary {dt:?} tables {cs_shape} {mode:?}"), &got, &want);
            }
        }
    }
}
