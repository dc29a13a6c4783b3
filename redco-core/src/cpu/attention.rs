//! CPU attention: the composite default (GEMM-based, on the backend's pool).
//! A fused streaming kernel is future work; the composite is already GEMM-bound.

use super::{Cpu, CpuStorage};
use crate::ops::attention::{composite_attention, AttentionSpec};
use crate::Result;

/// Attention through the composite default.
pub(crate) fn attention(
    b: &Cpu,
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    mask: Option<&CpuStorage>,
    spec: &AttentionSpec,
) -> Result<CpuStorage> {
    composite_attention(b, q, k, v, mask, spec)
}
