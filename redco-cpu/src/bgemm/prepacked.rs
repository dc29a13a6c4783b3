//! A bf16 B operand packed once ([`PackedHalfB`]), for products that multiply by the same
//! weight again and again (an inference server's): every 32-column VNNI panel of all k,
//! back to back, exactly as the driver packs a column block's panels per call, so a
//! product against it ([`bgemm_prepacked`]) skips that packing and equals the packing
//! product bit for bit.

use super::amx::{BLOCK, KSTEP, TILE};
use super::driver::{self, BSource};
use super::pack::pack_b;
use super::{Engine, HalfRef};
use crate::sgemm::{par_for, SendPtr};
use std::mem::MaybeUninit;

/// 32 u16 on a 64-byte boundary.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u16; 32]);

/// A bf16 `k x n` B in the bf16 GEMM's panel layout.
pub(crate) struct PackedHalfB {
    k: usize,
    n: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedHalfB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedHalfB({} x {})", self.k, self.n)
    }
}

impl PackedHalfB {
    /// Packs `b` (`k x n`, bf16 bits at any strides), its panels in parallel on the current
    /// rayon pool; `None` for an empty matrix or where no bf16 GEMM engine runs.
    ///
    /// # Panics
    /// If `b` does not hold every addressed element.
    pub(crate) fn new(k: usize, n: usize, b: HalfRef<'_>) -> Option<PackedHalfB> {
        super::engine()?;
        if k == 0 || n == 0 {
            return None;
        }
        assert!(b.data.len() > (k - 1) * b.rs + (n - 1) * b.cs, "PackedHalfB: B slice too short");
        let panel = panel_len(k);
        let panels = n.div_ceil(BLOCK);
        let mut lines = vec![Line([0; 32]); panels * panel / 32];
        let dst = SendPtr(lines.as_mut_ptr().cast::<u16>());
        // SAFETY: panel p is written by task p alone, inside the `panels * panel` elements;
        // pack_b reads only elements of B inside k x n (asserted above).
        par_for(panels, |p| unsafe { pack_b(&b, k, n, p * BLOCK, dst.get().add(p * panel)) });
        Some(PackedHalfB { k, n, lines })
    }

    fn elements(&self) -> &[u16] {
        // SAFETY: a Line is 32 u16 with no padding (size 64, align 64).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u16>(), self.lines.len() * 32) }
    }
}

/// u16 elements of one packed 32-column panel of depth `k` (as the driver counts them).
fn panel_len(k: usize) -> usize {
    k.div_ceil(KSTEP) * 2 * TILE
}

/// `C = A * B` for a packed B (`m x b.k()` A as bf16 bits at strides, C row-major f32 at
/// stride `ldc`, every element of its `m x b.n()` part written) with `engine`; false,
/// nothing written, where the engine does not run here.
///
/// # Panics
/// If `a` is too short for `m` rows or `c` for `m` rows of `ldc`, or `ldc < n`.
pub(crate) fn bgemm_prepacked(
    engine: Engine,
    m: usize,
    a: HalfRef<'_>,
    b: &PackedHalfB,
    c: &mut [MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) -> bool {
    if !engine.runs() {
        return false;
    }
    let (k, n) = (b.k, b.n);
    assert!(m == 0 || a.data.len() > (m - 1) * a.rs + (k - 1) * a.cs, "bgemm: A is too short for {m} x {k}");
    assert!(ldc >= n, "bgemm: ldc {ldc} < n {n}");
    assert!(m == 0 || c.len() >= (m - 1) * ldc + n, "bgemm: C is too short for {m} x {n}");
    if m == 0 {
        return true;
    }
    driver::run(engine, m, n, k, &a, BSource::Packed(b.elements()), c, ldc, threads);
    true
}
