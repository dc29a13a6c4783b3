//! A B operand packed once, for products that multiply by the same matrix again and again
//! (an inference server's weights): [`PackedB`] holds every K block of B already in the
//! micro-panel layout the driver packs into per task, so a GEMM against it skips packing.
//!
//! Layout: for each K block `kb` (the driver's blocking, which depends on `k` only), all
//! `n.div_ceil(NR)` panels of `kc x NR` back to back, starting at `kb * np * NR * kc_max`
//! floats. A task covering panels `pn0..pn1` finds its block at `pn0 * NR * kc` from
//! there: exactly what the per-task packing would have written, so the products are equal
//! bit for bit to the packing path's.

use super::kernel_avx2::Avx2;
use super::kernel_avx512::Avx512;
use super::microkernel::Family;
use super::{Isa, MatRef};

/// 16 floats on a 64-byte boundary (the packed panels are read with aligned loads).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// An f32 `k x n` B packed for the kernel family `isa`.
pub struct PackedB {
    isa: Isa,
    k: usize,
    n: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedB({:?}, {} x {})", self.isa, self.k, self.n)
    }
}

/// The driver's K blocking for depth `k` with family `K`: (blocks, depth of each but the last).
pub(super) fn k_blocks<K: Family>(k: usize) -> (usize, usize) {
    let kblocks = k.div_ceil(K::KC);
    (kblocks, k.div_ceil(kblocks))
}

impl PackedB {
    /// Packs `b` (`k x n`, any strides) for the family this CPU runs; `None` where none
    /// runs, or for an empty matrix.
    ///
    /// # Panics
    /// If `b` does not hold every addressed element.
    pub fn new(k: usize, n: usize, b: MatRef<f32>) -> Option<PackedB> {
        let isa = Isa::detect()?;
        if k == 0 || n == 0 {
            return None;
        }
        assert!(b.data.len() > (k - 1) * b.rs + (n - 1) * b.cs, "PackedB: B slice too short");
        Some(match isa {
            Isa::Avx512 => Self::pack::<Avx512>(isa, k, n, b),
            Isa::Avx2 => Self::pack::<Avx2>(isa, k, n, b),
        })
    }

    fn pack<K: Family>(isa: Isa, k: usize, n: usize, b: MatRef<f32>) -> PackedB {
        let np = n.div_ceil(K::NR);
        let (kblocks, kc_max) = k_blocks::<K>(k);
        let floats = kblocks * np * K::NR * kc_max;
        let mut lines = vec![Line([0.0; 16]); floats.div_ceil(16)];
        let base = lines.as_mut_ptr() as *mut f32;
        for kb in 0..kblocks {
            let pc = kb * kc_max;
            let kc = (k - pc).min(kc_max);
            // SAFETY: B(pc.., 0..) kc x n is in bounds (asserted above); the destination,
            // 64-byte aligned (NR * kc_max floats is a multiple of 16), holds np panels of
            // kc x NR floats; `isa` runs here (it came from `Isa::detect`).
            unsafe { K::pack_b(kc, n, b.data.as_ptr().add(pc * b.rs), b.rs, b.cs, base.add(kb * np * K::NR * kc_max)) };
        }
        PackedB { isa, k, n, lines }
    }

    /// Depth (rows of B).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Width (columns of B).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The kernel family it was packed for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lines.len() * size_of::<Line>()
    }

    /// The first packed float (for the driver).
    pub(super) fn as_ptr(&self) -> *const f32 {
        self.lines.as_ptr() as *const f32
    }
}
