//! Fused paged attention (`kernels/paged_attention.wgsl`): a serving step's ragged batch,
//! each sequence's queries over the key and value rows its slot table lists in the shared
//! pools, read in place (no gathered copy per sequence). The segment and slot tables ride
//! in the launch's parameters; each workgroup takes a block of one segment's rows for one
//! kv head and runs the online softmax of `online_softmax.wgsl` over key tiles staged through
//! the slot table.

use crate::attention::{keys_per_tile, MAX_ROWS};
use crate::{check_same, fused_float, tpl, u32p, Wgpu, WgpuStorage};
use redco_core::ops::paged_attention::PagedSpec;
use redco_core::{Result, Shape};

/// Words before the segment table in the parameters.
const HEADER: usize = 8;

/// The kernel's parameters for `s` with `bq` rows per workgroup: the header, the segment
/// table, the workgroup blocks and the slots (see the kernel's comment); and the number of
/// blocks.
fn params(s: &PagedSpec<'_>, bq: usize) -> Result<(Vec<u32>, usize)> {
    let rep = s.q_heads / s.kv_heads;
    let blocks: Vec<(usize, usize)> = s
        .segments
        .iter()
        .enumerate()
        .flat_map(|(i, sg)| (0..rep * sg.q_len).step_by(bq).map(move |r0| (i, r0)))
        .collect();
    let blocks_at = HEADER + 4 * s.segments.len();
    let mut slots_at = blocks_at + 2 * blocks.len();
    let mut p = vec![
        u32p(s.q_heads, "query heads")?,
        u32p(s.kv_heads, "kv heads")?,
        u32p(s.tokens, "tokens")?,
        (s.scale as f32).to_bits(),
        u32p(blocks_at, "paged attention tables")?,
        0,
        0,
        0,
    ];
    for sg in s.segments {
        for x in [sg.q_start, sg.q_len, sg.slots.len(), slots_at] {
            p.push(u32p(x, "paged attention segment")?);
        }
        slots_at += sg.slots.len();
    }
    for (i, r0) in &blocks {
        p.push(u32p(*i, "segment")?);
        p.push(u32p(*r0, "row")?);
    }
    for sg in s.segments {
        for &r in &sg.slots {
            p.push(u32p(r, "pool row")?);
        }
    }
    u32p(p.len(), "paged attention tables")?;
    Ok((p, blocks.len()))
}

/// [`redco_core::Backend::paged_attention`] on the device: `q` `[q_heads, tokens, d]`,
/// pools `k`, `v` `[rows, kv_heads, d]` (validated by the op). `Ok(None)` when the head dim
/// is too large for the device's workgroup memory (the op then runs its composite).
pub(crate) fn paged_attention(
    w: &Wgpu,
    q: &WgpuStorage,
    k: &WgpuStorage,
    v: &WgpuStorage,
    s: &PagedSpec<'_>,
) -> Result<Option<WgpuStorage>> {
    // pools held in another dtype than the queries: the op's composite widens them
    if q.dtype != k.dtype {
        return Ok(None);
    }
    fused_float(q, "paged_attention")?;
    check_same(q, k, "paged_attention (k)")?;
    check_same(q, v, "paged_attention (v)")?;
    let d = s.head_dim;
    let qs = Shape::new([s.q_heads, s.tokens, d]);
    let pool = Shape::new([s.rows, s.kv_heads, d]);
    crate::check_len(q, &qs, "paged_attention (q)")?;
    crate::check_len(k, &pool, "paged_attention (k)")?;
    crate::check_len(v, &pool, "paged_attention (v)")?;
    if qs.elem_count() == 0 {
        return w.alloc(0, q.dtype).map(Some);
    }
    let Some(bk) = keys_per_tile(d, w.ctx.limits.max_compute_workgroup_storage_size) else {
        return Ok(None);
    };
    let rep = s.q_heads / s.kv_heads;
    let most = s.segments.iter().map(|sg| rep * sg.q_len).max().unwrap_or(1);
    let bq = most.next_power_of_two().clamp(8, MAX_ROWS);
    let (p, blocks) = params(s, bq)?;
    let (store, xt) = (w.store(q.dtype), w.elem(q.dtype));
    let key = format!("paged_attention/{d}/{bq}/{bk}/{xt}/{store}");
    let (ds, bqs, bks) = (d.to_string(), bq.to_string(), bk.to_string());
    let src = || {
        tpl(
            &[include_str!("kernels/paged_attention.wgsl"), include_str!("kernels/online_softmax.wgsl")].concat(),
            &[("$D", &ds), ("$BQ", &bqs), ("$BK", &bks), ("$STORE", store), ("$XT", xt)],
        )
    };
    let out = w.alloc(qs.elem_count(), q.dtype)?;
    let groups = (u32p(blocks, "row blocks")?, u32p(s.kv_heads, "kv heads")?, 1);
    w.launch(&key, src, &[q, k, v], &out, &p, groups)?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_core::ops::paged_attention::PagedSegment;

    /// The tables: a block list covering every segment's rows in `bq` steps, each segment's
    /// slots where its entry says.
    #[test]
    fn tables_list_blocks_and_slots() {
        let segs = [
            PagedSegment { q_start: 0, q_len: 1, slots: vec![3, 1] },
            PagedSegment { q_start: 1, q_len: 5, slots: vec![0, 2, 4, 5, 6] },
        ];
        let s = PagedSpec { q_heads: 4, kv_heads: 2, head_dim: 8, tokens: 6, rows: 7, scale: 0.5, segments: &segs };
        let (p, blocks) = params(&s, 8).unwrap();
        // rows: 2 x 1 (one block) and 2 x 5 = 10 (blocks at 0 and 8)
        assert_eq!(blocks, 3);
        let blocks_at = p[4] as usize;
        assert_eq!(blocks_at, HEADER + 8);
        assert_eq!(&p[blocks_at..blocks_at + 6], &[0, 0, 1, 0, 1, 8]);
        let slots = |i: usize| {
            let (n, at) = (p[HEADER + 4 * i + 2] as usize, p[HEADER + 4 * i + 3] as usize);
            p[at..at + n].to_vec()
        };
        assert_eq!((slots(0), slots(1)), (vec![3, 1], vec![0, 2, 4, 5, 6]));
        assert_eq!(p.len(), blocks_at + 6 + 7);
    }
}
