//! glibc allocator settings for tensor-sized buffers.
//!
//! By default glibc serves every allocation above a (dynamic) threshold with its own
//! `mmap` and returns it with `munmap` when freed, so each new activation or gradient of a
//! training step faults its pages in again and the kernel zeroes them: measured on the
//! bench LLaMA, page faults were 15% of the first training steps' time, and every later
//! step faulted in 60-230 MB again, because each thread's arena gives a heap back to the
//! system as soon as it is empty. [`tune`] therefore serves buffers up to 32 MiB (the
//! largest glibc allows) from one heap shared by all threads (tensor ops allocate rarely,
//! so its lock is not contended), trimmed only above 256 MiB of free memory: a training
//! step then faults in under 2 MB, and peak memory no longer varies with which thread
//! freed what.
//!
//! These are settings of the whole process, so the library never applies them by itself:
//! a program calls [`tune`] once at start (the `redco` command, the benchmarks and the
//! examples do), before it starts threads; an embedder with its own allocator leaves it
//! out. `REDCO_MALLOC_TUNE=0` makes [`tune`] do nothing (to compare, or to override a
//! program that calls it).
//!
//! [`advise_huge_pages`] asks Linux for transparent huge pages on large fresh buffers (GEMM
//! outputs, packed GEMM operands), where walking a big matrix row by row otherwise misses
//! the TLB on every row: huge pages on the output made `cargo xtask bench gemm` 2048^3
//! about 1.5% faster. `REDCO_MALLOC_TUNE=0` turns this off too.

use std::sync::OnceLock;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    fn mallopt(param: i32, value: i32) -> i32;
}

#[cfg(target_os = "linux")]
extern "C" {
    fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
}

/// Size (and alignment) of an x86-64 / aarch64 transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Whether the settings may be applied (`REDCO_MALLOC_TUNE` is not `0`).
fn allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| !std::env::var("REDCO_MALLOC_TUNE").is_ok_and(|v| v == "0"))
}

/// Marks the whole huge pages inside `[ptr, ptr + bytes)` for transparent huge pages
/// (`MADV_HUGEPAGE`), for buffers of at least two huge pages that are about to be written
/// for the first time. Best effort: without THP support, or on other systems, it does nothing.
pub fn advise_huge_pages(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const MADV_HUGEPAGE: i32 = 14;
        if bytes < 2 * HUGE_PAGE || !allowed() {
            return;
        }
        if bytes >= super::block_cache::LARGE && super::block_cache::SERVING.load(std::sync::atomic::Ordering::Relaxed)
        {
            // a LargeBlocks mapping, advised whole when it was made
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
        let end = (ptr as usize + bytes) & !(HUGE_PAGE - 1);
        if end > start {
            // SAFETY: madvise with MADV_HUGEPAGE only changes how the kernel backs pages of
            // this process's own mapping inside the caller's buffer; it never changes contents.
            // Its result is ignored on purpose: the advice is optional.
            unsafe { madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes, HUGE_PAGE);
}

/// Marks a whole page-aligned mapping of ours for transparent huge pages (the kernel uses
/// them on its aligned 2 MiB stretches). Unlike [`advise_huge_pages`] it advises the whole
/// mapping, so the mapping stays one region that `mremap` can resize.
pub(crate) fn advise_mapping(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const MADV_HUGEPAGE: i32 = 14;
        if bytes >= 2 * HUGE_PAGE && allowed() {
            // SAFETY: as in advise_huge_pages; `ptr` starts a mapping of `bytes` bytes
            unsafe { madvise(ptr as *mut std::ffi::c_void, bytes, MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Applies the allocator settings (see the module documentation) once per process, unless
/// `REDCO_MALLOC_TUNE=0`; returns whether they are in effect. Call it at the start of a
/// program, before other threads allocate.
///
/// ```
/// // first thing in main, before any thread starts
/// let tuned = redco_cpu::malloc::tune();
/// # let _ = tuned;
/// ```
pub fn tune() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| allowed() && apply())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    const M_ARENA_MAX: i32 = -8;
    // SAFETY: mallopt only changes allocator parameters; it is thread-safe in glibc.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
            && mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1
            && mallopt(M_ARENA_MAX, 1) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        if std::env::var("REDCO_MALLOC_TUNE").is_ok_and(|v| v == "0") {
            return;
        }
        assert!(super::tune());
        // a buffer below the threshold, freed and taken again, comes from the heap
        let v = vec![1u8; 8 << 20];
        drop(v);
        let w = vec![2u8; 8 << 20];
        assert_eq!(w[123], 2);
    }

    #[test]
    fn huge_page_advice_keeps_the_contents() {
        for bytes in [0usize, 1000, 4 << 20, (6 << 20) + 12345] {
            let mut v: Vec<u8> = Vec::with_capacity(bytes);
            super::advise_huge_pages(v.as_ptr(), bytes);
            v.extend((0..bytes).map(|i| (i % 251) as u8));
            super::advise_huge_pages(v.as_ptr(), bytes);
            assert!(v.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        }
    }
}
