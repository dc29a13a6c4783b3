//! A PJRT client: created once per plugin and process with its create options, holding the
//! addressable devices.

use crate::api::{pjrt_error, Api};
use crate::ffi::{self, Sized as _};
use crate::pjrt;
use redco_core::Result;
use std::sync::Arc;

/// A value of a client create option (`PJRT_NamedValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// A string.
    Str(String),
    /// A 64-bit integer.
    Int(i64),
    /// A list of 64-bit integers.
    Ints(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

impl OptionValue {
    /// Parses `text` the way a command line gives it: `true`/`false`, an integer, a float,
    /// a comma-separated integer list, else a string.
    pub fn parse(text: &str) -> OptionValue {
        match text {
            "true" => return OptionValue::Bool(true),
            "false" => return OptionValue::Bool(false),
            _ => {}
        }
        if let Ok(i) = text.parse::<i64>() {
            return OptionValue::Int(i);
        }
        if let Ok(f) = text.parse::<f32>() {
            return OptionValue::Float(f);
        }
        if text.contains(',') {
            if let Ok(v) = text.split(',').map(|s| s.trim().parse::<i64>()).collect::<std::result::Result<Vec<_>, _>>()
            {
                return OptionValue::Ints(v);
            }
        }
        OptionValue::Str(text.to_string())
    }
}

/// One addressable device of a client.
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) raw: *mut ffi::PJRT_Device,
    /// The device's position in the client's addressable devices.
    pub index: usize,
    /// The plugin's global device id.
    pub id: i32,
    /// The device kind, as the plugin names it (e.g. `cpu`, `TPU v4`, `NVIDIA H100`).
    pub kind: String,
    /// The memory available to buffers on the device, when known (the plugin's limit, or
    /// the host's memory for CPU devices).
    pub memory_bytes: Option<u64>,
}

// SAFETY: device handles are owned by the client and valid for its life; PJRT is
// thread-safe.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

pub(crate) struct ClientInner {
    pub(crate) api: &'static Api,
    pub(crate) raw: *mut ffi::PJRT_Client,
    pub(crate) platform: String,
    pub(crate) devices: Vec<Device>,
    /// The key-value store the client's callbacks reach (dropped after the client).
    _kv: Option<Box<crate::kv::KvStore>>,
}

// SAFETY: a PJRT client is thread-safe; the raw handle is destroyed once, on drop.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_Client_Destroy_Args::new();
        a.client = self.raw;
        let _ = pjrt!(self.api, PJRT_Client_Destroy, &mut a);
    }
}

/// A PJRT client of one plugin, shared by clones (the devices, buffers and executables made
/// from it keep it alive).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PJRT {} client, {} device(s), {:?}", self.inner.platform, self.inner.devices.len(), self.inner.api)
    }
}

impl Client {
    /// Creates a client of `api` with the named create `options` (e.g. the CPU plugin's
    /// `cpu_device_count`).
    pub fn new(api: &'static Api, options: &[(String, OptionValue)]) -> Result<Client> {
        Client::with_store(api, options, None)
    }

    /// The create options redco gives `api`'s plugin for `devices` devices: the CPU
    /// plugin's `cpu_device_count`; for XLA's GPU plugins (`xla_cuda_plugin.so`,
    /// `xla_rocm_plugin.so`) no preallocation, so that several clients (tests, one process
    /// per rank on one GPU) share the device instead of the first taking 75% of its memory as
    /// XLA's default does; none for other plugins (XLA's plugins refuse options they do not
    /// know).
    pub fn default_options(api: &Api, devices: usize) -> Vec<(String, OptionValue)> {
        let name = api.path().file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        if name.contains("cpu") {
            vec![("cpu_device_count".to_string(), OptionValue::Int(devices.max(1) as i64))]
        } else if name.contains("cuda") || name.contains("rocm") {
            vec![("preallocate".to_string(), OptionValue::Bool(false))]
        } else {
            Vec::new()
        }
    }

    /// Like [`Client::new`], with the plugin's key-value callbacks backed by `kv` (for
    /// multi-process clients: pass `node_id` and `num_nodes` in `options`, as jax does).
    pub fn with_store(
        api: &'static Api,
        options: &[(String, OptionValue)],
        kv: Option<crate::kv::KvStore>,
    ) -> Result<Client> {
        let kv = kv.map(Box::new);
        let named: Vec<ffi::PJRT_NamedValue> = options.iter().map(|(k, v)| named_value(k, v)).collect();
        let mut a = ffi::PJRT_Client_Create_Args::new();
        a.create_options = named.as_ptr();
        a.num_options = named.len();
        if let Some(kv) = &kv {
            kv.install(&mut a);
        }
        pjrt!(api, PJRT_Client_Create, &mut a)
            .map_err(|e| pjrt_error("creating a client", format!("{e} (options {options:?})")))?;
        drop(named);
        let mut inner = ClientInner { api, raw: a.client, platform: String::new(), devices: Vec::new(), _kv: kv };
        inner.platform = platform_name(&inner)?;
        inner.devices = devices(&inner)?;
        if inner.devices.is_empty() {
            return Err(pjrt_error("creating a client", format!("{:?} has no addressable device", api)));
        }
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The plugin behind this client.
    pub fn api(&self) -> &'static Api {
        self.inner.api
    }

    /// The platform name (`cpu`, `tpu`, `cuda`, ...).
    pub fn platform(&self) -> &str {
        &self.inner.platform
    }

    /// The addressable devices, in the plugin's order.
    pub fn devices(&self) -> &[Device] {
        &self.inner.devices
    }

    /// The device at `index`, or an error naming how many there are.
    pub fn device(&self, index: usize) -> Result<&Device> {
        self.inner.devices.get(index).ok_or_else(|| {
            pjrt_error(
                "choosing a device",
                format!(
                    "device {index} requested but the {} client has {}",
                    self.inner.platform,
                    self.inner.devices.len()
                ),
            )
        })
    }
}

/// A `PJRT_NamedValue` pointing into `k` and `v` (which must outlive its use).
fn named_value(k: &str, v: &OptionValue) -> ffi::PJRT_NamedValue {
    let mut n = ffi::PJRT_NamedValue::new();
    n.name = k.as_ptr() as *const _;
    n.name_size = k.len();
    match v {
        OptionValue::Str(s) => {
            n.type_ = ffi::PJRT_NamedValue_kString;
            n.__bindgen_anon_1.string_value = s.as_ptr() as *const _;
            n.value_size = s.len();
        }
        OptionValue::Int(i) => {
            n.type_ = ffi::PJRT_NamedValue_kInt64;
            n.__bindgen_anon_1.int64_value = *i;
            n.value_size = 1;
        }
        OptionValue::Ints(v) => {
            n.type_ = ffi::PJRT_NamedValue_kInt64List;
            n.__bindgen_anon_1.int64_array_value = v.as_ptr();
            n.value_size = v.len();
        }
        OptionValue::Float(f) => {
            n.type_ = ffi::PJRT_NamedValue_kFloat;
            n.__bindgen_anon_1.float_value = *f;
            n.value_size = 1;
        }
        OptionValue::Bool(b) => {
            n.type_ = ffi::PJRT_NamedValue_kBool;
            n.__bindgen_anon_1.bool_value = *b;
            n.value_size = 1;
        }
    }
    n
}

/// Copies a (pointer, length) string out of the plugin.
pub(crate) fn plugin_str(p: *const std::ffi::c_char, len: usize) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the plugin returns `len` valid bytes at `p`, alive for the call's owner.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(p as *const u8, len) }).into_owned()
}

fn platform_name(c: &ClientInner) -> Result<String> {
    let mut a = ffi::PJRT_Client_PlatformName_Args::new();
    a.client = c.raw;
    pjrt!(c.api, PJRT_Client_PlatformName, &mut a)?;
    Ok(plugin_str(a.platform_name, a.platform_name_size))
}

fn devices(c: &ClientInner) -> Result<Vec<Device>> {
    let mut a = ffi::PJRT_Client_AddressableDevices_Args::new();
    a.client = c.raw;
    pjrt!(c.api, PJRT_Client_AddressableDevices, &mut a)?;
    // SAFETY: the client owns an array of `num_addressable_devices` device handles.
    let raws = unsafe { std::slice::from_raw_parts(a.addressable_devices, a.num_addressable_devices) };
    raws.iter()
        .enumerate()
        .map(|(index, &raw)| {
            let mut d = ffi::PJRT_Device_GetDescription_Args::new();
            d.device = raw;
            pjrt!(c.api, PJRT_Device_GetDescription, &mut d)?;
            let mut id = ffi::PJRT_DeviceDescription_Id_Args::new();
            id.device_description = d.device_description;
            pjrt!(c.api, PJRT_DeviceDescription_Id, &mut id)?;
            let mut k = ffi::PJRT_DeviceDescription_Kind_Args::new();
            k.device_description = d.device_description;
            pjrt!(c.api, PJRT_DeviceDescription_Kind, &mut k)?;
            let kind = plugin_str(k.device_kind, k.device_kind_size);
            let memory_bytes = memory_limit(c, raw);
            Ok(Device { raw, index, id: id.id, kind, memory_bytes })
        })
        .collect()
}

/// The device's memory limit from `PJRT_Device_MemoryStats`, else (CPU devices, whose
/// plugin reports none) the host's physical memory.
fn memory_limit(c: &ClientInner, raw: *mut ffi::PJRT_Device) -> Option<u64> {
    let mut m = ffi::PJRT_Device_MemoryStats_Args::new();
    m.device = raw;
    if pjrt!(c.api, PJRT_Device_MemoryStats, &mut m).is_ok() && m.bytes_limit_is_set && m.bytes_limit > 0 {
        return Some(m.bytes_limit as u64);
    }
    if c.platform.eq_ignore_ascii_case("cpu") {
        return host_memory_bytes();
    }
    None
}

/// `MemTotal` from `/proc/meminfo`.
fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
