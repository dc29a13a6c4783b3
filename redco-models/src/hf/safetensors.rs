//! Reading Hugging Face safetensors checkpoints: one `model.safetensors`, or shards listed
//! by `model.safetensors.index.json`; files are memory-mapped.

use redco_core::{Error, HostData, Result, Shape};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A tensor read from a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// The values.
    pub data: HostData,
    /// The shape.
    pub shape: Shape,
}

fn err(p: &Path, e: impl std::fmt::Display) -> Error {
    Error::data("safetensors", format!("{}: {e}", p.display()))
}

/// The checkpoint files of `dir`.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).map_err(|_| {
        Error::invalid(
            "safetensors",
            format!("{} has neither model.safetensors nor model.safetensors.index.json", dir.display()),
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(&index, e))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| err(&index, "no weight_map"))?;
    let mut names = Vec::with_capacity(map.len());
    for (tensor, f) in map {
        let name = f.as_str().ok_or_else(|| err(&index, format!("`{tensor}` maps to {f}, not a file name")))?;
        // a shard is a file of this directory: no absolute path, no `..`, no subdirectory
        let plain = Path::new(name).components().count() == 1
            && matches!(Path::new(name).components().next(), Some(std::path::Component::Normal(_)));
        if !plain {
            return Err(err(&index, format!("`{tensor}` maps to `{name}`, which is not a file of {}", dir.display())));
        }
        names.push(name.to_string());
    }
    names.sort();
    names.dedup();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

fn host(v: &safetensors::tensor::TensorView<'_>, name: &str, p: &Path) -> Result<HostData> {
    let b = v.data();
    Ok(match v.dtype() {
        safetensors::Dtype::F32 => HostData::F32(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::F64 => HostData::F64(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::F16 => HostData::F16(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::BF16 => HostData::BF16(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::I64 => HostData::I64(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::I32 => HostData::I32(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::U8 | safetensors::Dtype::BOOL => HostData::U8(b.to_vec()),
        d => return Err(err(p, format!("tensor `{name}` has unsupported dtype {d:?}"))),
    })
}

/// Every tensor of the checkpoint in `dir` (or of one safetensors file).
pub fn read_all(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let paths = if path.is_dir() { files(path)? } else { vec![path.to_path_buf()] };
    let mut out = BTreeMap::new();
    for p in paths {
        let f = std::fs::File::open(&p).map_err(|e| err(&p, e))?;
        // SAFETY: the map is read-only and dropped before this function returns; a file
        // changed underneath while we copy out of it can at worst give wrong values, which
        // the checkpoint's own shape checks then report.
        let mm = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| err(&p, e))?;
        let st = safetensors::SafeTensors::deserialize(&mm)
            .map_err(|e| err(&p, format!("not a valid safetensors file: {e}")))?;
        for (name, v) in st.tensors() {
            let data = host(&v, &name, &p)?;
            out.insert(name, HostTensor { data, shape: Shape::new(v.shape().to_vec()) });
        }
    }
    Ok(out)
}
