//! Loading a PJRT plugin: the shared library, its `GetPjrtApi` table, the version check,
//! and the conversion of every `PJRT_Error` into a redco [`Error`].

use crate::ffi::{self, Sized as _};
use redco_core::{Error, Result};
use std::collections::HashMap;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The environment variable naming the PJRT plugin (a path to its shared library).
pub const PLUGIN_ENV: &str = "REDCO_PJRT_PLUGIN";

/// A loaded PJRT plugin: its function table and where it came from.
///
/// Plugins are loaded once per process and never unloaded (XLA's plugins do not support
/// `dlclose`), so an `Api` is `'static` and shared by every client made from it.
pub struct Api {
    raw: *const ffi::PJRT_Api,
    path: PathBuf,
    version: (i32, i32),
    _lib: libloading::Library,
}

// SAFETY: the PJRT C API is thread-safe (every entry point may be called from any thread);
// the table itself is immutable after `GetPjrtApi`.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PJRT plugin {} (API {}.{})", self.path.display(), self.version.0, self.version.1)
    }
}

/// The error of a failed call into PJRT: the operation, the plugin's message and code.
pub(crate) fn pjrt_error(op: &str, msg: impl std::fmt::Display) -> Error {
    Error::Backend { backend: "pjrt".into(), msg: format!("{op}: {msg}") }
}

/// Checks a plugin's reported API version against the committed header's: the major
/// versions must be equal (PJRT breaks compatibility only across majors), and the plugin's
/// function table must reach every entry point redco calls (`needed` bytes).
pub fn check_version(path: &Path, major: i32, minor: i32, table_size: usize, needed: usize) -> Result<()> {
    let ours = (ffi::PJRT_API_MAJOR as i32, ffi::PJRT_API_MINOR as i32);
    if major != ours.0 || table_size < needed {
        return Err(pjrt_error(
            "loading the plugin",
            format!(
                "{} implements PJRT C API {major}.{minor} (function table of {table_size} bytes), \
                 which redco cannot use: redco is built against API {}.{} and needs major version {} \
                 with a table of at least {needed} bytes",
                path.display(),
                ours.0,
                ours.1,
                ours.0
            ),
        ));
    }
    Ok(())
}

/// Bytes of the function table up to and including the last entry point redco calls.
fn needed_table_size() -> usize {
    macro_rules! end_of {
        ($($f:ident),*) => {
            [$(std::mem::offset_of!(ffi::PJRT_Api, $f) + std::mem::size_of::<ffi::$f>()),*].into_iter().max().unwrap_or(0)
        };
    }
    end_of!(
        PJRT_Error_Destroy,
        PJRT_Error_Message,
        PJRT_Error_GetCode,
        PJRT_Event_Await,
        PJRT_Event_Destroy,
        PJRT_Client_Create,
        PJRT_Client_Destroy,
        PJRT_Client_PlatformName,
        PJRT_Client_AddressableDevices,
        PJRT_Client_Compile,
        PJRT_Client_BufferFromHostBuffer,
        PJRT_Device_GetDescription,
        PJRT_DeviceDescription_Id,
        PJRT_DeviceDescription_Kind,
        PJRT_LoadedExecutable_Destroy,
        PJRT_LoadedExecutable_GetExecutable,
        PJRT_LoadedExecutable_Execute,
        PJRT_Executable_Destroy,
        PJRT_Executable_NumOutputs,
        PJRT_Buffer_Destroy,
        PJRT_Buffer_ElementType,
        PJRT_Buffer_Dimensions,
        PJRT_Buffer_ToHostBuffer
    )
}

impl Api {
    /// Loads the plugin named by `REDCO_PJRT_PLUGIN`.
    pub fn from_env() -> Result<&'static Api> {
        match std::env::var_os(PLUGIN_ENV) {
            Some(p) if !p.is_empty() => Api::load(Path::new(&p)),
            _ => Err(pjrt_error(
                "loading the plugin",
                format!(
                    "no PJRT plugin given: set {PLUGIN_ENV} to the path of a plugin's shared library \
                     (e.g. pjrt_c_api_cpu_plugin.so from `pip download --no-deps lammps-jax-pjrt-cpu`, \
                     libtpu.so, or the CUDA plugin of jax-cuda13-pjrt) or pass --pjrt-plugin"
                ),
            )),
        }
    }

    /// Loads (once per process) the plugin at `path`, checks its version and initialises it.
    pub fn load(path: &Path) -> Result<&'static Api> {
        static LOADED: Mutex<Option<HashMap<PathBuf, &'static Api>>> = Mutex::new(None);
        let key = std::fs::canonicalize(path).map_err(|e| {
            pjrt_error("loading the plugin", format!("cannot open the PJRT plugin {}: {e}", path.display()))
        })?;
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        let map = loaded.get_or_insert_with(HashMap::new);
        if let Some(api) = map.get(&key) {
            return Ok(*api);
        }
        let api: &'static Api = Box::leak(Box::new(Api::open(&key)?));
        map.insert(key, api);
        Ok(api)
    }

    fn open(path: &Path) -> Result<Api> {
        let fail = |msg: String| pjrt_error("loading the plugin", msg);
        // SAFETY: loading a shared library runs its initialisers; a PJRT plugin is a shared
        // library meant to be loaded this way.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| fail(format!("cannot load {} as a shared library: {e}", path.display())))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const ffi::PJRT_Api> =
            unsafe { lib.get(b"GetPjrtApi\0") }
                .map_err(|e| fail(format!("{} is not a PJRT plugin (no GetPjrtApi symbol: {e})", path.display())))?;
        // SAFETY: the plugin returns a pointer to its static function table, or null.
        let raw = unsafe { get() };
        if raw.is_null() {
            return Err(fail(format!("{}: GetPjrtApi returned no function table", path.display())));
        }
        // SAFETY: every PJRT table starts with `struct_size`, `extension_start` and the
        // version struct, whatever its version.
        let (table, major, minor) = unsafe {
            let t = &*raw;
            (t.struct_size, t.pjrt_api_version.major_version, t.pjrt_api_version.minor_version)
        };
        check_version(path, major, minor, table, needed_table_size())?;
        let api = Api { raw, path: path.to_path_buf(), version: (major, minor), _lib: lib };
        if api.table().PJRT_Plugin_Initialize.is_some() {
            let mut a = ffi::PJRT_Plugin_Initialize_Args::new();
            crate::pjrt!(&api, PJRT_Plugin_Initialize, &mut a)?;
        }
        Ok(api)
    }

    /// The plugin's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's PJRT C API version `(major, minor)`.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The function table.
    pub(crate) fn table(&self) -> &ffi::PJRT_Api {
        // SAFETY: checked non-null at load; the table is static in the plugin, which is
        // never unloaded.
        unsafe { &*self.raw }
    }

    /// True when the plugin's table reaches the entry point at `offset`.
    pub(crate) fn has(&self, offset: usize) -> bool {
        offset < self.table().struct_size
    }

    /// Converts a returned `PJRT_Error*` (null on success) into a `Result`, destroying it.
    pub(crate) fn check(&self, err: *mut ffi::PJRT_Error, op: &str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let t = self.table();
        let mut m = ffi::PJRT_Error_Message_Args::new();
        m.error = err;
        let mut c = ffi::PJRT_Error_GetCode_Args::new();
        c.error = err;
        // SAFETY: `err` is a live error from this plugin; the message points into it and is
        // copied before the error is destroyed.
        let (msg, code) = unsafe {
            if let Some(f) = t.PJRT_Error_Message {
                f(&mut m);
            }
            let msg = if m.message.is_null() {
                String::from("(no message)")
            } else {
                let bytes = std::slice::from_raw_parts(m.message as *const u8, m.message_size);
                String::from_utf8_lossy(bytes).into_owned()
            };
            let code = match t.PJRT_Error_GetCode {
                Some(f) if f(&mut c).is_null() => c.code,
                _ => ffi::PJRT_Error_Code_UNKNOWN,
            };
            if let Some(f) = t.PJRT_Error_Destroy {
                let mut d = ffi::PJRT_Error_Destroy_Args::new();
                d.error = err;
                f(&mut d);
            }
            (msg, code)
        };
        Err(pjrt_error(op, format!("{msg} [{}]", code_name(code))))
    }

    /// The error for an entry point the plugin does not provide.
    pub(crate) fn missing(&self, f: &str) -> Error {
        pjrt_error(
            f,
            format!(
                "the PJRT plugin {} (API {}.{}) does not provide this entry point",
                self.path.display(),
                self.version.0,
                self.version.1
            ),
        )
    }
}

/// The name of a `PJRT_Error_Code`.
fn code_name(code: ffi::PJRT_Error_Code) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(code as usize).copied().unwrap_or("unknown code")
}

/// Calls the PJRT entry point `$f` of `$api` with `$args`, turning a missing entry point
/// or a returned error into an [`Error`] naming the entry point.
#[macro_export]
#[doc(hidden)]
macro_rules! pjrt {
    ($api:expr, $f:ident, $args:expr) => {{
        let api: &$crate::api::Api = $api;
        let off = ::std::mem::offset_of!($crate::ffi::PJRT_Api, $f);
        match api.table().$f {
            Some(f) if api.has(off) => {
                // SAFETY: the entry point comes from the plugin's table (checked to reach
                // it) and receives an argument struct sized from the header.
                let err = unsafe { f($args) };
                api.check(err, stringify!($f))
            }
            _ => Err(api.missing(stringify!($f))),
        }
    }};
}
