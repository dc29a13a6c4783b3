//! The caching allocator: device buffers are rounded to size classes, and a freed buffer
//! goes back to its class's free list instead of to `cuMemFree`, so a training step reuses
//! the previous step's buffers with no driver call. Every kernel runs on the backend's one
//! stream, so a buffer freed by the host may be handed out again at once: work queued on
//! the old owner runs before work queued on the new one.

use crate::device::err;
use cudarc::driver::sys::CUdeviceptr;
use redco_core::Result;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// Buffers given back to the driver.
    pub freed: u64,
    /// Host nanoseconds spent in the driver's allocation and free calls.
    pub driver_nanos: u64,
}

/// Where raw device memory comes from (the driver, or a fake in tests).
pub trait Source: Send + Sync {
    /// A new buffer of `bytes` bytes.
    fn alloc(&self, bytes: usize) -> Result<CUdeviceptr>;
    /// Frees buffers from [`Source::alloc`] (one wait for the device for all of them).
    fn free(&self, ptrs: &[CUdeviceptr]);
}

struct State {
    /// Cached buffers by size class.
    free: BTreeMap<usize, Vec<CUdeviceptr>>,
    stats: MemoryStats,
}

/// The allocator of one device.
pub struct Pool {
    source: Box<dyn Source>,
    state: Mutex<State>,
}

/// How much larger than asked a cached buffer may be and still be handed out (a quarter:
/// at large batch the activations' sizes differ by a few 2 MiB classes step to step, and a
/// miss costs a driver call that waits for the device).
fn fits_in(class: usize, cached: usize) -> bool {
    class > SMALL && cached <= class + class / 4
}

impl Pool {
    /// A pool over `source`.
    pub fn new(source: Box<dyn Source>) -> Arc<Pool> {
        Arc::new(Pool { source, state: Mutex::new(State { free: BTreeMap::new(), stats: MemoryStats::default() }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of at least `bytes` bytes: its pointer and size class (the class of the
    /// buffer handed out: a cached one up to a quarter larger may serve a large request).
    pub fn take(&self, bytes: usize) -> Result<(CUdeviceptr, usize)> {
        let class = class_of(bytes);
        {
            let mut s = self.lock();
            // the smallest cached class that can serve the request, and a buffer of it
            let hit = s
                .free
                .range_mut(class..)
                .find(|(_, v)| !v.is_empty())
                .filter(|(&c, _)| c == class || fits_in(class, c))
                .and_then(|(&c, v)| Some((v.pop()?, c)));
            if let Some((p, c)) = hit {
                s.stats.in_use += c;
                s.stats.peak_in_use = s.stats.peak_in_use.max(s.stats.in_use);
                s.stats.reused += 1;
                return Ok((p, c));
            }
        }
        let p = match self.driver_alloc(class) {
            Ok(p) => p,
            Err(_) => {
                // out of memory with buffers cached: give back the largest until as much is
                // free, then everything, trying again after each
                let again = if self.release_at_least(class) > 0 { self.driver_alloc(class).ok() } else { None };
                match again {
                    Some(p) => p,
                    None => {
                        self.release();
                        self.driver_alloc(class).map_err(|e| {
                            let s = self.stats();
                            err(format!(
                                "out of GPU memory: asked for {} MiB with {} MiB in use ({e})",
                                class >> 20,
                                s.in_use >> 20
                            ))
                        })?
                    }
                }
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

    /// The source's allocation, its host time counted.
    fn driver_alloc(&self, class: usize) -> Result<CUdeviceptr> {
        let t = Instant::now();
        let r = self.source.alloc(class);
        self.lock().stats.driver_nanos += t.elapsed().as_nanos() as u64;
        r
    }

    /// Frees `ptrs` (all of size class `classes[i]`) through the source, counted.
    fn driver_free(&self, ptrs: &[(usize, CUdeviceptr)]) {
        if ptrs.is_empty() {
            return;
        }
        let raw: Vec<CUdeviceptr> = ptrs.iter().map(|p| p.1).collect();
        let t = Instant::now();
        self.source.free(&raw);
        let mut s = self.lock();
        s.stats.driver_nanos += t.elapsed().as_nanos() as u64;
        s.stats.freed += ptrs.len() as u64;
        s.stats.reserved -= ptrs.iter().map(|p| p.0).sum::<usize>();
    }

    /// Returns a buffer from [`Pool::take`] to the cache.
    pub fn give(&self, ptr: CUdeviceptr, class: usize) {
        let mut s = self.lock();
        s.stats.in_use -= class;
        s.free.entry(class).or_default().push(ptr);
    }

    /// Frees cached buffers, largest first, until at least `bytes` are freed (or the cache
    /// is empty); returns the bytes freed.
    pub fn release_at_least(&self, bytes: usize) -> usize {
        let mut picked = Vec::new();
        let mut freed = 0;
        {
            let mut s = self.lock();
            while freed < bytes {
                let Some(mut e) = s.free.last_entry() else { break };
                let class = *e.key();
                match e.get_mut().pop() {
                    Some(p) => {
                        picked.push((class, p));
                        freed += class;
                    }
                    None => drop(e.remove()),
                }
            }
        }
        self.driver_free(&picked);
        freed
    }

    /// Frees every cached buffer.
    pub fn release(&self) {
        let all: Vec<(usize, CUdeviceptr)> = std::mem::take(&mut self.lock().free)
            .into_iter()
            .flat_map(|(c, ptrs)| ptrs.into_iter().map(move |p| (c, p)))
            .collect();
        self.driver_free(&all);
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
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Hands out increasing fake addresses, failing past a budget.
    struct Fake {
        next: AtomicU64,
        budget: usize,
        live: Mutex<usize>,
        /// The length of each batch freed.
        frees: Mutex<Vec<usize>>,
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
        fn free(&self, ptrs: &[CUdeviceptr]) {
            self.frees.lock().unwrap().push(ptrs.len());
        }
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
        let fake = Arc::new(Fake {
            next: AtomicU64::new(4096),
            budget: 64 << 20,
            live: Mutex::new(0),
            frees: Mutex::new(Vec::new()),
        });
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
        let fake = Arc::new(Fake {
            next: AtomicU64::new(4096),
            budget: 8 << 20,
            live: Mutex::new(0),
            frees: Mutex::new(Vec::new()),
        });
        let pool = Pool::new(Box::new(fake.clone()));
        let (a, ca) = pool.take(6 << 20).unwrap();
        pool.give(a, ca);
        // another class does not fit beside the cached 6 MiB: the cache is freed (the fake
        // forgets nothing, so it still fails) and the error names the sizes
        let e = pool.take(4 << 20).unwrap_err().to_string();
        assert!(e.contains("out of GPU memory") && e.contains("4 MiB"), "{e}");
        assert_eq!(pool.stats().reserved, 0);
    }

    #[test]
    fn a_cached_buffer_up_to_a_quarter_larger_serves_a_large_request() {
        let fake = Arc::new(Fake {
            next: AtomicU64::new(4096),
            budget: 256 << 20,
            live: Mutex::new(0),
            frees: Mutex::new(Vec::new()),
        });
        let pool = Pool::new(Box::new(fake.clone()));
        let (a, ca) = pool.take(10 << 20).unwrap();
        pool.give(a, ca);
        // 8 MiB: the cached 10 MiB is a quarter larger: handed out, counted as 10 MiB
        let (b, cb) = pool.take(8 << 20).unwrap();
        assert_eq!((b, cb), (a, 10 << 20));
        assert_eq!((pool.stats().fresh, pool.stats().reused, pool.stats().in_use), (1, 1, 10 << 20));
        pool.give(b, cb);
        // 6 MiB: 10 MiB is too large, a fresh buffer
        let (c, cc) = pool.take(6 << 20).unwrap();
        assert_ne!(c, a);
        assert_eq!(cc, 6 << 20);
        pool.give(c, cc);
        // small requests take their own class only
        let (d, cd) = pool.take(1000).unwrap();
        pool.give(d, cd);
        let (e, ce) = pool.take(700).unwrap();
        assert_eq!((e, ce), (d, 1024));
        let (f, cf) = pool.take(600).unwrap();
        assert_eq!(cf, 1024, "600 bytes round to 1 KiB");
        assert_ne!(f, d, "the cached buffer is taken");
    }

    #[test]
    fn running_out_frees_the_largest_cached_buffers_first_in_one_batch() {
        struct Counting {
            live: Mutex<usize>,
            budget: usize,
            next: AtomicU64,
            sizes: Mutex<HashMap<CUdeviceptr, usize>>,
            batches: Mutex<Vec<usize>>,
        }
        impl Source for Arc<Counting> {
            fn alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
                let mut live = self.live.lock().unwrap();
                if *live + bytes > self.budget {
                    return Err(err("fake device full"));
                }
                *live += bytes;
                let p = self.next.fetch_add(bytes as u64, Ordering::Relaxed);
                self.sizes.lock().unwrap().insert(p, bytes);
                Ok(p)
            }
            fn free(&self, ptrs: &[CUdeviceptr]) {
                let mut live = self.live.lock().unwrap();
                for p in ptrs {
                    *live -= self.sizes.lock().unwrap().remove(p).unwrap();
                }
                self.batches.lock().unwrap().push(ptrs.len());
            }
        }
        let src = Arc::new(Counting {
            live: Mutex::new(0),
            budget: 40 << 20,
            next: AtomicU64::new(4096),
            sizes: Mutex::new(HashMap::new()),
            batches: Mutex::new(Vec::new()),
        });
        let pool = Pool::new(Box::new(src.clone()));
        let held: Vec<_> = [2 << 20, 4 << 20, 12 << 20, 16 << 20].iter().map(|&b| pool.take(b).unwrap()).collect();
        for &(p, c) in &held {
            pool.give(p, c);
        }
        // 34 MiB cached of 40; 20 MiB more fit once the 16 and 12 MiB buffers are freed
        let (_, c) = pool.take(20 << 20).unwrap();
        assert_eq!(c, 20 << 20);
        assert_eq!(*src.batches.lock().unwrap(), vec![2], "one batch of the two largest");
        let s = pool.stats();
        assert_eq!((s.freed, s.reserved), (2, (2 << 20) + (4 << 20) + (20 << 20)));
        // the small ones stay cached
        assert_eq!(pool.take(4 << 20).unwrap(), held[1]);
    }
}
