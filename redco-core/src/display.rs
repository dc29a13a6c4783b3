//! Printing a tensor's values: `format!("{t}")` shows them nested by dimension, as
//! PyTorch's `print(tensor)` does, followed by the shape, dtype and backend.
//!
//! Large tensors are summarised: along a dimension longer than [`EDGE`]` * 2` only the first
//! and last [`EDGE`] entries are shown, with `...` between, once the tensor holds more than
//! [`SUMMARY_THRESHOLD`] elements. Printing reads the values to the host (it forces a lazy
//! backend); a sharded tensor prints its layout instead (replicate it first to see all of
//! its values), and a failed read prints the error instead of panicking.

use crate::{Backend, Tensor};
use std::fmt;

/// Tensors with more elements than this are summarised.
pub const SUMMARY_THRESHOLD: usize = 1000;
/// Entries shown at each end of a summarised dimension.
pub const EDGE: usize = 3;

impl<B: Backend> fmt::Display for Tensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tail = format!("shape={}, dtype={:?}, backend={}", self.shape(), self.dtype(), self.backend().name());
        if self.is_sharded() {
            return write!(
                f,
                "tensor(<laid out as {:?}; replicate it to print its values>, {tail})",
                self.placements()
            );
        }
        let values = match self.to_host() {
            Ok(h) => h,
            Err(e) => return write!(f, "tensor(<values unavailable: {e}>, {tail})"),
        };
        let dims = self.dims().to_vec();
        let summarise = self.elem_count() > SUMMARY_THRESHOLD;
        let cells: Vec<String> = if self.dtype().is_float() {
            float_cells(&values.to_f64_vec(), f.precision().unwrap_or(4))
        } else {
            match values.to_i64_vec() {
                Ok(v) => v.iter().map(i64::to_string).collect(),
                Err(e) => return write!(f, "tensor(<values unavailable: {e}>, {tail})"),
            }
        };
        let width = cells.iter().map(String::len).max().unwrap_or(0);
        let mut out = String::from("tensor(");
        nest(&mut out, &cells, &dims, 0, 0, width, summarise, "tensor(".len());
        write!(f, "{out}, {tail})")
    }
}

/// The text of each float: fixed-point with `precision` decimals, or scientific notation
/// when the magnitudes span too much for fixed-point to show them.
fn float_cells(v: &[f64], precision: usize) -> Vec<String> {
    let finite = v.iter().copied().filter(|x| x.is_finite() && *x != 0.0).map(f64::abs);
    let (lo, hi) = finite.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let sci = hi >= 1e8 || (lo.is_finite() && lo < 1e-4) || (lo.is_finite() && hi / lo >= 1e5);
    v.iter()
        .map(|&x| match (x.is_nan(), x.is_infinite()) {
            (true, _) => "nan".to_string(),
            (_, true) => if x > 0.0 { "inf" } else { "-inf" }.to_string(),
            _ if sci => format!("{x:.precision$e}"),
            _ => format!("{x:.precision$}"),
        })
        .collect()
}

/// Writes the values of dimension `d` (starting at element `offset`) as a bracketed list.
#[allow(clippy::too_many_arguments)]
fn nest(
    out: &mut String,
    cells: &[String],
    dims: &[usize],
    d: usize,
    offset: usize,
    width: usize,
    summarise: bool,
    indent: usize,
) {
    if d == dims.len() {
        // a rank-0 tensor
        out.push_str(cells.first().map_or("", String::as_str));
        return;
    }
    let n = dims[d];
    let stride: usize = dims[d + 1..].iter().product();
    let shown: Vec<Option<usize>> = if summarise && n > 2 * EDGE {
        (0..EDGE).map(Some).chain([None]).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    out.push('[');
    let last_dim = d + 1 == dims.len();
    for (k, entry) in shown.iter().enumerate() {
        if k > 0 {
            out.push(',');
            if last_dim {
                out.push(' ');
            } else {
                // one blank line between blocks of rank 3 and more, as PyTorch prints them
                let blank = dims.len() - d - 1;
                out.push_str(&"\n".repeat(blank.min(2)));
                out.push_str(&" ".repeat(indent + d + 1));
            }
        }
        match entry {
            None => out.push_str("..."),
            Some(i) if last_dim => out.push_str(&format!("{:>width$}", cells[offset + i])),
            Some(i) => nest(out, cells, dims, d + 1, offset + i * stride, width, summarise, indent),
        }
    }
    out.push(']');
}
