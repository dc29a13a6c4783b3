//! Batched matmuls through cuBLAS (`cublasGemmStridedBatchedEx`): f32 (TF32 tensor cores
//! when `Cuda::set_tf32(true)`: `--cuda-tf32`), f64, and bf16 / f16 on tensor cores with f32 accumulation;
//! a mixture of experts' grouped matmul as one GEMM per non-empty group on its operands in
//! place.
//!
//! cuBLAS is column-major; a row-major `C = op(A) op(B)` is the column-major
//! `C^T = op(B)^T op(A)^T`, so the operands go in swapped, each with its own transpose.

use crate::context::Cuda;
use crate::device::err;
use crate::elementwise::same;
use crate::storage::CudaStorage;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use redco_core::backend::{GroupedSpec, MatmulSpec};
use redco_core::{DType, Error, Result};
use std::ffi::c_void;

/// cuBLAS's arguments for one spec (column-major view), unit-tested on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gemm {
    /// Rows of the column-major result (= n).
    pub m: i32,
    /// Columns of the column-major result (= m).
    pub n: i32,
    pub k: i32,
    /// Transpose of the first operand (B).
    pub ta: bool,
    /// Transpose of the second operand (A).
    pub tb: bool,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
}

pub(crate) fn plan(s: &MatmulSpec) -> Result<Gemm> {
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| Error::invalid("matmul", format!("dimension {v} is above cuBLAS's 32-bit limit")))
    };
    Ok(Gemm {
        m: int(s.n)?,
        n: int(s.m)?,
        k: int(s.k)?,
        ta: s.trans_b,
        tb: s.trans_a,
        // B stored [k, n] (row-major) is column-major [n, k] with ld n; stored [n, k], ld k
        lda: int(if s.trans_b { s.k } else { s.n }.max(1))?,
        ldb: int(if s.trans_a { s.m } else { s.k }.max(1))?,
        ldc: int(s.n.max(1))?,
        stride_a: if s.b_batched { (s.k * s.n) as i64 } else { 0 },
        stride_b: if s.a_batched { (s.m * s.k) as i64 } else { 0 },
        stride_c: (s.m * s.n) as i64,
    })
}

/// One group's GEMM of a grouped matmul: its plan and the element offsets of its rows in
/// `x`, its matrix in `w` and its rows in the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupGemm {
    pub gemm: Gemm,
    pub x_at: usize,
    pub w_at: usize,
    pub out_at: usize,
}

/// The GEMMs of a grouped matmul, one per non-empty group (unit-tested on the host):
/// group `e`'s `counts[e]` rows of `x [T, k]`, starting after the groups before it, times
/// its matrix `w[e]` (`[n, k]` with `trans_w`, else `[k, n]`), into the same rows of the
/// result `[T, n]`.
pub(crate) fn grouped_plan(spec: &GroupedSpec) -> Result<Vec<GroupGemm>> {
    let (k, n) = (spec.k, spec.n);
    let mut at = 0;
    let mut out = Vec::new();
    for (e, &c) in spec.counts.iter().enumerate() {
        if c > 0 {
            let one = MatmulSpec {
                batch: 1,
                m: c,
                n,
                k,
                trans_a: false,
                trans_b: spec.trans_w,
                a_batched: false,
                b_batched: false,
            };
            out.push(GroupGemm { gemm: plan(&one)?, x_at: at * k, w_at: e * n * k, out_at: at * n });
        }
        at += c;
    }
    Ok(out)
}

impl Cuda {
    /// cuBLAS's data and compute types for `dt`.
    fn gemm_types(&self, dt: DType, op: &'static str) -> Result<(cudaDataType, cublasComputeType_t)> {
        Ok(match dt {
            DType::F32 if self.tf32() => (cudaDataType::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32),
            DType::F32 => (cudaDataType::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F),
            DType::F64 => (cudaDataType::CUDA_R_64F, cublasComputeType_t::CUBLAS_COMPUTE_64F),
            DType::BF16 => (cudaDataType::CUDA_R_16BF, cublasComputeType_t::CUBLAS_COMPUTE_32F),
            DType::F16 => (cudaDataType::CUDA_R_16F, cublasComputeType_t::CUBLAS_COMPUTE_32F),
            d => return Err(Error::UnsupportedDType { op, dtype: d }),
        })
    }

    /// Queues the row-major GEMM `g` (batch `batch`) on the stream, timed as a matmul:
    /// `(a, b, c)` are the device addresses of the row-major operands and the result.
    ///
    /// # Safety
    /// The addresses must hold what `g` reads and writes, in `dt`.
    unsafe fn gemm(
        &self,
        g: &Gemm,
        (a, b, c): (u64, u64, u64),
        batch: i32,
        dt: DType,
        (data, compute): (cudaDataType, cublasComputeType_t),
    ) -> Result<()> {
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if dt == DType::F64 {
            (&one64 as *const f64 as _, &zero64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &zero32 as *const f32 as _)
        };
        let blas = self.blas()?;
        self.inner.ctx.bind_to_thread().map_err(err)?;
        // alpha and beta live on this frame through the call, which only queues the GEMM
        self.timed("matmul", || {
            unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    *blas.handle(),
                    op(g.ta),
                    op(g.tb),
                    g.m,
                    g.n,
                    g.k,
                    alpha,
                    b as *const c_void,
                    data,
                    g.lda,
                    g.stride_a,
                    a as *const c_void,
                    data,
                    g.ldb,
                    g.stride_b,
                    beta,
                    c as *mut c_void,
                    data,
                    g.ldc,
                    g.stride_c,
                    batch,
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| err(format!("{e}")))
        })
    }

    /// The grouped matmul of a mixture of experts ([`GroupedSpec`]): one cuBLAS GEMM per
    /// non-empty group, each reading its rows and its expert's matrix in place and writing
    /// its rows of the result (no copies of the operands, as the composite makes).
    pub(crate) fn grouped_matmul_op(&self, x: &CudaStorage, w: &CudaStorage, s: &GroupedSpec) -> Result<CudaStorage> {
        same(x, w, "grouped_matmul")?;
        let rows: usize = s.counts.iter().sum();
        if x.len() != rows * s.k || w.len() != s.counts.len() * s.n * s.k {
            return Err(Error::invalid(
                "grouped_matmul",
                format!("operands of {} and {} elements for {s:?}", x.len(), w.len()),
            ));
        }
        let dt = x.dtype();
        let types = self.gemm_types(dt, "grouped_matmul")?;
        let c = self.alloc(rows * s.n, dt)?;
        if c.is_empty() {
            return Ok(c);
        }
        if s.k == 0 {
            return self.fill(c.len(), 0.0, dt);
        }
        let bytes = dt.size_in_bytes() as u64;
        for g in grouped_plan(s)? {
            let at = |base: u64, elems: usize| base + elems as u64 * bytes;
            let ptrs = (at(x.ptr(), g.x_at), at(w.ptr(), g.w_at), at(c.ptr(), g.out_at));
            // SAFETY: the lengths were checked against the spec above, and each group's
            // rows and matrix lie inside them (`grouped_plan`)
            unsafe { self.gemm(&g.gemm, ptrs, 1, dt, types) }
                .map_err(|e| err(format!("cuBLAS GEMM failed for a group of {s:?}: {e}")))?;
        }
        Ok(c)
    }

    pub(crate) fn matmul_op(&self, a: &CudaStorage, b: &CudaStorage, s: &MatmulSpec) -> Result<CudaStorage> {
        same(a, b, "matmul")?;
        let need_a = s.m * s.k * if s.a_batched { s.batch } else { 1 };
        let need_b = s.k * s.n * if s.b_batched { s.batch } else { 1 };
        if a.len() != need_a || b.len() != need_b {
            return Err(Error::invalid(
                "matmul",
                format!("operands of {} and {} elements for {s:?}", a.len(), b.len()),
            ));
        }
        let dt = a.dtype();
        let c = self.alloc(s.batch * s.m * s.n, dt)?;
        if c.is_empty() {
            return Ok(c);
        }
        if s.k == 0 {
            return self.fill(c.len(), 0.0, dt);
        }
        let (data, compute) = self.gemm_types(dt, "matmul")?;
        let g = plan(s)?;
        let batch =
            i32::try_from(s.batch).map_err(|_| Error::invalid("matmul", "batch above cuBLAS's 32-bit limit"))?;
        // SAFETY: the operand lengths were checked against the spec above
        unsafe { self.gemm(&g, (a.ptr(), b.ptr(), c.ptr()), batch, dt, (data, compute)) }
            .map_err(|e| err(format!("cuBLAS GEMM failed for {s:?}: {e}")))?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The column-major product cuBLAS computes from `plan`, done on the host: it must equal
    /// the row-major product the spec asks for.
    fn emulate(s: &MatmulSpec, a: &[f64], b: &[f64]) -> Vec<f64> {
        let g = plan(s).unwrap();
        let mut c = vec![0.0; s.batch * s.m * s.n];
        // column-major element (r, col) of X with leading dimension ld
        let at = |x: &[f64], off: usize, ld: i32, r: usize, col: usize| x[off + r + col * ld as usize];
        for bt in 0..s.batch {
            for r in 0..g.m as usize {
                for col in 0..g.n as usize {
                    let mut acc = 0.0;
                    for p in 0..g.k as usize {
                        let x = if g.ta {
                            at(b, bt * g.stride_a as usize, g.lda, p, r)
                        } else {
                            at(b, bt * g.stride_a as usize, g.lda, r, p)
                        };
                        let y = if g.tb {
                            at(a, bt * g.stride_b as usize, g.ldb, col, p)
                        } else {
                            at(a, bt * g.stride_b as usize, g.ldb, p, col)
                        };
                        acc += x * y;
                    }
                    c[bt * g.stride_c as usize + r + col * g.ldc as usize] = acc;
                }
            }
        }
        c
    }

    /// Each group's GEMM of `grouped_plan`, done on the host as cuBLAS would (column-major,
    /// from the group's offsets), equals the grouped product: empty groups, every row in
    /// one group, both weight layouts.
    #[test]
    fn the_grouped_plan_computes_each_groups_rows_in_place() {
        let (k, n) = (5, 3);
        for counts in [vec![2, 0, 3, 1], vec![0, 6, 0, 0], vec![1, 1, 1, 1], vec![0, 0, 0, 0]] {
            for trans_w in [true, false] {
                let e = counts.len();
                let rows: usize = counts.iter().sum();
                let spec = GroupedSpec { counts: counts.clone(), k, n, trans_w };
                let x: Vec<f64> = (0..rows * k).map(|i| (i as f64 * 0.37).sin()).collect();
                let w: Vec<f64> = (0..e * n * k).map(|i| (i as f64 * 0.61).cos()).collect();
                let mut got = vec![f64::NAN; rows * n];
                for g in grouped_plan(&spec).unwrap() {
                    let one = MatmulSpec {
                        batch: 1,
                        m: g.gemm.n as usize,
                        n,
                        k,
                        trans_a: false,
                        trans_b: trans_w,
                        a_batched: false,
                        b_batched: false,
                    };
                    assert_eq!(plan(&one).unwrap(), g.gemm);
                    let c = emulate(&one, &x[g.x_at..], &w[g.w_at..g.w_at + n * k]);
                    got[g.out_at..g.out_at + c.len()].copy_from_slice(&c);
                }
                let mut at = 0;
                for (ex, &c) in counts.iter().enumerate() {
                    for r in at..at + c {
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|p| {
                                    let wv = if trans_w { w[(ex * n + j) * k + p] } else { w[(ex * k + p) * n + j] };
                                    x[r * k + p] * wv
                                })
                                .sum();
                            assert!((got[r * n + j] - want).abs() < 1e-12, "{counts:?} {trans_w}: row {r}, col {j}");
                        }
                    }
                    at += c;
                }
            }
        }
    }

    #[test]
    fn the_plan_computes_the_row_major_product_in_every_layout() {
        for (ta, tb, ab, bb) in [
            (false, false, true, true),
            (true, false, true, false),
            (false, true, false, true),
            (true, true, true, true),
        ] {
            let s = MatmulSpec { batch: 2, m: 3, n: 4, k: 5, trans_a: ta, trans_b: tb, a_batched: ab, b_batched: bb };
            let a: Vec<f64> = (0..s.m * s.k * if ab { 2 } else { 1 }).map(|i| (i as f64 * 0.37).sin()).collect();
            let b: Vec<f64> = (0..s.k * s.n * if bb { 2 } else { 1 }).map(|i| (i as f64 * 0.61).cos()).collect();
            let got = emulate(&s, &a, &b);
            for bt in 0..2 {
                for i in 0..3 {
                    for j in 0..4 {
                        let mut want = 0.0;
                        for p in 0..5 {
                            let (ao, bo) = (if ab { bt * 15 } else { 0 }, if bb { bt * 20 } else { 0 });
                            let x = if ta { a[ao + p * 3 + i] } else { a[ao + i * 5 + p] };
                            let y = if tb { b[bo + j * 5 + p] } else { b[bo + p * 4 + j] };
                            want += x * y;
                        }
                        assert!((got[bt * 12 + i * 4 + j] - want).abs() < 1e-12, "{s:?} at {bt},{i},{j}");
                    }
                }
            }
        }
    }
}
