//! `redco perplexity`: a causal model's perplexity on a text file, counted as llama.cpp's
//! `llama-perplexity` counts it, so a quantized model (GGUF blocks, `--quantize`, AWQ or
//! GPTQ) is compared with its 16-bit self and with llama.cpp on the same file.
//!
//! The text is encoded whole (the tokenizer's `<s>` first) and cut into chunks of `--seq-len`
//! tokens (a tail shorter than a chunk is left out); each chunk starts with `<s>` in place
//! of its first token, and only the predictions of its second half are scored (every token
//! then has at least `ctx / 2` tokens of context): `ctx - 1 - ctx / 2` tokens a chunk. The
//! perplexity is `exp` of the mean negative log-likelihood of those tokens, and its error
//! the standard error of that mean carried through `exp`, as llama.cpp prints them.

use super::backends::{self, CliBackend, Devices, OnBackend};
use super::{check, cores, model_config};
use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::runtime::Comm;
use redco_core::{Backend, DType, Error, Result, Tensor};
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::hf::vocab;
use std::path::PathBuf;

/// Arguments of `redco perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    /// Hugging Face model directory or LLaMA-family GGUF file (as `generate --model`).
    #[arg(long)]
    pub model: PathBuf,
    /// The text to score, a UTF-8 file (llama.cpp's `-f`), e.g. wikitext-2's `wiki.test.raw`.
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per chunk (llama.cpp's `-c`); at most the model's context.
    #[arg(long, value_parser = check::count, default_value_t = 512)]
    pub seq_len: usize,
    /// Score at most this many chunks (llama.cpp's `--chunks`; default: every whole chunk).
    #[arg(long, value_parser = check::count)]
    pub chunks: Option<usize>,
    /// Chunks run through the model at once.
    #[arg(long, value_parser = check::count, default_value_t = 1)]
    pub batch_size: usize,
    /// Mesh as DPxMP: run split over DP x MP ranks.
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Compute backend: cpu, wgpu (the `wgpu` feature), pjrt (the `tpu` feature) or cuda (the `cuda` feature); one device per rank.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Quantize the linear layers to llama.cpp's blocks as the model loads (q8_0, q4_0,
    /// q4_1, q4_k or q6_k), as `generate --quantize`.
    #[arg(long)]
    pub quantize: Option<String>,
    /// Parameter dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// CPU threads in all (shared by the ranks; default: every core).
    #[arg(long, value_parser = check::threads)]
    pub threads: Option<usize>,
}

/// The chunks of `tokens` llama.cpp scores: `ctx` tokens each, at most `limit` of them,
/// the first token of each replaced by `bos` when the tokenizer adds one.
pub fn chunks(tokens: &[i64], ctx: usize, limit: Option<usize>, bos: Option<i64>) -> Vec<Vec<i64>> {
    let n = (tokens.len() / ctx.max(1)).min(limit.unwrap_or(usize::MAX));
    (0..n)
        .map(|i| {
            let mut c = tokens[i * ctx..(i + 1) * ctx].to_vec();
            if let Some(b) = bos {
                c[0] = b;
            }
            c
        })
        .collect()
}

/// The first position of a chunk of `ctx` tokens whose prediction is scored.
pub fn first_scored(ctx: usize) -> usize {
    ctx / 2
}

/// Perplexity and its standard error from the negative log-likelihoods of the scored
/// tokens, as llama.cpp's final estimate.
pub fn estimate(nll: &[f64]) -> (f64, f64) {
    let n = nll.len().max(1) as f64;
    let mean = nll.iter().sum::<f64>() / n;
    let ppl = mean.exp();
    let var = nll.iter().map(|x| x * x).sum::<f64>() / n - mean * mean;
    let err = if var > 0.0 && nll.len() > 1 { (var / (n - 1.0)).sqrt() * ppl } else { 0.0 };
    (ppl, err)
}

/// The negative log-likelihood of every scored token of `batch` (chunks of equal length),
/// chunk by chunk.
fn score<B: Backend>(model: &redco_models::auto::AutoModel<B>, b: &B, batch: &[Vec<i64>]) -> Result<Vec<f64>> {
    let (n, ctx) = (batch.len(), batch[0].len());
    let first = first_scored(ctx);
    let ids = Tensor::from_vec(b, batch.concat(), [n, ctx])?;
    let logits = redco_core::no_grad(|| model.forward(&ids, None))?.replicate()?;
    // the predictions at positions first..ctx-1 of the tokens after them, in f32 or wider
    let scored = ctx - 1 - first;
    let logits = logits.narrow(1, first, scored)?;
    let logits = if logits.dtype() == DType::F64 { logits } else { logits.cast(DType::F32)? };
    let targets: Vec<i64> = batch.iter().flat_map(|c| c[first + 1..].iter().copied()).collect();
    let targets = Tensor::from_vec(b, targets, [n, scored, 1])?;
    let logp = logits.log_softmax(-1)?.gather(&targets, -1)?.to_vec_f64()?;
    Ok(logp.into_iter().map(|x| -x).collect())
}

/// The scored negative log-likelihoods of every chunk, on one rank of the mesh.
fn run_rank<B: Backend>(b: &B, comm: Option<&Comm<B>>, a: &PerplexityArgs, chunks: &[Vec<i64>]) -> Result<Vec<f64>> {
    let cfg = HfConfig::from_dir(&a.model)?;
    let plan = model_config::rank_plan(&cfg, comm)?;
    let dtype = check::dtype(&a.dtype).map_err(|e| Error::invalid("perplexity", e))?;
    let quant = super::quantize::format(a.quantize.as_deref())?;
    let speak = comm.is_none_or(|c| c.rank() == 0);
    let model = super::quantize::load(b, &a.model, dtype, plan.as_ref(), quant, speak)?;
    let mut nll = Vec::new();
    for (i, batch) in chunks.chunks(a.batch_size).enumerate() {
        nll.extend(score(&model, b, batch)?);
        if speak {
            let done = (i * a.batch_size + batch.len()).min(chunks.len());
            let (ppl, _) = estimate(&nll);
            crate::out!("[{done}]{ppl:.4},");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
    }
    if speak {
        crate::outln!();
    }
    Ok(nll)
}

/// Every rank of the mesh, on the chosen backend.
struct OnMesh<'a> {
    a: &'a PerplexityArgs,
    chunks: &'a [Vec<i64>],
    mesh: redco_core::runtime::Mesh,
    threads: usize,
}

impl OnBackend for OnMesh<'_> {
    type Out = Vec<f64>;
    fn run<B: CliBackend>(self, d: Devices<B>) -> Result<Self::Out> {
        d.on_mesh(self.mesh, self.threads, |b, comm| run_rank(b, comm, self.a, self.chunks))
    }
}

/// Runs `redco perplexity`.
pub fn run(mut a: PerplexityArgs) -> CliResult<()> {
    let mesh = check::mesh(&a.mesh)?;
    let dtype = check::dtype(&a.dtype)?;
    super::quantize::format(a.quantize.as_deref())?;
    let kind = backends::backend(&a.backend)?;
    let text =
        std::fs::read_to_string(&a.text).map_err(|e| format!("cannot read {} as text: {e}", a.text.display()))?;
    a.model = super::gguf_model::resolve(&a.model, dtype, kind.reads_blocks())?;
    let cfg = HfConfig::from_dir(&a.model)?;
    if cfg.model_type == "t5" {
        return Err("perplexity: T5 is an encoder-decoder; perplexity is for causal models".into());
    }
    if let Some(max) = cfg.max_positions.filter(|&m| a.seq_len > m) {
        return Err(
            format!("--seq-len {}: beyond the model's context of {max} (max_position_embeddings)", a.seq_len).into()
        );
    }
    if a.seq_len < 4 {
        return Err(format!("--seq-len {}: a chunk needs at least 4 tokens (half are context)", a.seq_len).into());
    }
    let tok = Tokenizer::from_dir(&a.model)?;
    // the whole text at once, as llama.cpp encodes it (not cut into pieces)
    let tokens = tok.encode(&text, true)?;
    if tok.eos_id().is_some() && tok.encode("a", true)?.last() == tok.eos_id().as_ref() {
        return Err(format!(
            "{}: the tokenizer appends `</s>` to every text; perplexity (as llama.cpp's) is for tokenizers that do not",
            tok.source().display()
        )
        .into());
    }
    let source = format!("{} encoded by {}", a.text.display(), tok.source().display());
    vocab::check_ids(&tokens, cfg.vocab, false, &source, Some(&tok))?;
    if tokens.len() < 2 * a.seq_len {
        return Err(format!(
            "{} encodes to {} tokens; perplexity with --seq-len {} needs at least {} (two chunks, as llama.cpp)",
            a.text.display(),
            tokens.len(),
            a.seq_len,
            2 * a.seq_len
        )
        .into());
    }
    let bos = tok.bos_id().filter(|b| tokens.first() == Some(b));
    let chunks = chunks(&tokens, a.seq_len, a.chunks, bos);
    let scored = a.seq_len - 1 - first_scored(a.seq_len);
    let leader = super::launch::is_leader();
    if leader {
        crate::outln!(
            "perplexity: {} tokens, {} chunks of {} (the last {scored} predictions of each scored)",
            tokens.len(),
            chunks.len(),
            a.seq_len
        );
    }
    let threads = cores::threads_per_rank(a.threads, mesh);
    let nll = backends::dispatch(kind, mesh, OnMesh { a: &a, chunks: &chunks, mesh, threads })?;
    if nll.iter().any(|x| !x.is_finite()) {
        return Err("perplexity: the model gave a non-finite log-likelihood (NaN or infinite logits)".into());
    }
    if leader {
        let (ppl, err) = estimate(&nll);
        let mean = nll.iter().sum::<f64>() / nll.len().max(1) as f64;
        crate::outln!("Final estimate: PPL = {ppl:.4} +/- {err:.5} ({} tokens scored, mean NLL {mean:.6})", nll.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_as_llama_cpp_cuts_them() {
        let t: Vec<i64> = (10..31).collect(); // 21 tokens
        let c = chunks(&t, 8, None, Some(1));
        assert_eq!(c, vec![vec![1, 11, 12, 13, 14, 15, 16, 17], vec![1, 19, 20, 21, 22, 23, 24, 25]]);
        assert_eq!(chunks(&t, 8, Some(1), None), vec![(10..18).collect::<Vec<i64>>()]);
        assert_eq!(first_scored(8), 4);
        assert_eq!(first_scored(7), 3);
    }

    #[test]
    fn estimate_is_exp_of_the_mean_with_its_standard_error() {
        let nll = [1.0, 2.0, 3.0, 2.0];
        let (ppl, err) = estimate(&nll);
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        // variance 0.5 (population), standard error sqrt(0.5 / 3), carried through exp
        assert!((err - (0.5f64 / 3.0).sqrt() * 2f64.exp()).abs() < 1e-12, "{err}");
        assert_eq!(estimate(&[0.7]).1, 0.0);
    }
}
