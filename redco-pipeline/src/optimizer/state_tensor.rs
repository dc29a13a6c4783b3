//! [`StateTensor`]: a tensor of an optimizer's saved state where it lives, on the
//! parameters' backend or (an offloaded optimizer's) in host memory, so a checkpoint is
//! written and read one tensor at a time without moving host state onto the device.

use redco_core::{Backend, DType, Error, HostData, Result, Shape, Tensor};
use redco_cpu::Cpu;

/// One tensor of an optimizer's state (or an offloaded f32 master) as a checkpoint
/// writes or restores it.
#[derive(Clone)]
pub enum StateTensor<B: Backend> {
    /// On the parameters' backend `B`.
    Device(Tensor<B>),
    /// In host memory, on the CPU backend (an offloaded optimizer's).
    Host(Tensor<Cpu>),
}

impl<B: Backend> StateTensor<B> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            StateTensor::Device(t) => t.dtype(),
            StateTensor::Host(t) => t.dtype(),
        }
    }

    /// This rank's local shape.
    pub fn local_shape(&self) -> &Shape {
        match self {
            StateTensor::Device(t) => t.local_shape(),
            StateTensor::Host(t) => t.local_shape(),
        }
    }

    /// This rank's local values.
    pub fn local_to_host(&self) -> Result<HostData> {
        match self {
            StateTensor::Device(t) => t.local_to_host(),
            StateTensor::Host(t) => t.local_to_host(),
        }
    }

    /// The tensor on the device; an error for host state (an optimizer that keeps its state
    /// on the device was handed host state: the loader asks [`TrainOptimizer::host`] first).
    ///
    /// [`TrainOptimizer::host`]: super::TrainOptimizer::host
    pub fn into_device(self, key: &str) -> Result<Tensor<B>> {
        match self {
            StateTensor::Device(t) => Ok(t),
            StateTensor::Host(_) => Err(Error::Parameter {
                name: key.into(),
                msg: "host state handed to an optimizer that keeps its state on the device".into(),
            }),
        }
    }

    /// The tensor in host memory as f32 on `host` (device state downloaded, keeping its
    /// layout).
    pub fn into_host(self, host: &Cpu) -> Result<Tensor<Cpu>> {
        match self {
            StateTensor::Host(t) if t.dtype() == DType::F32 => Ok(t),
            StateTensor::Host(t) => redco_core::no_grad(|| t.cast(DType::F32)),
            StateTensor::Device(t) => host_copy(host, &t),
        }
    }

    /// `data` (`shape`, this rank's local values) as state kept where `opt` keeps it: in
    /// host memory for an offloaded optimizer, else uploaded to `b`.
    pub fn placed(opt: &dyn super::TrainOptimizer<B>, b: &B, data: HostData, shape: Shape) -> Result<Self> {
        let dt = data.dtype();
        Ok(match opt.host() {
            Some(h) => StateTensor::Host(Tensor::from_storage(h, h.upload_owned(data)?, shape, dt)),
            None => StateTensor::Device(Tensor::from_storage(b, b.upload_owned(data)?, shape, dt)),
        })
    }
}

/// `t`'s local shard on `host`, as f32, laid out as `t` (global shape and placements).
pub(crate) fn host_copy<B: Backend>(host: &Cpu, t: &Tensor<B>) -> Result<Tensor<Cpu>> {
    let data = t.local_to_host()?;
    let data = if data.dtype() == DType::F32 { data } else { data.cast(DType::F32) };
    let s = host.upload_owned(data)?;
    Ok(Tensor::from_local(host, s, t.shape().clone(), t.local_shape().clone(), t.placements(), DType::F32))
}

/// `t` (a host tensor) on `b`, laid out as `like`, in `like`'s dtype.
pub(crate) fn device_copy<B: Backend>(b: &B, t: &Tensor<Cpu>, like: &Tensor<B>) -> Result<Tensor<B>> {
    let data = t.local_to_host()?;
    let data = if like.dtype() == data.dtype() { data } else { data.cast(like.dtype()) };
    let s = b.upload_owned(data)?;
    Ok(Tensor::from_local(b, s, like.shape().clone(), like.local_shape().clone(), like.placements(), like.dtype()))
}
