//! glibc allocator settings for tensor-sized buffers.
//!
//! By default glibc serves every allocation above a (dynamic) threshold with its own
//! `mmap` and returns it with `munmap` when freed, so each new activation or gradient of a
//! training step faults its pages in again and the kernel zeroes them: measured on the
//! bench LLaMA, page faults were 15% of the first training steps' time, and every later
//! step faulted in 60-230 MB again, because each thread's arena gives a heap back to the
//! system as soon as it is empty. The CPU backend therefore serves buffers up to 32 MiB
//! (the largest glibc allows) from one heap shared by all threads (tensor ops allocate
//! rarely, so its lock is not contended), trimmed only above 256 MiB of free memory: a
//! training step then faults in under 2 MB, and peak memory no longer varies with which
//! thread freed what. Set `REDCO_MALLOC_TUNE=0` to leave the allocator as it is (for
//! example when the program installs its own allocator or settings).

use std::sync::OnceLock;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    fn mallopt(param: i32, value: i32) -> i32;
}

/// Applies the settings once per process (unless `REDCO_MALLOC_TUNE=0`); returns whether
/// they are in effect.
pub fn tune() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        if std::env::var("REDCO_MALLOC_TUNE").is_ok_and(|v| v == "0") {
            return false;
        }
        apply()
    })
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
}
