//! glibc allocator settings for tensor-sized buffers.
//!
//! By default glibc serves every allocation above a (dynamic) threshold with its own
//! `mmap` and returns it with `munmap` when freed, so each new activation or gradient of a
//! training step faults its pages in again and the kernel zeroes them: measured on the
//! bench LLaMA, a third of a training step went to page faults. The CPU backend therefore
//! keeps buffers up to 32 MiB (the largest glibc allows) in the heap and lets up to
//! 512 MiB of freed memory stay mapped for reuse. Set `REDCO_MALLOC_TUNE=0` to leave the
//! allocator as it is (for example when the program installs its own allocator settings).

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
    const M_TOP_PAD: i32 = -2;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only changes allocator parameters; it is thread-safe in glibc.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
            && mallopt(M_TRIM_THRESHOLD, 512 << 20) == 1
            && mallopt(M_TOP_PAD, 16 << 20) == 1
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
