//! `impl Backend for Cuda`: each primitive and fused op handed to its family's module.

use crate::context::Cuda;
use crate::storage::CudaStorage;
use redco_core::backend::{BinaryOp, CmpOp, GroupedSpec, MatmulSpec, ReduceOp, RotaryMode, UnaryOp};
use redco_core::ops::adamw::AdamStep;
use redco_core::ops::attention::AttentionSpec;
use redco_core::{Backend, DType, HostData, Result, Shape};

impl Backend for Cuda {
    type Storage = CudaStorage;
    redco_core::comm_slot!(Cuda);

    fn memory_stats(&self) -> Option<redco_core::backend::MemoryStats> {
        let s = self.memory();
        Some(redco_core::backend::MemoryStats { in_use: s.in_use as u64, peak: s.peak_in_use as u64 })
    }
    fn reset_peak_memory(&self) {
        self.inner.pool.reset_peak()
    }
    fn profile_ops(&self) -> bool {
        self.start_profile();
        true
    }
    fn op_profile(&self) -> Result<Vec<redco_core::backend::OpTime>> {
        self.take_profile()
    }
    fn peak_flops(&self, dtype: DType) -> Option<f64> {
        self.dense_peak(dtype)
    }
    fn name(&self) -> String {
        "cuda".into()
    }
    fn supports(&self, _dtype: DType) -> bool {
        true
    }
    fn upload(&self, data: &HostData) -> Result<CudaStorage> {
        self.upload_data(data)
    }
    fn download(&self, s: &CudaStorage) -> Result<HostData> {
        self.download_data(s)
    }
    fn storage_dtype(&self, s: &CudaStorage) -> DType {
        s.dtype()
    }
    fn sync(&self) -> Result<()> {
        self.inner.stream.synchronize().map_err(|e| crate::device::err(format!("a kernel failed: {e}")))
    }
    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<CudaStorage> {
        self.fill(n, value, dtype)
    }
    fn unary(&self, op: UnaryOp, x: &CudaStorage, n: usize) -> Result<CudaStorage> {
        self.unary_op(op, x, n)
    }
    fn binary(
        &self,
        op: BinaryOp,
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
    ) -> Result<CudaStorage> {
        self.binary_op(op, a, b, out)
    }
    fn compare(
        &self,
        op: CmpOp,
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
    ) -> Result<CudaStorage> {
        self.compare_op(op, a, b, out)
    }
    fn where_cond(
        &self,
        cond: (&CudaStorage, &Shape),
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
    ) -> Result<CudaStorage> {
        self.where_op(cond, a, b, out)
    }
    fn matmul(&self, a: &CudaStorage, b: &CudaStorage, spec: &MatmulSpec) -> Result<CudaStorage> {
        self.matmul_op(a, b, spec)
    }
    fn grouped_matmul(&self, x: &CudaStorage, w: &CudaStorage, spec: &GroupedSpec) -> Result<CudaStorage> {
        self.grouped_matmul_op(x, w, spec)
    }
    fn quant_matmul(
        &self,
        x: &CudaStorage,
        w: &CudaStorage,
        spec: &redco_core::ops::quant_matmul::QuantMatmulSpec,
    ) -> Result<CudaStorage> {
        self.quant_matmul_op(x, w, spec)
    }
    fn reduce(&self, op: ReduceOp, x: &CudaStorage, shape: &Shape, dim: usize) -> Result<CudaStorage> {
        self.reduce_op(op, x, shape, dim)
    }
    fn cast(&self, x: &CudaStorage, n: usize, dtype: DType) -> Result<CudaStorage> {
        self.cast_op(x, n, dtype)
    }
    fn permute(&self, x: &CudaStorage, shape: &Shape, perm: &[usize]) -> Result<CudaStorage> {
        self.permute_op(x, shape, perm)
    }
    fn expand(&self, x: &CudaStorage, shape: &Shape, out: &Shape) -> Result<CudaStorage> {
        self.expand_op(x, shape, out)
    }
    fn narrow(&self, x: &CudaStorage, shape: &Shape, dim: usize, start: usize, len: usize) -> Result<CudaStorage> {
        self.narrow_op(x, shape, dim, start, len)
    }
    fn cat(&self, xs: &[(&CudaStorage, &Shape)], dim: usize) -> Result<CudaStorage> {
        self.cat_op(xs, dim)
    }
    fn index_select(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        ids: &CudaStorage,
        n_ids: usize,
    ) -> Result<CudaStorage> {
        self.index_select_op(x, shape, dim, ids, n_ids)
    }
    fn index_add(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        ids: &CudaStorage,
        src: &CudaStorage,
    ) -> Result<CudaStorage> {
        self.index_add_op(x, shape, dim, ids, src)
    }
    fn gather(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        idx: &CudaStorage,
        idx_shape: &Shape,
    ) -> Result<CudaStorage> {
        self.gather_op(x, shape, dim, idx, idx_shape)
    }
    fn scatter_add(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        idx: &CudaStorage,
        idx_shape: &Shape,
        src: &CudaStorage,
    ) -> Result<CudaStorage> {
        self.scatter_add_op(x, shape, dim, idx, idx_shape, src)
    }

    fn softmax(&self, x: &CudaStorage, shape: &Shape) -> Result<CudaStorage> {
        self.softmax_op(x, shape, false)
    }
    fn log_softmax(&self, x: &CudaStorage, shape: &Shape) -> Result<CudaStorage> {
        self.softmax_op(x, shape, true)
    }
    fn layer_norm(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        weight: Option<&CudaStorage>,
        bias: Option<&CudaStorage>,
        eps: f64,
    ) -> Result<CudaStorage> {
        self.norm_op(x, shape, weight, bias, eps, false)
    }
    fn rms_norm(&self, x: &CudaStorage, shape: &Shape, weight: Option<&CudaStorage>, eps: f64) -> Result<CudaStorage> {
        self.norm_op(x, shape, weight, None, eps, true)
    }
    fn norm_backward(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        weight: Option<&CudaStorage>,
        g: &CudaStorage,
        eps: f64,
        rms: bool,
    ) -> Result<CudaStorage> {
        self.norm_backward_op(x, shape, weight, g, eps, rms)
    }
    fn rotary(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        cos: &CudaStorage,
        sin: &CudaStorage,
        cs_shape: &Shape,
        mode: RotaryMode,
    ) -> Result<CudaStorage> {
        self.rotary_op(x, shape, cos, sin, cs_shape, mode)
    }
    fn adamw(
        &self,
        x: &CudaStorage,
        g: &CudaStorage,
        m: &CudaStorage,
        v: &CudaStorage,
        n: usize,
        step: &AdamStep,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let (x, m, v) = (self.duplicate(x)?, self.duplicate(m)?, self.duplicate(v)?);
        self.adamw_in_place(&x, g, &m, &v, n, step)?;
        Ok((x, m, v))
    }
    fn adamw_into(
        &self,
        x: &CudaStorage,
        g: &CudaStorage,
        m: &mut CudaStorage,
        v: &mut CudaStorage,
        n: usize,
        step: &AdamStep,
    ) -> Result<CudaStorage> {
        self.adamw_into_op(x, g, m, v, n, step)
    }
    fn adamw_many(
        &self,
        items: &mut [redco_core::ops::adamw::AdamItem<'_, CudaStorage>],
        step: &AdamStep,
    ) -> Result<Vec<CudaStorage>> {
        self.adamw_many_op(items, step)
    }
    fn adamw_master_many(
        &self,
        items: &mut [redco_core::ops::adamw::AdamMasterItem<'_, CudaStorage>],
        step: &AdamStep,
        grad_scale: f64,
        copy: DType,
    ) -> Result<Vec<(CudaStorage, CudaStorage)>> {
        self.adamw_master_many_op(items, step, grad_scale, copy)
    }
    fn sum_squares_many(&self, xs: &[(&CudaStorage, &Shape)]) -> Result<CudaStorage> {
        self.sum_squares_many_op(xs)
    }
    fn cross_entropy(
        &self,
        logits: &CudaStorage,
        shape: &Shape,
        targets: &CudaStorage,
        ignore_index: i64,
    ) -> Result<CudaStorage> {
        self.xent_op(logits, shape, targets, ignore_index, None)
    }
    fn cross_entropy_backward(
        &self,
        logits: &CudaStorage,
        shape: &Shape,
        targets: &CudaStorage,
        ignore_index: i64,
        grad: &CudaStorage,
    ) -> Result<CudaStorage> {
        self.xent_op(logits, shape, targets, ignore_index, Some(grad))
    }
    fn paged_attention(
        &self,
        q: &CudaStorage,
        k: &CudaStorage,
        v: &CudaStorage,
        spec: &redco_core::ops::paged_attention::PagedSpec<'_>,
    ) -> Result<Option<CudaStorage>> {
        self.paged_attention_op(q, k, v, spec)
    }
    fn attention(
        &self,
        q: &CudaStorage,
        k: &CudaStorage,
        v: &CudaStorage,
        mask: Option<&CudaStorage>,
        spec: &AttentionSpec,
    ) -> Result<CudaStorage> {
        match self.attention_op(q, k, v, mask, spec)? {
            Some(out) => Ok(out),
            None => redco_core::ops::attention::composite_attention(self, q, k, v, mask, spec),
        }
    }
    fn attention_backward(
        &self,
        q: &CudaStorage,
        k: &CudaStorage,
        v: &CudaStorage,
        mask: Option<&CudaStorage>,
        dout: &CudaStorage,
        spec: &AttentionSpec,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        match self.attention_backward_op(q, k, v, mask, dout, spec)? {
            Some(g) => Ok(g),
            None => redco_core::ops::attention_grad::composite_attention_backward(self, q, k, v, mask, dout, spec),
        }
    }
}
