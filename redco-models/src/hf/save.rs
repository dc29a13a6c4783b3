//! Saving a model in the Hugging Face layout transformers loads: `config.json` and
//! `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards with
//! `model.safetensors.index.json` when the model is larger than one shard. Under tensor
//! parallelism every rank calls it: each tensor is gathered whole in turn and rank 0 writes,
//! so no rank holds more than one shard file's tensors at once.

use super::config::HfConfig;
use redco_core::nn::{Module, ModuleExt};
use redco_core::runtime::Comm;
use redco_core::{Backend, Error, Result, Tensor};
use redco_pipeline::checkpoint::{safetensors_bytes, write_atomic};
use std::collections::BTreeMap;
use std::path::Path;

/// The default largest shard file (bytes), as transformers' `max_shard_size="5GB"`.
pub const DEFAULT_SHARD_BYTES: usize = 5_000_000_000;

/// Writes `model` (with configuration `cfg`) to `dir` in transformers' layout, splitting the
/// weights into files of at most `max_shard_bytes` (a tensor larger than that gets a file of
/// its own). Every rank of a sharded model calls it with its communicator; rank 0 (or the
/// caller, without one) writes.
pub fn save_pretrained<B: Backend, M: Module<B> + ?Sized>(
    model: &M,
    cfg: &HfConfig,
    dir: &Path,
    max_shard_bytes: usize,
    comm: Option<&Comm<B>>,
) -> Result<()> {
    let rank = comm.map_or(0, |c| c.rank());
    let io = |e: std::io::Error| Error::io("save", "cannot write", dir, e);
    if rank == 0 {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let params = hf_tensors(model.named_parameters())?;
    // group the parameters, in order, into shards
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current = Vec::new();
    let mut size = 0;
    let mut total = 0;
    for (i, (_, p)) in params.iter().enumerate() {
        let bytes = p.elem_count() * p.dtype().size_in_bytes();
        total += bytes;
        if size > 0 && size + bytes > max_shard_bytes {
            shards.push(std::mem::take(&mut current));
            size = 0;
        }
        current.push(i);
        size += bytes;
    }
    shards.push(current);
    let n = shards.len();
    let file = |i: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        }
    };
    let mut weight_map = BTreeMap::new();
    for (si, shard) in shards.iter().enumerate() {
        let mut tensors = Vec::with_capacity(shard.len());
        for &i in shard {
            let (name, p) = &params[i];
            let whole = p.replicate()?;
            tensors.push((name.clone(), whole.to_host()?, whole.dims().to_vec()));
            weight_map.insert(name.clone(), serde_json::Value::String(file(si)));
        }
        if rank == 0 {
            let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
            write_atomic(&dir.join(file(si)), &safetensors_bytes(&tensors, meta)?)?;
        }
    }
    if rank == 0 {
        if n > 1 {
            let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
            write_json(&dir.join("model.safetensors.index.json"), &index)?;
        } else {
            // a stale index from an earlier, larger save would shadow nothing but confuse readers
            let _ = std::fs::remove_file(dir.join("model.safetensors.index.json"));
        }
        write_json(&dir.join("config.json"), &cfg.raw)?;
    }
    Ok(())
}

/// Named tensors under the names a Hugging Face checkpoint uses: a tensor stacked over
/// experts (a `*` in its name, e.g. Mixtral's `experts.*.w1.weight`, `[E, ..]`) becomes one
/// tensor per expert, the `*` replaced by its index; every other passes through.
pub fn hf_tensors<B: Backend>(named: Vec<(String, Tensor<B>)>) -> Result<Vec<(String, Tensor<B>)>> {
    let mut out = Vec::with_capacity(named.len());
    for (name, t) in named {
        if !name.contains('*') {
            out.push((name, t));
            continue;
        }
        let dims = t.dims().to_vec();
        let Some((&e, rest)) = dims.split_first() else {
            return Err(Error::invalid("save", format!("`{name}` is stacked over experts but has no dimensions")));
        };
        for j in 0..e {
            out.push((name.replacen('*', &j.to_string(), 1), t.narrow(0, j, 1)?.reshape(rest.to_vec())?));
        }
    }
    Ok(out)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::invalid("save", e.to_string()))?;
    write_atomic(path, text.as_bytes())
}
