//! The eager PJRT backend: each op is traced into a one-op StableHLO program, compiled
//! once per program text (op, shapes, dtypes, structural parameters; runtime numbers are
//! inputs) and cached, then executed on this backend's device.

use crate::api::{pjrt_error, Api};
use crate::client::Client;
use crate::executable::Executable;
use crate::hlo::Et;
use crate::proto::CompileOptions;
use crate::storage::PjrtStorage;
use crate::trace::{is_host_read, Input, TVal, Tracer};
use redco_core::{DType, Error, HostData, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of the program cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// Programs compiled.
    pub compiled: u64,
    /// Executions.
    pub executed: u64,
    /// Microseconds spent compiling.
    pub compile_us: u64,
}

pub(crate) struct Ctx {
    pub(crate) client: Client,
    programs: Mutex<HashMap<String, Arc<Executable>>>,
    compiled: AtomicU64,
    pub(crate) executed: AtomicU64,
    compile_us: AtomicU64,
}

/// The PJRT backend: one device of a PJRT client; clones (and [`Pjrt::on_device`]) share
/// the client and the program cache.
#[derive(Clone)]
pub struct Pjrt {
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) device: usize,
}

impl std::fmt::Debug for Pjrt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pjrt(device {} of {:?})", self.device, self.ctx.client)
    }
}

impl Pjrt {
    /// The backend on device 0 of a new client of the plugin named by `REDCO_PJRT_PLUGIN`,
    /// with `cpu_device_count = devices` when the plugin is XLA's CPU plugin.
    pub fn from_env(devices: usize) -> Result<Pjrt> {
        Pjrt::open(Api::from_env()?, devices)
    }

    /// The backend on device 0 of a new client of `api`; `devices` sets the CPU plugin's
    /// device count (other plugins expose the devices they find, and must have at least
    /// `devices`).
    pub fn open(api: &'static Api, devices: usize) -> Result<Pjrt> {
        let client = Client::new(api, &Client::default_options(api, devices))?;
        if client.devices().len() < devices {
            return Err(pjrt_error(
                "opening the backend",
                format!(
                    "{devices} devices requested but the {} client has {}",
                    client.platform(),
                    client.devices().len()
                ),
            ));
        }
        Ok(Pjrt::with_client(client))
    }

    /// The backend on device 0 of `client`.
    pub fn with_client(client: Client) -> Pjrt {
        let ctx = Ctx {
            client,
            programs: Mutex::new(HashMap::new()),
            compiled: AtomicU64::new(0),
            executed: AtomicU64::new(0),
            compile_us: AtomicU64::new(0),
        };
        Pjrt { ctx: Arc::new(ctx), device: 0 }
    }

    /// The same client and program cache on device `index`.
    pub fn on_device(&self, index: usize) -> Result<Pjrt> {
        self.ctx.client.device(index)?;
        Ok(Pjrt { ctx: self.ctx.clone(), device: index })
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.ctx.client
    }

    /// This backend's device index in the client.
    pub fn device_index(&self) -> usize {
        self.device
    }

    /// The program cache's counters.
    pub fn stats(&self) -> ProgramStats {
        ProgramStats {
            compiled: self.ctx.compiled.load(Ordering::Relaxed),
            executed: self.ctx.executed.load(Ordering::Relaxed),
            compile_us: self.ctx.compile_us.load(Ordering::Relaxed),
        }
    }

    /// The compiled one-device program of `text`, from the cache or compiled now.
    pub fn program(&self, text: &str, what: &str) -> Result<Arc<Executable>> {
        self.program_with(text, what, &CompileOptions::portable())
    }

    /// The program of `text` compiled with `options` (cached per text and options).
    pub fn program_with(&self, text: &str, what: &str, options: &CompileOptions) -> Result<Arc<Executable>> {
        // one-device programs (every eager op) are looked up by their text, without a copy
        let key = (*options != CompileOptions::portable()).then(|| format!("{options:?}\n{text}"));
        let lookup = key.as_deref().unwrap_or(text);
        if let Some(p) = self.ctx.programs.lock().unwrap_or_else(|p| p.into_inner()).get(lookup) {
            return Ok(p.clone());
        }
        let t0 = std::time::Instant::now();
        let exe = Arc::new(self.ctx.client.compile(text.as_bytes(), options, what)?);
        self.ctx.compile_us.fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.ctx.compiled.fetch_add(1, Ordering::Relaxed);
        let key = key.unwrap_or_else(|| text.to_string());
        self.ctx.programs.lock().unwrap_or_else(|p| p.into_inner()).insert(key, exe.clone());
        Ok(exe)
    }

    /// Traces `f` over `inputs` into one program, compiles it (once) and runs it here.
    pub(crate) fn run(
        &self,
        what: &'static str,
        inputs: &[&PjrtStorage],
        f: impl FnOnce(&Tracer, &[TVal]) -> Result<Vec<TVal>>,
    ) -> Result<Vec<PjrtStorage>> {
        let t = Tracer::new();
        let vals: Vec<TVal> =
            inputs.iter().map(|s| t.input(Input::Storage((*s).clone()), s.len(), Et::of(s.dtype()))).collect();
        let outs = f(&t, &vals)?;
        let bytes: usize = outs.iter().map(|o| o.0.ty.len() * o.0.ty.et.dtype().size_in_bytes()).sum();
        self.ctx.client.check_fits(self.ctx.client.device(self.device)?, bytes, what)?;
        let refs: Vec<&TVal> = outs.iter().collect();
        let (text, bound) = t.finish(&refs, &[]);
        let exe = self.program(&text, what)?;
        self.execute(&exe, &bound)
    }

    /// Like [`Pjrt::run`] for a fused op whose composite may read the host: a trace that
    /// hits a host read runs `eager` (op by op) instead.
    pub(crate) fn run_or(
        &self,
        what: &'static str,
        inputs: &[&PjrtStorage],
        f: impl FnOnce(&Tracer, &[TVal]) -> Result<Vec<TVal>>,
        eager: impl FnOnce() -> Result<Vec<PjrtStorage>>,
    ) -> Result<Vec<PjrtStorage>> {
        match self.run(what, inputs, f) {
            Err(e) if is_host_read(&e) => eager(),
            r => r,
        }
    }

    pub(crate) fn execute(&self, exe: &Executable, bound: &[Input]) -> Result<Vec<PjrtStorage>> {
        // host data and scalars are uploaded per run; storages are passed as they are
        let owned: Vec<Option<crate::Buffer>> = bound
            .iter()
            .map(|b| match b {
                Input::Storage(_) => Ok(None),
                Input::Arg(i) => Err(pjrt_error("execute", format!("argument {i} of a compiled step is unbound"))),
                Input::Host(h) => self.ctx.client.upload(self.device, h, &[h.len()]).map(Some),
                Input::Scalar(v, et) => self.ctx.client.upload(self.device, &scalar(*v, *et), &[]).map(Some),
            })
            .collect::<Result<_>>()?;
        let args: Vec<&crate::Buffer> = bound
            .iter()
            .zip(&owned)
            .filter_map(|(b, o)| match (b, o) {
                (Input::Storage(s), _) => Some(&*s.buf),
                (_, o) => o.as_ref(),
            })
            .collect();
        let outs = exe.execute(self.device, &args)?;
        self.ctx.executed.fetch_add(1, Ordering::Relaxed);
        Ok(outs.into_iter().map(|b| PjrtStorage { buf: Arc::new(b), host: None }).collect())
    }

    /// Storage uploaded from `data`, keeping the host copy of integer data.
    pub(crate) fn store(&self, data: HostData) -> Result<PjrtStorage> {
        let buf = self.ctx.client.upload(self.device, &data, &[data.len()])?;
        let host = (!data.dtype().is_float()).then(|| Arc::new(data));
        Ok(PjrtStorage { buf: Arc::new(buf), host })
    }

    /// The host values of integer ids (from the kept host copy, else read back), checked to
    /// be integers.
    pub(crate) fn host_ids(&self, ids: &PjrtStorage, op: &'static str) -> Result<Arc<HostData>> {
        if !matches!(ids.dtype(), DType::I64 | DType::I32) {
            return Err(Error::UnsupportedDType { op, dtype: ids.dtype() });
        }
        match &ids.host {
            Some(h) => Ok(h.clone()),
            None => Ok(Arc::new(ids.buf.download()?)),
        }
    }

    /// Checks that every id is in `0..size` (or equals `ignore`), as the CPU backend does.
    pub(crate) fn check_ids(
        &self,
        ids: &PjrtStorage,
        size: usize,
        ignore: Option<i64>,
        op: &'static str,
    ) -> Result<()> {
        let h = self.host_ids(ids, op)?;
        let bad = |i: i64| (i < 0 || i as u64 >= size as u64) && Some(i) != ignore;
        let found = match &*h {
            HostData::I64(v) => v.iter().copied().find(|&i| bad(i)),
            HostData::I32(v) => v.iter().map(|&i| i as i64).find(|&i| bad(i)),
            _ => None,
        };
        match found {
            Some(index) => Err(Error::IndexOutOfRange { op, index, size }),
            None => Ok(()),
        }
    }
}

/// True for XLA's CPU plugin (which takes `cpu_device_count`).
/// A one-element host buffer of `v` in `et`.
pub(crate) fn scalar(v: f64, et: Et) -> HostData {
    match et {
        Et::F64 => HostData::F64(vec![v]),
        Et::F16 => HostData::F16(vec![half::f16::from_f64(v)]),
        Et::BF16 => HostData::BF16(vec![half::bf16::from_f64(v)]),
        Et::I64 | Et::U32 => HostData::I64(vec![v as i64]),
        Et::I32 => HostData::I32(vec![v as i32]),
        Et::U8 | Et::Pred => HostData::U8(vec![v as u8]),
        Et::F32 => HostData::F32(vec![v as f32]),
    }
}
