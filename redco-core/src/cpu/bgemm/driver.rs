//! Blocking and threading of the AMX bf16 GEMM.
//!
//! ```text
//! for each block of NC columns (packed B of at most B_BYTES, shared):
//!   pack its 32-column panels, in parallel
//!   tasks = (run of MC rows) x (share of the block's panels), in parallel; each task:
//!     pack its rows of A, 32 at a time (thread-local, at most A_BYTES)
//!     for each k block of KC_STEPS x 32:
//!       for each of its B panels:           (the panel's k block, <= 128 KiB, in L2)
//!         for each 32-row block of its A:   (A's k block from L2)
//!           32 x 32 micro-kernel over the k block, C = (first k block) or C += (later ones),
//!           straight in C (edges via a scratch block)
//! ```

use super::amx::{Tiles, BLOCK, KSTEP, TILE};
use super::pack::{pack_a, pack_b};
use super::{HalfRef, A_BYTES, B_BYTES};
use crate::cpu::sgemm::buffer::{with_buf, Slot};
use crate::cpu::sgemm::{par_for, split, SendPtr};
use std::mem::MaybeUninit;

/// k steps (of 32) per micro-kernel call: k up to 2048 in one call (measured faster than
/// 256 or 512 at a time on a Sapphire Rapids Xeon: the C round trips cost more than the
/// B panel's L1 reuse saved), longer k (a down projection) in blocks, each B panel's block
/// at most 128 KiB.
const KC_STEPS: usize = 64;

/// The most 32-row blocks of A one task packs.
const MAX_ROW_BLOCKS: usize = 8;

/// A 32 x 32 f32 block for the edges of C.
#[repr(C, align(64))]
struct Scratch([f32; BLOCK * BLOCK]);

/// Runs the GEMM (see the module doc). `m, n, k >= 1`, bounds checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    m: usize,
    n: usize,
    k: usize,
    a: &HalfRef,
    b: &HalfRef,
    c: &mut [MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) {
    let nt = threads.min(rayon::current_num_threads()).max(1);
    let steps = k.div_ceil(KSTEP);
    // u16 elements of one packed 32-row A block or 32-column B panel (all of k)
    let panel = k.div_ceil(KSTEP) * 2 * TILE;
    let panels = n.div_ceil(BLOCK);
    let row_blocks = m.div_ceil(BLOCK);
    let nc = (B_BYTES / (2 * panel)).clamp(1, panels);
    let mut mc = (A_BYTES / (2 * panel)).clamp(1, MAX_ROW_BLOCKS);
    if row_blocks.div_ceil(mc) < nt {
        mc = row_blocks.div_ceil(nt).max(1);
    }
    let row_tasks = row_blocks.div_ceil(mc);
    let cp = SendPtr(c.as_mut_ptr().cast::<f32>());
    with_buf(Slot::HalfB, |bbuf| {
        // the buffers hold f32s: two u16 each
        let bp = SendPtr(bbuf.reserve((nc * panel).div_ceil(2)).cast::<u16>());
        for p0 in (0..panels).step_by(nc) {
            let np = nc.min(panels - p0);
            // SAFETY: panel p of this block is written by task p alone, inside the nc panels
            // reserved; pack_b reads only elements of B inside k x n (bounds checked).
            par_for(np, |p| unsafe { pack_b(b, k, n, (p0 + p) * BLOCK, bp.get().add(p * panel)) });
            let col_tasks = if row_tasks < nt { nt.div_ceil(row_tasks).min(np) } else { 1 };
            par_for(row_tasks * col_tasks, |t| {
                let (rt, ct) = (t / col_tasks, t % col_tasks);
                let (rb0, rb1) = (rt * mc, ((rt + 1) * mc).min(row_blocks));
                let (q0, q1) = split(np, col_tasks, ct);
                with_buf(Slot::HalfA, |abuf| {
                    let ap = abuf.reserve(((rb1 - rb0) * panel).div_ceil(2)).cast::<u16>();
                    for rb in rb0..rb1 {
                        // SAFETY: block rb - rb0 of the reserved A buffer (this task's own).
                        unsafe { pack_a(a, m, k, rb * BLOCK, ap.add((rb - rb0) * panel)) };
                    }
                    // SAFETY: AMX is ready (bgemm_uninit checked `available`).
                    let tiles = unsafe { Tiles::configure() };
                    for s0 in (0..steps).step_by(KC_STEPS) {
                        let run = KC_STEPS.min(steps - s0);
                        let off = s0 * 2 * TILE;
                        for q in q0..q1 {
                            let j0 = (p0 + q) * BLOCK;
                            for rb in rb0..rb1 {
                                let i0 = rb * BLOCK;
                                // SAFETY: the packed panels hold all k steps; this task alone
                                // writes the C block (i0, j0) (row and column ranges of tasks
                                // are disjoint), inside m x n of C at stride ldc; blocks after
                                // the first k block read what the earlier ones wrote.
                                unsafe {
                                    let ab = ap.add((rb - rb0) * panel + off);
                                    let bb = bp.get().add(q * panel + off);
                                    block(&tiles, run, ab, bb, cp.get(), ldc, (i0, j0), (m, n), s0 > 0);
                                }
                            }
                        }
                    }
                });
            });
        }
    });
}

/// `steps` k steps of one 32 x 32 block of C at `(i0, j0)` (`C =`, or `C +=` when
/// `accumulate`): straight in C when the block lies inside `m x n`, else through a scratch
/// block of which only the part inside is read and written.
///
/// # Safety
/// As [`Tiles::kernel`] for `a` and `b`; `c` is writable (and, when `accumulate`, already
/// written) at every `(i, j)` inside `m x n` (row stride `ldc`), and no other thread writes
/// the block.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    tiles: &Tiles,
    steps: usize,
    a: *const u16,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    (i0, j0): (usize, usize),
    (m, n): (usize, usize),
    accumulate: bool,
) {
    // SAFETY: see the function's contract.
    unsafe {
        if i0 + BLOCK <= m && j0 + BLOCK <= n {
            tiles.kernel(steps, a, b, c.add(i0 * ldc + j0), ldc * 4, accumulate);
        } else {
            let mut s = Scratch([0.0; BLOCK * BLOCK]);
            let (rows, cols) = ((m - i0).min(BLOCK), (n - j0).min(BLOCK));
            if accumulate {
                for r in 0..rows {
                    std::ptr::copy_nonoverlapping(c.add((i0 + r) * ldc + j0), s.0.as_mut_ptr().add(r * BLOCK), cols);
                }
            }
            tiles.kernel(steps, a, b, s.0.as_mut_ptr(), BLOCK * 4, accumulate);
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(s.0.as_ptr().add(r * BLOCK), c.add((i0 + r) * ldc + j0), cols);
            }
        }
    }
}
