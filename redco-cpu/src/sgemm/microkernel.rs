//! What a register-blocked micro-kernel computes and how the driver calls it: the tile's
//! destination, the prefetches the driver asks for, and `Family`, the kernel and packing
//! routines of one instruction set that the blocked driver is generic over.

use super::source::Source;

/// The L2 prefetches a kernel call runs for the driver, on top of its own L1 prefetches.
///
/// Both are hints: the addresses are never dereferenced, so they may point anywhere.
#[derive(Clone, Copy)]
pub struct Prefetch {
    /// Walked 8 bytes per iteration (a new line every 8): a slice of the packed A panel that
    /// the task multiplies next.
    pub next: *const f32,
    /// First of two lines, in the first of `src_rows` rows, of the *unpacked* A that the task
    /// is about to pack: one row every `SRC_GAP` iterations, two lines each.
    pub src: *const f32,
    /// Distance between those rows, in elements.
    pub src_stride: usize,
    /// Rows to prefetch from `src` (0: none).
    pub src_rows: usize,
}

/// Where and how the micro-kernel writes its tile.
#[derive(Clone, Copy)]
pub struct TileDst {
    /// Top-left element of the destination tile.
    pub c: *mut f32,
    /// Row stride of C.
    pub rsc: usize,
    /// Column stride of C.
    pub csc: usize,
    /// Valid rows (`1..=MR`).
    pub mr: usize,
    /// Valid columns (`1..=NR`).
    pub nr: usize,
    /// `true`: C += tile, `false`: C = tile.
    pub load_c: bool,
}

/// One instruction set's micro-kernel, its packing routines and the blocking the driver uses
/// with it (chosen for the cache hierarchy of the machines that have that instruction set).
///
/// # Safety
/// Implementors' functions require the CPU features of their family; the driver calls them
/// only after [`super::Isa::detect`] (or a test) has checked those.
pub(crate) trait Family {
    /// Rows of the micro-tile (broadcast from packed A).
    const MR: usize;
    /// Columns of the micro-tile (vectors of packed B).
    const NR: usize;
    /// Target depth of a K block (rounded so that all K blocks have similar size).
    const KC: usize;
    /// Maximum width of a per-task packed B block (`KC * NC * 4` bytes stay in L2).
    const NC: usize;
    /// Up to this many bytes of packed A per K block and task, A mostly stays in L2 next to
    /// its B block and the kernel does not prefetch the next A panel.
    const L2_A_BYTES: usize;

    /// The `MR x NR` micro-kernel: `kc` steps of a packed A panel (`MR` floats each) and a
    /// packed B panel (`NR` floats each, 64-byte aligned) into the tile `dst`.
    ///
    /// # Safety
    /// As the family's kernel documents: CPU features, `kc * MR` / `kc * NR` readable floats,
    /// `dst` a writable region with no other live references.
    unsafe fn kernel(kc: usize, a: *const f32, b: *const f32, dst: TileDst, pf: Prefetch);

    /// A short last panel's tile (`dst.mr < MR` valid rows) with fewer accumulator rows
    /// than [`Family::kernel`], bit for bit its result for those rows; returns false, with
    /// nothing done, where the family has no such kernel for `dst.mr` rows (the default).
    ///
    /// # Safety
    /// As [`Family::kernel`].
    unsafe fn kernel_short(kc: usize, a: *const f32, b: *const f32, dst: TileDst) -> bool {
        let _ = (kc, a, b, dst);
        false
    }

    /// Packs one `MR x kc` panel of A (`rows <= MR` valid rows, the rest zero) from `src`
    /// (A(i0, p0), strides `rs`, `cs`; f32 or 16-bit, widened) into `dst`.
    ///
    /// # Safety
    /// Every addressed source element readable, `dst` writable for `kc * MR` floats.
    unsafe fn pack_a<E: Source>(kc: usize, rows: usize, src: *const E, rs: usize, cs: usize, dst: *mut f32);

    /// Packs a `kc x cols` block of B (f32 or 16-bit, widened) into `cols.div_ceil(NR)`
    /// consecutive `kc x NR` panels (the last zero-padded).
    ///
    /// # Safety
    /// Every addressed source element readable, `dst` writable for the panels and 64-byte
    /// aligned.
    unsafe fn pack_b<E: Source>(kc: usize, cols: usize, src: *const E, rs: usize, cs: usize, dst: *mut f32);
}
