//! Blocking and threading of the bf16 GEMM (either engine).
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
use super::dot::Dot;
use super::pack::{pack_a, pack_b};
use super::{Engine, HalfRef, Micro, A_BYTES, B_BYTES};
use crate::sgemm::buffer::{with_buf, Slot};
use crate::sgemm::{par_for, split, SendPtr};
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

/// Where the B panels come from: packed per column block from `B` itself, or already
/// packed whole ([`super::PackedHalfB`]: every panel of all k, panel `p` at `p * panel`).
#[derive(Clone, Copy)]
pub(super) enum BSource<'a> {
    /// The operand, packed block by block.
    Operand(&'a HalfRef<'a>),
    /// Every panel, packed once.
    Packed(&'a [u16]),
}

/// Runs the GEMM (see the module doc) on `engine`. `m, n, k >= 1`, bounds checked by the
/// caller (a packed B holds `n.div_ceil(32)` panels of all k), and the engine runs here
/// ([`Engine::runs`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    engine: Engine,
    m: usize,
    n: usize,
    k: usize,
    a: &HalfRef,
    b: BSource<'_>,
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
        let bp = match b {
            BSource::Operand(_) => SendPtr(bbuf.reserve((nc * panel).div_ceil(2)).cast::<u16>()),
            BSource::Packed(_) => SendPtr(std::ptr::null_mut()),
        };
        for p0 in (0..panels).step_by(nc) {
            let np = nc.min(panels - p0);
            let block_b = match b {
                BSource::Operand(b) => {
                    // SAFETY: panel p of this block is written by task p alone, inside the nc
                    // panels reserved; pack_b reads only elements of B inside k x n (bounds
                    // checked).
                    par_for(np, |p| unsafe { pack_b(b, k, n, (p0 + p) * BLOCK, bp.get().add(p * panel)) });
                    bp.get() as *const u16
                }
                // the block's panels, as the per-block packing would have written them
                BSource::Packed(all) => all[p0 * panel..].as_ptr(),
            };
            let block_b = SendPtr(block_b.cast_mut());
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
                    let blocks = Blocks { steps, panel, a: ap, b: block_b.get(), c: cp.get(), ldc, m, n, p0 };
                    // SAFETY: the engine runs here (bgemm_on checked `runs`); the task's rows
                    // and panels are its own (disjoint from every other task's).
                    unsafe {
                        match engine {
                            Engine::Amx => blocks.run(&Tiles::configure(), (rb0, rb1), (q0, q1)),
                            Engine::Dot => blocks.run(&Dot::assume_ready(), (rb0, rb1), (q0, q1)),
                        }
                    }
                });
            });
        }
    });
}

/// One task's view of the packed operands and of C.
struct Blocks {
    /// k steps (of 32) in all.
    steps: usize,
    /// u16 elements of one packed 32-row A block or 32-column B panel.
    panel: usize,
    /// The task's packed A blocks (its first row block first).
    a: *const u16,
    /// The column block's packed B panels (its first panel first).
    b: *const u16,
    /// C, row-major at stride `ldc`.
    c: *mut f32,
    ldc: usize,
    m: usize,
    n: usize,
    /// The column block's first panel.
    p0: usize,
}

impl Blocks {
    /// The micro-kernel over row blocks `rb0..rb1` (packed from `a`) and the column block's
    /// panels `q0..q1`, k block by k block.
    ///
    /// # Safety
    /// `kern` may run here; `a` holds the packed row blocks `rb0..rb1`, `b` the packed
    /// panels through `q1`, all k steps; no other thread writes these blocks of C, which is
    /// writable inside `m x n`.
    unsafe fn run<K: Micro>(&self, kern: &K, (rb0, rb1): (usize, usize), (q0, q1): (usize, usize)) {
        for s0 in (0..self.steps).step_by(KC_STEPS) {
            let run = KC_STEPS.min(self.steps - s0);
            let off = s0 * 2 * TILE;
            for q in q0..q1 {
                let j0 = (self.p0 + q) * BLOCK;
                for rb in rb0..rb1 {
                    let i0 = rb * BLOCK;
                    // SAFETY: the packed panels hold all k steps; this task alone writes
                    // the C block (i0, j0), inside m x n of C at stride ldc; blocks after the
                    // first k block read what the earlier ones wrote.
                    unsafe {
                        let ab = self.a.add((rb - rb0) * self.panel + off);
                        let bb = self.b.add(q * self.panel + off);
                        block(kern, run, ab, bb, self.c, self.ldc, (i0, j0), (self.m, self.n), s0 > 0);
                    }
                }
            }
        }
    }
}

/// `steps` k steps of one 32 x 32 block of C at `(i0, j0)` (`C =`, or `C +=` when
/// `accumulate`): straight in C when the block lies inside `m x n`, else through a scratch
/// block of which only the part inside is read and written.
///
/// # Safety
/// As [`Micro::kernel`] for `a` and `b`; `c` is writable (and, when `accumulate`, already
/// written) at every `(i, j)` inside `m x n` (row stride `ldc`), and no other thread writes
/// the block.
#[allow(clippy::too_many_arguments)]
unsafe fn block<K: Micro>(
    kern: &K,
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
            kern.kernel(steps, a, b, c.add(i0 * ldc + j0), ldc * 4, accumulate);
        } else {
            let mut s = Scratch([0.0; BLOCK * BLOCK]);
            let (rows, cols) = ((m - i0).min(BLOCK), (n - j0).min(BLOCK));
            if accumulate {
                for r in 0..rows {
                    std::ptr::copy_nonoverlapping(c.add((i0 + r) * ldc + j0), s.0.as_mut_ptr().add(r * BLOCK), cols);
                }
            }
            kern.kernel(steps, a, b, s.0.as_mut_ptr(), BLOCK * 4, accumulate);
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(s.0.as_ptr().add(r * BLOCK), c.add((i0 + r) * ldc + j0), cols);
            }
        }
    }
}
