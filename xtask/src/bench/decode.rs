//! `cargo xtask bench decode`: new tokens per second of greedy generation at batch 1 with the
//! KV cache, through redco's CPU backend and, in the same run, transformers' `generate`
//! (eager attention, same thread count), on a randomly initialised small LLaMA.
//!
//! tok/s is new tokens over the whole `generate` call (prefill included). The prefill-free
//! cost of one decode step is estimated as (time for `new` tokens - time for 1 token) / (new - 1):
//! a 1-token generate is the prefill plus the first head projection. `--layers N` (default 6)
//! changes the depth, to separate the per-layer cost from the head's.
//!
//! `--moe` measures a Qwen3-MoE of 32 experts (4 per token) whose active parameters per
//! token are the dense model's, against transformers' `Qwen3MoeForCausalLM` and, in the
//! same run, redco's dense model of the same active parameters (`redco dense`).
//!
//! `--quantize q8_0|q4_0|q4_1|q4_k|q6_k`: the same model with its linear layers quantized to
//! llama.cpp's blocks at load (`redco q8_0` etc., multiplied from the blocks in place) runs
//! beside the float one, interleaved: the row shows what bytes per weight buy at batch 1.
//!
//! `--grown-cache`: a row `grown kv` of the same model through the cache grown by
//! concatenation (`CausalLm::next_logits`, beam search's path) beside `generate`'s, which
//! writes its cache in place: what a cache copied once a token and layer costs.
//!
//! `--model FILE.gguf` reads a LLaMA GGUF (llama.cpp's own file) with its linear layers'
//! blocks kept, as `redco generate --model FILE.gguf` does, the rest in `--dtype`.
//!
//! `--peer-llama-cpp BIN` (with `--model FILE.gguf`): llama.cpp's own `llama-bench` (the
//! binary, or the `build/bin` directory holding it) on the same file and threads, one run
//! between each of redco's repetitions: decode as `tg NEW` at a depth of the prompt's
//! length, prompt processing as `pp P` against redco's 1-token generate from a `P`-token
//! prompt (`--prefill P`, default 512 or the model's context less one).
//!
//! `--model DIR --dtype f32|bf16|f16` measures a saved LLaMA instead (both systems load the
//! directory; e.g. a 1.1B one written in bf16 by transformers), and adds each system's load
//! time from the page cache (the files are read once before; redco: `Llama::from_pretrained`;
//! torch: `from_pretrained`, in its peer), "load +
//! first token" (the load and a 1-token generate) and peak resident set (this process's
//! `VmHWM`; the peer's `ru_maxrss`).

use super::stats::median;
use super::torch::TorchPeer;
use crate::args::Args;
use crate::machine;
use redco_core::{Backend, DType, Tensor};
use redco_cpu::Cpu;
use redco_models::generate::{generate, CausalLm, GenerationConfig, Padded};
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use std::time::Instant;

/// The bench model: hidden 512, 8 heads (8 key/value heads), intermediate 1408, vocab 8000.
fn model_config(layers: usize, context: usize) -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 8000,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
    })
}

/// The MoE bench model (`--moe`): the dense model's attention, and in place of its MLP 32
/// experts of intermediate 352, 4 per token (Qwen3-MoE's layer): per token the same active
/// parameters as the dense model's MLP (4 x 352 = 1408), eight times its MLP weights.
fn moe_config(layers: usize, context: usize) -> serde_json::Value {
    let mut c = model_config(layers, context);
    c["model_type"] = "qwen3_moe".into();
    c["num_experts"] = 32.into();
    c["num_experts_per_tok"] = 4.into();
    c["moe_intermediate_size"] = 352.into();
    c["norm_topk_prob"] = true.into();
    c["decoder_sparse_step"] = 1.into();
    c["mlp_only_layers"] = serde_json::json!([]);
    c["head_dim"] = 64.into();
    c
}

/// Seconds for one `generate` of exactly `new` tokens.
pub(super) fn redco_once<B: Backend, M: CausalLm<B> + Sync>(
    model: &M,
    ids: &Tensor<B>,
    new: usize,
) -> Result<f64, String> {
    let cfg = GenerationConfig { max_new_tokens: new, ..GenerationConfig::default() };
    let t = Instant::now();
    let g = generate(model, ids, None, &cfg).map_err(|e| e.to_string())?;
    let s = t.elapsed().as_secs_f64();
    if g.new_tokens != [new] {
        return Err(format!("redco generated {:?} tokens, not {new}", g.new_tokens));
    }
    Ok(s)
}

/// Seconds for one transformers `generate` of exactly `new` tokens.
pub(super) fn torch_once(
    p: &mut TorchPeer,
    cfg: &serde_json::Value,
    ids: &[i64],
    new: usize,
    dtype: &str,
) -> Result<f64, String> {
    let mut req = serde_json::json!({"op": "decode", "config": cfg, "ids": ids, "new": new, "reps": 1, "dtype": dtype});
    if let Some(dir) = cfg.get("model_dir") {
        req["model_dir"] = dir.clone();
        req["dtype"] = cfg.get("dtype").cloned().unwrap_or("f32".into());
    }
    let v = p.ask(&req)?;
    v["times"].get(0).and_then(|x| x.as_f64()).ok_or_else(|| "torch peer: no times".to_string())
}

/// Reads every file of `dir` once, so that it sits in the page cache.
fn warm_page_cache(dir: &std::path::Path) -> Result<(), String> {
    use std::io::Read;
    let mut buf = vec![0u8; 8 << 20];
    for e in std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
        let path = e.map_err(|e| e.to_string())?.path();
        if path.is_file() {
            let mut f = std::fs::File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            while f.read(&mut buf).map_err(|e| format!("cannot read {}: {e}", path.display()))? > 0 {}
        }
    }
    Ok(())
}

/// Timings of one system: full generates and 1-token generates.
#[derive(Default)]
struct Timings {
    full: Vec<f64>,
    first: Vec<f64>,
}

impl Timings {
    /// (tok/s over the whole generate, generate s, 1-token generate s, decode s per token).
    fn summary(&self, new: usize) -> (f64, f64, f64, Option<f64>) {
        let (full, first) = (median(&self.full), median(&self.first));
        let step = (new > 1).then(|| (full - first) / (new - 1) as f64);
        (new as f64 / full, full, first, step)
    }
}

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["moe", "grown-cache"])?;
    args.only(&[
        "threads",
        "reps",
        "torch",
        "json",
        "prompt",
        "new",
        "layers",
        "model",
        "dtype",
        "moe",
        "quantize",
        "peer-llama-cpp",
        "prefill",
        "grown-cache",
    ])?;
    if let Some(bin) = args.get("peer-llama-cpp") {
        if !args.get("model").is_some_and(|m| m.ends_with(".gguf")) {
            return Err("--peer-llama-cpp runs llama.cpp on the same GGUF file: give --model FILE.gguf".into());
        }
        // before the file is read into a directory
        super::decode_llama::LlamaBench::binary(bin)?;
    }
    let moe = args.has("moe");
    let quant =
        args.get("quantize").map(redco_core::quant::QuantFormat::parse).transpose().map_err(|e| e.to_string())?;
    if moe && quant.is_some() {
        return Err("--quantize runs beside the float model: give --moe or --quantize, not both".into());
    }
    if moe && args.get("model").is_some() {
        return Err("--moe builds its own mixture of experts: give --moe or --model, not both".into());
    }
    let threads = args.num("threads", machine::cores())?;
    let reps = args.num("reps", 5)?.max(1);
    let prompt = args.num("prompt", 16)?.max(1);
    let new = args.num("new", 64)?.max(1);
    let layers = args.num("layers", 6)?;
    let context = (prompt + new).max(2048);
    let dtype = match args.get("dtype").unwrap_or("f32") {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        d => return Err(format!("--dtype {d}: use f32, bf16 or f16")),
    };
    let dev = Cpu::try_new(threads).map_err(|e| e.to_string())?;
    // a GGUF file is read into a directory first, its linear layers' blocks kept
    let gguf_dir = match args.get("model") {
        Some(f) if f.ends_with(".gguf") => {
            let dir = std::env::temp_dir().join(format!("redco-bench-decode-gguf-{}", std::process::id()));
            redco_models::gguf::llama::import(std::path::Path::new(f), &dir, dtype, true).map_err(|e| e.to_string())?;
            if args.get("torch").is_some() {
                return Err("--torch reads a Hugging Face directory, not a GGUF file".into());
            }
            Some(dir)
        }
        _ => None,
    };
    let model_arg =
        gguf_dir.as_ref().map(|d| d.to_string_lossy().into_owned()).or(args.get("model").map(str::to_string));
    let (cfg, cfg_json, model, load_s) = match model_arg.as_deref() {
        Some(dir) => {
            let dir = std::path::Path::new(dir);
            let cfg = HfConfig::from_dir(dir).map_err(|e| e.to_string())?;
            // both systems then read the checkpoint from the page cache (the first to load a
            // cold file would otherwise pay the disk for both)
            warm_page_cache(dir)?;
            let t = Instant::now();
            let model = Llama::from_pretrained(&dev, dir, dtype).map_err(|e| e.to_string())?;
            let load = t.elapsed().as_secs_f64();
            let abs = std::fs::canonicalize(dir).map_err(|e| e.to_string())?;
            let json = serde_json::json!({
                "model_dir": abs.to_string_lossy(),
                "dtype": args.get("dtype").unwrap_or("f32"),
                "hidden_size": cfg.hidden,
                "num_hidden_layers": cfg.layers,
                "vocab_size": cfg.vocab,
            });
            (cfg, json, model, Some(load))
        }
        None => {
            let cfg_json = if moe { moe_config(layers, context) } else { model_config(layers, context) };
            let mut hf = cfg_json.clone();
            if !moe {
                hf["model_type"] = "llama".into();
            }
            let cfg = HfConfig::from_json(&hf.to_string()).map_err(|e| e.to_string())?;
            let model = Llama::new(&dev, &cfg, dtype, 0).map_err(|e| e.to_string())?;
            (cfg, cfg_json, model, None)
        }
    };
    if let Some(s) = load_s {
        eprintln!("redco: loaded {} in {s:.2} s", args.get("model").unwrap_or(""));
    }
    let prompt_ids: Vec<i64> = (0..prompt as i64).map(|i| (i * 37 + 11) % cfg.vocab as i64).collect();
    let ids = Tensor::from_vec(&dev, prompt_ids.clone(), [1, prompt]).map_err(|e| e.to_string())?;
    eprintln!("machine: {} | threads: {threads}", machine::describe());
    let mut torch = match args.get("torch") {
        Some(py) => {
            let p = TorchPeer::start(py, threads)?;
            eprintln!("torch peer: {}", p.info);
            Some(p)
        }
        None => None,
    };
    // torch's load of the saved model, timed before anything else uses it
    let torch_load_s = match (torch.as_mut(), cfg_json.get("model_dir")) {
        (Some(p), Some(dir)) => {
            let v = p.ask(&serde_json::json!({"op": "load", "model_dir": dir, "dtype": cfg_json["dtype"]}))?;
            v["load_s"].as_f64()
        }
        _ => None,
    };
    // with --moe, the dense model of the same active parameters runs beside it
    let dense = if moe {
        let mut hf = model_config(layers, context);
        hf["model_type"] = "llama".into();
        let cfg = HfConfig::from_json(&hf.to_string()).map_err(|e| e.to_string())?;
        Some(Llama::new(&dev, &cfg, dtype, 0).map_err(|e| e.to_string())?)
    } else if let Some(f) = quant {
        // with --quantize, the same weights as blocks take the dense model's place
        let mut m = match model_arg.as_deref() {
            Some(dir) => Llama::from_pretrained(&dev, std::path::Path::new(dir), dtype),
            None => Llama::new(&dev, &cfg, dtype, 0),
        }
        .map_err(|e| e.to_string())?;
        let (done, left) =
            redco_core::nn::quantize_linears(&mut m, f, &|n| !n.ends_with(".gate")).map_err(|e| e.to_string())?;
        eprintln!("redco {f}: {} linear layers quantized, {} left in floats", done.len(), left.len());
        Some(m)
    } else {
        None
    };
    // llama.cpp on the same file, and redco's prefill of as many tokens
    let llama = match (args.get("peer-llama-cpp"), args.get("model")) {
        (Some(bin), Some(file)) => {
            let l = super::decode_llama::LlamaBench::new(bin, file, threads)?;
            eprintln!("peer: {}", l.info);
            Some(l)
        }
        _ => None,
    };
    let prefill =
        args.num("prefill", 512)?.clamp(1, cfg.max_positions.map_or(usize::MAX, |m| m.saturating_sub(1).max(1)));
    let prefill_ids =
        Tensor::from_vec(&dev, (0..prefill as i64).map(|i| (i * 37 + 11) % cfg.vocab as i64).collect(), [1, prefill])
            .map_err(|e| e.to_string())?;
    let (mut llama_decode, mut llama_pp, mut our_prefill) = (Vec::new(), Vec::new(), Vec::new());
    let other = quant.map_or("redco dense".to_string(), |f| format!("redco {}", f.name().to_lowercase()));
    // warm-up: both systems, both lengths (torch also builds its model here)
    redco_once(&model, &ids, new)?;
    redco_once(&model, &ids, 1)?;
    if llama.is_some() {
        redco_once(&model, &prefill_ids, 1)?;
    }
    if let Some(d) = &dense {
        redco_once(d, &ids, new)?;
    }
    let grown = args.has("grown-cache").then_some(Padded(&model));
    if let Some(g) = &grown {
        redco_once(g, &ids, new)?;
        redco_once(g, &ids, 1)?;
    }
    if let Some(p) = torch.as_mut() {
        torch_once(p, &cfg_json, &prompt_ids, new, "f32")?;
        torch_once(p, &cfg_json, &prompt_ids, 1, "f32")?;
    }
    let (mut ours, mut theirs, mut same_active) = (Timings::default(), Timings::default(), Timings::default());
    let mut grown_t = Timings::default();
    // Interleave: every repetition runs redco then torch, the full generate then the 1-token one.
    for rep in 0..reps {
        ours.full.push(redco_once(&model, &ids, new)?);
        ours.first.push(redco_once(&model, &ids, 1)?);
        if let Some(d) = &dense {
            same_active.full.push(redco_once(d, &ids, new)?);
            same_active.first.push(redco_once(d, &ids, 1)?);
        }
        if let Some(g) = &grown {
            grown_t.full.push(redco_once(g, &ids, new)?);
            grown_t.first.push(redco_once(g, &ids, 1)?);
        }
        if let Some(p) = torch.as_mut() {
            theirs.full.push(torch_once(p, &cfg_json, &prompt_ids, new, "f32")?);
            theirs.first.push(torch_once(p, &cfg_json, &prompt_ids, 1, "f32")?);
        }
        if let Some(l) = &llama {
            our_prefill.push(redco_once(&model, &prefill_ids, 1)?);
            llama_decode.push(l.decode_s(new, prompt)?);
            llama_pp.push(l.prefill_tok_s(prefill)?);
        }
        eprintln!("rep {}/{reps} done", rep + 1);
    }
    let mut results = vec![("redco-cpu", ours.summary(new))];
    let mut loads = vec![load_s];
    let mut rss = vec![super::llm_child::peak_rss() as f64];
    if let Some(p) = torch.as_mut() {
        results.push(("torch", theirs.summary(new)));
        loads.push(torch_load_s);
        let info = p.ask(&serde_json::json!({"op": "info"}))?;
        rss.push(info["peak_rss_kib"].as_f64().unwrap_or(f64::NAN) * 1024.0);
    }
    // the dense row last: the ratio against torch stays the first two rows'
    if dense.is_some() {
        results.push((other.as_str(), same_active.summary(new)));
        loads.push(None);
        rss.push(f64::NAN);
    }
    if grown.is_some() {
        results.push(("grown kv", grown_t.summary(new)));
        loads.push(None);
        rss.push(f64::NAN);
    }
    println!();
    match args.get("model") {
        Some(dir) => println!(
            "LLaMA decode of {dir}, {dtype:?}, batch 1: {}; redco loaded it in {:.2} s",
            super::llm::sizes(&cfg),
            load_s.unwrap_or(f64::NAN)
        ),
        None if moe => println!(
            "Qwen3-MoE decode, {dtype:?}, batch 1: hidden 512, {layers} layers, 8 heads (8 kv), 32 experts of \
             intermediate 352, 4 per token, vocab 8000; `redco dense`: the LLaMA of the same active parameters \
             (intermediate 1408)"
        ),
        None => println!(
            "LLaMA decode, {dtype:?}, batch 1: hidden 512, {layers} layers, 8 heads (8 kv), intermediate 1408, vocab 8000"
        ),
    }
    println!("prompt {prompt}, {new} new tokens, greedy, KV cache, {threads} threads, {}", machine::describe());
    println!("medians of {reps} interleaved repetitions");
    println!(
        "{:>10} {:>10} {:>13} {:>15} {:>15} {:>13} {:>8} {:>14} {:>13}",
        "system",
        "tok/s",
        "generate ms",
        "1-token gen ms",
        "decode ms/tok",
        "decode tok/s",
        "load s",
        "load+1st tok s",
        "peak RSS MiB"
    );
    let mut rows = Vec::new();
    for (i, &(name, (tok_s, full, first, step))) in results.iter().enumerate() {
        let load = loads[i];
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
        println!(
            "{:>10} {:>10.1} {:>13.2} {:>15.2} {:>15} {:>13} {:>8} {:>14} {:>13.0}",
            name,
            tok_s,
            full * 1e3,
            first * 1e3,
            opt(step, &|s| format!("{:.3}", s * 1e3)),
            opt(step, &|s| format!("{:.1}", 1.0 / s)),
            opt(load, &|l| format!("{l:.2}")),
            opt(load, &|l| format!("{:.2}", l + first)),
            rss[i] / (1u64 << 20) as f64,
        );
        rows.push(serde_json::json!({
            "system": name,
            "decode_tok_s": tok_s,
            "generate_s": full,
            "one_token_generate_s": first,
            "decode_s_per_token": step,
            "load_s": load,
            "load_and_first_token_s": load.map(|l| l + first),
            "peak_rss_bytes": rss[i],
        }));
    }
    let ratio = (torch.is_some() && results.len() >= 2).then(|| {
        let (a, b) = (results[0].1, results[1].1);
        let step = a.3.zip(b.3).map(|(x, y)| y / x);
        (a.0 / b.0, step)
    });
    if let Some((tok, step)) = ratio {
        println!(
            "redco/torch: {tok:.2}x tok/s (prefill included){}",
            step.map_or(String::new(), |s| format!(", {s:.2}x per decode step"))
        );
    }
    if let Some((_, g)) = results.iter().find(|r| r.0 == "grown kv") {
        let ours = results[0].1;
        println!(
            "cache written in place / grown by concatenation: {:.2}x tok/s{}",
            ours.0 / g.0,
            ours.3.zip(g.3).map_or(String::new(), |(a, b)| format!(", {:.2}x per decode step", b / a))
        );
    }
    let vs_llama = llama.as_ref().map(|l| {
        let ours_step = results[0].1 .3.unwrap_or(f64::NAN);
        let (their_step, their_pp) = (median(&llama_decode), median(&llama_pp));
        let our_pp = prefill as f64 / median(&our_prefill);
        println!(
            "{}: decode {:.1} tok/s (tg{new} @ d{prompt}), prompt processing {:.1} tok/s (pp{prefill})",
            l.info,
            1.0 / their_step,
            their_pp
        );
        println!(
            "redco: decode {:.1} tok/s, prompt processing {our_pp:.1} tok/s ({prefill}-token prompt)",
            1.0 / ours_step
        );
        println!("redco/llama.cpp: decode {:.2}x, prompt processing {:.2}x", their_step / ours_step, our_pp / their_pp);
        serde_json::json!({
            "peer": l.info,
            "llama_cpp_decode_tok_s": 1.0 / their_step,
            "llama_cpp_prefill_tok_s": their_pp,
            "redco_prefill_tok_s": our_pp,
            "prefill_tokens": prefill,
            "decode_ratio": their_step / ours_step,
            "prefill_ratio": our_pp / their_pp,
        })
    });
    if let Some(path) = args.get("json") {
        let out = serde_json::json!({
            "vs_llama_cpp": vs_llama,
            "machine": machine::describe(),
            "threads": threads,
            "model": cfg_json,
            "prompt": prompt,
            "new_tokens": new,
            "reps": reps,
            "torch": torch.as_ref().map(|p| p.info.clone()),
            "rows": rows,
            "ratio_vs_torch": ratio.map(|r| r.0),
            "decode_step_ratio_vs_torch": ratio.and_then(|r| r.1),
        });
        std::fs::write(path, serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    if let Some(d) = &gguf_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(())
}
