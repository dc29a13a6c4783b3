//! The wire format of the store's TCP protocol: requests and answers, length-checked.

use super::*;

pub(super) fn encode_request(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 + 4 + key.len() + 8 + value.len());
    buf.push(op);
    buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
    buf.extend_from_slice(key);
    buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    buf.extend_from_slice(value);
    buf
}

pub(super) fn encode_response(status: u8, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 + 8 + payload.len());
    buf.push(status);
    buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    buf.extend_from_slice(payload);
    buf
}

pub(super) fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut a = [0u8; N];
    r.read_exact(&mut a)?;
    Ok(a)
}

/// Reads exactly `len` bytes; `len` must already be checked against a limit. The buffer
/// grows as bytes arrive, so a peer that lies about a length costs nothing.
pub(super) fn read_bytes(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(len as u64).read_to_end(&mut v)?;
    if v.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("message cut short: {} of {len} bytes", v.len()),
        ));
    }
    Ok(v)
}

pub(super) struct Request {
    pub(super) op: u8,
    pub(super) key: String,
    pub(super) value: Vec<u8>,
}

pub(super) enum BadRequest {
    /// The peer closed the connection between requests.
    Closed,
    /// The socket failed (or the request was cut short).
    Io(io::Error),
    /// The request breaks the protocol; the string says how.
    Malformed(String),
}

impl From<io::Error> for BadRequest {
    fn from(e: io::Error) -> Self {
        BadRequest::Io(e)
    }
}

pub(super) fn read_request(r: &mut impl Read) -> std::result::Result<Request, BadRequest> {
    let [op] = match read_array::<1>(r) {
        Ok(op) => op,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(BadRequest::Closed),
        Err(e) => return Err(BadRequest::Io(e)),
    };
    if !matches!(op, OP_HELLO | OP_SET | OP_GET | OP_ADD) {
        return Err(BadRequest::Malformed(format!("unknown op {op}")));
    }
    let key_len = u32::from_le_bytes(read_array(r)?) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(BadRequest::Malformed(format!("key of {key_len} bytes is over the limit of {MAX_KEY_LEN}")));
    }
    let key = String::from_utf8(read_bytes(r, key_len)?)
        .map_err(|_| BadRequest::Malformed("key is not UTF-8".to_string()))?;
    let value_len = u64::from_le_bytes(read_array(r)?);
    let (limit, exact) = match op {
        OP_HELLO => (64, false),
        OP_SET => (MAX_VALUE_LEN as u64, false),
        _ => (8, true), // get: timeout in ms; add: delta
    };
    if value_len > limit || (exact && value_len != limit) {
        return Err(BadRequest::Malformed(format!(
            "op {op}: value of {value_len} bytes (the limit is {limit}{})",
            if exact { ", exactly" } else { "" }
        )));
    }
    let value = read_bytes(r, value_len as usize)?;
    Ok(Request { op, key, value })
}

pub(super) fn read_response(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let [status] = read_array::<1>(r)?;
    if !matches!(status, ST_OK | ST_TIMEOUT | ST_ERROR) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not a store answer (status byte {status})")));
    }
    let len = u64::from_le_bytes(read_array(r)?);
    if len > MAX_VALUE_LEN as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answer of {len} bytes is over the limit of {MAX_VALUE_LEN}"),
        ));
    }
    Ok((status, read_bytes(r, len as usize)?))
}
