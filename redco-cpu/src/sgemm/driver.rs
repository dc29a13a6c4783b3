//! Blocking loops and rayon parallelisation for the packed (large-problem) path.
//!
//! Generic over the micro-kernel [`Family`] (its tile `MR x NR` and its blocking `KC`, `NC`).
//!
//! Loop nest (per call):
//! ```text
//! for ic in M blocks of MC rows (A for all of K is packed once per M block, L3 resident):
//!   one fork: tasks = (M chunk) x (N block of <= NC columns), equal sized, owned round-robin
//!   by <= `threads` workers; each worker runs, for every K block pc (equal sizes <= KC),
//!   each of its tasks:
//!     pack B[pc.., block] into a per-thread buffer         (KC x NC, L2 resident)
//!     for each MR panel of A in the M chunk (workers start at staggered panels):
//!       claim-and-pack the A panel if nobody has yet, else wait until it is ready
//!       for each NR panel of the B block:                   (A panel in L1, B from L2)
//!         micro-kernel (it prefetches its A and B streams into L1, a slice of the next A
//!         panel -- or of its unpacked rows, if this task will pack it -- into L2, and, near
//!         its end, its C tile)
//! ```
//! A panels are packed on demand by whichever task needs them first (an atomic state per
//! panel), so packing overlaps with compute, the packer uses the panel while it is hot, and
//! there is a single fork-join per M block (no barrier per K block).
//! A task waits only for a panel that another *running* task is packing (packing never
//! blocks), so this cannot deadlock even if rayon runs the workers one after another.
//! The first K block writes C (`C = ...`) unless `accumulate`; later K blocks add to it.
//! M is only split (and B then packed once per M chunk) when N has fewer panels than threads.

use super::buffer::{with_buf, Slot};
use super::microkernel::{Family, Prefetch, TileDst};
use super::source::Source;
use super::MatRef;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU8, Ordering};

/// Upper bound on the packed A buffer (f32 elements, 32 MiB): bounds the M block height.
const A_BUF_MAX: usize = 8 << 20;

/// Raw pointer wrapper that may be shared across rayon tasks.
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: the driver guarantees that concurrent tasks only write disjoint regions through these
// pointers and only read regions that are not written concurrently.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: see above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The raw pointer (a method, so closures capture the whole `Send` wrapper).
    #[inline(always)]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Strided operand description with a raw base pointer (elements f32 or 16-bit).
struct Op<E> {
    ptr: SendPtr<E>,
    rs: usize,
    cs: usize,
}

// Copy whatever `E` is (a derive would ask `E: Copy` of the pointer's target).
impl<E> Clone for Op<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Op<E> {}

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}

/// Where the tasks narrow their finished rows of C into a 16-bit result (see `sink`): the
/// output's base and row stride (elements), its element size and the narrowing function.
#[derive(Clone, Copy)]
pub(crate) struct Epilogue {
    /// The first element of the output.
    pub(crate) out: SendPtr<u8>,
    /// Row stride of the output, in elements.
    pub(crate) ld: usize,
    /// Bytes per output element.
    pub(crate) elem: usize,
    /// Narrows `n` f32s into `n` output elements (`sink::narrow_raw`).
    pub(crate) narrow: unsafe fn(*const f32, *mut u8, usize),
}

/// Splits `len` items into `parts` contiguous near-equal ranges; returns range `i`.
pub(crate) fn split(len: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = len / parts;
    let rem = len % parts;
    let start = i * base + i.min(rem);
    (start, start + base + usize::from(i < rem))
}

/// Packed GEMM entry point: `C = A*B` or `C += A*B`, C row-major with leading dimension `ldc`.
/// A and B are f32 or 16-bit floats (widened while packing); C is f32. With `epi`, each task
/// also narrows its rows of C into the epilogue's output as it finishes them (C at the
/// output's shape); returns whether it did (not when it computes `C^T` instead).
/// Requires the CPU features of `K` (checked by the caller), `m, n, k >= 1` and validated slice bounds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<K: Family, E: Source>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<E>,
    b: MatRef<E>,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
    epi: Option<Epilogue>,
) -> bool {
    let nt = threads.min(rayon::current_num_threads()).max(1);
    let a_op = Op { ptr: SendPtr(a.data.as_ptr() as *mut E), rs: a.rs, cs: a.cs };
    let b_op = Op { ptr: SendPtr(b.data.as_ptr() as *mut E), rs: b.rs, cs: b.cs };
    let c_op = Op { ptr: SendPtr(c), rs: ldc, cs: 1 };
    // Narrow N and tall M: compute C^T = B^T A^T so that the vector dimension is the long one.
    if n < K::NR && m >= 2 * K::NR {
        let at = Op { ptr: b_op.ptr, rs: b.cs, cs: b.rs };
        let bt = Op { ptr: a_op.ptr, rs: a.cs, cs: a.rs };
        let ct = Op { ptr: c_op.ptr, rs: 1, cs: ldc };
        gemm_strided::<K, E>(n, m, k, at, bt, ct, accumulate, nt, None, None);
        false
    } else {
        gemm_strided::<K, E>(m, n, k, a_op, b_op, c_op, accumulate, nt, epi, None);
        epi.is_some()
    }
}

/// `C = A*B` (C row-major `m x n`, leading dimension `ldc`) with B already packed for `K`
/// (`packed`, laid out as [`super::prepacked`] describes, for this `k` and `n`): the
/// blocked path without its B packing.
///
/// # Safety
/// `packed` holds B packed by family `K` for exactly this `k` and `n`; `a` and `c` cover
/// the problem; the CPU runs `K`; `m, n, k >= 1`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_packed_b<K: Family>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<f32>,
    packed: *const f32,
    c: *mut f32,
    ldc: usize,
    threads: usize,
) {
    let nt = threads.min(rayon::current_num_threads()).max(1);
    let a_op = Op { ptr: SendPtr(a.data.as_ptr() as *mut f32), rs: a.rs, cs: a.cs };
    // B's strides are never read on this path (its panels are packed already)
    let b_op = Op { ptr: SendPtr(packed as *mut f32), rs: 0, cs: 0 };
    let c_op = Op { ptr: SendPtr(c), rs: ldc, cs: 1 };
    gemm_strided::<K, f32>(m, n, k, a_op, b_op, c_op, false, nt, None, Some(SendPtr(packed as *mut f32)));
}

/// Runs `f(i)` for `i in 0..n`, in parallel on the current rayon pool when `n > 1`.
pub(crate) fn par_for(n: usize, f: impl Fn(usize) + Sync + Send) {
    if n <= 1 {
        (0..n).for_each(f);
    } else {
        (0..n).into_par_iter().with_max_len(1).for_each(f);
    }
}

/// Panel state: not packed yet.
const EMPTY: u8 = 0;
/// Panel state: a running task is packing it.
const BUSY: u8 = 1;
/// Panel state: packed and readable.
const READY: u8 = 2;

/// Geometry shared by all tasks of one M block.
#[derive(Clone, Copy)]
struct Block {
    /// First row of the M block.
    ic: usize,
    /// A panels in the M block.
    mp: usize,
    /// Depth of every K block except possibly the last (also the A panel stride unit).
    kc_max: usize,
    /// Full problem shape (m, n, k).
    shape: (usize, usize, usize),
}

/// Core blocked GEMM on raw strided operands (C may have any strides).
#[allow(clippy::too_many_arguments)]
fn gemm_strided<K: Family, E: Source>(
    m: usize,
    n: usize,
    k: usize,
    a: Op<E>,
    b: Op<E>,
    c: Op<f32>,
    accumulate: bool,
    nt: usize,
    epi: Option<Epilogue>,
    bpre: Option<SendPtr<f32>>,
) {
    let np = n.div_ceil(K::NR);
    let kblocks = k.div_ceil(K::KC);
    let kc_max = k.div_ceil(kblocks);
    // M block height: the whole packed A (all K blocks) of an M block stays in the buffer.
    let mc = ((A_BUF_MAX / (kc_max * kblocks)).max(K::MR) / K::MR) * K::MR;
    let mc_max = m.min(mc);
    // N blocks: at most K::NC wide, a multiple of the thread count (balanced split of panels).
    let ncp_max = (K::NC / K::NR).max(1);
    let nblocks = if nt > 1 { nt * np.div_ceil(nt * ncp_max) } else { np.div_ceil(ncp_max) }.min(np);
    with_buf(Slot::A, |abuf| {
        let mp_max = mc_max.div_ceil(K::MR);
        let apack = SendPtr(abuf.reserve(mp_max * K::MR * kc_max * kblocks));
        let flags: Vec<AtomicU8> = (0..mp_max * kblocks).map(|_| AtomicU8::new(EMPTY)).collect();
        let mut ic = 0;
        while ic < m {
            let mb = (m - ic).min(mc);
            let mp = mb.div_ceil(K::MR);
            if ic > 0 {
                flags.iter().for_each(|f| f.store(EMPTY, Ordering::Relaxed));
            }
            // Fewer N blocks than threads: also split M.
            let mchunks = if nblocks >= nt { 1 } else { nt.div_ceil(nblocks).min(mp) };
            let blk = Block { ic, mp, kc_max, shape: (m, n, k) };
            let flags = &flags;
            let ntasks = mchunks * nblocks;
            let workers = nt.min(ntasks);
            let task = |t: usize, kb: usize| {
                let (mi, nb) = (t / nblocks, t % nblocks);
                let pm = split(mp, mchunks, mi);
                let pn = split(np, nblocks, nb);
                // Stagger the starting A panel by worker, so that the workers' first tasks of a
                // K block pack equal shares of its panels (later tasks find them packed).
                let start = (pm.1 - pm.0) * (t % workers) / workers;
                // SAFETY: tasks write disjoint C tiles (disjoint M or N panel ranges) and each
                // task's K blocks run in order on one worker; A panels are written once, by the
                // task that claims them, before being published.
                unsafe { compute_task::<K, E>(pm, pn, kb, start, blk, apack, flags, a, b, c, accumulate, epi, bpre) };
            };
            // Static round-robin ownership of tasks (equal-sized, so balanced); K blocks
            // outermost on each worker so the packed A of one K block is the working set shared
            // by all concurrent tasks, and each task's K blocks run in order on one worker.
            par_for(workers, |w| {
                for kb in 0..kblocks {
                    for t in (w..ntasks).step_by(workers) {
                        task(t, kb);
                    }
                }
            });
            ic += mb;
        }
    });
}

/// Makes A panel `ip` of K block `kb` available: packs it if no task has claimed it yet,
/// otherwise waits until the claiming task has published it. Returns its address.
///
/// # Safety
/// `apack` must hold `kblocks * mp` panels of `K::MR * kc_max` floats; `a` must cover the block.
#[allow(clippy::too_many_arguments)]
unsafe fn ensure_a<K: Family, E: Source>(
    ip: usize,
    kb: usize,
    kc: usize,
    blk: &Block,
    apack: SendPtr<f32>,
    flags: &[AtomicU8],
    a: Op<E>,
) -> *const f32 {
    let (m, _, _) = blk.shape;
    // SAFETY: panel (kb, ip) is inside the A buffer (caller contract).
    let dst = unsafe { apack.get().add((kb * blk.mp + ip) * K::MR * blk.kc_max) };
    let f = &flags[kb * blk.mp + ip];
    if f.load(Ordering::Acquire) != READY {
        if f.compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Acquire).is_ok() {
            let r0 = blk.ic + ip * K::MR;
            let pc = kb * blk.kc_max;
            // SAFETY: A(r0.., pc..) with rows x kc elements is in bounds (validated by the
            // caller); only this task writes the claimed panel, nobody reads it before READY.
            unsafe {
                K::pack_a(kc, (m - r0).min(K::MR), a.ptr.get().add(r0 * a.rs + pc * a.cs), a.rs, a.cs, dst);
            }
            f.store(READY, Ordering::Release);
        } else {
            // The claiming task is running and packing never blocks, so this terminates.
            while f.load(Ordering::Acquire) != READY {
                std::hint::spin_loop();
            }
        }
    }
    dst
}

/// Where the kernel should prefetch the unpacked source of A panel `ipn` of K block `kb`
/// (first row, first column of the block) and how many rows: none unless A is row-major, the
/// task has another panel and nobody has claimed that one yet.
fn next_source<K: Family, E: Source>(
    ipn: usize,
    kb: usize,
    blk: &Block,
    flags: &[AtomicU8],
    a: Op<E>,
    len: usize,
) -> (*const E, usize) {
    let (m, _, _) = blk.shape;
    let r0 = blk.ic + ipn * K::MR;
    let src = a.ptr.get().wrapping_add(r0 * a.rs + kb * blk.kc_max) as *const E;
    let claimable = flags[kb * blk.mp + ipn].load(Ordering::Relaxed) == EMPTY;
    (src, if a.cs == 1 && len > 1 && claimable { (m - r0).min(K::MR) } else { 0 })
}

/// One task for K block `kb`: packs the B block for N panels `pn0..pn1` (or finds it in
/// `bpre`, B packed whole beforehand) and multiplies it with A panels `pm0..pm1` (visited
/// cyclically from `pm0 + start`); in the last K block, narrows each A panel's finished rows
/// into `epi`'s output.
///
/// # Safety
/// Panel ranges must be in bounds; no other task may write the same C tiles concurrently;
/// `apack`/`flags` must describe the M block `blk` (see [`ensure_a`]); `epi`'s output has
/// C's shape and row-major C (`c.cs == 1`).
#[allow(clippy::too_many_arguments)]
unsafe fn compute_task<K: Family, E: Source>(
    (pm0, pm1): (usize, usize),
    (pn0, pn1): (usize, usize),
    kb: usize,
    start: usize,
    blk: Block,
    apack: SendPtr<f32>,
    flags: &[AtomicU8],
    a: Op<E>,
    b: Op<E>,
    c: Op<f32>,
    accumulate: bool,
    epi: Option<Epilogue>,
    bpre: Option<SendPtr<f32>>,
) {
    let (m, n, k) = blk.shape;
    let len = pm1 - pm0;
    let np = n.div_ceil(K::NR);
    with_buf(Slot::B, |bbuf| {
        let j0 = pn0 * K::NR;
        {
            let pc = kb * blk.kc_max;
            let kc = (k - pc).min(blk.kc_max);
            let load_c = accumulate || kb > 0;
            let bpack = match bpre {
                // SAFETY: the packed B holds K block kb's np panels from kb * np * NR *
                // kc_max, panel pn0 at pn0 * NR * kc from there (see `prepacked`)
                Some(p) => unsafe { p.get().add(kb * np * K::NR * blk.kc_max + pn0 * K::NR * kc) },
                None => {
                    let bpack = bbuf.reserve((pn1 - pn0) * K::NR * blk.kc_max);
                    // SAFETY: B(pc.., j0..) kc x cols is in bounds; the buffer holds (pn1 - pn0) panels.
                    unsafe {
                        K::pack_b(
                            kc,
                            (n - j0).min((pn1 - pn0) * K::NR),
                            b.ptr.get().add(pc * b.rs + j0 * b.cs),
                            b.rs,
                            b.cs,
                            bpack,
                        );
                    }
                    bpack
                }
            };
            // The kernel prefetches the task's next A panel into L2, a slice per B panel,
            // unless the A of a K block stays in L2 anyway (then it walks the current panel).
            let prefetch_next = len * K::MR * kc * 4 > K::L2_A_BYTES;
            let slice = K::MR * kc / (pn1 - pn0);
            for idx in 0..len {
                let ip = pm0 + (start + idx) % len;
                // SAFETY: panel (kb, ip) is inside the M block.
                let ap = unsafe { ensure_a::<K, E>(ip, kb, kc, &blk, apack, flags, a) };
                // The next panel may not be packed yet; prefetching it is still harmless.
                let next_panel = if prefetch_next {
                    let ipn = pm0 + (start + idx + 1) % len;
                    apack.get().wrapping_add((kb * blk.mp + ipn) * K::MR * blk.kc_max) as *const f32
                } else {
                    ap
                };
                let i0 = blk.ic + ip * K::MR;
                let mr = (m - i0).min(K::MR);
                // If nobody has claimed the next panel yet, this task will probably pack it:
                // its calls on this panel bring the unpacked source rows into L2 (two lines
                // of each row per call, which covers the K block when it has >= kc / 32 B panels).
                let (src, src_rows) = next_source::<K, E>(pm0 + (start + idx + 1) % len, kb, &blk, flags, a, len);
                for jp in pn0..pn1 {
                    let j0 = jp * K::NR;
                    let dst = TileDst {
                        // SAFETY: (i0, j0) is inside C.
                        c: unsafe { c.ptr.get().add(i0 * c.rs + j0 * c.cs) },
                        rsc: c.rs,
                        csc: c.cs,
                        mr,
                        nr: (n - j0).min(K::NR),
                        load_c,
                    };
                    // Two 64-byte lines per row and call, whatever the element size; the kernel
                    // steps through the rows in f32 units, so a 16-bit row stride is halved
                    // (rounded down: these are hints, the line need not be exact).
                    let off = (jp - pn0) * 128 / size_of::<E>();
                    let pf = Prefetch {
                        next: if prefetch_next { next_panel.wrapping_add((jp - pn0) * slice) } else { ap },
                        src: src.wrapping_add(off) as *const f32,
                        src_stride: a.rs * size_of::<E>() / 4,
                        src_rows: if off < kc { src_rows } else { 0 },
                    };
                    // SAFETY: packed panels hold kc steps; tile is owned by this task; the
                    // caller verified the CPU features of K; `pf` addresses are only prefetched.
                    unsafe {
                        let bp = bpack.add((jp - pn0) * K::NR * kc);
                        if mr == K::MR || !K::kernel_short(kc, ap, bp, dst) {
                            K::kernel(kc, ap, bp, dst, pf)
                        }
                    };
                }
                if let Some(e) = epi.filter(|_| pc + kc == k) {
                    // The panel's rows of this task's columns are final: narrow them while
                    // they are in cache.
                    let cols = (n - j0).min((pn1 - pn0) * K::NR);
                    for i in i0..i0 + mr {
                        // SAFETY: row i, columns j0..j0 + cols are inside C and the output
                        // (same shape); only this task writes them.
                        unsafe {
                            (e.narrow)(c.ptr.get().add(i * c.rs + j0), e.out.get().add((i * e.ld + j0) * e.elem), cols)
                        };
                    }
                }
            }
        }
    });
}
