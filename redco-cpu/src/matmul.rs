//! CPU matmul: batched, with transpose flags folded into strides (no copies).
//! f32 uses the generated GEMM (AVX-512F or AVX2 + FMA) when the CPU has one; everything else the `gemm` crate.
//! bf16 products use the packed bf16 GEMM ([`bgemm`]) where the CPU has AMX-BF16 or
//! AVX512-BF16; elsewhere f16 and bf16 run the generated f32 GEMM, whose packers widen them
//! in registers (no widened copy of either operand), and without a generated GEMM they widen
//! to f32. [`F32Gemm`] lets tests run both f32 paths in one process.

use super::bgemm;
use super::half_gemv::{self, Half};
use super::real::Real;
use super::{floats, sgemm, Floats, Store};
use rayon::prelude::*;
use redco_core::backend::MatmulSpec;
use redco_core::{DType, Error, HostData, Result};

/// Element strides (row, column) of operand matrices.
#[derive(Clone, Copy)]
pub(crate) struct Strides {
    pub(crate) a_rs: usize,
    pub(crate) a_cs: usize,
    pub(crate) b_rs: usize,
    pub(crate) b_cs: usize,
}

/// Which GEMM an f32 product may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum F32Gemm {
    /// The generated GEMM (AVX-512 or AVX2) where it runs here ([`super::sgemm_enabled`]), else the `gemm` crate:
    /// what the backend does.
    Auto,
    /// Always the `gemm` crate (the portable fallback), whatever the CPU: what the tests
    /// use to check the fallback on a machine with a generated GEMM.
    #[cfg_attr(not(test), allow(dead_code))]
    Portable,
}

impl F32Gemm {
    /// True when this choice runs a generated GEMM on this machine.
    pub(crate) fn fast(self) -> bool {
        self == F32Gemm::Auto && super::sgemm_enabled()
    }
}

fn strides(s: &MatmulSpec) -> Strides {
    let (a_rs, a_cs) = if s.trans_a { (1, s.m) } else { (s.k, 1) };
    let (b_rs, b_cs) = if s.trans_b { (1, s.k) } else { (s.n, 1) };
    Strides { a_rs, a_cs, b_rs, b_cs }
}

/// `c = a * b` for one `m x k` by `k x n` product given by element strides, `c` row-major
/// `m x n`, on `threads` threads of the current pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_strided<T: Real + GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
    st: Strides,
    threads: usize,
) {
    gemm_strided_with(m, n, k, a, b, c, st, threads, F32Gemm::Auto)
}

/// [`gemm_strided`] with the f32 GEMM chosen by `path`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_strided_with<T: Real + GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
    st: Strides,
    threads: usize,
    path: F32Gemm,
) {
    let spec = MatmulSpec { batch: 1, m, n, k, trans_a: false, trans_b: false, a_batched: false, b_batched: false };
    gemm_one(a, b, c, &spec, st, threads, path)
}

/// One GEMM `c = a * b` (c row-major m x n), on `threads` threads of the current pool; f32
/// tries the fast GEMM first unless `path` is [`F32Gemm::Portable`].
fn gemm_one<T: Real + GemmElem>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    s: &MatmulSpec,
    st: Strides,
    threads: usize,
    path: F32Gemm,
) {
    if path == F32Gemm::Auto && T::try_fast(a, b, c, s, st, threads) {
        return;
    }
    let par = if threads > 1 && s.m * s.n * s.k >= 64 * 64 * 64 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the slices hold the m x k, k x n and m x n matrices addressed by the strides
    // (checked by `matmul` below), `c` is exclusively borrowed, and read_dst is false so the
    // uninitialised-looking zeros in `c` are never read.
    unsafe {
        gemm::gemm(
            s.m,
            s.n,
            s.k,
            c.as_mut_ptr(),
            1,
            s.n as isize,
            false,
            a.as_ptr(),
            st.a_cs as isize,
            st.a_rs as isize,
            b.as_ptr(),
            st.b_cs as isize,
            st.b_rs as isize,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

/// Element types with an optional faster GEMM than the `gemm` crate.
pub(crate) trait GemmElem: Sized + 'static {
    fn try_fast(a: &[Self], b: &[Self], c: &mut [Self], s: &MatmulSpec, st: Strides, threads: usize) -> bool;
}

impl GemmElem for f64 {
    fn try_fast(_: &[f64], _: &[f64], _: &mut [f64], _: &MatmulSpec, _: Strides, _: usize) -> bool {
        false
    }
}

impl GemmElem for f32 {
    fn try_fast(a: &[f32], b: &[f32], c: &mut [f32], s: &MatmulSpec, st: Strides, threads: usize) -> bool {
        super::sgemm_hook(a, b, c, s.m, s.n, s.k, (st.a_rs, st.a_cs), (st.b_rs, st.b_cs), threads)
    }
}

/// Ok when the operand buffers hold exactly the (batched or shared) matrices of `spec`.
fn check_operands(a_len: usize, b_len: usize, spec: &MatmulSpec) -> Result<()> {
    let (sa, sb) = (spec.m * spec.k, spec.k * spec.n);
    let need_a = if spec.a_batched { spec.batch * sa } else { sa };
    let need_b = if spec.b_batched { spec.batch * sb } else { sb };
    if a_len != need_a || b_len != need_b {
        return Err(Error::invalid("matmul", format!("operand sizes {a_len} and {b_len} do not match {spec:?}")));
    }
    Ok(())
}

/// The result types of the generated GEMM: f32 (written by the kernels) and the 16-bit
/// floats (narrowed by the GEMM's tasks as they finish rows, [`sgemm::gemm_narrow`]).
pub(crate) trait FastOut: Sized + Copy + Send + Sync {
    /// `c = a * b` (row-major `m x n`), every element written; false where no generated
    /// GEMM runs for `E` here.
    fn gemm<E: sgemm::Source>(
        m: usize,
        n: usize,
        k: usize,
        a: sgemm::MatRef<E>,
        b: sgemm::MatRef<E>,
        c: &mut [std::mem::MaybeUninit<Self>],
        threads: usize,
    ) -> bool;
}

impl FastOut for f32 {
    fn gemm<E: sgemm::Source>(
        m: usize,
        n: usize,
        k: usize,
        a: sgemm::MatRef<E>,
        b: sgemm::MatRef<E>,
        c: &mut [std::mem::MaybeUninit<f32>],
        threads: usize,
    ) -> bool {
        sgemm::gemm_uninit(m, n, k, a, b, c, n, threads)
    }
}

/// The 16-bit results.
impl<O: sgemm::Sink> FastOut for O {
    fn gemm<E: sgemm::Source>(
        m: usize,
        n: usize,
        k: usize,
        a: sgemm::MatRef<E>,
        b: sgemm::MatRef<E>,
        c: &mut [std::mem::MaybeUninit<O>],
        threads: usize,
    ) -> bool {
        sgemm::gemm_narrow(m, n, k, a, b, c, threads)
    }
}

/// f32, bf16 or f16 operands through the generated GEMM (16-bit ones widened while packed),
/// writing a fresh output of `O` (f32, or the operands' 16-bit type narrowed as the GEMM
/// goes) without zero-filling it first.
fn matmul_fast<E: sgemm::Source, O: FastOut>(a: &[E], b: &[E], spec: &MatmulSpec, threads: usize) -> Result<Vec<O>> {
    let (sa, sb, sc) = (spec.m * spec.k, spec.k * spec.n, spec.m * spec.n);
    check_operands(a.len(), b.len(), spec)?;
    let total = spec.batch * sc;
    let mut c: Vec<O> = Vec::with_capacity(total);
    super::malloc::advise_huge_pages(c.as_ptr() as *const u8, total * size_of::<O>());
    if sc > 0 {
        let st = strides(spec);
        let a_of = |i: usize| sgemm::MatRef {
            data: if spec.a_batched { &a[i * sa..(i + 1) * sa] } else { a },
            rs: st.a_rs,
            cs: st.a_cs,
        };
        let b_of = |i: usize| sgemm::MatRef {
            data: if spec.b_batched { &b[i * sb..(i + 1) * sb] } else { b },
            rs: st.b_rs,
            cs: st.b_cs,
        };
        let out = &mut c.spare_capacity_mut()[..total];
        let small = sc * spec.k < 128 * 128 * 128;
        let one = |i: usize, ci: &mut [std::mem::MaybeUninit<O>], t: usize| {
            let ok = O::gemm(spec.m, spec.n, spec.k, a_of(i), b_of(i), ci, t);
            assert!(ok, "matmul: the generated GEMM was chosen on a CPU that cannot run it");
        };
        if spec.batch > 1 && small && threads > 1 {
            out.par_chunks_mut(sc).enumerate().for_each(|(i, ci)| one(i, ci, 1));
        } else {
            for (i, ci) in out.chunks_mut(sc).enumerate() {
                one(i, ci, threads);
            }
        }
    }
    // SAFETY: `O::gemm` wrote every element of every `m x n` block (it returns false only
    // without a generated GEMM for `E`, and then `one` panicked), so all `total` are initialised.
    unsafe { c.set_len(total) };
    Ok(c)
}

fn matmul_t<T: Real + GemmElem + Store>(
    a: &[T],
    b: &[T],
    spec: &MatmulSpec,
    threads: usize,
    path: F32Gemm,
) -> Result<Vec<T>> {
    let (sa, sb, sc) = (spec.m * spec.k, spec.k * spec.n, spec.m * spec.n);
    check_operands(a.len(), b.len(), spec)?;
    let mut c = vec![T::zero(); spec.batch * sc];
    if sc == 0 {
        return Ok(c);
    }
    let st = strides(spec);
    let a_of = |i: usize| if spec.a_batched { &a[i * sa..(i + 1) * sa] } else { a };
    let b_of = |i: usize| if spec.b_batched { &b[i * sb..(i + 1) * sb] } else { b };
    let small = sc * spec.k < 128 * 128 * 128;
    if spec.batch > 1 && small && threads > 1 {
        c.par_chunks_mut(sc).enumerate().for_each(|(i, ci)| gemm_one(a_of(i), b_of(i), ci, spec, st, 1, path));
    } else {
        for (i, ci) in c.chunks_mut(sc).enumerate() {
            gemm_one(a_of(i), b_of(i), ci, spec, st, threads, path);
        }
    }
    Ok(c)
}

/// A product of a few rows against one 16-bit weight (decoding), with the weight widened
/// in registers ([`half_gemv`]) instead of converted to a new f32 buffer; `None` when the
/// product is not of that kind.
fn half_weight_product(a: &HostData, b: &HostData, spec: &MatmulSpec, threads: usize) -> Option<Vec<f32>> {
    let (h, w): (Half, &[u16]) = match (a, b) {
        (HostData::BF16(_), HostData::BF16(w)) => (Half::Bf16, bytemuck::cast_slice(w)),
        (HostData::F16(_), HostData::F16(w)) => (Half::F16, bytemuck::cast_slice(w)),
        _ => return None,
    };
    // every row of A (all batches) against the one weight
    let rows = if spec.a_batched {
        spec.batch * spec.m
    } else if spec.batch == 1 {
        spec.m
    } else {
        return None;
    };
    if spec.b_batched || spec.trans_a || rows > half_gemv::MAX_ROWS || spec.k == 0 {
        return None;
    }
    let x = a.to_f32_vec();
    if x.len() != rows * spec.k || w.len() != spec.k * spec.n {
        return None;
    }
    let st = strides(spec);
    Some(half_gemv::gemv(h, rows, spec.n, spec.k, &x, w, (st.b_rs, st.b_cs), threads))
}

/// The fewest rows (all batches) of a bf16 product that go to the AMX GEMM rather than
/// the 16-bit GEMV: measured on a Sapphire Rapids Xeon (2 threads, a 2048 x 5632 weight),
/// the GEMV is faster up to 8 rows, AMX (whose packing of the weight costs about 2 ms
/// there) from about 12; 16 rows: 4.5 ms against 3.4.
pub(crate) const AMX_MIN_ROWS: usize = 9;

/// bf16 times bf16 through the packed bf16 GEMM ([`bgemm`]: AMX or AVX512-BF16), f32 out;
/// `None` where neither runs.
fn bf16_packed_product(a: &HostData, b: &HostData, spec: &MatmulSpec, threads: usize) -> Option<Result<Vec<f32>>> {
    let (HostData::BF16(a), HostData::BF16(b)) = (a, b) else { return None };
    let engine = bgemm::engine()?;
    let (a, b): (&[u16], &[u16]) = (bytemuck::cast_slice(a), bytemuck::cast_slice(b));
    let (sa, sb, sc) = (spec.m * spec.k, spec.k * spec.n, spec.m * spec.n);
    if let Err(e) = check_operands(a.len(), b.len(), spec) {
        return Some(Err(e));
    }
    let total = spec.batch * sc;
    let mut c: Vec<f32> = Vec::with_capacity(total);
    super::malloc::advise_huge_pages(c.as_ptr() as *const u8, total * 4);
    let st = strides(spec);
    for (i, ci) in c.spare_capacity_mut()[..total].chunks_mut(sc.max(1)).enumerate().take(spec.batch) {
        let ai = bgemm::HalfRef {
            data: if spec.a_batched { &a[i * sa..(i + 1) * sa] } else { a },
            rs: st.a_rs,
            cs: st.a_cs,
        };
        let bi = bgemm::HalfRef {
            data: if spec.b_batched { &b[i * sb..(i + 1) * sb] } else { b },
            rs: st.b_rs,
            cs: st.b_cs,
        };
        bgemm::bgemm_on(engine, spec.m, spec.n, spec.k, ai, bi, ci, spec.n, threads);
    }
    // SAFETY: `bgemm_on` (with the process's engine, which runs here) wrote every element of each of the
    // `batch` blocks of `m x n`, so all `total` are initialised.
    unsafe { c.set_len(total) };
    Some(Ok(c))
}

/// A product of 16-bit operands (of dtype `own`, wrapped by `wrap`) on the generated GEMM,
/// written in their type directly when `dt` is it; `None` where that GEMM does not read
/// them here.
fn half_fast<H: sgemm::Source + sgemm::Sink>(
    x: &[H],
    y: &[H],
    own: DType,
    wrap: fn(Vec<H>) -> HostData,
    spec: &MatmulSpec,
    dt: DType,
    threads: usize,
) -> Option<Result<HostData>> {
    if !sgemm::supports::<H>() {
        return None;
    }
    Some(if dt == own {
        matmul_fast(x, y, spec, threads).map(wrap)
    } else {
        matmul_fast(x, y, spec, threads).map(|c: Vec<f32>| f32::store(c, dt))
    })
}

/// Batched matmul of two same-typed float buffers.
pub(crate) fn matmul(a: &HostData, b: &HostData, spec: &MatmulSpec, dt: DType, threads: usize) -> Result<HostData> {
    matmul_with(a, b, spec, dt, threads, F32Gemm::Auto)
}

/// [`matmul`] with the f32 GEMM chosen by `path`.
pub(crate) fn matmul_with(
    a: &HostData,
    b: &HostData,
    spec: &MatmulSpec,
    dt: DType,
    threads: usize,
    path: F32Gemm,
) -> Result<HostData> {
    if !dt.is_float() {
        return Err(Error::UnsupportedDType { op: "matmul", dtype: dt });
    }
    // a few rows against a 16-bit weight stream the weight (bandwidth bound); from
    // AMX_MIN_ROWS rows on, AMX's packed GEMM is faster where it runs
    if path == F32Gemm::Auto && spec.m * spec.batch >= AMX_MIN_ROWS {
        if let Some(c) = bf16_packed_product(a, b, spec, threads) {
            return Ok(f32::store(c?, dt));
        }
    }
    if let Some(c) = half_weight_product(a, b, spec, threads) {
        return Ok(f32::store(c, dt));
    }
    if path == F32Gemm::Auto {
        if let Some(c) = bf16_packed_product(a, b, spec, threads) {
            return Ok(f32::store(c?, dt));
        }
    }
    if path.fast() {
        match (a, b) {
            (HostData::BF16(x), HostData::BF16(y)) => {
                if let Some(c) = half_fast(x, y, DType::BF16, HostData::BF16, spec, dt, threads) {
                    return c;
                }
            }
            (HostData::F16(x), HostData::F16(y)) => {
                if let Some(c) = half_fast(x, y, DType::F16, HostData::F16, spec, dt, threads) {
                    return c;
                }
            }
            _ => {}
        }
    }
    match (floats(a), floats(b)) {
        (Floats::F32(x), Floats::F32(y)) if path.fast() => {
            Ok(f32::store(matmul_fast::<f32, f32>(&x, &y, spec, threads)?, dt))
        }
        (Floats::F32(x), Floats::F32(y)) => Ok(f32::store(matmul_t(&x, &y, spec, threads, path)?, dt)),
        (Floats::F64(x), Floats::F64(y)) => Ok(f64::store(matmul_t(&x, &y, spec, threads, path)?, dt)),
        _ => Err(Error::invalid("matmul", "operands have different dtypes")),
    }
}

#[cfg(test)]
mod tests;
