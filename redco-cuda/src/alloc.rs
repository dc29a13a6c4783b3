//! The caching allocator: device buffers are rounded to size classes, and a freed buffer
//! goes back to its class's free list instead of to `cuMemFree`, so a training step reuses
//! the previous step's buffers with no driver call. Every kernel runs on the backend's one
//! stream, so a buffer freed by the host may be handed out again at once: work queued on
//! the old owner runs before work queued on the new one.

use crate::device::err;
use cudarc::driver::sys::CUdeviceptr;
use redco_core::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Sizes below this are rounded to 512 bytes; larger ones to 2 MiB.
const SMALL: usize = 1 << 20;

/// The size class of a request of `bytes` (at least 512 bytes).
pub fn class_of(bytes: usize) -> usize {
    if bytes <= SMALL {
        bytes.max(1).next_multiple_of(512)
    } else {
        bytes.next_multiple_of(2 << 20)
    }
}

/// Bytes held by the allocator, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in buffers that tensors hold now.
    pub in_use: usize,
    /// The most bytes tensors held at once since the pool was made or its peak was last
    /// reset (`Backend::reset_peak_memory`; torch's `max_memory_allocated`).
    pub peak_in_use: usize,
    /// Bytes taken from the driver (in use plus cached).
    pub reserved: usize,
    /// The most bytes ever taken from the driver (the high-water mark).
    pub peak_reserved: usize,
    /// Requests served from the cache.
    pub reused: u64,
    /// Requests that called the driver.
    pub fresh: u64,
}

/// Where raw device memory comes from (the driver, or a fake in tests).
pub trait Source: Send + Sync {
    /// A new buffer of `bytes` bytes.
    fn alloc(&self, bytes: usize) -> Result<CUdeviceptr>;
    /// Frees a buffer from [`Source::alloc`].
    fn free(&self, ptr: CUdeviceptr);
}

struct State {
    free: HashMap<usize, Vec<CUdeviceptr>>,
    stats: MemoryStats,
}

/// The allocator of one device.
pub struct Pool {
    source: Box<dyn Source>,
    state: Mutex<State>,
}

impl Pool {
    /// A pool over `source`.
    pub fn new(source: Box<dyn Source>) -> Arc<Pool> {
        Arc::new(Pool { source, state: Mutex::new(State { free: HashMap::new(), stats: MemoryStats::default() }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of at least `bytes` bytes: its pointer and size class.
    pub fn take(&self, bytes: usize) -> Result<(CUdeviceptr, usize)> {
        let class = class_of(bytes);
        {
            let mut s = self.lock();
            if let Some(p) = s.free.get_mut(&class).and_then(|v| v.pop()) {
                s.stats.in_use += class;
                s.stats.peak_in_use = s.stats.peak_in_use.max(s.stats.in_use);
                s.stats.reused += 1;
                return Ok((p, class));
            }
        }
        let p = match self.source.alloc(class) {
            Ok(p) => p,
            Err(_) => {
                // out of memory with buffers cached: give them back and try once more
                self.release();
                self.source.alloc(class).map_err(|e| {
                    let s = self.stats();
                    err(format!(
                        "out of GPU memory: asked for {} MiB with {} MiB in use ({e})",
                        class >> 20,
                        s.in_use >> 20
                    ))
                })?
            }
        };
        let mut s = self.lock();
        s.stats.in_use += class;
        s.stats.peak_in_use = s.stats.peak_in_use.max(s.stats.in_use);
        s.stats.reserved += class;
        s.stats.peak_reserved = s.stats.peak_reserved.max(s.stats.reserved);
        s.stats.fresh += 1;
        Ok((p, class))
    }

    /// Returns a buffer from [`Pool::take`] to the cache.
    pub fn give(&self, ptr: CUdeviceptr, class: usize) {
        let mut s = self.lock();
        s.stats.in_use -= class;
        s.free.entry(class).or_default().push(ptr);
    }

    /// Frees every cached buffer.
    pub fn release(&self) {
        let free: Vec<(usize, Vec<CUdeviceptr>)> = self.lock().free.drain().collect();
        for (class, ptrs) in free {
            for p in ptrs {
                self.source.free(p);
                self.lock().stats.reserved -= class;
            }
        }
    }

    /// Starts the in-use high-water mark again from what is in use now.
    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.stats.peak_in_use = s.stats.in_use;
    }

    /// The counters now.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Hands out increasing fake addresses, failing past a budget.
    struct Fake {
        next: AtomicU64,
        budget: usize,
        live: Mutex<usize>,
    }
    impl Source for Arc<Fake> {
        fn alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
            let mut live = self.live.lock().unwrap();
            if *live + bytes > self.budget {
                return Err(err("fake device full"));
            }
            *live += bytes;
            Ok(self.next.fetch_add(bytes as u64, Ordering::Relaxed))
        }
        fn free(&self, _ptr: CUdeviceptr) {}
    }

    #[test]
    fn classes_round_up() {
        assert_eq!(class_of(0), 512);
        assert_eq!(class_of(513), 1024);
        assert_eq!(class_of(SMALL), SMALL);
        assert_eq!(class_of(SMALL + 1), 2 << 20);
        assert_eq!(class_of(5 << 20), 6 << 20);
    }

    #[test]
    fn freed_buffers_are_reused_and_counted() {
        let fake = Arc::new(Fake { next: AtomicU64::new(4096), budget: 64 << 20, live: Mutex::new(0) });
        let pool = Pool::new(Box::new(fake.clone()));
        let (a, ca) = pool.take(3 << 20).unwrap();
        let (b, _) = pool.take(1000).unwrap();
        pool.give(a, ca);
        let (c, _) = pool.take(4 << 20).unwrap(); // same class as 3 MiB
        assert_eq!(c, a);
        let s = pool.stats();
        assert_eq!((s.fresh, s.reused, s.in_use, s.reserved), (2, 1, (4 << 20) + 1024, (4 << 20) + 1024));
        pool.give(b, 1024);
        pool.give(c, 4 << 20);
        assert_eq!(pool.stats().in_use, 0);
        assert_eq!(pool.stats().peak_reserved, (4 << 20) + 1024);
        assert_eq!(pool.stats().peak_in_use, (4 << 20) + 1024);
        pool.reset_peak();
        let (d, cd) = pool.take(1000).unwrap();
        assert_eq!(pool.stats().peak_in_use, 1024, "the peak starts again");
        pool.give(d, cd);
    }

    #[test]
    fn running_out_releases_the_cache_then_reports() {
        let fake = Arc::new(Fake { next: AtomicU64::new(4096), budget: 8 << 20, live: Mutex::new(0) });
        let pool = Pool::new(Box::new(fake.clone()));
        let (a, ca) = pool.take(6 << 20).unwrap();
        pool.give(a, ca);
        // another class does not fit beside the cached 6 MiB: the cache is freed (the fake
        // forgets nothing, so it still fails) and the error names the sizes
        let e = pool.take(4 << 20).unwrap_err().to_string();
        assert!(e.contains("out of GPU memory") && e.contains("4 MiB"), "{e}");
        assert_eq!(pool.stats().reserved, 0);
    }
}
