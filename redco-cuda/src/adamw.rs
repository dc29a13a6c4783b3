//! AdamW on the GPU (`kernels/adamw.cu`): one tensor in place, or every parameter of a
//! step in one launch (a table of the tensors' addresses and a list of fixed-size chunks,
//! so a block's work does not depend on how the parameters are sized).

use crate::context::{tn, Cuda};
use crate::elementwise::same;
use crate::launch::elementwise;
use crate::storage::CudaStorage;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use redco_core::ops::adamw::{AdamItem, AdamMasterItem, AdamStep};
use redco_core::{DType, Error, HostData, Result};

/// `AdamStep` as the kernel takes it.
#[repr(C)]
#[derive(Clone, Copy)]
struct Step {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    wd: f64,
    bias1: f64,
    bias2: f64,
}
// SAFETY: a #[repr(C)] block of f64, laid out as the kernel's `AdamStep`
unsafe impl DeviceRepr for Step {}

impl From<&AdamStep> for Step {
    fn from(h: &AdamStep) -> Step {
        Step {
            lr: h.lr,
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            wd: h.weight_decay,
            bias1: h.bias1,
            bias2: h.bias2,
        }
    }
}

/// Elements per chunk of the multi-tensor launch (a block of 256 threads takes 16 each).
pub(crate) const CHUNK: usize = 4096;
/// Threads per block of the multi-tensor launch.
const THREADS: u32 = 256;
/// At most this many blocks; each loops over the chunks (grid stride).
const MAX_BLOCKS: usize = 4096;

/// The chunks of a multi-tensor launch over tensors of `sizes` elements: `(tensor, first
/// element)` for every `chunk` elements of each tensor, in order; empty tensors have none.
pub(crate) fn chunks(sizes: &[usize], chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1);
    sizes.iter().enumerate().flat_map(|(t, &n)| (0..n.div_ceil(chunk)).map(move |c| (t, c * chunk))).collect()
}

/// The launch over `n_chunks` chunks.
pub(crate) fn many_config(n_chunks: usize) -> LaunchConfig {
    let blocks = n_chunks.clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// A multi-tensor launch's tables on the device (`kernels/adamw.cu`, `kernels/reduce.cu`'s
/// sum of squares): each tensor's row of addresses followed by its length, and the chunk
/// list (two i64 per chunk: the tensor, the chunk's first element).
pub(crate) struct MultiTensor {
    /// The per-tensor rows.
    pub table: CudaStorage,
    /// The chunk list.
    pub list: CudaStorage,
    /// Chunks in the list.
    pub chunks: usize,
}

/// The per-tensor rows of a multi-tensor table: each row's addresses, then the tensor's
/// length.
fn table_of(rows: &[Vec<u64>], sizes: &[usize]) -> Vec<i64> {
    rows.iter().zip(sizes).flat_map(|(r, &n)| r.iter().map(|&p| p as i64).chain([n as i64])).collect()
}

impl Cuda {
    /// Uploads the tables of a launch over tensors whose rows of addresses are `rows` and
    /// whose lengths are `sizes`, in chunks of `chunk` elements; `None` when no tensor has
    /// an element. The tables go with the launch on the stream: the kernel reads them
    /// before any later op can reuse their buffers.
    pub(crate) fn multi_tensor(&self, rows: &[Vec<u64>], sizes: &[usize], chunk: usize) -> Result<Option<MultiTensor>> {
        let list: Vec<i64> = chunks(sizes, chunk).into_iter().flat_map(|(t, s)| [t as i64, s as i64]).collect();
        if list.is_empty() {
            return Ok(None);
        }
        let chunks = list.len() / 2;
        Ok(Some(MultiTensor {
            table: self.upload_data(&HostData::I64(table_of(rows, sizes)))?,
            list: self.upload_data(&HostData::I64(list))?,
            chunks,
        }))
    }
}

/// Checks one item as [`Cuda::adamw_in_place`] does.
fn check(x: &CudaStorage, g: &CudaStorage, m: &CudaStorage, v: &CudaStorage, n: usize) -> Result<()> {
    for t in [g, m, v] {
        same(x, t, "adamw")?;
    }
    if [x, g, m, v].iter().any(|t| t.len() != n) {
        return Err(Error::invalid("adamw", format!("parameter, gradient and moments must all hold {n} elements")));
    }
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType { op: "adamw", dtype: x.dtype() });
    }
    Ok(())
}

impl Cuda {
    /// One AdamW step in place on `x`, `m` and `v` (buffers the caller owns alone).
    pub(crate) fn adamw_in_place(
        &self,
        x: &CudaStorage,
        g: &CudaStorage,
        m: &CudaStorage,
        v: &CudaStorage,
        n: usize,
        h: &AdamStep,
    ) -> Result<()> {
        check(x, g, m, v, n)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.function("adamw", &format!("adamw_{}", tn(x.dtype())))?;
        let s = Step::from(h);
        let (xp, gp, mp, vp, n64) = (x.ptr(), g.ptr(), m.ptr(), v.ptr(), n as i64);
        self.launch(&f, elementwise(n), |l| {
            l.arg(&xp).arg(&gp).arg(&mp).arg(&vp).arg(&n64).arg(&s);
        })
    }

    /// Moments shared with someone else (a checkpoint being written) are copied first, so
    /// the update writes only buffers this step owns.
    fn own(&self, t: &mut CudaStorage) -> Result<()> {
        if std::sync::Arc::strong_count(&t.0) != 1 {
            *t = self.duplicate(t)?;
        }
        Ok(())
    }

    /// [`redco_core::Backend::adamw_into`]: the moments updated where they are, the new
    /// parameter in a new buffer.
    pub(crate) fn adamw_into_op(
        &self,
        x: &CudaStorage,
        g: &CudaStorage,
        m: &mut CudaStorage,
        v: &mut CudaStorage,
        n: usize,
        h: &AdamStep,
    ) -> Result<CudaStorage> {
        self.own(m)?;
        self.own(v)?;
        let x = self.duplicate(x)?;
        self.adamw_in_place(&x, g, m, v, n, h)?;
        Ok(x)
    }

    /// [`redco_core::Backend::adamw_many`]: one launch per dtype for every item (the
    /// parameter read from its buffer, the new one written to a fresh buffer, the moments
    /// updated in place).
    pub(crate) fn adamw_many_op(
        &self,
        items: &mut [AdamItem<'_, CudaStorage>],
        h: &AdamStep,
    ) -> Result<Vec<CudaStorage>> {
        let mut out = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            check(it.x, it.g, it.m, it.v, it.n)?;
            self.own(it.m)?;
            self.own(it.v)?;
            out.push(self.alloc(it.n, it.x.dtype())?);
        }
        let s = Step::from(h);
        for dt in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            let of: Vec<usize> = (0..items.len()).filter(|&i| items[i].x.dtype() == dt).collect();
            if of.is_empty() {
                continue;
            }
            let rows: Vec<Vec<u64>> = of
                .iter()
                .map(|&i| vec![items[i].x.ptr(), out[i].ptr(), items[i].g.ptr(), items[i].m.ptr(), items[i].v.ptr()])
                .collect();
            let sizes: Vec<usize> = of.iter().map(|&i| items[i].n).collect();
            let Some(t) = self.multi_tensor(&rows, &sizes, CHUNK)? else { continue };
            let f = self.function("adamw", &format!("adamw_many_{}", tn(dt)))?;
            let (tp, cp, nc, ch) = (t.table.ptr(), t.list.ptr(), t.chunks as i64, CHUNK as i64);
            self.launch(&f, many_config(t.chunks), |l| {
                l.arg(&tp).arg(&cp).arg(&nc).arg(&ch).arg(&s);
            })?;
        }
        Ok(out)
    }
}

impl Cuda {
    /// [`redco_core::Backend::adamw_master_many`]: one launch per gradient dtype; each new
    /// master and compute copy in a fresh buffer (the old master is read, never written),
    /// the moments updated in place.
    pub(crate) fn adamw_master_many_op(
        &self,
        items: &mut [AdamMasterItem<'_, CudaStorage>],
        h: &AdamStep,
        grad_scale: f64,
        copy: DType,
    ) -> Result<Vec<(CudaStorage, CudaStorage)>> {
        if ![DType::F32, DType::BF16, DType::F16].contains(&copy) {
            return Err(Error::UnsupportedDType { op: "adamw_master_many (compute copy)", dtype: copy });
        }
        let mut out = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            for (t, what) in [(it.x, "master"), (&*it.m, "first moment"), (&*it.v, "second moment")] {
                if t.dtype() != DType::F32 {
                    return Err(Error::invalid("adamw_master_many", format!("the {what} is {:?}, not F32", t.dtype())));
                }
            }
            let gd = it.g.dtype();
            let pair = (gd == DType::F32) || (gd == copy);
            if !gd.is_float() || gd == DType::F64 || !pair {
                return Err(Error::invalid(
                    "adamw_master_many",
                    format!("no kernel for {gd:?} gradients with {copy:?} copies (f32 gradients, or the copy's dtype)"),
                ));
            }
            if [it.x, it.g, &*it.m, &*it.v].iter().any(|t| t.len() != it.n) {
                return Err(Error::invalid("adamw_master_many", format!("every buffer must hold {} elements", it.n)));
            }
            self.own(it.m)?;
            self.own(it.v)?;
            out.push((self.alloc(it.n, DType::F32)?, self.alloc(it.n, copy)?));
        }
        let s = Step::from(h);
        let grads: &[DType] = if copy == DType::F32 { &[DType::F32] } else { &[DType::F32, copy] };
        for &gd in grads {
            let of: Vec<usize> = (0..items.len()).filter(|&i| items[i].g.dtype() == gd).collect();
            if of.is_empty() {
                continue;
            }
            let rows: Vec<Vec<u64>> = of
                .iter()
                .map(|&i| {
                    let it = &items[i];
                    vec![it.x.ptr(), out[i].0.ptr(), out[i].1.ptr(), it.g.ptr(), it.m.ptr(), it.v.ptr()]
                })
                .collect();
            let sizes: Vec<usize> = of.iter().map(|&i| items[i].n).collect();
            let Some(t) = self.multi_tensor(&rows, &sizes, CHUNK)? else { continue };
            let f = self.function("adamw", &format!("adamw_master_{}_{}", tn(gd), tn(copy)))?;
            let (tp, cp, nc, ch) = (t.table.ptr(), t.list.ptr(), t.chunks as i64, CHUNK as i64);
            self.launch(&f, many_config(t.chunks), |l| {
                l.arg(&tp).arg(&cp).arg(&nc).arg(&ch).arg(&s).arg(&grad_scale);
            })?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{chunks, many_config, table_of, CHUNK};

    #[test]
    fn a_table_row_is_the_addresses_then_the_length() {
        // adamw_many's six i64 a tensor, the master form's seven, the sum of squares' two
        assert_eq!(table_of(&[vec![10, 20], vec![30, 40]], &[5, 6]), vec![10, 20, 5, 30, 40, 6]);
        let seven = table_of(&[vec![1, 2, 3, 4, 5, 6]], &[9]);
        assert_eq!((seven.len(), seven[6]), (7, 9));
    }

    #[test]
    fn every_element_is_in_exactly_one_chunk() {
        let sizes = [0, 1, CHUNK, CHUNK + 1, 3 * CHUNK - 1, 7];
        let list = chunks(&sizes, CHUNK);
        for (t, &n) in sizes.iter().enumerate() {
            let mut covered = vec![0u8; n];
            for &(_, s) in list.iter().filter(|(tt, _)| *tt == t) {
                assert_eq!(s % CHUNK, 0);
                for c in covered.iter_mut().skip(s).take(CHUNK) {
                    *c += 1;
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "tensor {t} of {n} elements");
        }
        assert_eq!(list.len(), 1 + 1 + 2 + 3 + 1);
        assert!(list.windows(2).all(|w| w[0] < w[1]), "in order");
    }

    #[test]
    fn the_grid_is_bounded_and_never_empty() {
        assert_eq!(many_config(0).grid_dim.0, 1);
        assert_eq!(many_config(10).grid_dim.0, 10);
        assert_eq!(many_config(1 << 20).grid_dim.0, 4096);
        assert_eq!(chunks(&[5], 0), vec![(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)], "a chunk of at least one");
    }
}
