//! `redco eval-dump`: the standard way to check a port against transformers. Reads
//! `input_ids`, `attention_mask`, `labels` and `gen_input_ids` (+ `gen_attention_mask`) from a
//! safetensors file and writes `logits`, `loss`, `grad.<parameter>` and `generated_ids`.

use super::backends::{self, CliBackend, Devices, OnBackend};
use super::{check, cores, model_config};
use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::nn::ModuleExt;
use redco_core::runtime::Comm;
use redco_core::{Backend, DType, HostData, Result, Tensor};
use redco_models::generate::{generate, BeamConfig, CausalLm, GenerationConfig};
use redco_models::hf::config::HfConfig;
use redco_models::hf::safetensors::{read_all, HostTensor};
use redco_models::t5::T5;
use redco_pipeline::checkpoint::{safetensors_bytes, write_atomic};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `redco eval-dump`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct EvalDumpArgs {
    /// Hugging Face model directory (config.json + safetensors), or a LLaMA-family GGUF
    /// file (as `generate --model`).
    #[arg(long)]
    pub model: PathBuf,
    /// Inputs: `input_ids` [batch, seq] and optionally `attention_mask`, `labels` (-100 is
    /// ignored; causal models shift internally), `gen_input_ids`, `gen_attention_mask`; for
    /// T5 also `decoder_input_ids` (default: the labels shifted right). T5 also writes
    /// `beam_generated_ids` (4 beams).
    #[arg(long)]
    pub inputs: PathBuf,
    /// Output safetensors file.
    #[arg(long)]
    pub out: PathBuf,
    /// Mesh as DPxMP: run split over DP x MP ranks.
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Compute backend: cpu, wgpu (the `wgpu` feature), pjrt (the `tpu` feature) or cuda (the `cuda` feature); one device per rank.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Greedy new tokens for `generated_ids`.
    #[arg(long, default_value_t = 8)]
    pub max_new_tokens: usize,
    /// Quantize the linear layers to llama.cpp's blocks as the model loads (q8_0, q4_0,
    /// q4_1, q4_k or q6_k; rows must be whole blocks: 32 values, 256 for the K formats) and
    /// multiply from the blocks in place.
    #[arg(long)]
    pub quantize: Option<String>,
    /// Parameter dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// CPU threads in all (shared by the ranks; default: every core).
    #[arg(long, value_parser = check::threads)]
    pub threads: Option<usize>,
}

type Named = Vec<(String, HostData, Vec<usize>)>;

fn dump<B: Backend>(
    b: &B,
    comm: Option<&Comm<B>>,
    a: &EvalDumpArgs,
    inputs: &BTreeMap<String, HostTensor>,
    dtype: DType,
) -> Result<Named> {
    let cfg = HfConfig::from_dir(&a.model)?;
    check_inputs(a, inputs, &cfg).map_err(|e| e.into_redco("eval-dump"))?;
    let plan = model_config::rank_plan(&cfg, comm)?;
    let get = |k: &str| -> Result<Option<Tensor<B>>> {
        inputs.get(k).map(|t| Tensor::from_host(b, &t.data, t.shape.clone())).transpose()
    };
    if cfg.model_type == "t5" {
        if a.quantize.is_some() {
            return Err(redco_core::Error::unsupported("eval-dump", "--quantize on T5 (decoder-only models quantize)"));
        }
        let model = T5::from_pretrained(b, &a.model, dtype, plan.as_ref())?;
        return dump_t5(&model, a, &get, &cfg);
    }
    let quant = super::quantize::format(a.quantize.as_deref())?;
    let model = super::quantize::load(b, &a.model, dtype, plan.as_ref(), quant, comm.is_none_or(|c| c.rank() == 0))?;
    let ids = get("input_ids")?
        .ok_or_else(|| redco_core::Error::invalid("eval-dump", format!("{} has no `input_ids`", a.inputs.display())))?;
    let mask = get("attention_mask")?;
    let mut out: Named = Vec::new();
    let logits = model.forward(&ids, mask.as_ref())?;
    out.push(host("logits", &logits)?);
    // a model with quantized layers split over a mesh dumps its loss, not gradients (the
    // gradient through blocks under a mesh is not implemented; on one rank the float
    // parameters' gradients are dumped, the blocks being constants)
    let mut quantized = false;
    redco_core::nn::Module::visit_linears(&model, "", &mut |_, l| {
        quantized |= l.quant.is_some() && l.weight.is_sharded()
    });
    if quantized && get("labels")?.is_some() && comm.is_none_or(|c| c.rank() == 0) {
        crate::cmd::out::warn(format_args!(
            "redco: eval-dump: quantized layers split over the mesh: the loss is dumped, not gradients"
        ));
    }
    if let Some(labels) = get("labels")? {
        let loss = if quantized {
            redco_core::no_grad(|| model.loss(&ids, mask.as_ref(), &labels))?
        } else {
            model.loss(&ids, mask.as_ref(), &labels)?
        };
        out.push(host("loss", &loss.reshape([1])?)?);
        if !quantized {
            let grads = loss.backward()?;
            for (name, p) in model.named_parameters() {
                if let Some(g) = grads.get(&p) {
                    out.push(host(&format!("grad.{name}"), g)?);
                }
            }
        }
    }
    if let Some(gen_ids) = get("gen_input_ids")? {
        let gen_mask = get("gen_attention_mask")?;
        // the model's stop tokens; finished rows padded with its pad_token_id, else 0 (what the
        // fixtures pass transformers), not the eos token
        let pad_token = cfg.pad_token_id.unwrap_or(0);
        let gc = GenerationConfig { max_new_tokens: a.max_new_tokens, pad_token, ..model.generation_config() };
        let g = generate(&model, &gen_ids, gen_mask.as_ref(), &gc)?;
        let len = g.rows.first().map_or(0, Vec::len);
        out.push(("generated_ids".into(), HostData::I64(g.rows.concat()), vec![g.rows.len(), len]));
    }
    Ok(out)
}

/// Refuses inputs the models cannot take, naming the tensor: ids that are not integers of
/// rank 2 or lie outside the vocabulary (labels may also be -100), masks of another shape
/// than their ids, and (decoder-only models) sequences or generations beyond the context.
fn check_inputs(a: &EvalDumpArgs, inputs: &BTreeMap<String, HostTensor>, cfg: &HfConfig) -> CliResult<()> {
    let file = a.inputs.display();
    for (ids, mask) in [
        ("input_ids", Some("attention_mask")),
        ("gen_input_ids", Some("gen_attention_mask")),
        ("labels", None),
        ("decoder_input_ids", None),
    ] {
        let Some(t) = inputs.get(ids) else { continue };
        let values: Vec<i64> = match &t.data {
            HostData::I64(v) => v.clone(),
            HostData::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            d => return Err(format!("{file}: `{ids}` is {:?}; token ids must be I64 or I32", d.dtype()).into()),
        };
        if t.shape.rank() != 2 {
            return Err(format!("{file}: `{ids}` has shape {}; expected [batch, seq]", t.shape).into());
        }
        let source = format!("{file}: `{ids}`");
        redco_models::hf::vocab::check_ids(&values, cfg.vocab, ids == "labels", &source, None)?;
        if let Some(m) = mask.and_then(|m| inputs.get(m).map(|t| (m, t))) {
            if m.1.shape != t.shape {
                return Err(format!("{file}: `{}` has shape {} but `{ids}` has {}", m.0, m.1.shape, t.shape).into());
            }
        }
        if let (false, Some(ctx)) = (cfg.model_type == "t5", cfg.max_positions) {
            let seq = t.shape.dims()[1];
            let total = if ids == "gen_input_ids" { seq.saturating_add(a.max_new_tokens) } else { seq };
            if total > ctx {
                return Err(format!(
                    "{file}: `{ids}` has {seq} tokens per row{}, beyond the model's context of {ctx} \
                     (max_position_embeddings)",
                    if ids == "gen_input_ids" {
                        format!(" and --max-new-tokens {} more", a.max_new_tokens)
                    } else {
                        String::new()
                    }
                )
                .into());
            }
        }
    }
    Ok(())
}

fn host<B: Backend>(name: &str, t: &Tensor<B>) -> Result<(String, HostData, Vec<usize>)> {
    let t = t.replicate()?;
    Ok((name.to_string(), t.to_host()?.cast(DType::F32), t.dims().to_vec()))
}

fn ids_out(name: &str, rows: Vec<Vec<i64>>) -> (String, HostData, Vec<usize>) {
    let len = rows.first().map_or(0, Vec::len);
    (name.into(), HostData::I64(rows.concat()), vec![rows.len(), len])
}

/// The encoder-decoder dump: decoder logits over `decoder_input_ids` (the shifted labels when
/// absent), loss, gradients, greedy and 4-beam generations.
fn dump_t5<B: Backend>(
    model: &T5<B>,
    a: &EvalDumpArgs,
    get: &dyn Fn(&str) -> Result<Option<Tensor<B>>>,
    cfg: &HfConfig,
) -> Result<Named> {
    let need = |k: &str| {
        get(k)?.ok_or_else(|| redco_core::Error::invalid("eval-dump", format!("{} has no `{k}`", a.inputs.display())))
    };
    let ids = need("input_ids")?;
    let mask = get("attention_mask")?;
    let labels = get("labels")?;
    let dec = match (get("decoder_input_ids")?, &labels) {
        (Some(d), _) => d,
        (None, Some(l)) => model.shift_right(l)?,
        (None, None) => {
            return Err(redco_core::Error::invalid("eval-dump", "t5 needs `decoder_input_ids` or `labels`"))
        }
    };
    let mut out: Named = vec![host("logits", &model.forward(&ids, mask.as_ref(), &dec)?)?];
    if let Some(labels) = labels {
        let loss = model.loss(&ids, mask.as_ref(), &labels, Some(&dec))?;
        let grads = loss.backward()?;
        out.push(host("loss", &loss.reshape([1])?)?);
        for (name, p) in model.named_parameters() {
            if let Some(g) = grads.get(&p) {
                out.push(host(&format!("grad.{name}"), g)?);
            }
        }
    }
    if let Some(gen_ids) = get("gen_input_ids")? {
        let gen_mask = get("gen_attention_mask")?;
        let gc = GenerationConfig { max_new_tokens: a.max_new_tokens, ..model.generation_config() };
        out.push(ids_out("generated_ids", model.generate(&gen_ids, gen_mask.as_ref(), &gc)?));
        let bc = BeamConfig { max_new_tokens: a.max_new_tokens, early_stopping: true, ..BeamConfig::for_model(cfg, 4) };
        out.push(ids_out("beam_generated_ids", model.generate_beam(&gen_ids, gen_mask.as_ref(), &bc)?));
    }
    Ok(out)
}

/// The dump on every rank of the mesh, on the chosen backend.
struct OnMesh<'a> {
    a: &'a EvalDumpArgs,
    inputs: &'a BTreeMap<String, HostTensor>,
    dtype: redco_core::DType,
    mesh: redco_core::runtime::Mesh,
    threads: usize,
}

impl OnBackend for OnMesh<'_> {
    type Out = Named;
    fn run<B: CliBackend>(self, d: Devices<B>) -> redco_core::Result<Self::Out> {
        d.on_mesh(self.mesh, self.threads, |b, comm| dump(b, comm, self.a, self.inputs, self.dtype))
    }
}

/// Runs `redco eval-dump`.
pub fn run(mut a: EvalDumpArgs) -> CliResult<()> {
    let mesh = check::mesh(&a.mesh)?;
    let dtype = check::dtype(&a.dtype)?;
    super::quantize::format(a.quantize.as_deref())?;
    let kind = backends::backend(&a.backend)?;
    a.model = super::gguf_model::resolve(&a.model, dtype, kind.reads_blocks())?;
    let inputs = read_all(&a.inputs)?;
    let threads = cores::threads_per_rank(a.threads, mesh);
    let on = OnMesh { a: &a, inputs: &inputs, dtype, mesh, threads };
    let tensors = backends::dispatch(kind, mesh, on)?;
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors_bytes(&tensors, meta)?;
    // one writer: the process of rank 0
    if super::launch::is_leader() {
        write_atomic(&a.out, &bytes)?;
        crate::outln!("wrote {} tensors to {}", tensors.len(), a.out.display());
    }
    Ok(())
}
