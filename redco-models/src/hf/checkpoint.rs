//! A Hugging Face safetensors checkpoint opened for reading by name and by slice: every file
//! (one `model.safetensors` or the shards of `model.safetensors.index.json`) is memory-mapped
//! and its header validated once; reading a tensor, or one rank's slice of it, copies only
//! those bytes and then drops the mapped pages again, so a rank that loads its quarter of a
//! model holds about a quarter of the model (plus at most one tensor's pages) in memory.

use super::safetensors::{files, HostTensor};
use redco_core::{DType, Error, HostData, Result, Shape};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct Entry {
    file: usize,
    dtype: DType,
    shape: Shape,
    /// Byte range in the file.
    start: usize,
    end: usize,
}

/// An opened checkpoint.
pub struct Checkpoint {
    maps: Vec<memmap2::Mmap>,
    paths: Vec<PathBuf>,
    entries: BTreeMap<String, Entry>,
}

fn err(p: &Path, e: impl std::fmt::Display) -> Error {
    Error::invalid("safetensors", format!("{}: {e}", p.display()))
}

fn dtype_of(d: safetensors::Dtype) -> Option<DType> {
    Some(match d {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F64 => DType::F64,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::I64 => DType::I64,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::U8 | safetensors::Dtype::BOOL => DType::U8,
        _ => return None,
    })
}

/// A readable message for a header the safetensors crate refuses.
fn explain(e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall | E::InvalidHeaderLength => "the file is truncated (shorter than its header)".into(),
        E::MetadataIncompleteBuffer => {
            "the data section does not match the header (file truncated, or offsets past the end)".into()
        }
        E::InvalidOffset(name) => format!("tensor `{name}` has offsets that overlap another tensor or leave a gap"),
        E::TensorInvalidInfo => "a tensor's byte range does not match its shape and dtype".into(),
        E::InvalidHeader | E::InvalidHeaderDeserialization | E::InvalidHeaderStart => {
            "the header is not valid safetensors JSON".into()
        }
        other => format!("not a valid safetensors file: {other:?}"),
    }
}

impl Checkpoint {
    /// Opens the checkpoint of `path`: a model directory or one `.safetensors` file.
    pub fn open(path: &Path) -> Result<Self> {
        let paths = if path.is_dir() { files(path)? } else { vec![path.to_path_buf()] };
        let mut maps = Vec::new();
        let mut entries = BTreeMap::new();
        for (fi, p) in paths.iter().enumerate() {
            let f = std::fs::File::open(p).map_err(|e| err(p, e))?;
            // SAFETY: the map is only read; a file truncated underneath us would fault, which
            // no loader can prevent, and the header below is validated against its length.
            let mm = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| err(p, e))?;
            let (n, meta) = safetensors::SafeTensors::read_metadata(&mm).map_err(|e| err(p, explain(e)))?;
            for (name, info) in meta.tensors() {
                let dtype = dtype_of(info.dtype)
                    .ok_or_else(|| err(p, format!("tensor `{name}` has unsupported dtype {:?}", info.dtype)))?;
                let (s, e) = info.data_offsets;
                if entries.contains_key(&name) {
                    return Err(err(p, format!("tensor `{name}` appears in more than one file")));
                }
                let entry =
                    Entry { file: fi, dtype, shape: Shape::new(info.shape.clone()), start: 8 + n + s, end: 8 + n + e };
                entries.insert(name, entry);
            }
            maps.push(mm);
        }
        Ok(Checkpoint { maps, paths, entries })
    }

    /// Every tensor name with its shape and stored dtype.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &Shape, DType)> {
        self.entries.iter().map(|(n, e)| (n.as_str(), &e.shape, e.dtype))
    }

    /// The shape of tensor `name`, if the checkpoint has it.
    pub fn shape(&self, name: &str) -> Option<&Shape> {
        self.entries.get(name).map(|e| &e.shape)
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| Error::invalid("safetensors", format!("no tensor named `{name}`")))
    }

    /// The whole tensor `name`.
    pub fn read(&self, name: &str) -> Result<HostTensor> {
        let e = self.entry(name)?;
        if e.shape.rank() == 0 {
            return self.read_slice(name, 0, 0, 0);
        }
        self.read_slice(name, 0, 0, e.shape.dims()[0])
    }

    /// Rows `start..start + len` of dimension `dim` of tensor `name` (everything of a
    /// scalar), copying only those bytes out of the mapped file.
    pub fn read_slice(&self, name: &str, dim: usize, start: usize, len: usize) -> Result<HostTensor> {
        let e = self.entry(name)?;
        let p = &self.paths[e.file];
        let mm = &self.maps[e.file];
        let bytes = &mm[e.start..e.end];
        let es = e.dtype.size_in_bytes();
        let (shape, parts) = if e.shape.rank() == 0 {
            (e.shape.clone(), vec![bytes])
        } else {
            if dim >= e.shape.rank() || start + len > e.shape.dims()[dim] {
                return Err(err(
                    p,
                    format!("slice {start}..{} of dim {dim} is outside `{name}` {}", start + len, e.shape),
                ));
            }
            let (outer, n, inner) = e.shape.split_at_dim(dim);
            let parts: Vec<&[u8]> = (0..outer)
                .map(|o| {
                    let at = (o * n + start) * inner * es;
                    &bytes[at..at + len * inner * es]
                })
                .collect();
            (e.shape.with_dim(dim, len), parts)
        };
        let data = host_from_parts(e.dtype, &parts);
        // Give the pages back: the copy is what this rank keeps.
        // SAFETY: read-only private mapping; dropping its pages only means a later read
        // faults them in again from the file.
        unsafe {
            let _ = mm.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, e.start, e.end - e.start);
        }
        Ok(HostTensor { data, shape })
    }
}

/// The values of `parts` (little-endian `dtype` bytes, in order) in one typed buffer: one
/// copy out of the mapped file, into memory advised for huge pages (a weight is then
/// streamed with few TLB misses).
fn host_from_parts(dtype: DType, parts: &[&[u8]]) -> HostData {
    fn collect<T: bytemuck::Pod>(parts: &[&[u8]]) -> Vec<T> {
        let size = std::mem::size_of::<T>();
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        let mut v: Vec<T> = Vec::with_capacity(bytes / size);
        redco_core::cpu::malloc::advise_huge_pages(v.as_ptr() as *const u8, bytes);
        for p in parts {
            match bytemuck::try_cast_slice::<u8, T>(p) {
                Ok(s) => v.extend_from_slice(s),
                // data not aligned for `T` in the file
                Err(_) => v.extend(p.chunks_exact(size).map(bytemuck::pod_read_unaligned::<T>)),
            }
        }
        v
    }
    match dtype {
        DType::F32 => HostData::F32(collect(parts)),
        DType::F64 => HostData::F64(collect(parts)),
        DType::F16 => HostData::F16(collect(parts)),
        DType::BF16 => HostData::BF16(collect(parts)),
        DType::I64 => HostData::I64(collect(parts)),
        DType::I32 => HostData::I32(collect(parts)),
        DType::U8 => HostData::U8(collect(parts)),
    }
}
