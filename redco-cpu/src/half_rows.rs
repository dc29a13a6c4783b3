//! Row kernels on 16-bit data without whole-tensor f32 copies: the rows are taken a block at
//! a time (a few tens of KiB), each block's inputs widened into f32 buffers of the task's
//! own, the f32 kernel run on them, and its f32 result narrowed into the 16-bit output
//! while it is still in cache.
//!
//! Widening a whole bf16 input first (and narrowing a whole f32 result after) moves 20
//! bytes per element through memory for a kernel that reads one input and writes one
//! output; block by block it moves the 4 bytes of the 16-bit data, the rest staying in the
//! core's caches. The f32 kernels run unchanged, so the results are those of widening
//! first, bit for bit.

use super::simd;
use half::{bf16, f16};
use rayon::prelude::*;
use redco_core::dtype::{bf16_to_f32, f32_to_bf16};
use redco_core::{DType, Error, HostData, Result};

/// Elements per block of the widest operand: small enough that a block's f32 buffers stay
/// in L2 (and that the f32 kernels, given one block, run it on the calling thread).
const BLOCK: usize = 8192;

/// A 16-bit float input: its values and how many of them make a row.
#[derive(Clone, Copy)]
pub(crate) struct HalfIn<'a> {
    data: HalfSlice<'a>,
    row: usize,
}

#[derive(Clone, Copy)]
enum HalfSlice<'a> {
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> HalfIn<'a> {
    /// `h` (bf16 or f16) read `row` elements per row; `None` for other dtypes.
    pub(crate) fn of(h: &'a HostData, row: usize) -> Option<Self> {
        let data = match h {
            HostData::BF16(v) => HalfSlice::Bf16(v),
            HostData::F16(v) => HalfSlice::F16(v),
            _ => return None,
        };
        Some(HalfIn { data, row })
    }

    fn dtype(&self) -> DType {
        match self.data {
            HalfSlice::Bf16(_) => DType::BF16,
            HalfSlice::F16(_) => DType::F16,
        }
    }

    fn len(&self) -> usize {
        match self.data {
            HalfSlice::Bf16(v) => v.len(),
            HalfSlice::F16(v) => v.len(),
        }
    }

    /// Rows `r0..r0 + rows` widened into `buf` (replacing its contents).
    fn widen(&self, r0: usize, rows: usize, buf: &mut Vec<f32>) {
        let range = r0 * self.row..(r0 + rows) * self.row;
        let n = range.len();
        buf.clear();
        buf.reserve(n);
        let dst = &mut buf.spare_capacity_mut()[..n];
        match self.data {
            HalfSlice::Bf16(v) => simd::map_into(&v[range], dst, &bf16_to_f32),
            HalfSlice::F16(v) => simd::map_into(&v[range], dst, &f16::to_f32),
        }
        // SAFETY: the first `n` elements were written just above.
        unsafe { buf.set_len(n) };
    }
}

/// Runs the f32 row kernel `f` over `rows` rows of the 16-bit inputs `ins` (all of one
/// dtype, which the output takes, `out_row` elements per output row), a block of rows at a
/// time and blocks in parallel. `f(r0, xs)` gets the block's first row and its inputs
/// widened (rows `r0..`, as many as `xs[i].len() / ins[i].row`) and returns the block's
/// output rows in f32.
pub(crate) fn by_blocks<const N: usize>(
    op: &'static str,
    ins: [HalfIn<'_>; N],
    rows: usize,
    out_row: usize,
    f: impl Fn(usize, [&[f32]; N]) -> Vec<f32> + Sync,
) -> Result<HostData> {
    let dt = ins.first().map_or(DType::BF16, HalfIn::dtype);
    for x in &ins {
        if x.dtype() != dt || x.len() != rows * x.row {
            return Err(Error::invalid(op, "16-bit operands of different dtypes or row counts"));
        }
    }
    let widest = ins.iter().map(|x| x.row).chain([out_row]).max().unwrap_or(1).max(1);
    let per = (BLOCK / widest).max(1);
    let run = |b: usize, out: &mut dyn FnMut(&[f32])| -> Result<()> {
        let r0 = b * per;
        let n = per.min(rows - r0);
        let mut bufs: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
        for (x, buf) in ins.iter().zip(bufs.iter_mut()) {
            x.widen(r0, n, buf);
        }
        let ys = f(r0, std::array::from_fn(|i| &bufs[i][..]));
        if ys.len() != n * out_row {
            return Err(Error::invalid(
                op,
                format!("a block kernel gave {} values for {n} rows of {out_row}", ys.len()),
            ));
        }
        out(&ys);
        Ok(())
    };
    let total = rows * out_row;
    if total == 0 {
        return Ok(HostData::from_f32(Vec::new(), dt));
    }
    let chunk = per * out_row;
    Ok(match dt {
        DType::F16 => {
            let mut o: Vec<f16> = Vec::with_capacity(total);
            o.spare_capacity_mut()[..total]
                .par_chunks_mut(chunk)
                .enumerate()
                .try_for_each(|(b, dst)| run(b, &mut |ys| simd::map_into(ys, dst, &f16::from_f32)))?;
            // SAFETY: the blocks cover all `total` elements, each written by `run` above.
            unsafe { o.set_len(total) };
            HostData::F16(o)
        }
        _ => {
            let mut o: Vec<bf16> = Vec::with_capacity(total);
            o.spare_capacity_mut()[..total]
                .par_chunks_mut(chunk)
                .enumerate()
                .try_for_each(|(b, dst)| run(b, &mut |ys| simd::map_into(ys, dst, &f32_to_bf16)))?;
            // SAFETY: the blocks cover all `total` elements, each written by `run` above.
            unsafe { o.set_len(total) };
            HostData::BF16(o)
        }
    })
}

#[cfg(test)]
mod tests;
