//! Per-row cross-entropy with an ignore index (`kernels/cross_entropy.wgsl`, one row per
//! segment of a workgroup, see `rows.rs`). Targets are checked on the host first: one
//! outside the vocabulary (other than the ignore index) is an [`Error::IndexOutOfRange`].

use crate::{rows, u32p, Wgpu, WgpuStorage};
use redco_core::{Error, Result, Shape};

/// `logsumexp(row) - row[target]` for each row of `logits` (`[n, vocab]`), 0 where the
/// target is `ignore_index`.
pub(crate) fn cross_entropy(
    w: &Wgpu,
    logits: &WgpuStorage,
    shape: &Shape,
    targets: &WgpuStorage,
    ignore_index: i64,
) -> Result<WgpuStorage> {
    if shape.rank() != 2 || targets.len != shape.dims()[0] {
        return Err(Error::ShapeMismatch { op: "cross_entropy", lhs: shape.clone(), rhs: Shape::new([targets.len]) });
    }
    let (n, vocab) = (shape.dims()[0], shape.dims()[1]);
    let host = w.host_ids(targets, "cross_entropy (targets)")?;
    if let Some(&bad) = host.iter().find(|&&t| t != ignore_index && (t < 0 || t as usize >= vocab)) {
        return Err(Error::IndexOutOfRange { op: "cross_entropy", index: bad, size: vocab });
    }
    let out = w.alloc(n, logits.dtype)?;
    if n == 0 {
        return Ok(out);
    }
    let tpr = rows::threads_per_row(vocab);
    let (store, xt) = (w.store(logits.dtype), w.elem(logits.dtype));
    let key = format!("cross_entropy/{tpr}/{xt}/{store}");
    let src = || rows::source_lse(include_str!("kernels/cross_entropy.wgsl"), tpr, &[("$STORE", store), ("$XT", xt)]);
    // an ignore index beyond i32 matches the saturated device copy of such targets; the
    // kernel also treats every target outside the vocabulary as ignored (checked above)
    let ignore = ignore_index.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    let params = [u32p(n, "rows")?, u32p(vocab, "vocabulary")?, ignore as u32];
    w.launch(&key, src, &[logits, targets], &out, &params, rows::groups(n, tpr)?)?;
    Ok(out)
}
