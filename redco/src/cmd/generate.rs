//! `redco generate`: text from a Hugging Face LLaMA directory, streamed token by token for
//! one prompt, batched (left-padded) for several; greedy or sampled, on one device or split
//! over a mesh.

use super::backends::{self, BackendKind, CliBackend, Devices, OnBackend};
use super::{check, cores, fits, model_config};
use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::runtime::Comm;
use redco_core::{Backend, Error, Result, Tensor};
use redco_models::generate::{generate_beam, generate_with, BeamConfig, GenerationConfig, Sampling};
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::hf::vocab;
use redco_models::t5::T5;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `redco generate`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct GenerateArgs {
    /// Hugging Face model directory (LLaMA, GPT-J or OPT: config.json, safetensors,
    /// tokenizer.json), e.g. a
    /// `redco train` workdir; or a LLaMA-family GGUF file (llama.cpp's: F32, F16, BF16,
    /// Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors, dequantized to --dtype once and kept in
    /// ~/.cache/redco/gguf).
    #[arg(long)]
    pub model: PathBuf,
    /// A prompt (repeat for a batch).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// A file of prompts, one per line.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// New tokens per prompt at most (default: 32, or what the model's context leaves after
    /// the longest prompt when that is fewer; printed when it is).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, value_parser = check::non_negative, default_value_t = 0.0)]
    pub temperature: f64,
    /// Sample only from the k most likely tokens.
    #[arg(long, value_parser = check::count)]
    pub top_k: Option<usize>,
    /// Sample only from the most likely tokens holding this much probability.
    #[arg(long, value_parser = check::fraction)]
    pub top_p: Option<f64>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Beam search with this many beams (length penalty 1, early stopping); 1 = greedy or
    /// sampled decoding.
    #[arg(long, value_parser = check::beams, default_value_t = 1)]
    pub num_beams: usize,
    /// Also stop at these token ids (besides the model's end-of-sequence tokens); each must
    /// be an id of the model's vocabulary.
    #[arg(long, value_parser = check::token_id)]
    pub stop_id: Vec<i64>,
    /// Mesh as DPxMP: split the model over MP ranks.
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Compute backend: cpu, wgpu (the `wgpu` feature), pjrt (the `tpu` feature) or cuda (the `cuda` feature); one device per rank.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Quantize the linear layers to llama.cpp's blocks as the model loads (q8_0, q4_0,
    /// q4_1, q4_k or q6_k; rows must be whole blocks: 32 values, 256 for the K formats) and
    /// multiply from the blocks in place.
    #[arg(long)]
    pub quantize: Option<String>,
    /// Parameter dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// CPU threads in all (default: every core).
    #[arg(long, value_parser = check::threads)]
    pub threads: Option<usize>,
    /// Allow more ranks than cores on a host (slow; for trying meshes on a small machine).
    #[arg(long)]
    pub oversubscribe: bool,
}

/// New tokens when `--max-new-tokens` is not given: [`DEFAULT_NEW_TOKENS`], or what the
/// model's context leaves after the longest prompt (`prompt` tokens) when that is fewer
/// (said on stderr by the rank that prints, `speak`).
fn new_tokens(cfg: &HfConfig, given: Option<usize>, prompt: usize, speak: bool) -> usize {
    if let Some(n) = given {
        return n;
    }
    match cfg.max_positions.filter(|_| cfg.model_type != "t5") {
        Some(ctx) if ctx.saturating_sub(prompt) < DEFAULT_NEW_TOKENS => {
            let n = ctx.saturating_sub(prompt).max(1);
            if speak {
                crate::cmd::out::warn(format_args!(
                    "redco: generating at most {n} new tokens (--max-new-tokens default: the model's context of \
                     {ctx} less the {prompt}-token prompt)"
                ));
            }
            n
        }
        _ => DEFAULT_NEW_TOKENS,
    }
}

/// New tokens per prompt when neither `--max-new-tokens` nor the model's context says less.
const DEFAULT_NEW_TOKENS: usize = 32;

fn run_rank<B: Backend>(b: &B, comm: Option<&Comm<B>>, a: &GenerateArgs, prompts: &[String]) -> Result<Vec<String>> {
    let cfg = HfConfig::from_dir(&a.model)?;
    let plan = model_config::rank_plan(&cfg, comm)?;
    let dtype = check::dtype(&a.dtype).map_err(|e| Error::invalid("generate", e))?;
    let tok = Tokenizer::from_dir(&a.model)?;
    let speak = comm.is_none_or(|c| c.rank() == 0);
    if let Some(w) = vocab::check_tokenizer(&tok, cfg.vocab)? {
        if speak {
            crate::cmd::out::warn(format_args!("redco: warning: {w}"));
        }
    }
    for &id in &a.stop_id {
        vocab::check_ids(&[id], cfg.vocab, false, &format!("--stop-id {id}"), None)?;
    }
    let texts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = tok.encode_batch(&texts, true)?;
    let source = format!("the prompts, encoded by {}", tok.source().display());
    vocab::check_ids(&batch.ids, cfg.vocab, false, &source, Some(&tok))?;
    let max_new_tokens = new_tokens(&cfg, a.max_new_tokens, batch.seq, speak);
    let threads = a.threads.unwrap_or_else(cores::host_cores);
    let quant = super::quantize::format(a.quantize.as_deref())?;
    fits::check_generation_fits(&cfg, (batch.batch * a.num_beams, batch.seq, max_new_tokens), dtype, threads, quant)
        .map_err(|e| e.into_redco("generate"))?;
    let ids = Tensor::from_vec(b, batch.ids.clone(), [batch.batch, batch.seq])?;
    let mask = Tensor::from_vec(b, batch.mask.clone(), [batch.batch, batch.seq])?;
    let sampling = if a.temperature > 0.0 {
        Sampling::Sample { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed }
    } else {
        Sampling::Greedy
    };
    // the model's stop and padding tokens, the tokenizer's end of sequence and --stop-id too
    let mut gc = GenerationConfig { max_new_tokens, sampling, ..GenerationConfig::for_model(&cfg) };
    gc.stop_tokens.extend(tok.eos_id());
    gc.stop_tokens.extend(&a.stop_id);
    gc.pad_token = cfg.pad_token_id.unwrap_or(tok.padding_id());
    let stop = gc.stop_tokens.clone();
    let beams = BeamConfig {
        max_new_tokens,
        early_stopping: true,
        stop_tokens: stop.clone(),
        pad_token: gc.pad_token,
        ..BeamConfig::for_model(&cfg, a.num_beams)
    };
    let decode = |rows: Vec<Vec<i64>>, skip: usize| -> Result<Vec<String>> {
        rows.iter()
            .map(|row| {
                let cont: Vec<i64> = row[skip..].iter().copied().take_while(|t| !stop.contains(t)).collect();
                tok.decode(&cont, true)
            })
            .collect()
    };
    if cfg.model_type == "t5" {
        // encoder-decoder: the answer is the decoder's output after its start token
        if a.quantize.is_some() {
            return Err(Error::unsupported("generate", "--quantize on T5 (decoder-only models quantize)"));
        }
        let model = T5::from_pretrained(b, &a.model, dtype, plan.as_ref())?;
        let rows = if a.num_beams > 1 {
            model.generate_beam(&ids, Some(&mask), &beams)?
        } else {
            model.generate(&ids, Some(&mask), &gc)?
        };
        return decode(rows, 1);
    }
    let model = super::quantize::load(b, &a.model, dtype, plan.as_ref(), quant, speak)?;
    if a.num_beams > 1 {
        return decode(generate_beam(&model, &ids, Some(&mask), &beams)?, batch.seq);
    }
    let speak = speak && prompts.len() == 1;
    // streaming: decode prompt + continuation and print what is new (a token may end
    // mid-character, and tokenizers decide spacing from context)
    let mut seq: Vec<i64> = batch.ids.iter().zip(&batch.mask).filter(|(_, m)| **m != 0).map(|(&t, _)| t).collect();
    let base = tok.decode(&seq, true)?;
    let mut shown = base.len();
    if speak {
        crate::out!("{base}");
        let _ = std::io::stdout().flush();
    }
    let g = generate_with(&model, &ids, Some(&mask), &gc, |_, t| {
        if !speak || stop.contains(&t[0]) {
            return;
        }
        seq.push(t[0]);
        if let Ok(s) = tok.decode(&seq, true) {
            if s.len() > shown && s.is_char_boundary(shown) && !s.ends_with('\u{fffd}') {
                crate::out!("{}", &s[shown..]);
                let _ = std::io::stdout().flush();
                shown = s.len();
            }
        }
    })?;
    if speak {
        crate::outln!();
    }
    decode(g.rows, batch.seq)
}

/// The generation on every rank of the mesh, on the chosen backend.
struct OnMesh<'a> {
    a: &'a GenerateArgs,
    prompts: &'a [String],
    mesh: redco_core::runtime::Mesh,
    threads: usize,
}

impl OnBackend for OnMesh<'_> {
    type Out = Vec<String>;
    fn run<B: CliBackend>(self, d: Devices<B>) -> Result<Vec<String>> {
        d.on_mesh(self.mesh, self.threads, |b, comm| run_rank(b, comm, self.a, self.prompts))
    }
}

/// Runs `redco generate`.
pub fn run(mut a: GenerateArgs) -> CliResult<()> {
    super::quantize::format(a.quantize.as_deref())?;
    let kind = backends::backend(&a.backend)?;
    a.model = super::gguf_model::resolve(&a.model, check::dtype(&a.dtype)?, kind.reads_blocks())?;
    let mesh = check::mesh(&a.mesh)?;
    if kind == BackendKind::Cpu {
        cores::check_devices(mesh, a.threads, a.oversubscribe)?;
    }
    let mut prompts = a.prompt.clone();
    if let Some(f) = &a.prompts_file {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read prompts file {}: {e}", f.display()))?;
        let before = prompts.len();
        prompts.extend(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string));
        if prompts.len() == before {
            return Err(format!("--prompts-file {}: the file holds no prompts (only empty lines)", f.display()).into());
        }
    }
    if prompts.is_empty() {
        return Err("give a prompt: --prompt TEXT (repeatable) or --prompts-file FILE".into());
    }
    let threads = cores::threads_per_rank(a.threads, mesh);
    let on = OnMesh { a: &a, prompts: &prompts, mesh, threads };
    let outs = backends::dispatch(kind, mesh, on)?;
    // one greedy/sampled prompt of a decoder-only model has been streamed already
    let streamed = prompts.len() == 1 && a.num_beams <= 1 && !model_config::is_t5(&a.model);
    if !streamed && super::launch::is_leader() {
        for (p, o) in prompts.iter().zip(outs) {
            crate::outln!("{p}{}{o}", if p.ends_with(' ') { "" } else { " " });
        }
    }
    Ok(())
}
