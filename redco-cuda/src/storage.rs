//! [`CudaStorage`]: a device buffer from the caching allocator with its dtype and length.

use crate::alloc::Pool;
use crate::bounds::Bounds;
use crate::context::Cuda;
use crate::device::err;
use cudarc::driver::sys::CUdeviceptr;
use redco_core::{DType, HostData, Result};
use std::sync::{Arc, OnceLock};

/// One contiguous device buffer; cloning shares it, the last clone returns it to the pool.
#[derive(Clone, Debug)]
pub struct CudaStorage(pub(crate) Arc<Buf>);

/// The buffer behind a [`CudaStorage`].
pub(crate) struct Buf {
    pub(crate) ptr: CUdeviceptr,
    class: usize,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    /// The range of an integer buffer's values where the host knows it (see [`Bounds`]).
    bounds: OnceLock<Bounds>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuf({:?} x {})", self.dtype, self.len)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.pool.give(self.ptr, self.class);
    }
}

impl CudaStorage {
    /// The device address.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.0.ptr
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.0.len
    }
    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// The range of the values where the host knows it.
    pub(crate) fn bounds(&self) -> Option<Bounds> {
        self.0.bounds.get().copied()
    }
    /// Records the range of a buffer just written (a buffer's values never change after
    /// its op returns it, so the first record stands).
    pub(crate) fn know(&self, b: Option<Bounds>) {
        if let Some(b) = b {
            let _ = self.0.bounds.set(b);
        }
    }
    /// Whether every value is known, without a read-back, to index `0..size` or to equal
    /// `except`.
    pub(crate) fn known_within(&self, size: usize, except: Option<i64>) -> bool {
        self.bounds().is_some_and(|b| b.within(size, except))
    }
}

impl Cuda {
    /// A new uninitialised buffer of `len` elements of `dtype`.
    pub(crate) fn alloc(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        let bytes = len.checked_mul(dtype.size_in_bytes()).ok_or_else(|| err(format!("{len} elements overflow")))?;
        let (ptr, class) = self.inner.pool.take(bytes)?;
        Ok(CudaStorage(Arc::new(Buf {
            ptr,
            class,
            dtype,
            len,
            bounds: OnceLock::new(),
            pool: self.inner.pool.clone(),
        })))
    }

    /// Copies host data into a new buffer.
    pub(crate) fn upload_data(&self, data: &HostData) -> Result<CudaStorage> {
        let s = self.alloc(data.len(), data.dtype())?;
        let bytes = data.as_bytes();
        if !bytes.is_empty() {
            self.inner.ctx.bind_to_thread().map_err(err)?;
            // SAFETY: the buffer holds `bytes.len()` bytes; the copy from pageable host memory
            // has read the source before it returns
            self.timed("host copies", || {
                unsafe { cudarc::driver::result::memcpy_htod_async(s.ptr(), bytes, self.inner.stream.cu_stream()) }
                    .map_err(|e| err(format!("copy to the GPU failed: {e}")))
            })?;
        }
        s.know(match data {
            HostData::I64(v) => Some(Bounds::of(v.iter().copied())),
            HostData::I32(v) => Some(Bounds::of(v.iter().map(|&x| x as i64))),
            _ => None,
        });
        Ok(s)
    }

    /// Copies a buffer back to the host (waits for the work queued before it).
    pub(crate) fn download_data(&self, s: &CudaStorage) -> Result<HostData> {
        let mut bytes = vec![0u8; s.len() * s.dtype().size_in_bytes()];
        if !bytes.is_empty() {
            self.inner.ctx.bind_to_thread().map_err(err)?;
            // SAFETY: `bytes` is as long as the buffer; the stream is synchronised before it is read
            self.timed("host copies", || {
                unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut bytes, s.ptr(), self.inner.stream.cu_stream()) }
                    .map_err(|e| err(format!("copy from the GPU failed: {e}")))
            })?;
        }
        self.inner.stream.synchronize().map_err(|e| err(format!("a kernel failed: {e}")))?;
        HostData::from_bytes(s.dtype(), &bytes)
    }

    /// A zeroed i32 flag on the device, for kernels that report bad ids.
    pub(crate) fn flag(&self) -> Result<CudaStorage> {
        self.upload_data(&HostData::I32(vec![0]))
    }

    /// Whether a flag from [`Cuda::flag`] was set (reads it back).
    pub(crate) fn flag_set(&self, f: &CudaStorage) -> Result<bool> {
        Ok(self.download_data(f)?.to_i64_vec()?.first().copied().unwrap_or(0) != 0)
    }
}
