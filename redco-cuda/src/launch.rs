//! Launch configurations and the parameter blocks the kernels take, computed on the host
//! (and unit-tested here, without a GPU).

use cudarc::driver::{DeviceRepr, LaunchConfig};
use redco_core::{Error, Result, Shape};

/// Threads per block of the elementwise (grid-stride) kernels.
pub const THREADS: u32 = 256;
/// The most blocks an elementwise launch uses (the kernels loop over the rest).
pub const MAX_BLOCKS: u64 = 65_535;
/// Warps per block of the attention kernels (one row each).
pub const ROW_WARPS: u32 = 4;
/// Highest rank the broadcast kernels index (`MAX_RANK` in `common.cuh`).
pub const MAX_RANK: usize = 8;
/// Largest head dimension of the fused attention (`32 * MAX_PER_LANE`).
pub const MAX_HEAD_DIM: usize = 256;

/// A grid-stride launch over `n` elements.
pub fn elementwise(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// One block per row (looping over rows past the grid), threads sized to the row: a
/// multiple of 32 between 32 and 1024.
pub fn per_row(rows: usize, len: usize) -> LaunchConfig {
    let threads = (len.next_power_of_two() as u32).clamp(32, 1024);
    let blocks = (rows as u64).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// Spans per row of a row reduction over `rows` rows of `size` elements: 1 (a block per
/// row) when there are rows enough to fill the GPU, else each row split into spans of at
/// least 16K elements, about 1024 blocks in all (a whole tensor's sum is one row: on one
/// block it would run on one SM of 132).
pub fn split_parts(rows: usize, size: usize) -> usize {
    const MIN_SPAN: usize = 16 * 1024;
    const BLOCKS: usize = 1024;
    if rows == 0 || rows >= BLOCKS / 4 {
        return 1;
    }
    (size / MIN_SPAN).min(BLOCKS.div_ceil(rows)).max(1)
}

/// Shared memory a block may use without opting in (the same on every architecture).
pub const SHARED_BYTES: usize = 48 * 1024;

/// A pass of the tiled attention (`kernels/attention.cu`): their shared-memory layouts
/// differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPass {
    /// The forward: key and value tiles, one query row per warp.
    Forward,
    /// The backward over query rows (dq): key and value tiles, a query and an
    /// output-gradient row per warp.
    Queries,
    /// The backward over key rows (dk, dv): query and output-gradient tiles with their
    /// lse and D, a key and a value row per warp.
    Keys,
}

impl AttnPass {
    /// Shared bytes of a block with `tile`-row tiles and `head_dim` features of
    /// `acc_bytes` each (rows are `head_dim + 1` apart).
    pub fn shared_bytes(self, tile: usize, head_dim: usize, acc_bytes: usize) -> usize {
        let (p, w) = (head_dim + 1, ROW_WARPS as usize);
        let elems = match self {
            AttnPass::Forward => (2 * tile + w) * p,
            AttnPass::Queries => (2 * tile + 2 * w) * p,
            AttnPass::Keys => 2 * tile * p + 2 * tile + 2 * w * p,
        };
        elems * acc_bytes
    }
}

/// The launch of an attention pass over `pairs` (batch, head) pairs of `rows` rows each
/// ([`ROW_WARPS`] rows per block, one per warp), and the tile: the most rows of the
/// streamed side (at most 32, one per lane) whose block fits in [`SHARED_BYTES`].
pub fn attention(
    pass: AttnPass,
    rows: usize,
    pairs: usize,
    head_dim: usize,
    acc_bytes: usize,
) -> Result<(LaunchConfig, i32)> {
    if head_dim == 0 || head_dim > MAX_HEAD_DIM {
        return Err(Error::invalid("cuda attention", format!("head_dim {head_dim} is not in 1..={MAX_HEAD_DIM}")));
    }
    let tile = [32, 16, 8, 4, 2, 1]
        .into_iter()
        .find(|&t| pass.shared_bytes(t, head_dim, acc_bytes) <= SHARED_BYTES)
        .ok_or_else(|| {
            Error::invalid("cuda attention", format!("head_dim {head_dim} does not fit in shared memory"))
        })?;
    let blocks = (rows as u64).div_ceil(ROW_WARPS as u64).max(1).saturating_mul(pairs.max(1) as u64);
    if blocks > i32::MAX as u64 {
        return Err(Error::invalid(
            "cuda launch",
            format!("{rows} rows of {pairs} heads are more than one launch can take"),
        ));
    }
    let shared = pass.shared_bytes(tile, head_dim, acc_bytes) as u32;
    let cfg =
        LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (32 * ROW_WARPS, 1, 1), shared_mem_bytes: shared };
    Ok((cfg, tile as i32))
}

/// The `Dims` block of `common.cuh`: an iteration space and the element strides of up to
/// three operands over it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Number of dimensions in use.
    pub rank: i32,
    /// The iteration space.
    pub out: [i64; MAX_RANK],
    /// Strides of the first operand (0 broadcasts).
    pub s0: [i64; MAX_RANK],
    /// Strides of the second operand.
    pub s1: [i64; MAX_RANK],
    /// Strides of the third operand.
    pub s2: [i64; MAX_RANK],
}

// SAFETY: a plain #[repr(C)] block of integers, laid out as the kernels' `Dims`
unsafe impl DeviceRepr for Dims {}

impl Dims {
    /// The space `out` with the operands' strides (each as long as `out`'s rank); adjacent
    /// dimensions that every operand walks contiguously are merged first, so most shapes
    /// become rank 1 or 2.
    pub fn new(out: &[usize], strides: &[&[i64]]) -> Result<Dims> {
        let (out, strides) = merge(out, strides);
        if out.len() > MAX_RANK {
            return Err(Error::invalid(
                "cuda kernels",
                format!("rank {} is above the {MAX_RANK} the kernels index", out.len()),
            ));
        }
        let mut d = Dims {
            rank: out.len() as i32,
            out: [1; MAX_RANK],
            s0: [0; MAX_RANK],
            s1: [0; MAX_RANK],
            s2: [0; MAX_RANK],
        };
        for (k, &n) in out.iter().enumerate() {
            d.out[k] = n as i64;
        }
        for (which, s) in strides.iter().enumerate() {
            let dst = match which {
                0 => &mut d.s0,
                1 => &mut d.s1,
                _ => &mut d.s2,
            };
            dst[..s.len()].copy_from_slice(s);
        }
        Ok(d)
    }

    /// Broadcast operands `ins` (shapes broadcastable to `out`) over `out`.
    pub fn broadcast(out: &Shape, ins: &[&Shape]) -> Result<Dims> {
        let st: Vec<Vec<i64>> =
            ins.iter().map(|s| s.broadcast_strides(out).into_iter().map(|x| x as i64).collect()).collect();
        let refs: Vec<&[i64]> = st.iter().map(|v| v.as_slice()).collect();
        Dims::new(out.dims(), &refs)
    }
}

/// Drops size-1 dimensions and merges neighbours that every operand walks contiguously.
fn merge(out: &[usize], strides: &[&[i64]]) -> (Vec<usize>, Vec<Vec<i64>>) {
    let mut o: Vec<usize> = Vec::new();
    let mut s: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
    for k in 0..out.len() {
        if out[k] == 1 {
            continue;
        }
        let joins = !o.is_empty()
            && strides.iter().enumerate().all(|(w, st)| s[w].last().copied() == Some(st[k] * out[k] as i64));
        if joins {
            let last = o.len() - 1;
            o[last] *= out[k];
            for (w, st) in strides.iter().enumerate() {
                s[w][last] = st[k];
            }
        } else {
            o.push(out[k]);
            for (w, st) in strides.iter().enumerate() {
                s[w].push(st[k]);
            }
        }
    }
    (o, s)
}

/// A tensor viewed as `[outer, size, inner]` around dimension `dim`.
pub fn around(shape: &Shape, dim: usize) -> (usize, usize, usize) {
    let d = shape.dims();
    (d[..dim].iter().product(), d[dim], d[dim + 1..].iter().product())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_rows_are_split_and_many_rows_are_not() {
        // a 0.7B model's embedding gradient summed whole: 1024 spans of 48K elements
        assert_eq!(split_parts(1, 32000 * 1536), 1024);
        // a small tensor stays on one block
        assert_eq!(split_parts(1, 4096), 1);
        assert_eq!(split_parts(1, 40 * 1024), 2);
        // few rows share the 1024 blocks
        assert_eq!(split_parts(8, 1 << 26), 128);
        // enough rows fill the GPU as they are
        assert_eq!(split_parts(256, 1 << 26), 1);
        assert_eq!(split_parts(0, 1 << 26), 1);
    }

    #[test]
    fn launch_sizes_cover_the_work() {
        let c = elementwise(1000);
        assert_eq!((c.grid_dim.0, c.block_dim.0), (4, 256));
        assert_eq!(elementwise(0).grid_dim.0, 1);
        assert_eq!(elementwise(1 << 40).grid_dim.0 as u64, MAX_BLOCKS);
        let r = per_row(10, 32000);
        assert_eq!((r.grid_dim.0, r.block_dim.0), (10, 1024));
        assert_eq!(per_row(3, 5).block_dim.0, 32);
        assert_eq!(per_row(1, 100).block_dim.0, 128);
    }

    #[test]
    fn attention_tiles_fit_shared_memory_and_cover_every_row() {
        for pass in [AttnPass::Forward, AttnPass::Queries, AttnPass::Keys] {
            for acc in [4, 8] {
                for d in 1..=MAX_HEAD_DIM {
                    let (c, tile) = attention(pass, 9, 3, d, acc).unwrap();
                    assert!((1..=32).contains(&tile), "{pass:?} d {d}: tile {tile}");
                    assert_eq!(c.shared_mem_bytes as usize, pass.shared_bytes(tile as usize, d, acc));
                    assert!(c.shared_mem_bytes as usize <= SHARED_BYTES, "{pass:?} d {d} acc {acc}");
                    // the largest tile that fits: twice it does not, or it is already 32
                    assert!(tile == 32 || pass.shared_bytes(2 * tile as usize, d, acc) > SHARED_BYTES);
                    // 9 rows in blocks of 4 rows, for each of 3 heads
                    assert_eq!((c.grid_dim.0, c.block_dim.0), (9, 128));
                }
            }
        }
        // the common head sizes keep the full 32-row tile in f32
        for d in [64, 128] {
            assert_eq!(attention(AttnPass::Forward, 1, 1, d, 4).unwrap().1, 32);
            assert_eq!(attention(AttnPass::Queries, 1, 1, d, 4).unwrap().1, 32);
        }
        assert_eq!(attention(AttnPass::Keys, 1, 1, 128, 4).unwrap().1, 32);
        assert_eq!(attention(AttnPass::Keys, 1, 1, 256, 8).unwrap().1, 4);
        assert!(attention(AttnPass::Forward, 1, 1, 257, 4).is_err());
        assert!(attention(AttnPass::Forward, 1, 1, 0, 4).is_err());
        assert!(attention(AttnPass::Forward, usize::MAX / 2, 8, 64, 4).is_err());
    }

    #[test]
    fn contiguous_dimensions_merge() {
        // a plain contiguous [2, 3, 4] with itself: one dimension of 24
        let d = Dims::broadcast(&Shape::new([2, 3, 4]), &[&Shape::new([2, 3, 4]), &Shape::new([2, 3, 4])]).unwrap();
        assert_eq!((d.rank, d.out[0], d.s0[0], d.s1[0]), (1, 24, 1, 1));
        // a row vector broadcast over rows: [rows, cols] with strides (cols, 1) and (0, 1)
        let d = Dims::broadcast(&Shape::new([5, 7]), &[&Shape::new([5, 7]), &Shape::new([7])]).unwrap();
        assert_eq!((d.rank, &d.out[..2], &d.s0[..2], &d.s1[..2]), (2, &[5, 7][..], &[7, 1][..], &[0, 1][..]));
        // size-1 dimensions vanish
        let d = Dims::broadcast(&Shape::new([1, 6, 1]), &[&Shape::new([1, 6, 1])]).unwrap();
        assert_eq!((d.rank, d.out[0], d.s0[0]), (1, 6, 1));
    }

    #[test]
    fn merged_offsets_match_the_unmerged_ones() {
        // the kernels' offset arithmetic, done on the host over both forms
        let off = |d: &Dims, mut i: i64| {
            let (mut a, mut b) = (0, 0);
            for k in (0..d.rank as usize).rev() {
                let c = i % d.out[k];
                i /= d.out[k];
                a += c * d.s0[k];
                b += c * d.s1[k];
            }
            (a, b)
        };
        let out = Shape::new([3, 1, 4, 5]);
        let (x, y) = (Shape::new([3, 1, 4, 5]), Shape::new([1, 1, 4, 1]));
        let merged = Dims::broadcast(&out, &[&x, &y]).unwrap();
        let sx: Vec<i64> = x.broadcast_strides(&out).into_iter().map(|v| v as i64).collect();
        let sy: Vec<i64> = y.broadcast_strides(&out).into_iter().map(|v| v as i64).collect();
        let plain = Dims {
            rank: 4,
            out: [3, 1, 4, 5, 1, 1, 1, 1],
            s0: [sx[0], sx[1], sx[2], sx[3], 0, 0, 0, 0],
            s1: [sy[0], sy[1], sy[2], sy[3], 0, 0, 0, 0],
            s2: [0; MAX_RANK],
        };
        for i in 0..60 {
            assert_eq!(off(&merged, i), off(&plain, i), "element {i}");
        }
    }

    #[test]
    fn too_many_dimensions_are_refused() {
        let out = [2usize; 9];
        let s: Vec<i64> = (0..9).map(|k| if k % 2 == 0 { 1 << (9 - k) } else { 0 }).collect();
        assert!(Dims::new(&out, &[&s]).is_err());
        assert_eq!(around(&Shape::new([2, 3, 4, 5]), 2), (6, 4, 5));
    }
}
