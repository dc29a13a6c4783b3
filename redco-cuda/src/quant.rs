//! Products with block-quantized weights (`Backend::quant_matmul`, `kernels/quant.cu`): few
//! rows (decode, up to [`GEMV_ROWS`]) read the blocks in place, a warp per weight row, the
//! blocks dequantized in registers; more rows dequantize the weight once into `x`'s dtype
//! and run one cuBLAS GEMM against its transpose.

use crate::context::{tn, Cuda};
use crate::launch::{elementwise, MAX_BLOCKS};
use crate::storage::CudaStorage;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use redco_core::backend::MatmulSpec;
use redco_core::ops::quant_matmul::QuantMatmulSpec;
use redco_core::quant::QuantFormat;
use redco_core::{DType, Error, Result};

/// Rows of `x` up to which the product reads the blocks in place.
pub const GEMV_ROWS: usize = 16;
/// Warps per block of the in-place product (one weight row each).
const GEMV_WARPS: u32 = 4;

/// The format's code in `kernels/quant.cu`.
fn code(f: QuantFormat) -> i32 {
    match f {
        QuantFormat::Q4_0 => 0,
        QuantFormat::Q4_1 => 1,
        QuantFormat::Q8_0 => 2,
        QuantFormat::Q4K => 3,
        QuantFormat::Q6K => 4,
    }
}

/// The in-place product's launch over `n` weight rows.
fn gemv(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(GEMV_WARPS as u64).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (32 * GEMV_WARPS, 1, 1), shared_mem_bytes: 0 }
}

impl Cuda {
    pub(crate) fn quant_matmul_op(&self, x: &CudaStorage, w: &CudaStorage, s: &QuantMatmulSpec) -> Result<CudaStorage> {
        let QuantMatmulSpec { m, n, k, format } = *s;
        if w.dtype() != DType::U8 {
            return Err(Error::invalid("quant_matmul", format!("blocks must be U8, got {:?}", w.dtype())));
        }
        let dt = x.dtype();
        if !dt.is_float() {
            return Err(Error::UnsupportedDType { op: "quant_matmul", dtype: dt });
        }
        let row = format.row_bytes(k)?;
        if w.len() != n * row || x.len() != m * k {
            return Err(Error::invalid(
                "quant_matmul",
                format!("{} bytes and {} values for [{m}, {k}] @ [{n}, {k}] of {format}", w.len(), x.len()),
            ));
        }
        if m == 0 || n == 0 {
            return self.alloc(m * n, dt);
        }
        if k == 0 {
            return self.fill(m * n, 0.0, dt);
        }
        let (xp, wp, fmt) = (x.ptr(), w.ptr(), code(format));
        let (mi, ni, ki, ri) = (m as i64, n as i64, k as i64, row as i64);
        if m <= GEMV_ROWS {
            let y = self.alloc(m * n, dt)?;
            let f = self.function("quant", &format!("quant_gemv_{}", tn(dt)))?;
            let yp = y.ptr();
            self.launch(&f, gemv(n), |l| {
                l.arg(&xp).arg(&wp).arg(&yp).arg(&mi).arg(&ni).arg(&ki).arg(&ri).arg(&fmt);
            })?;
            return Ok(y);
        }
        let wt = self.alloc(n * k, dt)?;
        let f = self.function("quant", &format!("quant_dequant_{}", tn(dt)))?;
        let tp = wt.ptr();
        self.launch(&f, elementwise(n * (k / 32)), |l| {
            l.arg(&wp).arg(&tp).arg(&ni).arg(&ki).arg(&ri).arg(&fmt);
        })?;
        let spec = MatmulSpec { batch: 1, m, n, k, trans_a: false, trans_b: true, a_batched: false, b_batched: false };
        self.matmul_op(x, &wt, &spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_its_kernel_code_and_weight_rows_are_covered() {
        let codes: Vec<i32> = QuantFormat::ALL.iter().map(|&f| code(f)).collect();
        let mut sorted = codes.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        for n in [1usize, 4, 5, 4096, 1 << 20] {
            let c = gemv(n);
            let rows = c.grid_dim.0 as usize * GEMV_WARPS as usize;
            assert!(rows >= n || c.grid_dim.0 as u64 == MAX_BLOCKS, "{n}");
        }
    }
}
