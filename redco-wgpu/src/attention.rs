//! Fused scaled-dot-product attention (`kernels/attention.wgsl`): one workgroup per block
//! of query rows of one (batch, kv head) pair, online softmax over key tiles staged in
//! workgroup memory, grouped-query heads reading their shared kv head, the causal limit and
//! a broadcast keep-mask applied by strides. No `[batch, heads, q, kv]` tensor exists.

use crate::{check_same, tpl, u32p, Wgpu, WgpuStorage};
use redco_core::ops::attention::AttentionSpec;
use redco_core::{DType, Error, Result, Shape};

/// Rows (query positions of the heads sharing a kv head) per workgroup, at most.
pub(crate) const MAX_ROWS: usize = 64;
/// Keys per tile, at most (the kept keys of a tile are the bits of a u32).
const MAX_KEYS: usize = 32;

/// Keys per tile for head dim `d`: the most (a power of two up to `MAX_KEYS`) whose key and
/// value tiles fit the device's workgroup memory; `None` when not even one key fits.
pub(crate) fn keys_per_tile(d: usize, workgroup_bytes: u32) -> Option<usize> {
    let mut bk = MAX_KEYS;
    while bk > 1 && 2 * bk * d * 4 > workgroup_bytes as usize {
        bk /= 2;
    }
    (2 * bk * d * 4 <= workgroup_bytes as usize).then_some(bk)
}

/// Attention of `q` (`[batch, q_heads, q_len, d]`) over `k`, `v` (`[batch, kv_heads,
/// kv_len, d]`) with the optional U8 keep-mask; see [`AttentionSpec`]. `Ok(None)` when the
/// head dim is too large for the device's workgroup memory (the caller falls back to the
/// composite).
pub(crate) fn attention(
    w: &Wgpu,
    q: &WgpuStorage,
    k: &WgpuStorage,
    v: &WgpuStorage,
    mask: Option<&WgpuStorage>,
    s: &AttentionSpec,
) -> Result<Option<WgpuStorage>> {
    check_same(q, k, "attention (k)")?;
    check_same(q, v, "attention (v)")?;
    let d = s.head_dim;
    let qs = Shape::new([s.batch, s.q_heads, s.q_len, d]);
    let ks = Shape::new([s.batch, s.kv_heads, s.kv_len, d]);
    if s.kv_heads == 0 || !s.q_heads.is_multiple_of(s.kv_heads) {
        return Err(Error::ShapeMismatch { op: "attention (heads)", lhs: qs, rhs: ks });
    }
    crate::check_len(q, &qs, "attention (q)")?;
    crate::check_len(k, &ks, "attention (k)")?;
    crate::check_len(v, &ks, "attention (v)")?;
    let full = Shape::new([s.batch, s.q_heads, s.q_len, s.kv_len]);
    let mstrides = match (mask, &s.mask_shape) {
        (Some(m), Some(ms)) => {
            if m.dtype != DType::U8 {
                return Err(Error::UnsupportedDType { op: "attention (mask must be U8)", dtype: m.dtype });
            }
            crate::check_len(m, ms, "attention (mask)")?;
            if ms.rank() > 4 || ms.broadcast(&full, "attention (mask)")? != full {
                return Err(Error::ShapeMismatch { op: "attention (mask)", lhs: ms.clone(), rhs: full });
            }
            Some(ms.broadcast_strides(&full))
        }
        _ => None,
    };
    if qs.elem_count() == 0 {
        return w.alloc(0, q.dtype).map(Some);
    }
    if s.kv_len == 0 {
        return crate::elementwise::full(w, qs.elem_count(), 0.0, q.dtype).map(Some);
    }
    let Some(bk) = keys_per_tile(d, w.ctx.limits.max_compute_workgroup_storage_size) else {
        return Ok(None);
    };
    let rows = s.q_heads / s.kv_heads * s.q_len;
    let bq = rows.next_power_of_two().clamp(8, MAX_ROWS);
    let (store, xt) = (w.store(q.dtype), w.elem(q.dtype));
    let key = format!("attention/{d}/{bq}/{bk}/{xt}/{store}");
    let (ds, bqs, bks) = (d.to_string(), bq.to_string(), bk.to_string());
    let src = || {
        tpl(
            &[include_str!("kernels/attention.wgsl"), include_str!("kernels/online_softmax.wgsl")].concat(),
            &[("$D", &ds), ("$BQ", &bqs), ("$BK", &bks), ("$STORE", store), ("$XT", xt)],
        )
    };
    let ms = mstrides.clone().unwrap_or_else(|| vec![0; 4]);
    let mut params = vec![
        u32p(s.q_heads, "query heads")?,
        u32p(s.kv_heads, "kv heads")?,
        u32p(s.q_len, "query length")?,
        u32p(s.kv_len, "kv length")?,
        (s.scale as f32).to_bits(),
        s.causal as u32,
        mstrides.is_some() as u32,
    ];
    for st in ms {
        params.push(u32p(st, "mask stride")?);
    }
    let out = w.alloc(qs.elem_count(), q.dtype)?;
    // without a mask, `q` is bound in its place (never read)
    let m = mask.filter(|_| mstrides.is_some()).unwrap_or(q);
    let groups = (u32p(rows.div_ceil(bq), "row blocks")?, u32p(s.kv_heads, "kv heads")?, u32p(s.batch, "batch")?);
    w.launch(&key, src, &[q, k, v, m], &out, &params, groups)?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_tiles_shrink_to_fit_workgroup_memory() {
        assert_eq!(keys_per_tile(64, 16384), Some(32));
        assert_eq!(keys_per_tile(128, 16384), Some(16));
        assert_eq!(keys_per_tile(256, 16384), Some(8));
        assert_eq!(keys_per_tile(2048, 16384), Some(1));
        assert_eq!(keys_per_tile(4096, 16384), None);
    }
}
