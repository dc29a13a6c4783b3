//! Blocking loops and rayon parallelisation for the packed (large-problem) path.
//!
//! Loop nest (per call):
//! ```text
//! for ic in M blocks of MC rows:             (packed A block, L3 resident)
//!   for pc in K blocks of <= KC (equal sizes):
//!     pack A[ic.., pc..] cooperatively        (fork-join #1, dynamic chunks of 8 panels)
//!     tasks = (M chunk) x (N block of <= NC columns; #blocks a multiple of the thread count),
//!     handed out dynamically to <= `threads` workers:   (fork-join #2)
//!       pack B[pc.., block] into a per-thread buffer    (KC x NC, L2 resident)
//!       for each MR panel of A in the M chunk:
//!         for each NR panel of the B block:             (B streams from L2)
//!           prefetch next C tile to L2; micro-kernel
//! ```
//! The first K block writes C (`C = ...`) unless `accumulate`; later K blocks add to it.
//! M is only split (and B then packed once per M chunk) when N has too few panels.

use super::buffer::{with_buf, Slot};
use super::kernel_avx512::{kernel, TileDst, MR, NR};
use super::pack::{pack_a_panel, pack_b_block};
use super::MatRef;
use rayon::prelude::*;
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Target depth of a K block (rounded so that all K blocks have similar size).
pub(crate) const KC: usize = 512;
/// Maximum width of a per-task packed B block (`KC * NC * 4` bytes = 768 KiB, ~40% of L2).
pub(crate) const NC: usize = 384;
/// Height of the shared packed A block (multiple of MR).
pub(crate) const MC: usize = MR * 192;

/// Raw pointer wrapper that may be shared across rayon tasks.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: the driver guarantees that concurrent tasks only write disjoint regions through these
// pointers and only read regions that are not written concurrently.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: see above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The raw pointer (a method, so closures capture the whole `Send` wrapper).
    #[inline(always)]
    fn get(self) -> *mut T {
        self.0
    }
}

/// Strided operand description with a raw base pointer.
#[derive(Clone, Copy)]
struct Op {
    ptr: SendPtr<f32>,
    rs: usize,
    cs: usize,
}

/// Runs `f(t)` for `t in 0..ntasks`, in parallel on the current rayon pool when `ntasks > 1`.
fn par_for(ntasks: usize, f: impl Fn(usize) + Sync + Send) {
    if ntasks <= 1 {
        f(0);
    } else {
        (0..ntasks).into_par_iter().with_max_len(1).for_each(f);
    }
}

/// Splits `len` items into `parts` contiguous near-equal ranges; returns range `i`.
fn split(len: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = len / parts;
    let rem = len % parts;
    let start = i * base + i.min(rem);
    (start, start + base + usize::from(i < rem))
}

/// Packed GEMM entry point: `C = A*B` or `C += A*B`, C row-major with leading dimension `ldc`.
/// Requires AVX-512F (checked by the caller), `m, n, k >= 1` and validated slice bounds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    let nt = threads.min(rayon::current_num_threads()).max(1);
    let a_op = Op { ptr: SendPtr(a.data.as_ptr() as *mut f32), rs: a.rs, cs: a.cs };
    let b_op = Op { ptr: SendPtr(b.data.as_ptr() as *mut f32), rs: b.rs, cs: b.cs };
    let c_op = Op { ptr: SendPtr(c.as_mut_ptr()), rs: ldc, cs: 1 };
    // Narrow N and tall M: compute C^T = B^T A^T so that the vector dimension is the long one.
    if n < NR && m >= 2 * NR {
        let at = Op { ptr: b_op.ptr, rs: b.cs, cs: b.rs };
        let bt = Op { ptr: a_op.ptr, rs: a.cs, cs: a.rs };
        let ct = Op { ptr: c_op.ptr, rs: 1, cs: ldc };
        gemm_strided(n, m, k, at, bt, ct, accumulate, nt);
    } else {
        gemm_strided(m, n, k, a_op, b_op, c_op, accumulate, nt);
    }
}

/// Runs `f(task)` for every `task in 0..ntasks` on at most `nt` rayon workers, handing tasks
/// out dynamically (an atomic counter) so a slowed-down core does not stall the others.
fn par_dyn(nt: usize, ntasks: usize, f: impl Fn(usize) + Sync + Send) {
    let workers = nt.min(ntasks);
    if workers <= 1 {
        (0..ntasks).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    par_for(workers, |_| loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= ntasks {
            break;
        }
        f(t);
    });
}

/// Core blocked GEMM on raw strided operands (C may have any strides).
#[allow(clippy::too_many_arguments)]
fn gemm_strided(m: usize, n: usize, k: usize, a: Op, b: Op, c: Op, accumulate: bool, nt: usize) {
    let np = n.div_ceil(NR);
    let kblocks = k.div_ceil(KC);
    let kc_max = k.div_ceil(kblocks);
    let mc_max = m.min(MC);
    // N blocks: at most NC wide, a multiple of the thread count (balanced split of panels).
    let ncp_max = (NC / NR).max(1);
    let nblocks = if nt > 1 { nt * np.div_ceil(nt * ncp_max) } else { np.div_ceil(ncp_max) }.min(np);
    with_buf(Slot::A, |abuf| {
        let apack = SendPtr(abuf.reserve(mc_max.div_ceil(MR) * MR * kc_max));
        let mut ic = 0;
        while ic < m {
            let mb = (m - ic).min(MC);
            let mp = mb.div_ceil(MR);
            // Too few N blocks to keep every thread busy: also split M.
            let mchunks = if nblocks >= 2 * nt { 1 } else { (2 * nt).div_ceil(nblocks).min(mp) };
            let mut pc = 0;
            for kb in 0..kblocks {
                let kc = (k - pc).min(kc_max);
                let load_c = accumulate || kb > 0;
                // 1) Pack the A block cooperatively (chunks of APANELS micro-panels).
                const APANELS: usize = 8;
                let a_threads = if mp * kc >= 32 * 1024 { nt } else { 1 };
                par_dyn(a_threads, mp.div_ceil(APANELS), |t| {
                    for ip in t * APANELS..((t + 1) * APANELS).min(mp) {
                        let r0 = ic + ip * MR;
                        let rows = (m - r0).min(MR);
                        // SAFETY: A(r0.., pc..) with rows x kc elements is in bounds (validated
                        // by the caller); the destination panel ip lies inside the A buffer and
                        // panels are disjoint between tasks.
                        unsafe {
                            pack_a_panel(
                                kc,
                                rows,
                                a.ptr.get().add(r0 * a.rs + pc * a.cs),
                                a.rs,
                                a.cs,
                                apack.get().add(ip * MR * kc),
                            );
                        }
                    }
                });
                // 2) Compute: tasks are (M chunk, N block) pairs.
                par_dyn(nt, mchunks * nblocks, |t| {
                    let (mi, nb) = (t / nblocks, t % nblocks);
                    let (pm0, pm1) = split(mp, mchunks, mi);
                    let (pn0, pn1) = split(np, nblocks, nb);
                    // SAFETY: tasks write disjoint C tiles (disjoint M or N panel ranges);
                    // A buffer is only read here.
                    unsafe { compute_task((pm0, pm1), (pn0, pn1), (ic, pc, kc), (m, n), apack.get(), b, c, load_c) };
                });
                pc += kc;
            }
            ic += mb;
        }
    });
}

/// One task: packs the B block for N panels `pn0..pn1` and multiplies it with A panels
/// `pm0..pm1`.
///
/// # Safety
/// Panel ranges must be in bounds; no other task may write the same C tiles concurrently;
/// the packed A block must hold panels `pm0..pm1` for depth `kc`.
#[allow(clippy::too_many_arguments)]
unsafe fn compute_task(
    (pm0, pm1): (usize, usize),
    (pn0, pn1): (usize, usize),
    (ic, pc, kc): (usize, usize, usize),
    (m, n): (usize, usize),
    apack: *mut f32,
    b: Op,
    c: Op,
    load_c: bool,
) {
    with_buf(Slot::B, |bbuf| {
        let bpack = bbuf.reserve((pn1 - pn0) * NR * kc);
        let j0 = pn0 * NR;
        // SAFETY: B(pc.., j0..) kc x cols is in bounds; the buffer holds (pn1 - pn0) panels.
        unsafe {
            pack_b_block(kc, (n - j0).min((pn1 - pn0) * NR), b.ptr.get().add(pc * b.rs + j0 * b.cs), b.rs, b.cs, bpack);
        }
        for ip in pm0..pm1 {
            let i0 = ic + ip * MR;
            let mr = (m - i0).min(MR);
            // SAFETY: panel ip is inside the packed A block.
            let ap = unsafe { apack.add(ip * MR * kc) };
            for jp in pn0..pn1 {
                let j0 = jp * NR;
                let nr = (n - j0).min(NR);
                let dst = TileDst {
                    // SAFETY: (i0, j0) is inside C.
                    c: unsafe { c.ptr.get().add(i0 * c.rs + j0 * c.cs) },
                    rsc: c.rs,
                    csc: c.cs,
                    mr,
                    nr,
                    load_c,
                };
                // Prefetch the next tile of C into L2 while this kernel runs.
                let (ni, nj) = if jp + 1 < pn1 { (i0, j0 + NR) } else { (i0 + MR, pn0 * NR) };
                if ni < m && c.cs == 1 {
                    prefetch_tile_l2(c.ptr.get().wrapping_add(ni * c.rs + nj), c.rs, MR.min(m - ni));
                }
                // SAFETY: packed panels hold kc steps; tile is owned by this task; the
                // caller verified AVX-512F.
                unsafe { kernel(kc, ap, bpack.add((jp - pn0) * NR * kc), dst) };
            }
        }
    });
}

/// Prefetches `rows` rows of an `NR`-wide C tile (row stride `rs`) into L2.
fn prefetch_tile_l2(c: *const f32, rs: usize, rows: usize) {
    for r in 0..rows {
        let p = c.wrapping_add(r * rs) as *const i8;
        for l in 0..NR / 16 {
            // SAFETY: prefetch is only a hint and never faults; wrapping arithmetic has no UB.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l)) };
        }
    }
}
