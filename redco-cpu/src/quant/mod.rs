//! Products with block-quantized weights read in place (`Backend::quant_matmul`): the
//! activations are quantized to signed bytes in blocks of 32 (one f32 scale each, and the
//! scale times the block's code sum for the formats with minimums), and every weight block
//! meets its activation block in integer dot products, scaled in f32.
//!
//! With AVX2 the bytes multiply 32 at a time (`vpmaddubsw`/`vpmaddwd`, the weights' nibbles
//! and 6-bit codes unpacked in registers); elsewhere the same sums run as portable loops.
//! Weight rows are split over the threads; each row is read once per call and met by every
//! activation row while it is in cache, four rows at a time (each block unpacked once for
//! the four). Decoding (one row) is a stream over the blocks, so
//! its time follows the format's bytes.
//!
//! Products with many rows (prefill, large batches: [`PANEL_ROWS`] or more) do not
//! quantize the activations: a panel of weight rows at a time is dequantized to f32 (the
//! panel stays in cache) and multiplied by the f32 GEMM, whose throughput the integer dots
//! without VNNI do not reach; the blocks are still read once a call.

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

pub(crate) use act::QRows;

use rayon::prelude::*;
use redco_core::ops::quant_matmul::QuantMatmulSpec;
use redco_core::quant::QuantFormat;
use redco_core::{Error, HostData, Result};

/// One weight row (`k` values of blocks `w`) against every activation row of `x`, into
/// `out[i]` for row `i`.
type RowDots = fn(QuantFormat, &[u8], &QRows, &mut [f32]);

/// The dot-product kernels this machine runs (`avx2` or `portable`).
pub(crate) fn family() -> &'static str {
    if use_avx2() {
        "avx2"
    } else {
        "portable"
    }
}

fn use_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        redco_core::host_simd::avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn kernel(avx2: bool) -> RowDots {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        return avx2::row_dots;
    }
    let _ = avx2;
    portable::row_dots
}

/// Rows of `x` from which a product dequantizes panels for the f32 GEMM.
pub(crate) const PANEL_ROWS: usize = 24;

/// Weight rows dequantized per panel: about 1 MiB of f32.
fn panel_rows(k: usize) -> usize {
    ((1 << 18) / k.max(1)).clamp(16, 512)
}

/// `x [m, k] @ W^T` through f32 panels of `W` (see the module docs): false where this CPU
/// has no f32 GEMM kernel.
fn by_panels(x: &[f32], w: &[u8], spec: &QuantMatmulSpec, threads: usize, y: &mut [f32]) -> Result<bool> {
    let QuantMatmulSpec { m, n, k, format } = *spec;
    if !crate::sgemm::is_supported() {
        return Ok(false);
    }
    let row = format.row_bytes(k)?;
    let nb = panel_rows(k);
    let mut panel = vec![0f32; nb * k];
    for j0 in (0..n).step_by(nb) {
        let rows = nb.min(n - j0);
        let p = &mut panel[..rows * k];
        p.par_chunks_mut(k).enumerate().try_for_each(|(r, out)| {
            let at = (j0 + r) * row;
            redco_core::quant::blocks::dequantize_into(format, &w[at..at + row], out)
        })?;
        // C[:, j0..] = x (m x k) * panel^T: element (p, j) of B at panel[j * k + p]
        let a = crate::sgemm::MatRef { data: x, rs: k, cs: 1 };
        let b = crate::sgemm::MatRef { data: p, rs: 1, cs: k };
        if !crate::sgemm::sgemm(m, rows, k, a, b, &mut y[j0..], n, false, threads) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `x [m, k] @ W^T` for `W [n, k]` in the blocks `w`, as `x`'s dtype, on the current pool.
pub(crate) fn quant_matmul(x: &HostData, w: &HostData, spec: &QuantMatmulSpec, threads: usize) -> Result<HostData> {
    quant_matmul_with(x, w, spec, threads, use_avx2())
}

/// [`quant_matmul`] with the kernel family chosen (tests run both).
pub(crate) fn quant_matmul_with(
    x: &HostData,
    w: &HostData,
    spec: &QuantMatmulSpec,
    threads: usize,
    avx2: bool,
) -> Result<HostData> {
    let QuantMatmulSpec { m, n, k, format } = *spec;
    let HostData::U8(w) = w else {
        return Err(Error::invalid("quant_matmul", format!("blocks must be U8, got {:?}", w.dtype())));
    };
    let row = format.row_bytes(k)?;
    if w.len() != n * row || x.len() != m * k {
        return Err(Error::invalid(
            "quant_matmul",
            format!("{} bytes and {} values for [{m}, {k}] @ [{n}, {k}] of {format}", w.len(), x.len()),
        ));
    }
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType { op: "quant_matmul", dtype: x.dtype() });
    }
    if m == 0 || n == 0 || k == 0 {
        return Ok(HostData::from_f32(vec![0f32; m * n], x.dtype()));
    }
    let xf = x.to_f32_vec();
    if m >= PANEL_ROWS {
        let mut y = vec![0f32; m * n];
        if by_panels(&xf, w, spec, threads, &mut y)? {
            return Ok(HostData::from_f32(y, x.dtype()));
        }
    }
    let qx = QRows::quantize(&xf, m, k, format);
    let dots = kernel(avx2);
    let per = (n / (threads.max(1) * 8)).clamp(1, 64);
    let y = if m == 1 {
        let mut y = vec![0f32; n];
        y.par_chunks_mut(per).enumerate().for_each(|(c, ys)| {
            for (j, yj) in ys.iter_mut().enumerate() {
                let r = c * per + j;
                dots(format, &w[r * row..(r + 1) * row], &qx, std::slice::from_mut(yj));
            }
        });
        y
    } else {
        // rows of W^T x^T first (each weight row meets every activation row), then turned
        let mut yt = vec![0f32; n * m];
        yt.par_chunks_mut(per * m).enumerate().for_each(|(c, ys)| {
            for (j, yr) in ys.chunks_mut(m).enumerate() {
                let r = c * per + j;
                dots(format, &w[r * row..(r + 1) * row], &qx, yr);
            }
        });
        let mut y = vec![0f32; m * n];
        for (j, col) in yt.chunks_exact(m).enumerate() {
            for (i, &v) in col.iter().enumerate() {
                y[i * n + j] = v;
            }
        }
        y
    };
    Ok(HostData::from_f32(y, x.dtype()))
}

#[cfg(test)]
mod tests;
