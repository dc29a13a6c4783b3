//! PJRT events: awaited, then destroyed.

use crate::api::Api;
use crate::ffi::{self, Sized as _};
use crate::pjrt;
use redco_core::Result;

/// Waits for `event` (null is ready at once) and destroys it; an event that completed with
/// an error returns that error under `op`.
pub(crate) fn await_event(api: &Api, event: *mut ffi::PJRT_Event, op: &str) -> Result<()> {
    if event.is_null() {
        return Ok(());
    }
    let mut a = ffi::PJRT_Event_Await_Args::new();
    a.event = event;
    let waited = pjrt!(api, PJRT_Event_Await, &mut a);
    let mut d = ffi::PJRT_Event_Destroy_Args::new();
    d.event = event;
    let destroyed = pjrt!(api, PJRT_Event_Destroy, &mut d);
    waited.map_err(|e| crate::api::pjrt_error(op, e))?;
    destroyed
}
