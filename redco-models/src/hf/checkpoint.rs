//! A Hugging Face safetensors checkpoint opened for reading by name and by slice: every file
//! (one `model.safetensors` or the shards of `model.safetensors.index.json`) is memory-mapped
//! and its header validated once; reading a tensor, or one rank's slice of it, copies only
//! those bytes and then drops the mapped pages again, so a rank that loads its quarter of a
//! model holds about a quarter of the model (plus at most one tensor's pages) in memory.

use super::safetensors::{files, HostTensor};
use redco_core::{DType, Error, HostData, Result, Shape};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
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
    Error::data("safetensors", format!("{}: {e}", p.display()))
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

    /// The stored dtype of tensor `name`, if the checkpoint has it.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.entries.get(name).map(|e| e.dtype)
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
        self.read_as(name, e.dtype)
    }

    /// The whole tensor `name` as `dtype` (converted while it is copied out of the file).
    pub fn read_as(&self, name: &str, dtype: DType) -> Result<HostTensor> {
        let e = self.entry(name)?;
        if e.shape.rank() == 0 {
            return self.read_slice_as(name, 0, 0, 0, dtype);
        }
        self.read_slice_as(name, 0, 0, e.shape.dims()[0], dtype)
    }

    /// Rows `start..start + len` of dimension `dim` of tensor `name` (everything of a
    /// scalar), copying only those bytes out of the mapped file.
    pub fn read_slice(&self, name: &str, dim: usize, start: usize, len: usize) -> Result<HostTensor> {
        let e = self.entry(name)?;
        self.read_slice_as(name, dim, start, len, e.dtype)
    }

    /// [`Self::read_slice`] as `dtype`: bf16 and f16 become f32 while they are copied out
    /// of the file (one pass, over the rayon pool's threads); other conversions follow the
    /// copy.
    pub fn read_slice_as(&self, name: &str, dim: usize, start: usize, len: usize, dtype: DType) -> Result<HostTensor> {
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
        let data = host_from_parts(e.dtype, &parts, dtype);
        // Give the pages back: the copy is what this rank keeps.
        // SAFETY: read-only private mapping; dropping its pages only means a later read
        // faults them in again from the file.
        unsafe {
            let _ = mm.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, e.start, e.end - e.start);
        }
        Ok(HostTensor { data, shape })
    }
}

/// The values of `parts` (little-endian `dtype` bytes, in order) as `want` in one typed
/// buffer: one copy (or conversion) out of the mapped file, into memory advised for huge
/// pages (a weight is then streamed with few TLB misses), in chunks over the rayon pool's
/// threads, so that the kernel's clearing of the fresh pages (most of a load's time) runs
/// on every core.
fn host_from_parts(dtype: DType, parts: &[&[u8]], want: DType) -> HostData {
    let bits = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    match (dtype, want) {
        (DType::BF16, DType::F32) => {
            return HostData::F32(convert(parts, 2, |b| half::bf16::from_bits(bits(b)).to_f32()))
        }
        (DType::F16, DType::F32) => {
            return HostData::F32(convert(parts, 2, |b| half::f16::from_bits(bits(b)).to_f32()))
        }
        _ => {}
    }
    let data = match dtype {
        DType::F32 => HostData::F32(collect(parts)),
        DType::F64 => HostData::F64(collect(parts)),
        DType::F16 => HostData::F16(collect(parts)),
        DType::BF16 => HostData::BF16(collect(parts)),
        DType::I64 => HostData::I64(collect(parts)),
        DType::I32 => HostData::I32(collect(parts)),
        DType::U8 => HostData::U8(collect(parts)),
    };
    data.into_dtype(want)
}

/// Elements per copying task: large enough to amortise a task.
const CHUNK: usize = 1 << 16;

/// A fresh buffer for `total` values, advised for huge pages.
fn fresh<T>(total: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(total);
    redco_cpu::malloc::advise_huge_pages(v.as_ptr() as *const u8, total * std::mem::size_of::<T>());
    v
}

/// `parts` as values of `T` (the file's type).
fn collect<T: bytemuck::Pod + Send + Sync>(parts: &[&[u8]]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let fast = |d: &mut [MaybeUninit<T>], s: &[u8]| match bytemuck::try_cast_slice::<u8, T>(s) {
        Ok(s) => d.iter_mut().zip(s).for_each(|(d, &x)| {
            d.write(x);
        }),
        // data not aligned for `T` in the file
        Err(_) => d.iter_mut().zip(s.chunks_exact(size)).for_each(|(d, b)| {
            d.write(bytemuck::pod_read_unaligned::<T>(b));
        }),
    };
    fill(parts, size, fast)
}

/// `parts` (values of `size` bytes) converted by `f`.
fn convert<U: Send>(parts: &[&[u8]], size: usize, f: impl Fn(&[u8]) -> U + Sync) -> Vec<U> {
    fill(parts, size, |d: &mut [MaybeUninit<U>], s: &[u8]| {
        d.iter_mut().zip(s.chunks_exact(size)).for_each(|(d, b)| {
            d.write(f(b));
        })
    })
}

/// A buffer of every value of `parts` (`size` bytes each), chunk by chunk in parallel, each
/// chunk written whole by `write(destination, source bytes)`.
fn fill<U: Send>(parts: &[&[u8]], size: usize, write: impl Fn(&mut [MaybeUninit<U>], &[u8]) + Sync) -> Vec<U> {
    use rayon::prelude::*;
    let total = parts.iter().map(|p| p.len() / size).sum();
    let mut v = fresh::<U>(total);
    let mut out = &mut v.spare_capacity_mut()[..total];
    for p in parts {
        let (dst, rest) = out.split_at_mut(p.len() / size);
        out = rest;
        dst.par_chunks_mut(CHUNK).zip(p.par_chunks(CHUNK * size)).for_each(|(d, s)| write(d, s));
    }
    // SAFETY: the chunks of every part cover `total` elements, and `write` wrote each.
    unsafe { v.set_len(total) };
    v
}
