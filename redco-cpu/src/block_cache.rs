//! [`LargeBlocks`]: a global allocator that keeps large freed blocks and hands them out
//! again, so a training step stops faulting its biggest buffers in afresh.
//!
//! glibc serves every allocation of 32 MiB or more (the largest mmap threshold it allows,
//! see [`super::malloc`]) with its own `mmap` and gives it back with `munmap` when it is
//! freed. At real model sizes those are the logits and their gradient (batch x seq x vocab),
//! the embedding and head gradients, the bf16 copies of the f32 master weights: on the 134M
//! LLaMA in bf16 (`bench llm --preset llama-134m --dtype bf16`), measured with `perf`, 35%
//! of a training step went to the kernel clearing and mapping those pages again each step
//! (and to the TLB shootdowns of copy-on-write faults on calloc'd buffers read before they
//! are written).
//!
//! `LargeBlocks` forwards small requests to the system allocator; large ones get an
//! anonymous mapping of their own, and a freed one is kept (up to a byte limit and a
//! number of blocks). A later request takes the kept block of the nearest size and fits it
//! with `mremap`: shrinking gives the surplus pages back, growing keeps the resident pages
//! and adds fresh ones at the end. So the memory kept never exceeds what the program held
//! at its peak (a request that finds a kept block never maps new memory beside it), and
//! [`LargeBlocks::release`] returns all of it.
//!
//! It is an opt-in choice of the program, not of the library: the `redco` command and the
//! benchmarks install it with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: redco_cpu::LargeBlocks = redco_cpu::LargeBlocks::new();
//! ```
//!
//! On systems other than Linux, or with `REDCO_LARGE_BLOCKS=0`, it forwards everything to
//! the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Requests of at least this many bytes get their own mapping (glibc's own largest mmap
/// threshold, so smaller ones stay on the heap that [`super::malloc::tune`] configures).
pub const LARGE: usize = 32 << 20;
/// Set once a [`LargeBlocks`] has mapped a block: large buffers are then its mappings,
/// already advised for huge pages as a whole (advising part of one would split it into
/// regions `mremap` cannot resize).
pub(crate) static SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The page size the mappings are rounded to.
const PAGE: usize = 4096;
/// The most blocks kept at once.
const SLOTS: usize = 48;

/// A kept block: its address and mapped length (a multiple of [`PAGE`]).
#[derive(Clone, Copy)]
struct Block {
    ptr: usize,
    len: usize,
}

/// The kept blocks, oldest first.
struct Kept {
    blocks: [Block; SLOTS],
    n: usize,
    bytes: usize,
}

/// Counters of a [`LargeBlocks`], for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStats {
    /// Large requests served by a kept block.
    pub reused: u64,
    /// Large requests that mapped new memory.
    pub mapped: u64,
    /// Bytes kept right now.
    pub kept_bytes: usize,
}

/// The allocator; see the module docs.
pub struct LargeBlocks {
    kept: Mutex<Kept>,
    /// The most bytes kept (0: a quarter of the physical memory, read on first use).
    limit: AtomicUsize,
    reused: AtomicU64,
    mapped: AtomicU64,
    /// Bytes allocated through this allocator and not yet freed (every size).
    live: AtomicUsize,
    /// The most bytes live at once (since [`LargeBlocks::reset_peak`]).
    peak: AtomicUsize,
}

impl Default for LargeBlocks {
    fn default() -> Self {
        Self::new()
    }
}

impl LargeBlocks {
    /// An allocator keeping at most a quarter of the machine's physical memory.
    pub const fn new() -> Self {
        Self::with_limit(0)
    }

    /// An allocator keeping at most `limit` bytes of freed large blocks (0: a quarter of
    /// the physical memory).
    pub const fn with_limit(limit: usize) -> Self {
        LargeBlocks {
            kept: Mutex::new(Kept { blocks: [Block { ptr: 0, len: 0 }; SLOTS], n: 0, bytes: 0 }),
            limit: AtomicUsize::new(limit),
            reused: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes the program holds right now through this allocator (every allocation, small
    /// or large, at its requested size): its heap as it sees it, without the allocators'
    /// free memory.
    pub fn live_bytes(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The most bytes the program held at once (see [`LargeBlocks::live_bytes`]) since it
    /// started or since [`LargeBlocks::reset_peak`]: what a memory plan should predict, the
    /// resident set being this plus the allocators' free memory, the code and the stacks.
    pub fn peak_live_bytes(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from what is live now.
    pub fn reset_peak(&self) {
        self.peak.store(self.live_bytes(), Ordering::Relaxed);
    }

    fn note_alloc(&self, size: usize) {
        let now = self.live.fetch_add(size, Ordering::Relaxed) + size;
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn note_free(&self, size: usize) {
        self.live.fetch_sub(size, Ordering::Relaxed);
    }

    /// The counters so far.
    pub fn stats(&self) -> BlockStats {
        BlockStats {
            reused: self.reused.load(Ordering::Relaxed),
            mapped: self.mapped.load(Ordering::Relaxed),
            kept_bytes: self.lock().bytes,
        }
    }

    /// Gives every kept block back to the system (after loading a model, say, when the
    /// program will not need that much memory again).
    pub fn release(&self) {
        loop {
            let b = {
                let mut k = self.lock();
                if k.n == 0 {
                    return;
                }
                k.remove(0)
            };
            os::unmap(b);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // an allocator must not panic: a poisoned lock still guards consistent slots (no
        // code path panics while holding it)
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limit(&self) -> usize {
        match self.limit.load(Ordering::Relaxed) {
            0 => {
                let l = os::physical_bytes() / 4;
                self.limit.store(l.max(LARGE), Ordering::Relaxed);
                l.max(LARGE)
            }
            l => l,
        }
    }

    /// A block of `len` bytes (a multiple of PAGE), and whether it is fresh (all zeros).
    fn take(&self, len: usize) -> Option<(usize, bool)> {
        let kept = {
            let mut k = self.lock();
            k.nearest(len).map(|i| k.remove(i))
        };
        if let Some(b) = kept {
            if let Some(ptr) = os::refit(b, len) {
                self.reused.fetch_add(1, Ordering::Relaxed);
                return Some((ptr, false));
            }
            os::unmap(b);
        }
        let ptr = os::map(len)?;
        SERVING.store(true, Ordering::Relaxed);
        self.mapped.fetch_add(1, Ordering::Relaxed);
        Some((ptr, true))
    }

    /// Keeps the block, or gives it (or older ones) back past the limits.
    fn keep(&self, b: Block) {
        let limit = self.limit();
        if b.len > limit {
            os::unmap(b);
            return;
        }
        let mut out = [Block { ptr: 0, len: 0 }; SLOTS];
        let mut n_out = 0;
        {
            let mut k = self.lock();
            while k.n > 0 && (k.n == SLOTS || k.bytes + b.len > limit) {
                out[n_out] = k.remove(0);
                n_out += 1;
            }
            let n = k.n;
            k.blocks[n] = b;
            k.n += 1;
            k.bytes += b.len;
        }
        for b in &out[..n_out] {
            os::unmap(*b);
        }
    }
}

impl Kept {
    /// The index of the smallest kept block of at least `len` bytes, else of the largest,
    /// preferring the most recently freed among equals.
    fn nearest(&self, len: usize) -> Option<usize> {
        let blocks = &self.blocks[..self.n];
        let fits = (0..blocks.len()).rev().filter(|&i| blocks[i].len >= len).min_by_key(|&i| blocks[i].len);
        fits.or_else(|| (0..blocks.len()).rev().max_by_key(|&i| blocks[i].len))
    }

    fn remove(&mut self, i: usize) -> Block {
        let b = self.blocks[i];
        self.blocks.copy_within(i + 1..self.n, i);
        self.n -= 1;
        self.bytes -= b.len;
        b
    }
}

/// Whether a request goes to the block cache.
fn large(layout: &Layout) -> bool {
    os::ENABLED && layout.size() >= LARGE && layout.align() <= PAGE && os::switched_on()
}

fn pages(size: usize) -> usize {
    size.next_multiple_of(PAGE)
}

// SAFETY: large blocks are page-aligned anonymous mappings of at least `size` bytes, owned
// by exactly one allocation until freed; everything else is the system allocator's.
unsafe impl GlobalAlloc for LargeBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = if !large(&layout) {
            // SAFETY: the caller's contract is forwarded unchanged
            unsafe { System.alloc(layout) }
        } else {
            self.take(pages(layout.size())).map_or(std::ptr::null_mut(), |(p, _)| p as *mut u8)
        };
        if !p.is_null() {
            self.note_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is forwarded unchanged
        let p = unsafe { self.alloc_zeroed_uncounted(layout) };
        if !p.is_null() {
            self.note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.note_free(layout.size());
        // SAFETY: the caller's contract is forwarded unchanged
        unsafe { self.dealloc_uncounted(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is forwarded unchanged
        let p = unsafe { self.realloc_uncounted(ptr, layout, new_size) };
        if !p.is_null() {
            self.note_free(layout.size());
            self.note_alloc(new_size);
        }
        p
    }
}

impl LargeBlocks {
    /// `alloc_zeroed` without the live count.
    ///
    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`].
    unsafe fn alloc_zeroed_uncounted(&self, layout: Layout) -> *mut u8 {
        if !large(&layout) {
            // SAFETY: as above
            return unsafe { System.alloc_zeroed(layout) };
        }
        match self.take(pages(layout.size())) {
            Some((p, true)) => p as *mut u8,
            Some((p, false)) => {
                // SAFETY: the block is ours and at least `size` bytes long
                unsafe { std::ptr::write_bytes(p as *mut u8, 0, layout.size()) };
                p as *mut u8
            }
            None => std::ptr::null_mut(),
        }
    }

    /// `dealloc` without the live count.
    ///
    /// # Safety
    /// As [`GlobalAlloc::dealloc`].
    unsafe fn dealloc_uncounted(&self, ptr: *mut u8, layout: Layout) {
        if !large(&layout) {
            // SAFETY: as above
            return unsafe { System.dealloc(ptr, layout) };
        }
        self.keep(Block { ptr: ptr as usize, len: pages(layout.size()) });
    }

    /// `realloc` without the live count.
    ///
    /// # Safety
    /// As [`GlobalAlloc::realloc`].
    unsafe fn realloc_uncounted(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees a valid layout for new_size with the same align
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (large(&layout), large(&new)) {
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                let b = Block { ptr: ptr as usize, len: pages(layout.size()) };
                os::refit(b, pages(new_size)).map_or(std::ptr::null_mut(), |p| p as *mut u8)
            }
            _ => {
                // across the threshold: a new block, the contents copied, the old one freed
                // (uncounted: the caller counts the whole move)
                let p = if large(&new) {
                    self.take(pages(new_size)).map_or(std::ptr::null_mut(), |(p, _)| p as *mut u8)
                } else {
                    unsafe { System.alloc(new) }
                };
                if !p.is_null() {
                    // SAFETY: both blocks hold at least the smaller size and do not overlap
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc_uncounted(ptr, layout);
                    }
                }
                p
            }
        }
    }
}

#[cfg(target_os = "linux")]
mod os {
    //! Anonymous mappings through the C library.
    use super::Block;
    use std::ffi::c_void;

    pub const ENABLED: bool = true;

    /// False when `REDCO_LARGE_BLOCKS=0` (everything then goes to the system allocator).
    /// Read once with the C library's `getenv`, which does not allocate (an allocator
    /// must not call back into itself).
    pub fn switched_on() -> bool {
        use std::sync::atomic::{AtomicU8, Ordering};
        static STATE: AtomicU8 = AtomicU8::new(0); // 0 unread, 1 on, 2 off
        match STATE.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                // SAFETY: getenv reads the environment; the name is NUL-terminated
                let v = unsafe { getenv(c"REDCO_LARGE_BLOCKS".as_ptr()) };
                // SAFETY: a non-null result is a NUL-terminated string owned by the C library
                let off = !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"0";
                STATE.store(if off { 2 } else { 1 }, Ordering::Relaxed);
                !off
            }
        }
    }

    extern "C" {
        fn getenv(name: *const std::ffi::c_char) -> *const std::ffi::c_char;
        fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> i32;
        fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: i32, ...) -> *mut c_void;
        fn sysconf(name: i32) -> i64;
    }
    const PROT_READ: i32 = 1;
    const PROT_WRITE: i32 = 2;
    const MAP_PRIVATE: i32 = 2;
    const MAP_ANONYMOUS: i32 = 0x20;
    const MREMAP_MAYMOVE: i32 = 1;
    const SC_PAGESIZE: i32 = 30;
    const SC_PHYS_PAGES: i32 = 85;
    const FAILED: *mut c_void = !0usize as *mut c_void;

    /// A fresh zeroed mapping of `len` bytes.
    pub fn map(len: usize) -> Option<usize> {
        // SAFETY: an anonymous private mapping touches no existing memory
        let p = unsafe { mmap(std::ptr::null_mut(), len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) };
        if p == FAILED {
            return None;
        }
        crate::malloc::advise_mapping(p as *const u8, len);
        Some(p as usize)
    }

    /// `b` resized to `len` bytes (contents kept up to the smaller length), maybe moved.
    pub fn refit(b: Block, len: usize) -> Option<usize> {
        if b.len == len {
            return Some(b.ptr);
        }
        // SAFETY: `b` is a whole mapping of ours; MAYMOVE lets the kernel move it whole
        let p = unsafe { mremap(b.ptr as *mut c_void, b.len, len, MREMAP_MAYMOVE) };
        (p != FAILED).then_some(p as usize)
    }

    /// Gives `b` back to the system.
    pub fn unmap(b: Block) {
        // SAFETY: `b` is a whole mapping of ours that nothing uses any more; a failure
        // (which would only leak) is ignored, as an allocator cannot report it
        unsafe { munmap(b.ptr as *mut c_void, b.len) };
    }

    /// The machine's physical memory in bytes.
    pub fn physical_bytes() -> usize {
        // SAFETY: sysconf reads a system constant
        let (pages, size) = unsafe { (sysconf(SC_PHYS_PAGES), sysconf(SC_PAGESIZE)) };
        if pages > 0 && size > 0 {
            (pages as usize).saturating_mul(size as usize)
        } else {
            4 << 30
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    //! Elsewhere every request goes to the system allocator (`ENABLED` is false).
    use super::Block;

    pub const ENABLED: bool = false;

    pub fn switched_on() -> bool {
        false
    }
    pub fn map(_len: usize) -> Option<usize> {
        None
    }
    pub fn refit(_b: Block, _len: usize) -> Option<usize> {
        None
    }
    pub fn unmap(_b: Block) {}
    pub fn physical_bytes() -> usize {
        4 << 30
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes, 64).unwrap()
    }

    #[test]
    fn live_bytes_and_their_peak_follow_every_allocation_small_and_large() {
        let a = LargeBlocks::with_limit(1 << 30);
        let (small, big) = (layout(1000), layout(LARGE + 4096));
        // SAFETY: each pointer is freed once with the layout (or size) it was given
        unsafe {
            let p = a.alloc(small);
            let q = a.alloc_zeroed(big);
            assert!(!p.is_null() && !q.is_null());
            assert_eq!(a.live_bytes(), 1000 + LARGE + 4096);
            a.dealloc(q, big);
            assert_eq!((a.live_bytes(), a.peak_live_bytes()), (1000, 1000 + LARGE + 4096));
            // growing across the threshold and back counts the new size only
            let p = a.realloc(p, small, 2 * LARGE);
            assert!(!p.is_null());
            assert_eq!(a.live_bytes(), 2 * LARGE);
            let p = a.realloc(p, layout(2 * LARGE), 500);
            assert_eq!((a.live_bytes(), a.peak_live_bytes()), (500, 2 * LARGE));
            a.reset_peak();
            assert_eq!(a.peak_live_bytes(), 500);
            a.dealloc(p, layout(500));
        }
        assert_eq!(a.live_bytes(), 0);
    }

    #[test]
    fn a_freed_block_is_reused_and_resized() {
        let a = LargeBlocks::with_limit(1 << 30);
        let l = layout(LARGE + 12345);
        unsafe {
            let p = a.alloc(l);
            assert!(!p.is_null());
            std::ptr::write_bytes(p, 7, l.size());
            a.dealloc(p, l);
            assert_eq!(a.stats(), BlockStats { reused: 0, mapped: 1, kept_bytes: pages(l.size()) });
            // the same size again: the same block, not zeroed by alloc
            let q = a.alloc(l);
            assert_eq!(q, p);
            assert_eq!(*q.add(l.size() - 1), 7);
            a.dealloc(q, l);
            // zeroed on request
            let z = a.alloc_zeroed(l);
            assert!((0..l.size()).step_by(4093).all(|i| *z.add(i) == 0));
            a.dealloc(z, l);
            // a bigger request grows the kept block: its start keeps the old contents
            let big = layout(3 * LARGE);
            let p2 = a.alloc(l);
            std::ptr::write_bytes(p2, 9, l.size());
            a.dealloc(p2, l);
            let g = a.alloc(big);
            assert_eq!((*g, a.stats().mapped), (9, 1));
            *g.add(big.size() - 1) = 1;
            a.dealloc(g, big);
            let s = a.stats();
            assert_eq!((s.reused, s.mapped, s.kept_bytes), (4, 1, pages(big.size())));
            a.release();
            assert_eq!(a.stats().kept_bytes, 0);
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_the_threshold() {
        let a = LargeBlocks::with_limit(1 << 30);
        unsafe {
            let small = layout(1 << 20);
            let p = a.alloc(small);
            for i in 0..small.size() {
                *p.add(i) = (i % 251) as u8;
            }
            let q = a.realloc(p, small, 2 * LARGE);
            let r = a.realloc(q, layout(2 * LARGE), 3 * LARGE);
            let s = a.realloc(r, layout(3 * LARGE), 1000);
            assert!((0..1000).all(|i| *s.add(i) == (i % 251) as u8));
            a.dealloc(s, layout(1000));
            a.release();
        }
    }

    #[test]
    fn the_limit_bounds_what_is_kept() {
        let a = LargeBlocks::with_limit(2 * LARGE);
        let l = layout(LARGE);
        unsafe {
            let ps: Vec<*mut u8> = (0..4).map(|_| a.alloc(l)).collect();
            assert!(ps.iter().all(|p| !p.is_null()));
            for p in ps {
                a.dealloc(p, l);
            }
            assert_eq!(a.stats().kept_bytes, 2 * LARGE);
            // a block above the limit is never kept
            let huge = layout(3 * LARGE);
            let h = a.alloc(huge);
            a.dealloc(h, huge);
            assert!(a.stats().kept_bytes <= 2 * LARGE);
            a.release();
        }
    }

    #[test]
    fn small_and_over_aligned_requests_go_to_the_system() {
        let a = LargeBlocks::with_limit(1 << 30);
        unsafe {
            let l = Layout::from_size_align(LARGE, 1 << 16).unwrap();
            let p = a.alloc(l);
            assert_eq!(p as usize % (1 << 16), 0);
            a.dealloc(p, l);
            let s = layout(100);
            let q = a.alloc(s);
            a.dealloc(q, s);
            assert_eq!(a.stats(), BlockStats { reused: 0, mapped: 0, kept_bytes: 0 });
        }
    }
}
