//! The key-value callbacks of `PJRT_Client_Create` (get, try-get and put, all three set:
//! current XLA accepts them only together), backed by the bootstrap [`Store`] of the
//! process issue, so that a multi-host plugin (libtpu, the CUDA plugin) can exchange its
//! topology and ids between the processes of a run. Keys are prefixed per client.

use crate::ffi;
use redco_core::runtime::Store;
use std::sync::Arc;
use std::time::Duration;

/// What the callbacks reach through their `user_arg`: the store and the key prefix.
pub struct KvStore {
    store: Arc<dyn Store>,
    prefix: String,
}

impl KvStore {
    /// Callbacks over `store`, under keys `prefix` + the plugin's key.
    pub fn new(store: Arc<dyn Store>, prefix: &str) -> KvStore {
        KvStore { store, prefix: prefix.to_string() }
    }

    /// Sets the three callbacks (and this store as their argument) on client-create args;
    /// `self` must outlive the client.
    pub(crate) fn install(&self, a: &mut ffi::PJRT_Client_Create_Args) {
        let me = self as *const KvStore as *mut std::ffi::c_void;
        a.kv_get_callback = Some(kv_get);
        a.kv_get_user_arg = me;
        a.kv_try_get_callback = Some(kv_try_get);
        a.kv_try_get_user_arg = me;
        a.kv_put_callback = Some(kv_put);
        a.kv_put_user_arg = me;
    }

    fn key(&self, p: *const std::ffi::c_char, n: usize) -> String {
        format!("{}{}", self.prefix, crate::client::plugin_str(p, n))
    }
}

/// A value handed to the plugin: its length is stored just before the bytes, so the
/// deleter (which gets the pointer only) can free it.
fn give(value: &[u8]) -> *mut std::ffi::c_char {
    let mut v = Vec::with_capacity(8 + value.len());
    v.extend_from_slice(&(value.len() as u64).to_ne_bytes());
    v.extend_from_slice(value);
    let b = Box::into_raw(v.into_boxed_slice()) as *mut u8;
    // SAFETY: the box holds 8 + len bytes.
    unsafe { b.add(8) as *mut std::ffi::c_char }
}

/// Frees a value made by [`give`].
unsafe extern "C" fn free_value(p: *mut std::ffi::c_char) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` came from `give`: 8 bytes of length precede it in one boxed slice.
    unsafe {
        let base = (p as *mut u8).sub(8);
        let mut n = [0u8; 8];
        n.copy_from_slice(std::slice::from_raw_parts(base, 8));
        let len = u64::from_ne_bytes(n) as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, 8 + len)));
    }
}

/// The error a callback returns, made by the plugin's `callback_error` (a pointer to its
/// error constructor).
fn fail(cb: *mut ffi::PJRT_CallbackError, code: ffi::PJRT_Error_Code, msg: &str) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid pointer (or null) to its constructor, which copies
    // the message.
    match unsafe { cb.as_ref() }.copied().flatten() {
        Some(f) => unsafe { f(code, msg.as_ptr() as *const _, msg.len()) },
        None => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn kv_get(args: *mut ffi::PJRT_KeyValueGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes valid args whose user_arg is the KvStore installed above.
    let a = unsafe { &mut *args };
    let kv = unsafe { &*(a.user_arg as *const KvStore) };
    let key = kv.key(a.key, a.key_size);
    let timeout = Duration::from_millis(a.timeout_in_ms.max(0) as u64);
    match kv.store.get(&key, timeout) {
        Ok(v) => {
            a.value = give(&v);
            a.value_size = v.len();
            a.value_deleter_callback = Some(free_value);
            std::ptr::null_mut()
        }
        Err(e) => fail(a.callback_error, ffi::PJRT_Error_Code_DEADLINE_EXCEEDED, &e.to_string()),
    }
}

unsafe extern "C" fn kv_try_get(args: *mut ffi::PJRT_KeyValueTryGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: as in `kv_get`.
    let a = unsafe { &mut *args };
    let kv = unsafe { &*(a.user_arg as *const KvStore) };
    let key = kv.key(a.key, a.key_size);
    match kv.store.get(&key, Duration::ZERO) {
        Ok(v) => {
            a.value = give(&v);
            a.value_size = v.len();
            a.value_deleter_callback = Some(free_value);
            std::ptr::null_mut()
        }
        Err(_) => fail(a.callback_error, ffi::PJRT_Error_Code_NOT_FOUND, &format!("key `{key}` not found")),
    }
}

unsafe extern "C" fn kv_put(args: *mut ffi::PJRT_KeyValuePutCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: as in `kv_get`; the value is valid for the call.
    let a = unsafe { &mut *args };
    let kv = unsafe { &*(a.user_arg as *const KvStore) };
    let key = kv.key(a.key, a.key_size);
    let value = if a.value.is_null() {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(a.value as *const u8, a.value_size) }
    };
    match kv.store.set(&key, value) {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => fail(a.callback_error, ffi::PJRT_Error_Code_INTERNAL, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::Sized as _;
    use redco_core::runtime::store::MemStore;
    use std::sync::atomic::{AtomicI32, Ordering};

    static LAST: AtomicI32 = AtomicI32::new(-1);
    static mut RECORD: ffi::PJRT_CallbackError = Some(record);

    unsafe extern "C" fn record(
        code: ffi::PJRT_Error_Code,
        _m: *const std::ffi::c_char,
        _n: usize,
    ) -> *mut ffi::PJRT_Error {
        LAST.store(code as i32, Ordering::SeqCst);
        std::ptr::NonNull::dangling().as_ptr()
    }

    #[test]
    fn put_then_get_and_try_get_through_the_store() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let kv = KvStore::new(store.clone(), "pjrt/0/");
        let (key, value) = ("topology", b"\x00\x01bytes");
        let mut p = ffi::PJRT_KeyValuePutCallback_Args::new();
        p.key = key.as_ptr() as *const _;
        p.key_size = key.len();
        p.value = value.as_ptr() as *const _;
        p.value_size = value.len();
        p.user_arg = &kv as *const KvStore as *mut _;
        p.callback_error = &raw mut RECORD;
        assert!(unsafe { kv_put(&mut p) }.is_null());
        assert_eq!(store.get("pjrt/0/topology", Duration::ZERO).unwrap(), value);
        let mut g = ffi::PJRT_KeyValueGetCallback_Args::new();
        g.key = key.as_ptr() as *const _;
        g.key_size = key.len();
        g.timeout_in_ms = 100;
        g.user_arg = p.user_arg;
        g.callback_error = &raw mut RECORD;
        assert!(unsafe { kv_get(&mut g) }.is_null());
        let got = unsafe { std::slice::from_raw_parts(g.value as *const u8, g.value_size) }.to_vec();
        assert_eq!(got, value);
        unsafe { g.value_deleter_callback.unwrap()(g.value) };
        let missing = "absent";
        let mut t = ffi::PJRT_KeyValueTryGetCallback_Args::new();
        t.key = missing.as_ptr() as *const _;
        t.key_size = missing.len();
        t.user_arg = p.user_arg;
        t.callback_error = &raw mut RECORD;
        assert!(!unsafe { kv_try_get(&mut t) }.is_null());
        assert_eq!(LAST.load(Ordering::SeqCst), ffi::PJRT_Error_Code_NOT_FOUND as i32);
    }
}
