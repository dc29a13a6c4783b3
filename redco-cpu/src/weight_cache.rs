//! [`WeightCache`]: the f32 and bf16 weights a CPU backend multiplies by, kept packed for
//! its GEMMs (the f32 GEMM's panels; the bf16 GEMM's VNNI panels, where AMX or
//! AVX512-BF16 runs) once the program has said its weights are constant
//! ([`redco_core::Backend::hint_constant_weights`]: an inference server).
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
use redco_core::HostData;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A weight's packing, for the f32 or the bf16 GEMM.
#[derive(Clone)]
enum Packing {
    F32(Arc<PackedB>),
    #[cfg(target_arch = "x86_64")]
    Bf16(Arc<super::bgemm::PackedHalfB>),
}

/// One operand packed: the storage (weakly), its geometry, and its packing.
struct Entry {
    data: Weak<HostData>,
    geometry: (usize, usize, usize, usize),
    packed: Packing,
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
        let HostData::F32(data) = &**b else { return None };
        let made = self.lookup(b, (k, n, rs, cs), || {
            Some(Packing::F32(Arc::new(PackedB::new(k, n, sgemm::MatRef { data, rs, cs })?)))
        })?;
        match made {
            Packing::F32(p) => Some(p),
            #[cfg(target_arch = "x86_64")]
            Packing::Bf16(_) => None,
        }
    }

    /// [`WeightCache::get`] for a bf16 `b`, packed for the bf16 GEMM; `None` also where no
    /// bf16 GEMM engine runs.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn get_bf16(
        &self,
        b: &Arc<HostData>,
        k: usize,
        n: usize,
        rs: usize,
        cs: usize,
    ) -> Option<Arc<super::bgemm::PackedHalfB>> {
        let HostData::BF16(data) = &**b else { return None };
        let made = self.lookup(b, (k, n, rs, cs), || {
            let r = super::bgemm::HalfRef { data: bytemuck::cast_slice(data), rs, cs };
            Some(Packing::Bf16(Arc::new(super::bgemm::PackedHalfB::new(k, n, r)?)))
        })?;
        match made {
            Packing::Bf16(p) => Some(p),
            Packing::F32(_) => None,
        }
    }

    /// The packing of storage `b` at `geometry`: the kept one, or made by `make` and kept
    /// (the entries of freed storages dropped first); `None` when off or `make` cannot.
    fn lookup(
        &self,
        b: &Arc<HostData>,
        geometry: (usize, usize, usize, usize),
        make: impl FnOnce() -> Option<Packing>,
    ) -> Option<Packing> {
        if !self.is_on() {
            return None;
        }
        let key = Arc::as_ptr(b) as usize;
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(&key) {
            // the weak reference keeps the address taken, so a live one is this storage
            if e.data.strong_count() > 0 && e.geometry == geometry {
                return Some(e.packed.clone());
            }
        }
        map.retain(|_, e| e.data.strong_count() > 0);
        let packed = make()?;
        self.packed.fetch_add(1, Ordering::Relaxed);
        map.insert(key, Entry { data: Arc::downgrade(b), geometry, packed: packed.clone() });
        Some(packed)
    }
}

/// `a * b` through `cache` when `b` is a weight it keeps packed: `b` stored transposed
/// (`[n, k]`, unbatched), and either an f32 product with more rows of `a` (all batches)
/// than the unpacked small-`m` path takes and at least one panel of columns, or a bf16
/// product with as many rows as go to the bf16 GEMM; the f32 result, or `None` (the
/// caller runs the ordinary product).
pub(crate) fn packed_product(
    cache: &WeightCache,
    a: &HostData,
    b: &Arc<HostData>,
    spec: &redco_core::backend::MatmulSpec,
    threads: usize,
) -> Option<Vec<f32>> {
    let rows = match (spec.batch, spec.a_batched) {
        (1, _) => spec.m,
        (_, true) => spec.batch * spec.m,
        _ => return None,
    };
    if let HostData::BF16(x) = a {
        return packed_bf16_product(cache, x, b, spec, rows, threads);
    }
    let HostData::F32(x) = a else { return None };
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

/// The bf16 case of [`packed_product`]: `x` (`rows x k`) times the kept packing of `b`.
fn packed_bf16_product(
    cache: &WeightCache,
    x: &[half::bf16],
    b: &Arc<HostData>,
    spec: &redco_core::backend::MatmulSpec,
    rows: usize,
    threads: usize,
) -> Option<Vec<f32>> {
    let (k, n) = (spec.k, spec.n);
    if !spec.trans_b
        || spec.trans_a
        || spec.b_batched
        || rows < super::matmul::AMX_MIN_ROWS
        || k == 0
        || n == 0
        || x.len() != rows * k
    {
        return None;
    }
    let engine = super::bgemm::engine()?;
    let packed = cache.get_bf16(b, k, n, 1, k)?;
    let mut c: Vec<f32> = Vec::with_capacity(rows * n);
    let a = super::bgemm::HalfRef { data: bytemuck::cast_slice(x), rs: k, cs: 1 };
    if !super::bgemm::bgemm_prepacked(engine, rows, a, &packed, &mut c.spare_capacity_mut()[..rows * n], n, threads) {
        return None;
    }
    // SAFETY: `bgemm_prepacked` returned true, so it wrote every element of the rows x n result
    unsafe { c.set_len(rows * n) };
    Some(c)
}

#[cfg(test)]
mod tests;
