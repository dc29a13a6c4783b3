//! The storage of the PJRT backend: a device buffer, with the host copy of uploaded
//! integer data (ids) kept so that index checks need no device read.

use crate::buffer::Buffer;
use redco_core::{DType, HostData};
use std::sync::Arc;

/// One flat array on a PJRT device, shared by clones.
#[derive(Debug, Clone)]
pub struct PjrtStorage {
    pub(crate) buf: Arc<Buffer>,
    /// The host data it was uploaded from, kept for integer data (token ids, targets).
    pub(crate) host: Option<Arc<HostData>>,
}

impl PjrtStorage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.buf.dtype()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The device buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }
}
