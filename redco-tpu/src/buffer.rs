//! Device buffers: host data to a device and back, in every redco dtype.

use crate::api::pjrt_error;
use crate::client::{Client, Device};
use crate::event::await_event;
use crate::ffi::{self, Sized as _};
use crate::pjrt;
use redco_core::{DType, HostData, Result};

/// The PJRT element type of a redco dtype.
pub(crate) fn pjrt_type(d: DType) -> ffi::PJRT_Buffer_Type {
    match d {
        DType::F32 => ffi::PJRT_Buffer_Type_F32,
        DType::F64 => ffi::PJRT_Buffer_Type_F64,
        DType::F16 => ffi::PJRT_Buffer_Type_F16,
        DType::BF16 => ffi::PJRT_Buffer_Type_BF16,
        DType::I64 => ffi::PJRT_Buffer_Type_S64,
        DType::I32 => ffi::PJRT_Buffer_Type_S32,
        DType::U8 => ffi::PJRT_Buffer_Type_U8,
    }
}

/// The redco dtype of a PJRT element type, if it has one.
pub(crate) fn redco_type(t: ffi::PJRT_Buffer_Type) -> Option<DType> {
    Some(match t {
        ffi::PJRT_Buffer_Type_F32 => DType::F32,
        ffi::PJRT_Buffer_Type_F64 => DType::F64,
        ffi::PJRT_Buffer_Type_F16 => DType::F16,
        ffi::PJRT_Buffer_Type_BF16 => DType::BF16,
        ffi::PJRT_Buffer_Type_S64 => DType::I64,
        ffi::PJRT_Buffer_Type_S32 => DType::I32,
        ffi::PJRT_Buffer_Type_U8 | ffi::PJRT_Buffer_Type_PRED => DType::U8,
        _ => return None,
    })
}

/// One array on one device, destroyed when dropped.
pub struct Buffer {
    client: Client,
    pub(crate) raw: *mut ffi::PJRT_Buffer,
    dtype: DType,
    dims: Vec<usize>,
}

// SAFETY: PJRT buffers may be used and destroyed from any thread; the handle is destroyed
// once, on drop.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PjrtBuffer({:?} {:?})", self.dtype, self.dims)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_Buffer_Destroy_Args::new();
        a.buffer = self.raw;
        let _ = pjrt!(self.client.inner.api, PJRT_Buffer_Destroy, &mut a);
    }
}

/// `n` zeros of `dtype`.
fn zeros(dtype: DType, n: usize) -> HostData {
    use half::{bf16, f16};
    match dtype {
        DType::F32 => HostData::F32(vec![0.0; n]),
        DType::F64 => HostData::F64(vec![0.0; n]),
        DType::F16 => HostData::F16(vec![f16::ZERO; n]),
        DType::BF16 => HostData::BF16(vec![bf16::ZERO; n]),
        DType::I64 => HostData::I64(vec![0; n]),
        DType::I32 => HostData::I32(vec![0; n]),
        DType::U8 => HostData::U8(vec![0; n]),
    }
}

impl Client {
    /// Checks that `bytes` more fit on `device`, naming both sizes when they do not.
    pub(crate) fn check_fits(&self, device: &Device, bytes: usize, what: &str) -> Result<()> {
        match device.memory_bytes {
            Some(limit) if bytes as u64 > limit => Err(pjrt_error(
                what,
                format!(
                    "a buffer of {bytes} bytes ({:.2} GiB) does not fit on {} device {} ({:.2} GiB of memory)",
                    bytes as f64 / (1u64 << 30) as f64,
                    self.platform(),
                    device.id,
                    limit as f64 / (1u64 << 30) as f64
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Copies `data` (row-major, shaped `dims`) to the device at `device`.
    pub fn upload(&self, device: usize, data: &HostData, dims: &[usize]) -> Result<Buffer> {
        let dev = self.device(device)?;
        let n: usize = dims.iter().product();
        if n != data.len() {
            return Err(pjrt_error(
                "upload",
                format!("shape {dims:?} needs {n} elements, the data has {}", data.len()),
            ));
        }
        let bytes = data.as_bytes();
        self.check_fits(dev, bytes.len(), "upload")?;
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut a = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        a.client = self.inner.raw;
        a.data = bytes.as_ptr() as *const _;
        a.type_ = pjrt_type(data.dtype());
        a.dims = dims_i64.as_ptr();
        a.num_dims = dims_i64.len();
        a.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
        a.device = dev.raw;
        pjrt!(self.inner.api, PJRT_Client_BufferFromHostBuffer, &mut a)?;
        let buf = Buffer { client: self.clone(), raw: a.buffer, dtype: data.dtype(), dims: dims.to_vec() };
        // `data` must stay untouched until the transfer completes.
        await_event(self.inner.api, a.done_with_host_buffer, "upload")?;
        Ok(buf)
    }

    /// Wraps an output buffer of an execution, reading its type and dimensions.
    pub(crate) fn adopt(&self, raw: *mut ffi::PJRT_Buffer) -> Result<Buffer> {
        let api = self.inner.api;
        // Own it first, so an error below still destroys it.
        let mut buf = Buffer { client: self.clone(), raw, dtype: DType::F32, dims: Vec::new() };
        let mut t = ffi::PJRT_Buffer_ElementType_Args::new();
        t.buffer = raw;
        pjrt!(api, PJRT_Buffer_ElementType, &mut t)?;
        buf.dtype = redco_type(t.type_).ok_or_else(|| {
            pjrt_error("execute", format!("an output of PJRT element type {} has no redco dtype", t.type_))
        })?;
        let mut d = ffi::PJRT_Buffer_Dimensions_Args::new();
        d.buffer = raw;
        pjrt!(api, PJRT_Buffer_Dimensions, &mut d)?;
        // SAFETY: the buffer owns `num_dims` dimensions at `dims`.
        buf.dims = unsafe { std::slice::from_raw_parts(d.dims, d.num_dims) }.iter().map(|&x| x as usize).collect();
        Ok(buf)
    }
}

impl Buffer {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The client the buffer lives on.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Copies the buffer to the host (waiting for the computation producing it).
    pub fn download(&self) -> Result<HostData> {
        let n = self.len();
        let mut host = zeros(self.dtype, n);
        let dst: &mut [u8] = match &mut host {
            HostData::F32(v) => bytemuck::cast_slice_mut(v),
            HostData::F64(v) => bytemuck::cast_slice_mut(v),
            HostData::F16(v) => bytemuck::cast_slice_mut(v),
            HostData::BF16(v) => bytemuck::cast_slice_mut(v),
            HostData::I64(v) => bytemuck::cast_slice_mut(v),
            HostData::I32(v) => bytemuck::cast_slice_mut(v),
            HostData::U8(v) => v,
        };
        if dst.is_empty() {
            return Ok(host);
        }
        let mut a = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        a.src = self.raw;
        a.dst = dst.as_mut_ptr() as *mut _;
        a.dst_size = dst.len();
        let api = self.client.inner.api;
        pjrt!(api, PJRT_Buffer_ToHostBuffer, &mut a)?;
        await_event(api, a.event, "download")?;
        Ok(host)
    }
}
