//! [`WeightCache`]: the f32 weights a CPU backend multiplies by, kept packed for its GEMM
//! once the program has said its weights are constant
//! ([`crate::Backend::hint_constant_weights`]: an inference server).
//!
//! A product whose right operand is an f32 matrix stored transposed (a linear layer's
//! `[out, in]` weight, `x W^T`) and whose left has more rows than the unpacked small-`m`
//! path takes packs that operand into the GEMM's panels on every call: measured with `perf`
//! on `redco serve` at 32 concurrent requests (llama-134m, f32), 20% of the server's time.
//! With the hint, the first product by a storage packs it whole and keeps it; later ones
//! read the packed copy (products equal bit for bit: the same panels, the same kernel), so
//! the packing a server's first long prompt pays is paid once. Entries hold their storage
//! weakly: a freed buffer is never mistaken for a new one at the same address (the weak
//! reference keeps that address taken), and the entries of freed storages, packing
//! included, go at the next insertion.

use super::sgemm::{self, PackedB};
use crate::HostData;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One operand packed: the storage (weakly), its geometry, and its packing.
struct Entry {
    data: Weak<HostData>,
    geometry: (usize, usize, usize, usize),
    packed: Arc<PackedB>,
}

/// The cache; off until [`WeightCache::switch_on`].
#[derive(Default)]
pub(crate) struct WeightCache {
    on: AtomicBool,
    entries: Mutex<HashMap<usize, Entry>>,
    packed: AtomicU64,
}

impl WeightCache {
    /// Keeps weights packed from now on.
    pub(crate) fn switch_on(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// Whether it is on.
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Weights packed so far.
    pub(crate) fn packed_count(&self) -> u64 {
        self.packed.load(Ordering::Relaxed)
    }

    /// `b` (`k x n` at strides `rs`, `cs`) packed: made the first time, kept while `b`
    /// lives; `None` when off (or where no generated GEMM runs).
    pub(crate) fn get(&self, b: &Arc<HostData>, k: usize, n: usize, rs: usize, cs: usize) -> Option<Arc<PackedB>> {
        if !self.is_on() {
            return None;
        }
        let HostData::F32(data) = &**b else { return None };
        let key = Arc::as_ptr(b) as usize;
        let geometry = (k, n, rs, cs);
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(&key) {
            // the weak reference keeps the address taken, so a live one is this storage
            if e.data.strong_count() > 0 && e.geometry == geometry {
                return Some(e.packed.clone());
            }
        }
        map.retain(|_, e| e.data.strong_count() > 0);
        let packed = Arc::new(PackedB::new(k, n, sgemm::MatRef { data, rs, cs })?);
        self.packed.fetch_add(1, Ordering::Relaxed);
        map.insert(key, Entry { data: Arc::downgrade(b), geometry, packed: packed.clone() });
        Some(packed)
    }
}

/// `a * b` through `cache` when `b` is a weight it keeps packed: an f32 product with `b`
/// stored transposed (`[n, k]`, unbatched), more rows of `a` (all batches) than the
/// unpacked small-`m` path takes and at least one panel of columns; `None` otherwise (the
/// caller runs the ordinary product).
pub(crate) fn packed_product(
    cache: &WeightCache,
    a: &HostData,
    b: &Arc<HostData>,
    spec: &crate::backend::MatmulSpec,
    threads: usize,
) -> Option<Vec<f32>> {
    let HostData::F32(x) = a else { return None };
    let rows = match (spec.batch, spec.a_batched) {
        (1, _) => spec.m,
        (_, true) => spec.batch * spec.m,
        _ => return None,
    };
    let (k, n) = (spec.k, spec.n);
    let wide = n >= 32;
    if !cache.is_on()
        || !spec.trans_b
        || spec.trans_a
        || spec.b_batched
        || rows <= sgemm::skinny::MAX_M_DOTS
        || !wide
        || k == 0
        || x.len() != rows * k
        || !super::sgemm_enabled()
    {
        return None;
    }
    let packed = cache.get(b, k, n, 1, k)?;
    let mut c: Vec<f32> = Vec::with_capacity(rows * n);
    let ok = sgemm::gemm_prepacked(
        rows,
        sgemm::MatRef { data: x, rs: k, cs: 1 },
        &packed,
        &mut c.spare_capacity_mut()[..rows * n],
        n,
        threads,
    );
    if !ok {
        return None;
    }
    // SAFETY: `gemm_prepacked` returned true, so it wrote every element of the rows x n result
    unsafe { c.set_len(rows * n) };
    Some(c)
}

#[cfg(test)]
mod tests;
