//! Checkpoints: sharded (each rank writes its own shards of the parameters and optimizer
//! state, plus one manifest), atomic (written under a temporary name, fsynced, renamed; a
//! crash mid-write leaves the previous checkpoint readable), pruned to the last N, and a
//! consolidated export to one Hugging Face safetensors file.

use super::integrity::FileSum;
use super::st_writer::sync_dir;
use crate::optimizer::{StateTensor, TrainOptimizer};
use redco_core::nn::{Module, ModuleExt};
use redco_core::runtime::{Comm, Mesh};
use redco_core::{Backend, DType, Error, HostData, Placement, Result, Shape, Tensor};
use safetensors::tensor::TensorView;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically: a temporary sibling (named for this process and
/// call, so processes writing the same file never share one), fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map_or_else(|| "file".into(), |f| f.to_string_lossy().to_string());
    let tmp = path.with_file_name(format!(".{name}.{}-{n}.part", std::process::id()));
    // errors name the file asked for, then the step that failed
    let at = |what: &str, e: std::io::Error| {
        Error::invalid("checkpoint", format!("cannot write {}: {what} {}: {e}", path.display(), tmp.display()))
    };
    let written = (|| {
        let mut f = fs::File::create(&tmp).map_err(|e| at("cannot create", e))?;
        f.write_all(bytes).map_err(|e| at("cannot write", e))?;
        f.sync_all().map_err(|e| at("cannot sync", e))?;
        fs::rename(&tmp, path).map_err(|e| at("cannot rename", e))
    })();
    if written.is_err() {
        // a failed write (a full disk) leaves nothing behind
        let _ = fs::remove_file(&tmp);
    }
    written?;
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// The safetensors dtype of `d`.
pub fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I64 => safetensors::Dtype::I64,
        DType::I32 => safetensors::Dtype::I32,
        DType::U8 => safetensors::Dtype::U8,
    }
}

fn to_bytes(h: &HostData) -> Vec<u8> {
    match h {
        HostData::F32(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::F64(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::F16(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::BF16(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::I64(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::I32(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::U8(v) => v.clone(),
    }
}

fn from_view(v: &TensorView<'_>, name: &str) -> Result<HostData> {
    let b = v.data();
    let bad =
        || Error::Parameter { name: name.into(), msg: format!("unsupported dtype {:?} in checkpoint", v.dtype()) };
    Ok(match v.dtype() {
        safetensors::Dtype::F32 => HostData::F32(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::F64 => HostData::F64(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::F16 => HostData::F16(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::BF16 => HostData::BF16(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::I64 => HostData::I64(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::I32 => HostData::I32(bytemuck::pod_collect_to_vec(b)),
        safetensors::Dtype::U8 => HostData::U8(b.to_vec()),
        _ => return Err(bad()),
    })
}

/// Serialises named host tensors to safetensors bytes.
pub fn safetensors_bytes(
    tensors: &[(String, HostData, Vec<usize>)],
    meta: BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, h, _)| to_bytes(h)).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, h, s), b)| {
            TensorView::new(st_dtype(h.dtype()), s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::invalid("safetensors", e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta: std::collections::HashMap<String, String> = meta.into_iter().collect();
    safetensors::serialize(views, &Some(meta)).map_err(|e| Error::invalid("safetensors", e.to_string()))
}

/// The manifest of one checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// Optimizer steps done.
    pub step: u64,
    /// Mesh, as `DPxMP`.
    pub mesh: String,
    /// Parameter name -> (global shape, model-parallel placement).
    pub params: BTreeMap<String, (Vec<usize>, String)>,
    /// Parameter name -> data-parallel placement, for the parameters split over `dp` (a
    /// mixture's experts under expert parallelism: each dp rank's file holds its part,
    /// never sliced by ZeRO); absent for the others.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dp_split: BTreeMap<String, String>,
    /// Other run state to restore (e.g. the f16 loss scale).
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
    /// File name -> its length and digest, for every rank's file (empty in checkpoints of
    /// redco before checksums: those load unverified, with a warning).
    #[serde(default)]
    pub files: BTreeMap<String, FileSum>,
}

impl Manifest {
    /// Reads `<dir>/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let mpath = dir.join("manifest.json");
        serde_json::from_slice(&fs::read(&mpath).map_err(|e| Error::io("checkpoint", "cannot read", &mpath, e))?)
            .map_err(|e| Error::data("checkpoint", format!("{} is not a valid manifest: {e}", mpath.display())))
    }

    /// Checks `data`, the contents of the checkpoint file `name` in `dir`, against the
    /// recorded sum: an error names the file when it differs or is not listed.
    pub fn verify(&self, dir: &Path, name: &str, data: &[u8]) -> Result<()> {
        self.verify_sum(dir, name, || Ok(FileSum::of(data)))
    }

    /// Checks the checkpoint file `name` in `dir` as it is on disk (read in pieces).
    pub fn verify_file(&self, dir: &Path, name: &str) -> Result<()> {
        let path = dir.join(name);
        self.verify_sum(dir, name, || FileSum::of_file(&path))
    }

    fn verify_sum(&self, dir: &Path, name: &str, found: impl FnOnce() -> Result<FileSum>) -> Result<()> {
        let path = dir.join(name);
        if self.files.is_empty() {
            tracing::warn!(file = %path.display(), "this checkpoint has no checksums (written by an older redco): loaded unverified");
            return Ok(());
        }
        match self.files.get(name) {
            Some(want) => want.check(&found()?, &path),
            None => Err(Error::invalid(
                "checkpoint",
                format!("{} is not listed in {}'s manifest", path.display(), dir.display()),
            )),
        }
    }
}

fn placement_str(p: Placement) -> String {
    format!("{p:?}")
}

/// Manages `<workdir>/checkpoints`.
pub struct Checkpointer {
    /// The checkpoints directory.
    pub dir: PathBuf,
    /// How many complete checkpoints to keep (0 keeps all).
    pub keep_last: usize,
}

impl Checkpointer {
    /// Checkpoints under `<workdir>/checkpoints`.
    pub fn new(workdir: &Path, keep_last: usize) -> Self {
        Checkpointer { dir: workdir.join("checkpoints"), keep_last }
    }

    /// The directory of the checkpoint of `step`.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:08}"))
    }

    /// Saves this rank's shards of `model` and `opt` at `step`. Every rank of the run calls
    /// it with its communicator `comm` (none on one device); rank 0 publishes the checkpoint
    /// once all have written (the workdir must be shared by every rank's host).
    pub fn save<B: Backend, M: Module<B> + ?Sized>(
        &self,
        comm: Option<&Comm<B>>,
        step: u64,
        model: &M,
        opt: &dyn TrainOptimizer<B>,
    ) -> Result<PathBuf> {
        self.save_with(comm, step, model, opt, BTreeMap::new())
    }

    /// [`Checkpointer::save`] with extra run state recorded in the manifest.
    pub fn save_with<B: Backend, M: Module<B> + ?Sized>(
        &self,
        comm: Option<&Comm<B>>,
        step: u64,
        model: &M,
        opt: &dyn TrainOptimizer<B>,
        extra: BTreeMap<String, String>,
    ) -> Result<PathBuf> {
        self.save_laid_out(comm, step, model, opt, extra, None)
    }

    /// [`Checkpointer::save_with`] for state held in pieces (ZeRO-2/3 slices): the manifest
    /// records each parameter's whole layout from `layouts` (global shape, model-parallel
    /// placement), so a run at another mesh or stage can reassemble it.
    pub(crate) fn save_laid_out<B: Backend, M: Module<B> + ?Sized>(
        &self,
        comm: Option<&Comm<B>>,
        step: u64,
        model: &M,
        opt: &dyn TrainOptimizer<B>,
        extra: BTreeMap<String, String>,
        layouts: Option<&BTreeMap<String, redco_core::sharding::ShardLayout>>,
    ) -> Result<PathBuf> {
        let (rank, mesh) = comm.map_or((0, Mesh::single()), |c| (c.rank(), c.mesh()));
        let tmp = self.dir.join(format!("step-{step:08}.tmp"));
        fs::create_dir_all(&tmp).map_err(|e| Error::io("checkpoint", "cannot create", &tmp, e))?;
        let mut manifest = Manifest {
            step,
            mesh: mesh.to_string(),
            params: BTreeMap::new(),
            dp_split: BTreeMap::new(),
            extra,
            files: BTreeMap::new(),
        };
        // the file is written one tensor at a time: no second copy of the state in memory
        // (and from where it is: an offloaded optimizer's masters and state from host memory)
        let mut items: Vec<(String, StateTensor<B>)> = Vec::new();
        let host_masters = opt.host_masters();
        for (name, p) in model.named_parameters() {
            let (dims, placed) = match layouts.and_then(|l| l.get(&name)) {
                Some(l) => (l.shape.dims().to_vec(), l.placements),
                None => (p.dims().to_vec(), p.placements()),
            };
            manifest.params.insert(name.clone(), (dims, placement_str(placed.get(redco_core::MeshAxis::Mp))));
            if let dp @ Placement::Shard(_) = placed.get(redco_core::MeshAxis::Dp) {
                manifest.dp_split.insert(name.clone(), placement_str(dp));
            }
            let master = match host_masters.and_then(|h| h.get(&name)) {
                Some(h) => StateTensor::Host(h.clone()),
                None => StateTensor::Device(p),
            };
            items.push((format!("param/{name}"), master));
        }
        for (key, t) in opt.state_tensors()? {
            items.push((format!("opt/{key}"), t));
        }
        let entries: Vec<(String, DType, Vec<usize>)> =
            items.iter().map(|(k, t)| (k.clone(), t.dtype(), t.local_shape().dims().to_vec())).collect();
        let meta = BTreeMap::from([("opt_steps".to_string(), opt.steps().to_string())]);
        let mut w = super::st_writer::StWriter::create(&tmp.join(format!("rank-{rank}.safetensors")), &entries, &meta)?;
        for (key, t) in items {
            w.put(&key, &t.local_to_host()?)?;
        }
        // each rank records its file's sum beside it; rank 0 gathers them into the manifest
        let sum = serde_json::to_vec(&w.finish()?).map_err(|e| Error::invalid("checkpoint", e.to_string()))?;
        write_atomic(&tmp.join(format!("rank-{rank}.sum")), &sum)?;
        if let Some(c) = comm {
            c.barrier()?;
        }
        let fin = self.step_dir(step);
        if rank == 0 {
            for r in 0..mesh.size() {
                let sp = tmp.join(format!("rank-{r}.sum"));
                let sum: FileSum =
                    serde_json::from_slice(&fs::read(&sp).map_err(|e| Error::io("checkpoint", "cannot read", &sp, e))?)
                        .map_err(|e| Error::invalid("checkpoint", format!("{}: {e}", sp.display())))?;
                manifest.files.insert(format!("rank-{r}.safetensors"), sum);
                fs::remove_file(&sp).map_err(|e| Error::io("checkpoint", "cannot remove", &sp, e))?;
            }
            let m = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::invalid("checkpoint", e.to_string()))?;
            write_atomic(&tmp.join("manifest.json"), &m)?;
            if fin.exists() {
                fs::remove_dir_all(&fin).map_err(|e| Error::io("checkpoint", "cannot replace", &fin, e))?;
            }
            fs::rename(&tmp, &fin).map_err(|e| Error::io("checkpoint", "cannot publish", &tmp, e))?;
            sync_dir(&self.dir);
            write_atomic(&self.dir.join("latest"), fin.file_name().unwrap_or_default().to_string_lossy().as_bytes())?;
            self.prune()?;
        }
        if let Some(c) = comm {
            c.barrier()?;
        }
        Ok(fin)
    }

    /// Removes complete checkpoints beyond the last `keep_last` (never the best one).
    pub fn prune(&self) -> Result<()> {
        if self.keep_last == 0 {
            return Ok(());
        }
        let best = fs::read_to_string(self.dir.join("best")).ok().and_then(|b| b.lines().next().map(str::to_string));
        let mut steps: Vec<(u64, PathBuf)> = self
            .complete()?
            .into_iter()
            .filter(|(_, p)| best.as_deref() != p.file_name().and_then(|n| n.to_str()))
            .collect();
        steps.sort();
        while steps.len() > self.keep_last {
            let (_, p) = steps.remove(0);
            fs::remove_dir_all(&p).map_err(|e| Error::io("checkpoint", "cannot remove", &p, e))?;
        }
        Ok(())
    }

    /// Marks the checkpoint of `step` as the best by the eval metric (`metric`); pruning
    /// keeps it.
    pub fn mark_best(&self, step: u64, metric: f64) -> Result<()> {
        let name = format!("step-{step:08}\n{metric}\n");
        write_atomic(&self.dir.join("best"), name.as_bytes())
    }

    /// The best checkpoint's directory and metric, if one was marked.
    pub fn best(&self) -> Option<(PathBuf, f64)> {
        let t = fs::read_to_string(self.dir.join("best")).ok()?;
        let mut l = t.lines();
        let dir = self.dir.join(l.next()?);
        Some((dir, l.next()?.parse().ok()?))
    }

    /// Complete checkpoints (with a manifest), as (step, dir).
    pub fn complete(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(&self.dir) else { return Ok(out) };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if let Some(s) = name.strip_prefix("step-").filter(|s| !s.ends_with(".tmp")) {
                if let Ok(step) = s.parse::<u64>() {
                    if e.path().join("manifest.json").exists() {
                        out.push((step, e.path()));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The newest complete checkpoint, if any.
    pub fn latest(&self) -> Result<Option<(u64, PathBuf)>> {
        Ok(self.complete()?.into_iter().max_by_key(|(s, _)| *s))
    }

    /// Restores this rank's shards from checkpoint `dir` into `model` and `opt` (laid out
    /// by the same plan on the same mesh as `comm`'s). Errors name the mesh or the tensors
    /// that differ.
    pub fn load<B: Backend, M: Module<B> + ?Sized>(
        &self,
        comm: Option<&Comm<B>>,
        dir: &Path,
        model: &mut M,
        opt: &mut dyn TrainOptimizer<B>,
    ) -> Result<u64> {
        let (rank, mesh) = comm.map_or((0, Mesh::single()), |c| (c.rank(), c.mesh()));
        let manifest = Manifest::read(dir)?;
        if manifest.mesh != mesh.to_string() {
            return Err(Error::invalid(
                "checkpoint",
                format!("{} was written on mesh {} but this run has mesh {mesh}", dir.display(), manifest.mesh),
            ));
        }
        let mut diffs = Vec::new();
        let named = model.named_parameters();
        for (name, p) in &named {
            match manifest.params.get(name) {
                None => diffs.push(format!("`{name}` is not in the checkpoint")),
                Some((shape, pl))
                    if shape != p.dims() || *pl != placement_str(p.placements().get(redco_core::MeshAxis::Mp)) =>
                {
                    diffs.push(format!(
                        "`{name}`: checkpoint {shape:?} {pl}, model {:?} {:?}",
                        p.dims(),
                        p.placements().get(redco_core::MeshAxis::Mp)
                    ))
                }
                _ => {}
            }
        }
        for name in manifest.params.keys() {
            if !named.iter().any(|(n, _)| n == name) {
                diffs.push(format!("`{name}` is not in the model"));
            }
        }
        if !diffs.is_empty() {
            return Err(Error::invalid(
                "checkpoint",
                format!("{} is from another model: {}", dir.display(), diffs.join("; ")),
            ));
        }
        let fname = format!("rank-{rank}.safetensors");
        let fpath = dir.join(&fname);
        let bytes = fs::read(&fpath).map_err(|e| Error::io("checkpoint", "cannot read", &fpath, e))?;
        manifest.verify(dir, &fname, &bytes)?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::invalid("checkpoint", format!("{}: {e}", fpath.display())))?;
        let get = |key: &str| -> Result<(HostData, Shape)> {
            let v = st
                .tensor(key)
                .map_err(|_| Error::Parameter { name: key.into(), msg: format!("missing from {}", fpath.display()) })?;
            Ok((from_view(&v, key)?, Shape::new(v.shape().to_vec())))
        };
        let mut err = None;
        let host = opt.host().cloned();
        model.visit_mut("", &mut |name, p| {
            if err.is_some() {
                return;
            }
            let r = (|| -> Result<Tensor<B>> {
                let (h, shape) = get(&format!("param/{name}"))?;
                if &shape != p.local_shape() {
                    return Err(Error::Parameter {
                        name: name.into(),
                        msg: format!("shard {shape} in the checkpoint, {} in the model", p.local_shape()),
                    });
                }
                if let (Some(cpu), Some(hm)) = (&host, opt.host_masters_mut()) {
                    // offloaded: the f32 master in host memory, the compute copy below
                    let s = cpu.upload(&h.cast(DType::F32))?;
                    let m = Tensor::from_local(cpu, s, p.shape().clone(), shape, p.placements(), DType::F32);
                    hm.insert(name.to_string(), m);
                }
                let s = p.backend().upload(&h.cast(p.dtype()))?;
                Ok(Tensor::from_local(
                    p.backend(),
                    s,
                    p.shape().clone(),
                    p.local_shape().clone(),
                    p.placements(),
                    p.dtype(),
                )
                .into_var())
            })();
            match r {
                Ok(t) => *p = t,
                Err(e) => err = Some(e),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let opt_steps: u64 =
            st_metadata(&bytes)?.get("opt_steps").and_then(|s| s.parse().ok()).unwrap_or(manifest.step);
        let mut state = BTreeMap::new();
        if let Some(b) = named.first().map(|(_, t)| t.backend().clone()) {
            for (key, _) in st.tensors() {
                if let Some(k) = key.strip_prefix("opt/") {
                    let (h, shape) = get(&key)?;
                    state.insert(k.to_string(), StateTensor::placed(opt, &b, h, shape)?);
                }
            }
        }
        opt.load_state(opt_steps, state)?;
        Ok(manifest.step)
    }

    /// The extra run state recorded in checkpoint `dir`.
    pub fn extra(&self, dir: &Path) -> Result<BTreeMap<String, String>> {
        Ok(Manifest::read(dir)?.extra)
    }
}

fn st_metadata(bytes: &[u8]) -> Result<std::collections::HashMap<String, String>> {
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| Error::invalid("checkpoint", e.to_string()))?;
    Ok(meta.metadata().clone().unwrap_or_default())
}

/// Writes every parameter of `model`, whole, to one safetensors file (Hugging Face layout,
/// parameter names as given by the module; a tensor stacked over experts, a `*` in its name,
/// as one tensor per expert). Every rank calls it with its communicator
/// (none on one device): each tensor is gathered in turn and only rank 0 keeps it and
/// writes, so the other ranks never hold more than one whole tensor.
pub fn export_safetensors<B: Backend, M: Module<B> + ?Sized>(
    comm: Option<&Comm<B>>,
    model: &M,
    path: &Path,
) -> Result<()> {
    let params: BTreeMap<String, Tensor<B>> = model.named_parameters().into_iter().collect();
    let entries: Vec<(String, DType, Vec<usize>)> =
        model.named_parameters().iter().map(|(n, p)| (n.clone(), p.dtype(), p.dims().to_vec())).collect();
    export_each(comm, &entries, path, |name| Ok(params[name].clone()))
}

/// Writes the tensors `entries` (name, dtype, global dims), whole, to one safetensors file:
/// each made by `local(name)` (this rank's local shard, made as it is needed: a ZeRO slice
/// gathered, say) in the order given, gathered whole, written by rank 0 and dropped. Every
/// rank calls it with its communicator; no rank holds more than one whole tensor.
pub(crate) fn export_each<B: Backend>(
    comm: Option<&Comm<B>>,
    entries: &[(String, DType, Vec<usize>)],
    path: &Path,
    mut local: impl FnMut(&str) -> Result<Tensor<B>>,
) -> Result<()> {
    let rank = comm.map_or(0, |c| c.rank());
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    // a tensor stacked over experts (a `*` in its name, `[E, ..]`) is written as the
    // checkpoint holds it: one tensor per expert, the `*` replaced by its index
    let mut file_entries = Vec::with_capacity(entries.len());
    for (name, dt, dims) in entries {
        match (name.contains('*'), dims.split_first()) {
            (true, Some((&e, rest))) => {
                file_entries.extend((0..e).map(|j| (name.replacen('*', &j.to_string(), 1), *dt, rest.to_vec())))
            }
            _ => file_entries.push((name.clone(), *dt, dims.clone())),
        }
    }
    let mut w = if rank == 0 { Some(super::st_writer::StWriter::create(path, &file_entries, &meta)?) } else { None };
    for (name, _, dims) in entries {
        let whole = local(name)?.replicate()?;
        if let Some(w) = w.as_mut() {
            match (name.contains('*'), dims.split_first()) {
                (true, Some((&e, rest))) => {
                    for j in 0..e {
                        let piece = whole.narrow(0, j, 1)?.reshape(rest.to_vec())?;
                        w.put(&name.replacen('*', &j.to_string(), 1), &piece.to_host()?)?;
                    }
                }
                _ => w.put(name, &whole.to_host()?)?,
            }
        }
    }
    if let Some(w) = w {
        w.finish()?;
    }
    Ok(())
}
