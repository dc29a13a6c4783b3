//! The GGUF container (version 3, as llama.cpp's `gguf` library and `gguf-py` write it):
//! a header, typed key/value metadata, tensor descriptions, then the tensors' data aligned
//! to `general.alignment` (32 bytes unless the file says otherwise).
//!
//! Every count and length read from a file is checked against the file's size before
//! anything is allocated, so a truncated or corrupt file is an error naming what is wrong,
//! never a panic or a huge allocation.

use redco_core::{Error, Result};
use std::io::Write;
use std::path::Path;

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The version this module writes (and the newest it reads).
pub const VERSION: u32 = 3;
/// The data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING` (UTF-8).
    Str(String),
    /// `ARRAY` of one element type (its type code kept, so an empty array round-trips).
    Array(u32, Vec<Value>),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

impl Value {
    /// The GGUF type code of this value.
    pub fn type_code(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(..) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// An array of strings.
    pub fn strings<S: AsRef<str>>(items: &[S]) -> Value {
        Value::Array(8, items.iter().map(|s| Value::Str(s.as_ref().to_string())).collect())
    }

    /// An array of f32.
    pub fn f32s(items: &[f32]) -> Value {
        Value::Array(6, items.iter().map(|&x| Value::F32(x)).collect())
    }

    /// An array of i32.
    pub fn i32s(items: &[i32]) -> Value {
        Value::Array(5, items.iter().map(|&x| Value::I32(x)).collect())
    }

    /// The value as an unsigned integer, when it is an integer of any width that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(x) => Some(x.into()),
            Value::U16(x) => Some(x.into()),
            Value::U32(x) => Some(x.into()),
            Value::U64(x) => Some(x),
            Value::I8(x) => u64::try_from(x).ok(),
            Value::I16(x) => u64::try_from(x).ok(),
            Value::I32(x) => u64::try_from(x).ok(),
            Value::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => self.as_u64().map(|x| x as f64),
        }
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, when the value is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

/// A tensor type of GGML: the plain float types this module writes, and the quantized
/// block types by name (so a reader can say which one it met).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Any other type, by its code.
    Other(u32),
}

impl GgmlType {
    /// The type's code in a GGUF file.
    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::BF16 => 30,
            GgmlType::Other(c) => c,
        }
    }

    /// The block-quantized format of this type, when redco reads it.
    pub fn quant(self) -> Option<redco_core::quant::QuantFormat> {
        redco_core::quant::QuantFormat::from_ggml_type(self.code())
    }

    /// The type of code `c`.
    pub fn from_code(c: u32) -> GgmlType {
        match c {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            30 => GgmlType::BF16,
            c => GgmlType::Other(c),
        }
    }

    /// The type's name as llama.cpp prints it.
    pub fn name(self) -> String {
        const NAMES: [&str; 42] = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
            "NVFP4",
            "Q1_0",
        ];
        NAMES.get(self.code() as usize).map_or_else(|| format!("type {}", self.code()), |s| s.to_string())
    }

    /// Bytes per element of the plain types (None for block types).
    pub fn elem_bytes(self) -> Option<u64> {
        match self {
            GgmlType::F32 => Some(4),
            GgmlType::F16 | GgmlType::BF16 => Some(2),
            GgmlType::Other(_) => None,
        }
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// Its dimensions, fastest-varying first (GGML's order: a PyTorch `[out, in]` matrix is
    /// `[in, out]` here).
    pub dims: Vec<u64>,
    /// Its element type.
    pub ty: GgmlType,
    /// Its data's offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Elements in the tensor.
    pub fn elems(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of its data, for the plain types and the block types of
    /// [`redco_core::quant::QuantFormat`]
    /// (None for others, or a shape that is not whole blocks).
    pub fn byte_len(&self) -> Option<u64> {
        if let Some(b) = self.ty.elem_bytes() {
            return self.elems().checked_mul(b);
        }
        let q = self.ty.quant()?;
        let (per, size) = (q.block_values(), q.block_bytes());
        let n = self.elems();
        n.is_multiple_of(per as u64).then(|| n / per as u64 * size as u64)
    }
}

/// A GGUF file's header: its metadata and tensor descriptions (the data stays in the file).
#[derive(Debug, Clone, PartialEq)]
pub struct Gguf {
    /// The file's version (2 or 3).
    pub version: u32,
    /// The metadata, in file order.
    pub metadata: Vec<(String, Value)>,
    /// The tensors, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Where the data section starts in the file.
    pub data_offset: u64,
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::invalid("gguf", what.to_string())
}

/// A cursor over a file's bytes that refuses to read past the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let end = usize::try_from(n).ok().and_then(|n| self.at.checked_add(n)).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| {
            corrupt(format!("the file ends inside {what} (at byte {}, {} bytes long)", self.at, self.b.len()))
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }
    /// A count of items of at least `min_bytes` each, checked against what is left.
    fn count(&mut self, min_bytes: u64, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.b.len() - self.at) as u64;
        if n.saturating_mul(min_bytes.max(1)) > left {
            return Err(corrupt(format!("{what} is {n}, more than the {left} bytes left in the file hold")));
        }
        Ok(n as usize)
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        let what = format!("the value of `{key}`");
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(&what)?[0]),
            1 => Value::I8(self.arr::<1>(&what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(&what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(&what)?)),
            4 => Value::U32(self.u32(&what)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(&what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(&what)?)),
            7 => match self.arr::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(corrupt(format!("`{key}` is a bool of value {b}"))),
            },
            8 => Value::Str(self.string(&what)?),
            9 if depth == 0 => {
                let et = self.u32(&what)?;
                let min = match et {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    _ => 8,
                };
                let n = self.count(min, &format!("the length of `{key}`"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(et, v)
            }
            9 => return Err(corrupt(format!("`{key}` nests arrays, which this reader does not read"))),
            10 => Value::U64(self.u64(&what)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(&what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(&what)?)),
            t => return Err(corrupt(format!("`{key}` has value type {t}, which GGUF does not define"))),
        })
    }
}

impl Gguf {
    /// Parses the header of a GGUF file's bytes (the whole file, or at least its header and
    /// data section, whose tensor ranges are checked against `bytes.len()`).
    pub fn parse(bytes: &[u8]) -> Result<Gguf> {
        let mut c = Cursor { b: bytes, at: 0 };
        if c.take(4, "the magic").ok() != Some(MAGIC.as_slice()) {
            return Err(corrupt("not a GGUF file (it does not start with `GGUF`)"));
        }
        let version = c.u32("the version")?;
        if !(2..=VERSION).contains(&version) {
            return Err(corrupt(format!("GGUF version {version} is not supported (2 and 3 are)")));
        }
        let n_tensors = c.count(24, "the tensor count")?;
        let n_kv = c.count(13, "the metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key {i}"))?;
            let ty = c.u32(&format!("the type of `{key}`"))?;
            let v = c.value(ty, &key, 0)?;
            metadata.push((key, v));
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&format!("tensor name {i}"))?;
            let nd = c.u32(&format!("the rank of `{name}`"))?;
            if nd == 0 || nd > 4 {
                return Err(corrupt(format!("tensor `{name}` has {nd} dimensions (GGML has 1 to 4)")));
            }
            let dims = (0..nd).map(|_| c.u64(&format!("the shape of `{name}`"))).collect::<Result<Vec<_>>>()?;
            let ty = GgmlType::from_code(c.u32(&format!("the type of `{name}`"))?);
            let offset = c.u64(&format!("the offset of `{name}`"))?;
            tensors.push(TensorInfo { name, dims, ty, offset });
        }
        let g = Gguf { version, metadata, tensors, data_offset: 0 };
        let align = g.alignment()?;
        let data_offset = (c.at as u64).div_ceil(align) * align;
        let g = Gguf { data_offset, ..g };
        for t in &g.tensors {
            if t.offset % align != 0 {
                return Err(corrupt(format!("tensor `{}` is not aligned to {align} bytes", t.name)));
            }
            if let Some(len) = t.byte_len() {
                let end = len.checked_add(t.offset + data_offset);
                if end.is_none_or(|e| e > bytes.len() as u64) {
                    return Err(corrupt(format!(
                        "tensor `{}` runs past the end of the file (truncated, or a corrupt shape)",
                        t.name
                    )));
                }
            }
        }
        Ok(g)
    }

    /// Reads and parses the file at `path` (memory-mapped).
    pub fn open(path: &Path) -> Result<(Gguf, memmap2::Mmap)> {
        let io = |e: std::io::Error| Error::io("gguf", "cannot read", path, e);
        let f = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is only read; a file truncated underneath it would fault, which
        // no reader can prevent, and the header is validated against its length.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
        let g = Gguf::parse(&map).map_err(|e| Error::data("gguf", format!("{}: {e}", path.display())))?;
        Ok((g, map))
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.alignment`, or 32; an alignment that is not a power of two is an error.
    pub fn alignment(&self) -> Result<u64> {
        match self.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => Ok(a),
                _ => Err(corrupt(format!("general.alignment {v:?} is not a power of two"))),
            },
        }
    }

    /// The bytes of tensor `t` (a plain type or a block type [`redco_core::quant`] reads), from
    /// the file's bytes `file`.
    pub fn tensor_bytes<'a>(&self, file: &'a [u8], t: &TensorInfo) -> Result<&'a [u8]> {
        let len = t.byte_len().ok_or_else(|| {
            Error::invalid("gguf", format!("tensor `{}` is {}, which this reader does not read", t.name, t.ty.name()))
        })?;
        let start = (self.data_offset + t.offset) as usize;
        Ok(&file[start..start + len as usize])
    }
}

/// Writes a GGUF file: metadata first, then each tensor's description and data.
pub struct Writer {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(TensorInfo, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::Str(s) => put_str(out, s),
        Value::Array(t, items) => {
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl Writer {
    /// An empty file.
    pub fn new() -> Writer {
        Writer { metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Sets metadata `key` (replacing an earlier value of the same key).
    pub fn set(&mut self, key: &str, v: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.metadata.push((key.to_string(), v)),
        }
    }

    /// Adds tensor `name` of `dims` (fastest first) and type `ty` (a plain type, or a block
    /// type [`redco_core::quant`] reads, in llama.cpp's block layout), with its little-endian
    /// bytes; a length that does not match, or another type, is an error.
    pub fn tensor(&mut self, name: &str, dims: Vec<u64>, ty: GgmlType, bytes: Vec<u8>) -> Result<()> {
        let info = TensorInfo { name: name.to_string(), dims, ty, offset: 0 };
        let want = info.byte_len();
        if want != Some(bytes.len() as u64) {
            return Err(Error::invalid(
                "gguf",
                format!("tensor `{name}`: {} bytes for {:?} of {}", bytes.len(), info.dims, ty.name()),
            ));
        }
        self.tensors.push((info, bytes));
        Ok(())
    }

    /// Writes the file to `path` (through a temporary file renamed into place).
    pub fn write(mut self, path: &Path) -> Result<()> {
        let align = DEFAULT_ALIGNMENT;
        self.set("general.alignment", Value::U32(align as u32));
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k);
            head.extend_from_slice(&v.type_code().to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for (t, bytes) in &mut self.tensors {
            t.offset = offset;
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.code().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + bytes.len() as u64).div_ceil(align) * align;
        }
        head.resize((head.len() as u64).div_ceil(align) as usize * align as usize, 0);
        let io = |e: std::io::Error| Error::io("gguf", "cannot write", path, e);
        let tmp = path.with_extension("gguf.partial");
        let mut f = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(&tmp).map_err(io)?);
        f.write_all(&head).map_err(io)?;
        for (_, bytes) in &self.tensors {
            f.write_all(bytes).map_err(io)?;
            let pad = (bytes.len() as u64).div_ceil(align) * align - bytes.len() as u64;
            f.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        }
        f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("redco-gguf-{name}-{}.gguf", std::process::id()))
    }

    fn sample() -> std::path::PathBuf {
        let p = tmp("sample");
        let mut w = Writer::new();
        w.set("general.architecture", Value::Str("llama".into()));
        w.set("llama.block_count", Value::U32(2));
        w.set("tokenizer.ggml.tokens", Value::strings(&["<unk>", "a", "é"]));
        w.set("tokenizer.ggml.scores", Value::f32s(&[0.0, -1.5, -2.0]));
        w.set("empty", Value::Array(5, vec![]));
        w.set("neg", Value::I64(-7));
        let a: Vec<u8> = [1.0f32, -2.0, 3.5].iter().flat_map(|x| x.to_le_bytes()).collect();
        w.tensor("a", vec![3], GgmlType::F32, a).unwrap();
        w.tensor("b", vec![2, 2], GgmlType::BF16, vec![1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        w.write(&p).unwrap();
        p
    }

    #[test]
    fn a_written_file_reads_back_whole() {
        let p = sample();
        let (g, map) = Gguf::open(&p).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.get("general.architecture").and_then(Value::as_str), Some("llama"));
        assert_eq!(g.get("llama.block_count").and_then(Value::as_u64), Some(2));
        assert_eq!(g.get("neg"), Some(&Value::I64(-7)));
        assert_eq!(g.get("empty"), Some(&Value::Array(5, vec![])));
        let toks = g.get("tokenizer.ggml.tokens").and_then(Value::as_array).unwrap();
        assert_eq!(toks[2].as_str(), Some("é"));
        assert_eq!(g.data_offset % 32, 0);
        let a = &g.tensors[0];
        assert_eq!((a.name.as_str(), a.dims.clone(), a.ty, a.offset), ("a", vec![3], GgmlType::F32, 0));
        let bytes = g.tensor_bytes(&map, a).unwrap();
        assert_eq!(f32::from_le_bytes(bytes[8..12].try_into().unwrap()), 3.5);
        assert_eq!(g.tensors[1].offset, 32, "each tensor starts aligned");
        assert_eq!(g.tensor_bytes(&map, &g.tensors[1]).unwrap(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        std::fs::remove_file(p).ok();
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let p = sample();
        let bytes = std::fs::read(&p).unwrap();
        // the header and each tensor's full range are needed; any shorter prefix is refused
        for n in 0..bytes.len() - 28 {
            assert!(Gguf::parse(&bytes[..n]).is_err(), "a file cut at {n} bytes parsed");
        }
        std::fs::remove_file(p).ok();
    }

    #[test]
    fn corrupt_counts_and_types_are_named() {
        let p = sample();
        let mut bytes = std::fs::read(&p).unwrap();
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = Gguf::parse(&huge).unwrap_err().to_string();
        assert!(e.contains("tensor count"), "{e}");
        bytes[0] = b'X';
        assert!(Gguf::parse(&bytes).unwrap_err().to_string().contains("not a GGUF file"));
        std::fs::remove_file(p).ok();
    }

    #[test]
    fn block_types_are_named() {
        assert_eq!(GgmlType::from_code(8).name(), "Q8_0");
        assert_eq!(GgmlType::from_code(12).name(), "Q4_K");
        assert_eq!(GgmlType::from_code(30), GgmlType::BF16);
        assert_eq!(GgmlType::from_code(999).name(), "type 999");
    }
}
