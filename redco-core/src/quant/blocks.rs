//! llama.cpp's quantized blocks turned back into f32, as its own `dequantize_row_*` does:
//! `Q8_0` and `Q4_0` (32 values a block, one f16 scale), `Q4_1` (32 values, an f16 scale and
//! offset), `Q4_K` (256 values a super-block,
//! eight sub-blocks with 6-bit scales and minimums) and `Q6_K` (256 values, sixteen 8-bit
//! scales). The reference every kernel that reads blocks in place is checked against, and
//! what reads a GGUF file into a float model (`redco convert --to hf`).

use super::QuantFormat;
use crate::{Error, Result};
use half::f16;

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `Q4_K`'s scale and minimum of sub-block `j` (0..8) from its 12 packed bytes.
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (l, y) in y.iter_mut().enumerate() {
        *y = b[2 + l] as i8 as f32 * d;
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for l in 0..16 {
        let q = b[2 + l];
        y[l] = ((q & 0xF) as i32 - 8) as f32 * d;
        y[l + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for l in 0..16 {
        let q = b[4 + l];
        y[l] = (q & 0xF) as f32 * d + m;
        y[l + 16] = (q >> 4) as f32 * d + m;
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1, d2, m2) = (d * s1 as f32, dmin * m1 as f32, d * s2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 208);
    for half in 0..2 {
        let (ql, qh) = (&b[64 * half..64 * half + 64], &b[128 + 32 * half..128 + 32 * half + 32]);
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * sc[is + k] as i8 as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

/// Dequantizes whole blocks of `fmt` from `bytes` into `out` (`out.len()` values, whole
/// blocks; `bytes` exactly their length).
pub fn dequantize_into(fmt: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (per, size) = (fmt.block_values(), fmt.block_bytes());
    if !out.len().is_multiple_of(per) || bytes.len() != out.len() / per * size {
        return Err(Error::invalid(
            "dequantize",
            format!(
                "{} values of {} take {} bytes, not {}",
                out.len(),
                fmt.name(),
                out.len() / per * size,
                bytes.len()
            ),
        ));
    }
    let f: fn(&[u8], &mut [f32]) = match fmt {
        QuantFormat::Q4_0 => q4_0,
        QuantFormat::Q4_1 => q4_1,
        QuantFormat::Q8_0 => q8_0,
        QuantFormat::Q4K => q4_k,
        QuantFormat::Q6K => q6_k,
    };
    for (b, y) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(per)) {
        f(b, y);
    }
    Ok(())
}

/// The `elems` values of `bytes`, blocks of `fmt`; a length that is not whole blocks is
/// an error naming the format.
pub fn dequantize(fmt: QuantFormat, bytes: &[u8], elems: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; elems];
    dequantize_into(fmt, bytes, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_and_q4_0_blocks_are_scale_times_code() {
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = dequantize(QuantFormat::Q8_0, &b, 32).unwrap();
        assert_eq!(y, (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect::<Vec<_>>());
        // Q4_0: byte l holds value l (low nibble) and value l + 16 (high nibble), minus 8
        let mut b = h(0.25).to_vec();
        b.extend((0..16u8).map(|l| l | ((15 - l) << 4)));
        let y = dequantize(QuantFormat::Q4_0, &b, 32).unwrap();
        for l in 0..16 {
            assert_eq!((y[l], y[l + 16]), ((l as f32 - 8.0) * 0.25, ((15 - l) as f32 - 8.0) * 0.25));
        }
    }

    #[test]
    fn q4_1_blocks_are_scale_times_code_plus_offset() {
        let mut b = [h(0.5), h(-1.25)].concat();
        b.extend((0..16u8).map(|l| l | ((15 - l) << 4)));
        let y = dequantize(QuantFormat::Q4_1, &b, 32).unwrap();
        for l in 0..16 {
            assert_eq!((y[l], y[l + 16]), (l as f32 * 0.5 - 1.25, (15 - l) as f32 * 0.5 - 1.25));
        }
    }

    /// Packs eight 6-bit scales and minimums as `Q4_K` stores them.
    fn pack_k4(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
        let mut q = [0u8; 12];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
        }
        q
    }

    #[test]
    fn q4_k_follows_its_sub_block_scales_and_minimums() {
        let sc = [1, 7, 20, 33, 40, 51, 62, 63];
        let m = [0, 5, 17, 30, 41, 52, 60, 63];
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &pack_k4(sc, m)), (sc[j], m[j]), "sub-block {j}");
        }
        let (d, dmin) = (0.125f32, 0.0625f32);
        let mut b = [h(d), h(dmin)].concat();
        b.extend(pack_k4(sc, m));
        b.extend((0..128).map(|i| ((i % 16) as u8) | (((i * 7 % 16) as u8) << 4)));
        let y = dequantize(QuantFormat::Q4K, &b, 256).unwrap();
        for (v, &got) in y.iter().enumerate() {
            // value v: chunk v / 64; the low nibbles of the chunk's 32 bytes, then the high
            let (chunk, r) = (v / 64, v % 64);
            let byte = chunk * 32 + r % 32;
            let (q, sub) = if r < 32 { (byte % 16, 2 * chunk) } else { (byte * 7 % 16, 2 * chunk + 1) };
            let want = d * sc[sub] as f32 * q as f32 - dmin * m[sub] as f32;
            assert_eq!(got, want, "value {v}");
        }
    }

    #[test]
    fn q6_k_joins_four_low_and_two_high_bits() {
        let ql: Vec<u8> = (0..128).map(|i| (i * 37 % 256) as u8).collect();
        let qh: Vec<u8> = (0..64).map(|i| (i * 91 % 256) as u8).collect();
        let sc: Vec<i8> = (0..16).map(|i| (i as i8 - 8) * 3).collect();
        let d = 0.01f32;
        let mut b = [ql.clone(), qh.clone(), sc.iter().map(|&s| s as u8).collect()].concat();
        b.extend(h(d));
        let y = dequantize(QuantFormat::Q6K, &b, 256).unwrap();
        let d = f16::from_f32(d).to_f32();
        for (v, &got) in y.iter().enumerate() {
            // value v: half v / 128; within it, group g = r / 32 of four, position l = r % 32
            let (hf, r) = (v / 128, v % 128);
            let (g, l) = (r / 32, r % 32);
            let low = ql[64 * hf + l + 32 * (g % 2)];
            let low = if g < 2 { low & 0xF } else { low >> 4 };
            let high = (qh[32 * hf + l] >> (2 * g)) & 3;
            let q = (low | (high << 4)) as i32 - 32;
            let s = sc[8 * hf + l / 16 + 2 * g] as f32;
            assert_eq!(got, d * s * q as f32, "value {v}");
        }
    }

    #[test]
    fn short_data_is_refused_by_name() {
        assert!(dequantize(QuantFormat::Q8_0, &[0; 33], 32).unwrap_err().to_string().contains("34"));
    }
}
