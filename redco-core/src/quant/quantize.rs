//! Float rows to blocks (`--quantize` on `generate`, `serve` and `eval-dump`). The
//! layouts are llama.cpp's, so the bytes are a GGUF file's; the choice of
//! scales is redco's own: `Q8_0` and `Q6_K` scale each (sub-)block by its largest
//! magnitude, `Q4_0` by its value of largest magnitude (which then lands exactly on code
//! -8), `Q4_1` spans the block's range in 15 steps from its minimum, and `Q4_K` fits each sub-block's scale and offset by alternating least squares
//! (codes from the fit, then the fit from the codes) before the super-block quantizes them
//! to 6 bits and the codes are chosen once more against the stored scales.

use super::QuantFormat;
use crate::{Error, Result};
use half::f16;
use rayon::prelude::*;

/// `x` (whole rows of whole blocks) as blocks of `fmt`, row after row.
pub fn quantize(fmt: QuantFormat, x: &[f32]) -> Result<Vec<u8>> {
    let per = fmt.block_values();
    if !x.len().is_multiple_of(per) {
        return Err(Error::invalid(
            "quantize",
            format!("{} values are not whole {} blocks of {per}", x.len(), fmt.name()),
        ));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid("quantize", format!("value {i} is {}: only finite values quantize", x[i])));
    }
    let mut out = vec![0u8; x.len() / per * fmt.block_bytes()];
    let f: fn(&[f32], &mut [u8]) = match fmt {
        QuantFormat::Q8_0 => q8_0,
        QuantFormat::Q4_0 => q4_0,
        QuantFormat::Q4_1 => q4_1,
        QuantFormat::Q4K => q4_k,
        QuantFormat::Q6K => q6_k,
    };
    // blocks are independent: chunks of them over the rayon pool
    const CHUNK: usize = 256;
    let size = fmt.block_bytes();
    out.par_chunks_mut(size * CHUNK).zip(x.par_chunks(per * CHUNK)).for_each(|(o, xs)| {
        for (xb, ob) in xs.chunks_exact(per).zip(o.chunks_exact_mut(size)) {
            f(xb, ob);
        }
    });
    Ok(out)
}

fn put_half(b: &mut [u8], at: usize, v: f32) -> f32 {
    let h = f16::from_f32(v);
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    h.to_f32()
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn q8_0(x: &[f32], b: &mut [u8]) {
    let d = put_half(b, 0, amax(x) / 127.0);
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (o, v) in b[2..34].iter_mut().zip(x) {
        *o = (v * id).round().clamp(-127.0, 127.0) as i8 as u8;
    }
}

fn q4_0(x: &[f32], b: &mut [u8]) {
    // the value of largest magnitude maps to code -8 (its sign taken into the scale)
    let big = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = put_half(b, 0, big / -8.0);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let code = |v: f32| ((v * id).round() + 8.0).clamp(0.0, 15.0) as u8;
    for l in 0..16 {
        b[2 + l] = code(x[l]) | (code(x[l + 16]) << 4);
    }
}

fn q4_1(x: &[f32], b: &mut [u8]) {
    // the block's range in 15 steps from its minimum (llama.cpp's own choice)
    let lo = x.iter().fold(f32::MAX, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::MIN, |a, &v| a.max(v));
    let d = put_half(b, 0, (hi - lo) / 15.0);
    let m = put_half(b, 2, lo);
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let code = |v: f32| ((v - m) * id).round().clamp(0.0, 15.0) as u8;
    for l in 0..16 {
        b[4 + l] = code(x[l]) | (code(x[l + 16]) << 4);
    }
}

/// The scale `s >= 0` and offset `m >= 0` of `x ~ s * q - m` with codes `q` in
/// `0..=top`, fitted by alternating least squares from the min-max start.
fn fit_offset(x: &[f32], top: f32) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::MIN, |a, &v| a.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let (mut s, mut m) = ((hi - lo) / top, -lo);
    let err = |s: f32, m: f32| -> f32 {
        x.iter()
            .map(|&v| {
                let q = if s > 0.0 { ((v + m) / s).round().clamp(0.0, top) } else { 0.0 };
                (s * q - m - v).powi(2)
            })
            .sum()
    };
    let mut best = (err(s, m), s, m);
    for _ in 0..6 {
        // codes from the current fit, then the least-squares line through them
        let qs: Vec<f32> = x.iter().map(|&v| ((v + m) / s).round().clamp(0.0, top)).collect();
        let n = x.len() as f32;
        let (sq, sqq, sx, sqx) =
            qs.iter().zip(x).fold((0f32, 0f32, 0f32, 0f32), |a, (&q, &v)| (a.0 + q, a.1 + q * q, a.2 + v, a.3 + q * v));
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            break;
        }
        let ns = (n * sqx - sq * sx) / det;
        // the offset may not go below zero: the block's minimum is at most 0
        let nm = ((ns * sq - sx) / n).max(0.0);
        let ns = if nm == 0.0 && sqq > 0.0 { (sqx / sqq).max(0.0) } else { ns };
        if ns.is_nan() || ns <= 0.0 {
            break;
        }
        let e = err(ns, nm);
        if e < best.0 {
            best = (e, ns, nm);
        }
        (s, m) = (ns, nm);
    }
    (best.1, best.2)
}

fn q4_k(x: &[f32], b: &mut [u8]) {
    let fits: Vec<(f32, f32)> = x.chunks_exact(32).map(|c| fit_offset(c, 15.0)).collect();
    let max_s = fits.iter().fold(0f32, |a, f| a.max(f.0));
    let max_m = fits.iter().fold(0f32, |a, f| a.max(f.1));
    let d = put_half(b, 0, max_s / 63.0);
    let dmin = put_half(b, 2, max_m / 63.0);
    let code6 = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let sc: Vec<u8> = fits.iter().map(|f| code6(f.0, d)).collect();
    let mn: Vec<u8> = fits.iter().map(|f| code6(f.1, dmin)).collect();
    for j in 0..4 {
        b[4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        b[4 + j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        b[4 + j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    // codes against the stored scales and offsets
    let code = |v: f32, sub: usize| {
        let (s, m) = (d * sc[sub] as f32, dmin * mn[sub] as f32);
        if s > 0.0 {
            ((v + m) / s).round().clamp(0.0, 15.0) as u8
        } else {
            0
        }
    };
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (code(x[64 * c + l], 2 * c), code(x[64 * c + 32 + l], 2 * c + 1));
            b[16 + 32 * c + l] = lo | (hi << 4);
        }
    }
}

fn q6_k(x: &[f32], b: &mut [u8]) {
    // each sub-block of 16: its value of largest magnitude maps to code -32
    let scales: Vec<f32> = x
        .chunks_exact(16)
        .map(|c| c.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m }) / -32.0)
        .collect();
    let big = scales.iter().fold(0f32, |m, &s| m.max(s.abs()));
    let d = put_half(b, 208, big / 127.0);
    let sc: Vec<i8> =
        scales.iter().map(|&s| if d > 0.0 { (s / d).round().clamp(-128.0, 127.0) as i8 } else { 0 }).collect();
    for (j, &s) in sc.iter().enumerate() {
        b[192 + j] = s as u8;
    }
    let code = |v: usize| {
        let s = d * sc[v / 16] as f32;
        let q = if s != 0.0 { (x[v] / s).round().clamp(-32.0, 31.0) as i32 } else { 0 };
        (q + 32) as u8
    };
    for h in 0..2 {
        for l in 0..32 {
            let v = 128 * h + l;
            let (q1, q2, q3, q4) = (code(v), code(v + 32), code(v + 64), code(v + 96));
            b[64 * h + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            b[64 * h + 32 + l] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            b[128 + 32 * h + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::blocks::dequantize;
    use super::*;

    fn sample(n: usize, seed: u64) -> Vec<f32> {
        // a heavy-tailed row, as trained weights are
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((s >> 11) as f64 / (1u64 << 53) as f64) as f32 - 0.5;
                u * 0.1 + if (s >> 60) == 0 { u * 0.6 } else { 0.0 }
            })
            .collect()
    }

    /// Root-mean-square error over root-mean-square value.
    fn rel_rms(fmt: QuantFormat, x: &[f32]) -> f32 {
        let y = dequantize(fmt, &quantize(fmt, x).unwrap(), x.len()).unwrap();
        let e: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
        let n: f32 = x.iter().map(|a| a * a).sum();
        (e / n).sqrt()
    }

    #[test]
    fn each_format_keeps_the_error_its_bits_allow() {
        let x = sample(4096, 7);
        // 8 bits: about 2^-8 of the range; 6 bits a quarter as fine as that
        for (fmt, bound) in [
            (QuantFormat::Q8_0, 0.01),
            (QuantFormat::Q6K, 0.04),
            (QuantFormat::Q4K, 0.12),
            (QuantFormat::Q4_1, 0.16),
            (QuantFormat::Q4_0, 0.16),
        ] {
            let e = rel_rms(fmt, &x);
            assert!(e < bound, "{fmt}: relative rms error {e}");
        }
        assert!(rel_rms(QuantFormat::Q4K, &x) < rel_rms(QuantFormat::Q4_0, &x));
    }

    #[test]
    fn codes_and_scales_land_where_the_layout_says() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
        let b = quantize(QuantFormat::Q8_0, &x).unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), f16::from_f32(8.0 / 127.0).to_f32());
        assert_eq!(b[2] as i8, -127);
        // values already on a Q4_0 grid come back exactly
        let x: Vec<f32> = (0..32).map(|i| ((i % 16) as f32 - 8.0) * 0.25).collect();
        assert_eq!(dequantize(QuantFormat::Q4_0, &quantize(QuantFormat::Q4_0, &x).unwrap(), 32).unwrap(), x);
        // values on a Q4_1 grid (offset -1, step 0.5) come back exactly
        let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 * 0.5 - 1.0).collect();
        assert_eq!(dequantize(QuantFormat::Q4_1, &quantize(QuantFormat::Q4_1, &x).unwrap(), 32).unwrap(), x);
        // a constant sub-block and zeros stay exact in every format
        for fmt in QuantFormat::ALL {
            let z = vec![0f32; 256];
            assert_eq!(dequantize(fmt, &quantize(fmt, &z).unwrap(), 256).unwrap(), z, "{fmt}");
        }
    }

    #[test]
    fn partial_blocks_and_non_finite_values_are_refused() {
        assert!(quantize(QuantFormat::Q4K, &[0.0; 32]).unwrap_err().to_string().contains("Q4_K"));
        let mut x = vec![0.0f32; 32];
        x[3] = f32::NAN;
        assert!(quantize(QuantFormat::Q8_0, &x).unwrap_err().to_string().contains("value 3"));
    }
}
