//! Loading a checkpoint written at another mesh or ZeRO stage (PyTorch's distributed
//! checkpoint does the same): each tensor of the training state (the f32 masters and the
//! optimizer's per-parameter state) is assembled whole on the host from the ranks' files
//! that hold its pieces (its model-parallel shards, each cut in dp-slices at ZeRO-2/3, and
//! the moments at ZeRO-1), then cut again for this rank's layout. One tensor at a time:
//! no rank ever holds more than one whole tensor of the state, and each file is read only
//! where a tensor lies (its header, then the tensor's bytes).

use super::checkpoint::Manifest;
use crate::optimizer::{StateTensor, TrainOptimizer};
use redco_core::runtime::{Comm, Mesh};
use redco_core::sharding::ShardLayout;
use redco_core::{Backend, DType, Error, HostData, MeshAxis, Placement, Result, Shape, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// How a saved run laid out its state: the mesh and whether masters and optimizer state
/// were dp-sliced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Saved {
    pub mesh: Mesh,
    pub masters_sliced: bool,
    pub opt_sliced: bool,
}

impl Saved {
    /// The layout of the checkpoint with `manifest`, written at ZeRO stage `stage`.
    pub(crate) fn of(manifest: &Manifest, stage: u8) -> Result<Self> {
        let mesh: Mesh = manifest.mesh.parse()?;
        Ok(Saved { mesh, masters_sliced: stage >= 2 && mesh.dp > 1, opt_sliced: stage >= 1 && mesh.dp > 1 })
    }
}

/// One rank's safetensors file, read lazily: the header, then a tensor's bytes on demand.
struct LazyFile {
    path: PathBuf,
    file: File,
    /// Key -> (dtype, shape, absolute byte range).
    index: HashMap<String, (String, Vec<usize>, u64, u64)>,
    meta: HashMap<String, String>,
}

impl LazyFile {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io("checkpoint", "cannot read", path, e))?;
        let mut n = [0u8; 8];
        file.read_exact_at(&mut n, 0).map_err(|e| Error::io("checkpoint", "cannot read", path, e))?;
        let len = u64::from_le_bytes(n);
        if len > 1 << 30 {
            return Err(Error::data("checkpoint", format!("{}: a header of {len} bytes", path.display())));
        }
        let mut head = vec![0u8; len as usize];
        file.read_exact_at(&mut head, 8).map_err(|e| Error::io("checkpoint", "cannot read", path, e))?;
        let bad = |e: String| Error::data("checkpoint", format!("{}: {e}", path.display()));
        let v: serde_json::Value = serde_json::from_slice(&head).map_err(|e| bad(e.to_string()))?;
        let obj = v.as_object().ok_or_else(|| bad("the header is not an object".into()))?;
        let (mut index, mut meta) = (HashMap::new(), HashMap::new());
        for (k, e) in obj {
            if k == "__metadata__" {
                for (mk, mv) in e.as_object().into_iter().flatten() {
                    meta.insert(mk.clone(), mv.as_str().unwrap_or_default().to_string());
                }
                continue;
            }
            let dtype = e["dtype"].as_str().unwrap_or_default().to_string();
            let shape: Vec<usize> =
                e["shape"].as_array().into_iter().flatten().filter_map(|d| d.as_u64().map(|d| d as usize)).collect();
            let off = e["data_offsets"].as_array().ok_or_else(|| bad(format!("`{k}` has no data_offsets")))?;
            let (a, b) = (off[0].as_u64().unwrap_or(0), off[1].as_u64().unwrap_or(0));
            index.insert(k.clone(), (dtype, shape, 8 + len + a, 8 + len + b));
        }
        Ok(LazyFile { path: path.to_path_buf(), file, index, meta })
    }

    /// The tensor `key` as f32 (saved as f32, or as a 16-bit float widened exactly) and its
    /// shape.
    fn f32(&self, key: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let (dtype, shape, a, b) = self.index.get(key).ok_or_else(|| Error::Parameter {
            name: key.into(),
            msg: format!("missing from {}", self.path.display()),
        })?;
        let size = match dtype.as_str() {
            "F32" => 4,
            "BF16" | "F16" => 2,
            _ => 0,
        };
        if size == 0 || (b - a) as usize != shape.iter().product::<usize>() * size {
            return Err(Error::Parameter {
                name: key.into(),
                msg: format!(
                    "{}: resharding reads f32, bf16 or f16 state, found {dtype} of {} bytes",
                    self.path.display(),
                    b - a
                ),
            });
        }
        let mut bytes = vec![0u8; (b - a) as usize];
        self.file.read_exact_at(&mut bytes, *a).map_err(|e| Error::io("checkpoint", "cannot read", &self.path, e))?;
        let halves = || bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        let x = match dtype.as_str() {
            "BF16" => halves().map(|h| half::bf16::from_bits(h).to_f32()).collect(),
            "F16" => halves().map(|h| half::f16::from_bits(h).to_f32()).collect(),
            _ => bytemuck::pod_collect_to_vec(&bytes),
        };
        Ok((x, shape.clone()))
    }
}

/// `parts` (row-major, each `dims` with `dims[dim]` the part's size) side by side along `dim`.
fn concat(parts: &[Vec<f32>], dims: &[usize], dim: usize) -> Vec<f32> {
    let outer: usize = dims[..dim].iter().product();
    let row: usize = dims[dim..].iter().product();
    let mut out = Vec::with_capacity(row * outer * parts.len());
    for o in 0..outer {
        for p in parts {
            out.extend_from_slice(&p[o * row..(o + 1) * row]);
        }
    }
    out
}

/// The `i`-th of `k` equal parts of `x` (row-major `dims`) along `dim`.
fn narrow(x: &[f32], dims: &[usize], dim: usize, i: usize, k: usize) -> Vec<f32> {
    let outer: usize = dims[..dim].iter().product();
    let inner: usize = dims[dim + 1..].iter().product();
    let (whole, part) = (dims[dim] * inner, dims[dim] / k * inner);
    (0..outer).flat_map(|o| x[o * whole + i * part..o * whole + (i + 1) * part].iter().copied()).collect()
}

/// The split dimension of a placement, if split.
fn split_dim(p: Placement) -> Option<usize> {
    match p {
        Placement::Shard(d) => Some(d),
        _ => None,
    }
}

/// A saved parameter's whole layout, as the manifest records it: its global dims, and the
/// dimensions split over `mp` and over `dp` (a mixture's experts under expert parallelism).
struct SavedParam {
    dims: Vec<usize>,
    mp: Option<usize>,
    dp: Option<usize>,
}

/// The saved checkpoint's files, each opened once, and its parameters' whole layouts as
/// the manifest records them.
pub(crate) struct SavedFiles {
    saved: Saved,
    files: Vec<LazyFile>,
    params: BTreeMap<String, SavedParam>,
}

impl SavedFiles {
    /// Opens every rank's file of checkpoint `dir` (each verified against the manifest's
    /// sums first).
    pub(crate) fn open(dir: &Path, manifest: &Manifest, saved: Saved) -> Result<Self> {
        let mut files = Vec::new();
        for r in 0..saved.mesh.size() {
            let name = format!("rank-{r}.safetensors");
            manifest.verify_file(dir, &name)?;
            files.push(LazyFile::open(&dir.join(name))?);
        }
        let split = |p: &str| p.strip_prefix("Shard(").and_then(|r| r.strip_suffix(')')).and_then(|d| d.parse().ok());
        let mut params = BTreeMap::new();
        for (n, (dims, p)) in &manifest.params {
            let (mp, dp) = (split(p), manifest.dp_split.get(n).and_then(|d| split(d)));
            if mp.is_some() && mp == dp {
                return Err(Error::Parameter {
                    name: n.clone(),
                    msg: format!("split over mp and dp along the same dimension {mp:?}: not a layout redco saves"),
                });
            }
            params.insert(n.clone(), SavedParam { dims: dims.clone(), mp, dp });
        }
        Ok(SavedFiles { saved, files, params })
    }

    /// The optimizer's step count, as saved.
    pub(crate) fn opt_steps(&self) -> Option<u64> {
        self.files.first()?.meta.get("opt_steps")?.parse().ok()
    }

    /// The optimizer state keys saved for parameter `name` (`adam_m/NAME`, ...).
    pub(crate) fn opt_keys(&self, name: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.files[0]
            .index
            .keys()
            .filter_map(|k| k.strip_prefix("opt/"))
            .filter(|k| k.split_once('/').is_some_and(|(_, n)| n == name))
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    }

    /// The whole (global) f32 tensor saved under `key` for parameter `name`, as the
    /// manifest lays it out; `sliced`: saved as dp-slices (a parameter split over dp never
    /// is: each dp rank's file holds its part whole).
    fn global(&self, key: &str, name: &str, sliced: bool) -> Result<Vec<f32>> {
        let mesh = self.saved.mesh;
        let p = self
            .params
            .get(name)
            .ok_or_else(|| Error::Parameter { name: name.into(), msg: "not in the checkpoint's manifest".into() })?;
        let sliced = sliced && p.dp.is_none();
        // the dims of one rank's part, and of the dp row its mp parts make
        let mut row = p.dims.clone();
        if let Some(d) = p.dp {
            row[d] /= mesh.dp;
        }
        let mut part_dims = row.clone();
        if let Some(d) = p.mp {
            part_dims[d] /= mesh.mp;
        }
        let n: usize = part_dims.iter().product();
        let mut rows = Vec::new();
        for i in 0..if p.dp.is_some() { mesh.dp } else { 1 } {
            let mut parts = Vec::new();
            for j in 0..if p.mp.is_some() { mesh.mp } else { 1 } {
                let part = if sliced {
                    let mut flat = Vec::with_capacity(n.div_ceil(mesh.dp) * mesh.dp);
                    for d in 0..mesh.dp {
                        flat.extend(self.files[mesh.rank_of(d, j)].f32(key)?.0);
                    }
                    flat.truncate(n);
                    flat
                } else {
                    self.files[mesh.rank_of(i, j)].f32(key)?.0
                };
                if part.len() != n {
                    return Err(Error::Parameter {
                        name: key.into(),
                        msg: format!("{} elements saved for a shard of {n}", part.len()),
                    });
                }
                parts.push(part);
            }
            rows.push(match p.mp {
                Some(d) => concat(&parts, &part_dims, d),
                None => parts.swap_remove(0),
            });
        }
        Ok(match p.dp {
            Some(d) => concat(&rows, &row, d),
            None => rows.swap_remove(0),
        })
    }
}

/// Every parameter of the checkpoint in `dir` whole, as f32 in its global shape, handed to
/// `f` one at a time (name, dims, values) in name order: reassembled from the ranks' files
/// whatever the mesh, ZeRO stage and expert split it was written at (what `redco convert`
/// exports). Each file is verified against the manifest first.
pub fn for_each_whole_param(dir: &Path, mut f: impl FnMut(&str, &[usize], Vec<f32>) -> Result<()>) -> Result<()> {
    let manifest = Manifest::read(dir)?;
    let stage = manifest.extra.get("zero_stage").and_then(|z| z.parse::<u8>().ok()).unwrap_or(0);
    let saved = Saved::of(&manifest, stage)?;
    let files = SavedFiles::open(dir, &manifest, saved)?;
    for (name, p) in &files.params {
        let x = files.global(&format!("param/{name}"), name, saved.masters_sliced)?;
        f(name, &p.dims, x)?;
    }
    Ok(())
}

/// This rank's part of the global tensor `x` of a parameter laid out as `whole`: its shard
/// over dp (when split there) and over mp, and with `sliced` its flat dp-slice
/// (zero-padded; never for a parameter split over dp).
fn cut<B: Backend>(comm: &Comm<B>, x: &[f32], whole: &ShardLayout, sliced: bool) -> Vec<f32> {
    let mesh = comm.mesh();
    let mut dims = whole.shape.dims().to_vec();
    let over_dp = split_dim(whole.placements.get(MeshAxis::Dp));
    let mine = match over_dp {
        Some(d) => {
            let part = narrow(x, &dims, d, comm.index_along(MeshAxis::Dp), mesh.dp);
            dims[d] /= mesh.dp;
            part
        }
        None => x.to_vec(),
    };
    let local = match split_dim(whole.placements.get(MeshAxis::Mp)) {
        Some(d) => narrow(&mine, &dims, d, comm.index_along(MeshAxis::Mp), mesh.mp),
        None => mine,
    };
    if !sliced || over_dp.is_some() {
        return local;
    }
    let per = local.len().div_ceil(mesh.dp);
    let d = comm.index_along(MeshAxis::Dp);
    let mut slice: Vec<f32> = local.iter().skip(d * per).take(per).copied().collect();
    slice.resize(per, 0.0);
    slice
}

/// Restores `masters` (laid out as this run holds them: whole local shards, ZeRO-2 slices
/// or ZeRO-3 pieces) and the optimizer state for them from `files`, for parameters laid
/// out whole as `layouts`; `sliced` / `opt_sliced`: this run slices its masters / its
/// optimizer state over dp. Returns the state for `opt`, keyed as it saves it and placed
/// where it keeps it; an offloaded `opt` gets the f32 masters in host memory too (and
/// `masters` the compute copies, in their dtype).
pub(crate) fn restore<B: Backend>(
    files: &SavedFiles,
    comm: &Comm<B>,
    layouts: &BTreeMap<String, ShardLayout>,
    masters: &mut BTreeMap<String, Tensor<B>>,
    opt: &mut dyn TrainOptimizer<B>,
    (sliced, opt_sliced): (bool, bool),
) -> Result<BTreeMap<String, StateTensor<B>>> {
    let saved = files.saved;
    let mut state = BTreeMap::new();
    let host = opt.host().cloned();
    for (name, m) in masters.iter_mut() {
        let whole = layouts
            .get(name)
            .ok_or_else(|| Error::Parameter { name: name.clone(), msg: "no layout for this parameter".into() })?;
        let b = m.backend().clone();
        match files.params.get(name) {
            Some(p) if p.dims.as_slice() == whole.shape.dims() => {}
            found => {
                return Err(Error::Parameter {
                    name: name.clone(),
                    msg: format!("the checkpoint has {:?}, the model {}", found.map(|f| &f.dims), whole.shape),
                })
            }
        }
        let x = files.global(&format!("param/{name}"), name, saved.masters_sliced)?;
        let mine = cut(comm, &x, whole, sliced);
        drop(x);
        if mine.len() != m.local_shape().elem_count() {
            return Err(Error::Parameter {
                name: name.clone(),
                msg: format!("{} elements for a local shard of {}", mine.len(), m.local_shape()),
            });
        }
        let mine = HostData::F32(mine);
        let (dt, local) = (m.dtype(), m.local_shape().clone());
        let s = if dt == DType::F32 { b.upload(&mine)? } else { b.upload(&mine.cast(dt))? };
        if let (Some(cpu), Some(hm)) = (&host, opt.host_masters_mut()) {
            // offloaded: the f32 master in host memory, the device keeps the compute copy
            let h = Tensor::from_local(
                cpu,
                cpu.upload_owned(mine)?,
                m.shape().clone(),
                local.clone(),
                m.placements(),
                DType::F32,
            );
            hm.insert(name.clone(), h);
        }
        *m = Tensor::from_local(&b, s, m.shape().clone(), local, m.placements(), dt).into_var();
        for key in files.opt_keys(name) {
            let x = files.global(&format!("opt/{key}"), name, saved.opt_sliced)?;
            let mine = cut(comm, &x, whole, opt_sliced);
            let shape = if opt_sliced { Shape::new([mine.len()]) } else { whole.local.clone() };
            state.insert(key, StateTensor::placed(opt, &b, HostData::F32(mine), shape)?);
        }
    }
    Ok(state)
}
