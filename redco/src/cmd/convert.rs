//! `redco convert`: Hugging Face directory <-> sharded redco checkpoint.
//!
//! - `--to redco`: loads a Hugging Face model (LLaMA, GPT-J, OPT, T5) split over `--mesh` (each rank reads its slice)
//!   and writes `<out>/checkpoints/step-00000000` (one file per rank + manifest) with the
//!   model's config and tokenizer beside it, so `redco train --model <out> --resume` (or any
//!   run with the same plan) continues from it.
//! - `--to hf`: reassembles a redco checkpoint (a `step-*` directory, or a workdir's newest)
//!   into `config.json` + safetensors that transformers loads; from a `.gguf` file (a LLaMA),
//!   writes its Hugging Face directory with the file's vocabulary: float tensors as stored,
//!   `Q8_0`/`Q4_0`/`Q4_1`/`Q4_K`/`Q6_K` ones dequantized to `--dtype`.
//! - `--to gguf`: writes a Hugging Face LLaMA directory as one GGUF file (`--out x.gguf`) that
//!   llama.cpp runs, in `--dtype` (f32, f16 or bf16), with its SentencePiece vocabulary and
//!   chat template; `--quantize q8_0|q4_0|q4_1|q4_k|q6_k` writes the linear layers as
//!   llama.cpp's blocks (quantized as `--quantize` does at load).

use super::check;
use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::nn::ModuleExt;
use redco_core::optim::Sgd;
use redco_core::planning::trace::plan_from_trace;
use redco_core::runtime::{Mesh, SpmdOptions};
use redco_core::{DType, Error, HostData, Result, Shape, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::hf::config::HfConfig;
use redco_models::hf::save::{save_pretrained, DEFAULT_SHARD_BYTES};
use redco_models::t5::T5;
use redco_pipeline::checkpoint::Checkpointer;
use redco_pipeline::optimizer::OnDevice;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Arguments of `redco convert`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct ConvertArgs {
    /// What to write: `redco` (sharded checkpoint), `hf` (Hugging Face directory) or `gguf`
    /// (one llama.cpp file, from a Hugging Face LLaMA directory).
    #[arg(long)]
    pub to: String,
    /// Input: a Hugging Face directory (for --to redco), or a redco workdir / step directory
    /// (for --to hf).
    #[arg(long)]
    pub input: PathBuf,
    /// Output directory (the output file for --to gguf).
    #[arg(long)]
    pub out: PathBuf,
    /// Mesh of the sharded checkpoint (for --to redco).
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Parameter dtype written: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Quantize the linear layers to llama.cpp's blocks (for --to gguf: q8_0, q4_0, q4_1,
    /// q4_k or q6_k; layers whose rows are not whole blocks stay --dtype, and are named).
    #[arg(long)]
    pub quantize: Option<String>,
    /// Largest Hugging Face shard file in bytes (for --to hf).
    #[arg(long, value_parser = check::count, default_value_t = DEFAULT_SHARD_BYTES)]
    pub max_shard_bytes: usize,
}

const SIDE_FILES: [&str; 4] = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"];

fn copy_side_files(from: &Path, to: &Path) -> CliResult<()> {
    std::fs::create_dir_all(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    for f in SIDE_FILES {
        if from.join(f).exists() && from != to {
            std::fs::copy(from.join(f), to.join(f)).map_err(|e| format!("cannot copy {f}: {e}"))?;
        }
    }
    Ok(())
}

/// The trainer's plan: traced from a forward pass of the model on one device.
fn traced_plan(dir: &Path, mesh: Mesh) -> Result<redco_core::planning::ShardPlan> {
    let b = Cpu::try_new(1)?;
    let ids = Tensor::from_vec(&b, vec![1i64, 2, 3, 4], [1, 4])?;
    if HfConfig::from_dir(dir)?.model_type == "t5" {
        let m = T5::from_pretrained(&b, dir, DType::F32, None)?;
        let loss = m.loss(&ids, None, &ids, None)?;
        return plan_from_trace(&m.named_parameters(), &[&loss], mesh, false);
    }
    let m = AutoModel::from_pretrained(&b, dir, DType::F32, None)?;
    let loss = m.loss(&ids, None, &ids)?;
    plan_from_trace(&m.named_parameters(), &[&loss], mesh, false)
}

fn to_redco(a: &ConvertArgs) -> Result<PathBuf> {
    let mesh = check::mesh(&a.mesh).map_err(|e| Error::invalid("convert", e))?;
    let dtype = check::dtype(&a.dtype).map_err(|e| Error::invalid("convert", e))?;
    let t5 = HfConfig::from_dir(&a.input)?.model_type == "t5";
    let plan = traced_plan(&a.input, mesh)?;
    let ckpt = Checkpointer::new(&a.out, 0);
    let opts = SpmdOptions { threads_per_rank: Some(1), ..SpmdOptions::default() };
    let dirs = spmd_cpu(mesh, &opts, |rk| {
        let opt = OnDevice::<Cpu>(Box::new(Sgd::new(0.0, 0.0, 0.0)));
        if t5 {
            ckpt.save(
                Some(&rk.comm),
                0,
                &T5::from_pretrained(&rk.backend, &a.input, dtype, Some(&plan.at_rank(rk.rank)?))?,
                &opt,
            )
        } else {
            ckpt.save(
                Some(&rk.comm),
                0,
                &AutoModel::from_pretrained(&rk.backend, &a.input, dtype, Some(&plan.at_rank(rk.rank)?))?,
                &opt,
            )
        }
    })?;
    Ok(dirs.into_iter().next().unwrap_or_default())
}

/// The checkpoint directory `input` names: a `step-*` directory or a workdir's newest.
fn step_dir(input: &Path) -> Result<PathBuf> {
    if input.join("manifest.json").exists() {
        return Ok(input.to_path_buf());
    }
    Checkpointer::new(input, 0).latest()?.map(|(_, d)| d).ok_or_else(|| {
        Error::invalid(
            "convert",
            format!("{} holds no redco checkpoint (no manifest.json, no checkpoints/)", input.display()),
        )
    })
}

fn to_hf(a: &ConvertArgs) -> Result<PathBuf> {
    let dtype = check::dtype(&a.dtype).map_err(|e| Error::invalid("convert", e))?;
    let dir = step_dir(&a.input)?;
    // the configuration lives in the workdir (two levels up from step-*) or beside the input
    let cfg_dir = [a.input.clone(), dir.join("../.."), dir.clone()]
        .into_iter()
        .find(|d| d.join("config.json").exists())
        .ok_or_else(|| Error::invalid("convert", format!("no config.json next to {}", dir.display())))?;
    let cfg = HfConfig::from_dir(&cfg_dir)?;
    // each parameter reassembled from the ranks' files (model-parallel shards, ZeRO slices,
    // experts split over dp), whatever mesh and stage wrote them
    let b = Cpu::try_new(1)?;
    let mut params = BTreeMap::new();
    redco_pipeline::for_each_whole_param(&dir, |name, dims, x| {
        let whole = Tensor::from_host(&b, &HostData::F32(x).cast(dtype), Shape::new(dims.to_vec()))?;
        params.insert(name.to_string(), whole);
        Ok(())
    })?;
    save_pretrained(&params, &cfg, &a.out, a.max_shard_bytes, None)?;
    Ok(a.out.clone())
}

/// Runs `redco convert`.
pub fn run(a: ConvertArgs) -> CliResult<()> {
    if super::launch::is_multi_process() {
        return Err("convert runs in one process (its ranks are threads); start it without mpirun".into());
    }
    if a.quantize.is_some() && a.to != "gguf" {
        return Err(
            "--quantize writes GGUF files (--to gguf); to quantize at load, pass it to generate, serve or eval-dump"
                .into(),
        );
    }
    match a.to.as_str() {
        "redco" => {
            let d = to_redco(&a)?;
            copy_side_files(&a.input, &a.out)?;
            crate::outln!("wrote the sharded checkpoint {} (mesh {})", d.display(), a.mesh);
        }
        "hf" if a.input.extension().is_some_and(|e| e == "gguf") => {
            let dtype = check::dtype(&a.dtype)?;
            redco_models::gguf::llama::import(&a.input, &a.out, dtype, false)?;
            crate::outln!("wrote the Hugging Face model {}", a.out.display());
        }
        "hf" => {
            let d = to_hf(&a)?;
            let src = step_dir(&a.input)?;
            for from in [a.input.clone(), src.join("../..")] {
                for f in SIDE_FILES.iter().skip(1) {
                    if from.join(f).exists() && !d.join(f).exists() {
                        std::fs::copy(from.join(f), d.join(f)).map_err(|e| format!("cannot copy {f}: {e}"))?;
                    }
                }
            }
            crate::outln!("wrote the Hugging Face model {}", d.display());
        }
        "gguf" => {
            let dtype = check::dtype(&a.dtype)?;
            let quantize = super::quantize::format(a.quantize.as_deref())?;
            let left = redco_models::gguf::llama::export(&a.input, &a.out, dtype, quantize)?;
            if !left.is_empty() {
                crate::cmd::out::warn(format_args!(
                    "redco: --quantize: {} linear layers left in {} (rows not whole blocks): {}",
                    left.len(),
                    a.dtype,
                    left.join(", ")
                ));
            }
            let what = quantize.map_or(a.dtype.clone(), |f| format!("linear layers {f}, the rest {}", a.dtype));
            crate::outln!("wrote the GGUF file {} ({what})", a.out.display());
        }
        other => return Err(format!("--to must be `redco`, `hf` or `gguf`, not `{other}`").into()),
    }
    Ok(())
}
