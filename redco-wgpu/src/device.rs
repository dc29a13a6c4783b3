//! The device side: adapter selection, the buffer pool, the pending command encoder, the
//! pipeline cache and kernel dispatch, upload and read-back.

use redco_core::backend::MemoryStats;
use redco_core::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Invocations per workgroup of the one-dimensional kernels.
pub(crate) const WG: u32 = 256;
/// Queued dispatches after which the pending encoder is submitted.
const SUBMIT_EVERY: usize = 64;
/// Bytes of freed buffers the pool keeps at most.
const POOL_MAX_BYTES: u64 = 1 << 30;
/// How long a read-back waits for the device before reporting it lost.
const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// A backend error with the wgpu backend's name.
pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "wgpu".into(), msg: msg.into() }
}

/// Locks a mutex, turning poisoning (a panic on another thread) into an error.
pub(crate) fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock().map_err(|_| err("internal lock poisoned by a panic on another thread"))
}

/// Freed storage buffers by size class, reused by later allocations.
#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
    /// Bytes of buffers lent out now (held by tensors), and their peak.
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl Pool {
    /// Counts `b` lent out.
    fn lend(&self, b: wgpu::Buffer) -> wgpu::Buffer {
        let now = self.in_use.fetch_add(b.size(), Ordering::Relaxed) + b.size();
        self.peak.fetch_max(now, Ordering::Relaxed);
        b
    }
    /// Bytes lent out now and their peak.
    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats { in_use: self.in_use.load(Ordering::Relaxed), peak: self.peak.load(Ordering::Relaxed) }
    }
    /// Starts the peak again from what is lent out now.
    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.in_use.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    fn take(&self, class: u64) -> Option<wgpu::Buffer> {
        self.free.lock().ok()?.get_mut(&class)?.pop()
    }
    fn give(&self, b: wgpu::Buffer) {
        if let Ok(mut f) = self.free.lock() {
            let held: u64 = f.iter().map(|(c, v)| c * v.len() as u64).sum();
            if held + b.size() <= POOL_MAX_BYTES {
                f.entry(b.size()).or_default().push(b);
            }
        }
    }
}

/// A storage buffer that returns to its pool when dropped.
pub(crate) struct DevBuf {
    buf: Option<wgpu::Buffer>,
    pool: Arc<Pool>,
}

impl DevBuf {
    /// The wgpu buffer.
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        // `buf` is only `None` inside `drop`.
        self.buf.as_ref().unwrap_or_else(|| unreachable!("buffer taken before drop"))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.in_use.fetch_sub(b.size(), Ordering::Relaxed);
            self.pool.give(b);
        }
    }
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({} bytes)", self.buf.as_ref().map_or(0, |b| b.size()))
    }
}

/// The size class of an allocation of `bytes`: at least 256 bytes, then steps of a quarter
/// of a power of two (at most 25% waste).
fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(256);
    let p = 1u64 << (63 - (b - 1).leading_zeros()); // largest power of two below b (b > 256)
    let step = (p / 4).max(1);
    b.div_ceil(step) * step
}

/// A compiled kernel: its pipeline and the bind group layout it uses.
pub(crate) struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: Arc<wgpu::BindGroupLayout>,
}

struct Pending {
    enc: Option<wgpu::CommandEncoder>,
    ops: usize,
}

/// Every adapter wgpu finds, real GPUs first (discrete, integrated, virtual, other, then
/// CPU adapters such as lavapipe), in wgpu's order within a type.
pub(crate) fn adapters() -> Vec<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    adapters.sort_by_key(|a| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    });
    adapters
}

/// The device, its queue and every shared piece of state.
pub(crate) struct Ctx {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    /// Whether the device was opened with `SHADER_F16`: F16 storages then hold packed f16.
    pub(crate) f16: bool,
    kernels: Mutex<HashMap<String, Arc<Kernel>>>,
    layouts: Mutex<HashMap<(usize, usize), Arc<wgpu::BindGroupLayout>>>,
    pool: Arc<Pool>,
    pending: Mutex<Pending>,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

impl Ctx {
    /// Opens the adapter chosen by `REDCO_WGPU_ADAPTER` (a substring of the adapter name,
    /// case-insensitive), else the first of [`adapters`] (a GPU when there is one), with
    /// packed f16 where the adapter offers it unless `REDCO_WGPU_F16=0`.
    pub(crate) fn open() -> Result<Ctx> {
        Ctx::open_with(std::env::var("REDCO_WGPU_F16").map_or(true, |v| v.trim() != "0"))
    }

    /// [`Ctx::open`], with packed f16 only when `allow_f16` (and the adapter offers it).
    pub(crate) fn open_with(allow_f16: bool) -> Result<Ctx> {
        let adapters = adapters();
        let wanted = std::env::var("REDCO_WGPU_ADAPTER").ok().filter(|s| !s.is_empty());
        let names: Vec<String> =
            adapters.iter().map(|a| format!("{} ({:?})", a.get_info().name, a.get_info().backend)).collect();
        let adapter = match &wanted {
            Some(w) => adapters
                .into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&w.to_lowercase()))
                .ok_or_else(|| {
                    err(format!("no wgpu adapter name contains REDCO_WGPU_ADAPTER={w:?}; adapters found: {names:?}"))
                })?,
            None => adapters.into_iter().next().ok_or_else(|| {
                err("no wgpu adapter found (searched Vulkan, Metal, DX12 and GL; on Linux install a Vulkan driver \
                     such as mesa-vulkan-drivers)")
            })?,
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        // packed f16 storage where the adapter offers it, unless REDCO_WGPU_F16=0
        let f16 = allow_f16 && adapter.features().contains(wgpu::Features::SHADER_F16);
        let desc = wgpu::DeviceDescriptor {
            label: Some("redco-wgpu"),
            required_features: if f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() },
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| err(format!("cannot open a device on adapter {}: {e}", info.name)))?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let e2 = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = e2.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let l2 = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = l2.lock() {
                let why = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                *l = Some(format!("the device was lost ({reason:?}{why}); every later call on it fails"));
            }
        });
        Ok(Ctx {
            device,
            queue,
            info,
            limits,
            f16,
            kernels: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            pool: Arc::new(Pool::default()),
            pending: Mutex::new(Pending { enc: None, ops: 0 }),
            errors,
            lost,
        })
    }

    /// Errors when the device was lost or an earlier call raised a validation error.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(l) = lock(&self.lost)?.as_ref() {
            return Err(err(l.clone()));
        }
        let mut e = lock(&self.errors)?;
        if !e.is_empty() {
            let msg = e.join("; ");
            e.clear();
            drop(e);
            // a lost device shows first as validation errors (its objects are invalid); wgpu
            // reports the loss itself from a poll: name it when that is the cause
            let _ = self.device.poll(wgpu::PollType::Poll);
            if let Some(l) = lock(&self.lost)?.as_ref() {
                return Err(err(format!("{l} (then: {msg})")));
            }
            return Err(err(msg));
        }
        Ok(())
    }

    /// The size class of a buffer of `bytes` bytes (capped at the device limit), or an
    /// error naming the limit when `bytes` exceeds it.
    fn class_within_limit(&self, bytes: u64, what: &str) -> Result<u64> {
        let max = self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size);
        if bytes > max {
            return Err(err(format!(
                "{what}: a buffer of {bytes} bytes exceeds the device limit of {max} bytes \
                 (max_storage_buffer_binding_size / max_buffer_size of adapter {})",
                self.info.name
            )));
        }
        Ok(size_class(bytes).min(max / 4 * 4).max(bytes))
    }

    /// The buffer pool (its counts of bytes lent out).
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// A storage buffer of at least `bytes` bytes (contents undefined), from the pool when
    /// one of its size class is free.
    pub(crate) fn alloc(&self, bytes: u64) -> Result<DevBuf> {
        let class = self.class_within_limit(bytes, "alloc")?;
        self.check()?;
        let buf = match self.pool.take(class) {
            Some(b) => b,
            None => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: class,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        Ok(DevBuf { buf: Some(self.pool.lend(buf)), pool: self.pool.clone() })
    }

    /// A new storage buffer holding `data` (padded to its size class).
    pub(crate) fn upload_bytes(&self, data: &[u8]) -> Result<DevBuf> {
        let class = self.class_within_limit(data.len() as u64, "upload")?;
        self.check()?;
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: class,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.write(&buf, data);
        Ok(DevBuf { buf: Some(self.pool.lend(buf)), pool: self.pool.clone() })
    }

    /// Queues a write of `data` (a multiple of 4 bytes) to the start of `buf`: it lands
    /// before the next submission, and, unlike a buffer mapped at creation, fails as a
    /// recorded error rather than a panic when the device is gone.
    fn write(&self, buf: &wgpu::Buffer, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(buf, 0, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buf, 0, &padded);
        }
    }

    fn layout(&self, n_in: usize, n_out: usize) -> Result<Arc<wgpu::BindGroupLayout>> {
        let mut l = lock(&self.layouts)?;
        if let Some(x) = l.get(&(n_in, n_out)) {
            return Ok(x.clone());
        }
        let entry = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries: Vec<_> = (0..n_in as u32).map(|i| entry(i, true)).collect();
        entries.extend((0..n_out as u32).map(|o| entry(n_in as u32 + o, false)));
        entries.push(entry((n_in + n_out) as u32, true));
        let layout = Arc::new(
            self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries }),
        );
        l.insert((n_in, n_out), layout.clone());
        Ok(layout)
    }

    /// The kernel `key` with `n_in` inputs and `n_out` outputs, compiled from `source()` on
    /// first use.
    ///
    /// Binding convention of every kernel: inputs at bindings `0..n_in` (read-only
    /// storage), the outputs at `n_in..n_in + n_out` (read-write storage; one for most
    /// kernels), a `u32` parameter array at `n_in + n_out` (read-only storage); entry point
    /// `main`. A `trusted` kernel is compiled
    /// without wgpu's runtime bounds checks (twice the matmul throughput on lavapipe): the
    /// kernel itself must keep every access in bounds.
    pub(crate) fn kernel(
        &self,
        key: &str,
        n_in: usize,
        n_out: usize,
        trusted: bool,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<Kernel>> {
        if let Some(k) = lock(&self.kernels)?.get(key) {
            return Ok(k.clone());
        }
        let layout = self.layout(n_in, n_out)?;
        // with SHADER_F16 every kernel enables f16 (the directive must come first) and gets
        // the packed-f16 store `st_f16`
        let (enable, f16_fns) =
            if self.f16 { ("enable f16;\n", include_str!("kernels/common_f16.wgsl")) } else { ("", "") };
        let src = format!("{enable}{}\n{f16_fns}\n{}", include_str!("kernels/common.wgsl"), source());
        let desc = wgpu::ShaderModuleDescriptor { label: Some(key), source: wgpu::ShaderSource::Wgsl(src.into()) };
        let module = if trusted {
            // SAFETY: only kernels whose every read is clamped into its operand (whose
            // length the host checked) and every write guarded are compiled unchecked;
            // their loops are bounded by their parameters.
            unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            self.device.create_shader_module(desc)
        };
        let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        self.check().map_err(|e| err(format!("kernel {key} failed to compile: {e}")))?;
        let k = Arc::new(Kernel { pipeline, layout });
        lock(&self.kernels)?.insert(key.to_string(), k.clone());
        Ok(k)
    }

    /// Records one dispatch of `k` over `groups` workgroups (queued, not yet submitted).
    pub(crate) fn dispatch(
        &self,
        k: &Kernel,
        inputs: &[&wgpu::Buffer],
        outs: &[&wgpu::Buffer],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return Ok(());
        }
        self.check()?;
        let max = self.limits.max_compute_workgroups_per_dimension;
        if groups.0 > max || groups.1 > max || groups.2 > max {
            return Err(err(format!(
                "a dispatch of {groups:?} workgroups exceeds the device limit of {max} per dimension"
            )));
        }
        let mut p = params.to_vec();
        if p.is_empty() {
            p.push(0);
        }
        let pbuf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (p.len() * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.write(&pbuf, bytemuck::cast_slice(&p));
        let mut entries: Vec<wgpu::BindGroupEntry> = inputs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        for (o, b) in outs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: (inputs.len() + o) as u32, resource: b.as_entire_binding() });
        }
        entries.push(wgpu::BindGroupEntry {
            binding: (inputs.len() + outs.len()) as u32,
            resource: pbuf.as_entire_binding(),
        });
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &k.layout,
            entries: &entries,
        });
        let mut pending = lock(&self.pending)?;
        let enc = pending
            .enc
            .get_or_insert_with(|| self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }));
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        }
        pending.ops += 1;
        if pending.ops >= SUBMIT_EVERY {
            self.submit(&mut pending);
        }
        Ok(())
    }

    /// Records a buffer-to-buffer copy.
    pub(crate) fn copy(
        &self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut pending = lock(&self.pending)?;
        let enc = pending
            .enc
            .get_or_insert_with(|| self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }));
        enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, bytes);
        Ok(())
    }

    fn submit(&self, pending: &mut Pending) {
        if let Some(enc) = pending.enc.take() {
            self.queue.submit([enc.finish()]);
        }
        pending.ops = 0;
    }

    /// Submits the queued work.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut p = lock(&self.pending)?;
        self.submit(&mut p);
        drop(p);
        self.check()
    }

    /// Waits for every submitted operation.
    pub(crate) fn wait(&self) -> Result<()> {
        self.flush()?;
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: Some(WAIT_LIMIT) })
            .map_err(|e| err(format!("waiting for the device failed: {e}")))?;
        self.check()
    }

    /// Reads the first `bytes` bytes of `buf` back to the host (submits and waits).
    pub(crate) fn read(&self, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let size = bytes.div_ceil(4).max(1) * 4;
        self.check()?;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("redco-wgpu read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.copy(buf, 0, &staging, 0, size)?;
        self.flush()?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        // Another thread's poll may run our callback; keep polling until it has run.
        let t0 = std::time::Instant::now();
        loop {
            self.device
                .poll(wgpu::PollType::Wait { submission_index: None, timeout: Some(WAIT_LIMIT) })
                .map_err(|e| err(format!("waiting for a read-back failed: {e}")))?;
            self.check()?;
            match rx.recv_timeout(std::time::Duration::from_millis(1)) {
                Ok(Ok(())) => break,
                Ok(Err(e)) => return Err(err(format!("mapping a read-back buffer failed: {e}"))),
                Err(_) if t0.elapsed() < WAIT_LIMIT => continue,
                Err(_) => return Err(err("a read-back did not complete in 600 s (device lost or hung)")),
            }
        }
        let out = {
            let view = staging.get_mapped_range(..).map_err(|e| err(format!("reading a mapped buffer: {e:?}")))?;
            view[..bytes as usize].to_vec()
        };
        staging.unmap();
        Ok(out)
    }
}

/// Workgroup counts covering `n` invocations of `WG` threads, folded into two dimensions
/// when one is not enough (kernels recover the index with `gid`).
pub(crate) fn groups_1d(n: usize) -> (u32, u32, u32) {
    let g = n.div_ceil(WG as usize).max(1);
    if g <= 65535 {
        (g as u32, 1, 1)
    } else {
        let y = g.div_ceil(65535);
        (g.div_ceil(y) as u32, y as u32, 1)
    }
}
