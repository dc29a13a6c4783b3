//! Fused paged attention (`paged_attn_*` in `kernels/attention.cu`): a serving step's
//! ragged batch, each sequence's queries over the key and value rows its slot table lists
//! in the shared pools, read in place (no gathered copy per sequence). One warp per (token,
//! query head); the segment and slot tables go up as one i32 buffer per call.

use crate::context::{tn, Cuda};
use crate::elementwise::{fits, same};
use crate::launch::MAX_HEAD_DIM;
use crate::storage::CudaStorage;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use redco_core::ops::paged_attention::PagedSpec;
use redco_core::{Error, HostData, Result, Shape};

/// The kernel's `PagedArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct PagedArgs {
    q_heads: i64,
    kv_heads: i64,
    tokens: i64,
    head_dim: i64,
    segs_at: i64,
    scale: f64,
}
// SAFETY: #[repr(C)] integers and a float, laid out as the kernel's `PagedArgs`
unsafe impl DeviceRepr for PagedArgs {}

/// The kernel's table: each token's segment, then four words per segment (q_start, q_len,
/// kv_len, where its slots begin), then the slots; and where the segments begin.
fn table(s: &PagedSpec<'_>) -> Result<(Vec<i32>, usize)> {
    let i = |x: usize| {
        i32::try_from(x).map_err(|_| Error::invalid("paged_attention", format!("{x} exceeds the kernel's i32 tables")))
    };
    let segs_at = s.tokens;
    let mut slots_at = segs_at + 4 * s.segments.len();
    let mut t = Vec::with_capacity(slots_at + s.segments.iter().map(|g| g.slots.len()).sum::<usize>());
    for (n, g) in s.segments.iter().enumerate() {
        t.extend(std::iter::repeat_n(i(n)?, g.q_len));
    }
    for g in s.segments {
        t.extend([i(g.q_start)?, i(g.q_len)?, i(g.slots.len())?, i(slots_at)?]);
        slots_at += g.slots.len();
    }
    for g in s.segments {
        for &r in &g.slots {
            t.push(i(r)?);
        }
    }
    i(t.len())?;
    Ok((t, segs_at))
}

impl Cuda {
    /// [`redco_core::Backend::paged_attention`] on the GPU: `q` `[q_heads, tokens, d]`,
    /// pools `k`, `v` `[rows, kv_heads, d]` (validated by the op). `Ok(None)` for a head
    /// dim above the kernel's (the op then runs its composite).
    pub(crate) fn paged_attention_op(
        &self,
        q: &CudaStorage,
        k: &CudaStorage,
        v: &CudaStorage,
        s: &PagedSpec<'_>,
    ) -> Result<Option<CudaStorage>> {
        // pools held in another dtype than the queries: the op's composite widens them
        if q.dtype() != k.dtype() {
            return Ok(None);
        }
        same(q, k, "paged_attention (k)")?;
        same(q, v, "paged_attention (v)")?;
        let d = s.head_dim;
        fits(q, &Shape::new([s.q_heads, s.tokens, d]), "paged_attention (q)")?;
        fits(k, &Shape::new([s.rows, s.kv_heads, d]), "paged_attention (k)")?;
        fits(v, &Shape::new([s.rows, s.kv_heads, d]), "paged_attention (v)")?;
        if d > MAX_HEAD_DIM || !q.dtype().is_float() {
            return Ok(None);
        }
        let out = self.alloc(q.len(), q.dtype())?;
        if s.tokens == 0 || s.q_heads == 0 {
            return Ok(Some(out));
        }
        let (tab, segs_at) = table(s)?;
        let tab = self.upload_data(&HostData::I32(tab))?;
        let a = PagedArgs {
            q_heads: s.q_heads as i64,
            kv_heads: s.kv_heads as i64,
            tokens: s.tokens as i64,
            head_dim: d as i64,
            segs_at: segs_at as i64,
            scale: s.scale,
        };
        let dims = |x: usize, what: &str| {
            u32::try_from(x).map_err(|_| Error::invalid("paged_attention", format!("{x} {what} exceed a launch")))
        };
        let cfg = LaunchConfig {
            grid_dim: (dims(s.tokens, "tokens")?, dims(s.q_heads, "heads")?, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = self.function("attention", &format!("paged_attn_{}", tn(q.dtype())))?;
        let (qp, kp, vp, op, tp) = (q.ptr(), k.ptr(), v.ptr(), out.ptr(), tab.ptr());
        self.launch(&f, cfg, |l| {
            l.arg(&qp).arg(&kp).arg(&vp).arg(&op).arg(&tp).arg(&a);
        })?;
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_core::ops::paged_attention::PagedSegment;

    /// Each token names its segment; each segment's entry finds its slots.
    #[test]
    fn the_table_maps_tokens_to_segments_and_slots() {
        let segs = [
            PagedSegment { q_start: 0, q_len: 1, slots: vec![3, 1] },
            PagedSegment { q_start: 1, q_len: 2, slots: vec![0, 2, 4] },
        ];
        let s = PagedSpec { q_heads: 2, kv_heads: 1, head_dim: 8, tokens: 3, rows: 5, scale: 0.5, segments: &segs };
        let (t, at) = table(&s).unwrap();
        assert_eq!(at, 3);
        assert_eq!(&t[..3], &[0, 1, 1]);
        assert_eq!(&t[3..11], &[0, 1, 2, 11, 1, 2, 3, 13]);
        assert_eq!(&t[11..], &[3, 1, 0, 2, 4]);
    }
}
