//! 64-byte aligned, reusable scratch buffers for packed panels.

use std::cell::Cell;

/// One cache line worth of f32s; used only to get 64-byte alignment from `Vec`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable, 64-byte aligned f32 buffer (contents are unspecified after growth).
#[derive(Default)]
pub(crate) struct AlignedBuf {
    lines: Vec<Line>,
}

impl AlignedBuf {
    /// Ensures room for `len` f32s and returns a pointer to the (64-byte aligned) start.
    pub(crate) fn reserve(&mut self, len: usize) -> *mut f32 {
        let need = len.div_ceil(16).max(1);
        if self.lines.len() < need {
            self.lines = Vec::with_capacity(need);
            crate::malloc::advise_huge_pages(self.lines.as_ptr() as *const u8, need * 64);
            self.lines.resize(need, Line([0.0; 16]));
        }
        self.lines.as_mut_ptr() as *mut f32
    }
}

thread_local! {
    static POOL_A: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
    static POOL_B: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
    static POOL_HALF_A: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
    static POOL_HALF_B: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
    static POOL_C: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
}

/// Which thread-local slot a buffer is cached in.
#[derive(Clone, Copy)]
pub(crate) enum Slot {
    /// Shared packed-A block (owned by the calling thread).
    A,
    /// Per-task packed-B block.
    B,
    /// Per-task packed A rows of the bf16 GEMM (`cpu::bgemm`).
    HalfA,
    /// Shared packed B block of the bf16 GEMM.
    HalfB,
    /// The f32 result of a GEMM with a 16-bit output, narrowed from it (the calling thread).
    C,
}

/// Runs `f` with a thread-local cached buffer. The buffer is *taken out* of the slot for the
/// duration of `f`, so re-entrant use (e.g. rayon work-stealing running another GEMM on this
/// thread while we wait in a join) simply allocates a fresh buffer instead of aliasing.
pub(crate) fn with_buf<R>(slot: Slot, f: impl FnOnce(&mut AlignedBuf) -> R) -> R {
    let key = match slot {
        Slot::A => &POOL_A,
        Slot::B => &POOL_B,
        Slot::HalfA => &POOL_HALF_A,
        Slot::HalfB => &POOL_HALF_B,
        Slot::C => &POOL_C,
    };
    let mut buf = key.with(|c| c.take()).unwrap_or_default();
    let r = f(&mut buf);
    key.with(|c| c.set(Some(buf)));
    r
}
