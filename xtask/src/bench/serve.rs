//! `cargo xtask bench serve`: `redco serve` on loopback under a fixed set of requests at
//! several concurrencies, as a user's clients would load it (the binary beside this
//! program, which it builds first: `cargo build --release -p redco`).
//!
//! The model: `--preset` (default llama-134m) with the weights of one training step,
//! written by `redco train`. The requests: prompts of 16-128 words of the model's
//! word-level vocabulary and output lengths of 16-64 tokens, drawn from a fixed seed
//! (greedy, no stop), each streamed, so the client sees its first token and every later
//! one. At each concurrency (`--concurrency 1,8,32,128`), that many clients send
//! `--requests` each (bounded by `--max-seconds` per level). Printed per level:
//! requests/s, output tokens/s (the servers' own counts, from each stream's `usage`), time
//! to first token and the time between tokens (p50, p99), output tokens/s against
//! concurrency 1's, the most KV blocks in use (sampled from `/metrics`) and the server's
//! peak RSS; then the preemptions the run needed (a small `--kv-memory` makes the engine
//! preempt). `--mesh 1xN` serves over N tensor-parallel thread ranks. With `--soak
//! SECONDS`, one more level after the others: `--soak-concurrency` clients (default 8)
//! send requests until the time is up, and the server's RSS is sampled every 5 s (printed:
//! first, largest, last).
//!
//! `--dtype f32|bf16|f16` (default f32): the dtype both servers hold the weights and the
//! KV cache in. `--kv-dtype f32|bf16|f16`: redco's KV cache in another dtype than its
//! weights (`redco serve --kv-dtype`; the peer keeps its cache in `--dtype`, so the
//! ratios then compare two configurations, and the report says so).
//!
//! `--peer PY`: after redco's levels (redco's server stopped first), `transformers serve
//! --continuous-batching --device cpu` run by the Python `PY` (torch and
//! `transformers[serving]` installed) on the same model directory gets the same requests at
//! the same levels; printed: its table, then redco's output tokens/s against its at each
//! level and the time to first token at the first level. Both servers first answer one
//! greedy request with the same 48-word prompt (a warm-up); their texts are printed side by
//! side (the same weights and tokenizer: they should agree).
//!
//! `--guided json`: after redco's levels, one constrained warm-up request, then the same
//! levels again with every request constrained to JSON (`response_format: {"type":
//! "json_object"}`); printed: that table and
//! the constrained output tokens/s against the unconstrained at each level (the cost of the
//! grammar's token masks). It needs a vocabulary that spells JSON: `--llama-vocab FILE`
//! (below) gives the model one; the presets' word-level one cannot.
//!
//! `--peer-llama-cpp BIN` (a `llama-server`; `--llama-vocab FILE` its vocabulary): the model
//! gets a SentencePiece vocabulary llama.cpp reads and random weights, and after redco's
//! levels (and transformers' with `--peer`) llama.cpp serves the same model, converted by
//! `redco convert --to gguf` at `--dtype`, with the same requests; printed as for `--peer`.
//! See `serve_llama.rs`.
//!
//! `--quantize TYPE` (`q8_0`, `q4_0`, `q4_k_m`, `q4_k_s`, ...: llama.cpp's quantization
//! types): with `--peer-llama-cpp BIN`, the f32 GGUF is quantized by the `llama-quantize`
//! beside BIN and both servers serve that one file (redco reads its blocks in place);
//! without a peer, redco quantizes at load (`redco serve --quantize`, the types redco
//! writes: q8_0, q4_0, q4_1, q4_k, q6_k). `--keep DIR` writes the model (and the GGUF files)
//! into DIR and leaves them there (for `bench decode --model DIR/model-q8_0.gguf` or
//! llama.cpp's `llama-bench`).

use super::memory::redco_beside;
use super::serve_load::{
    complete, draw, healthy, level_json, metric, print_levels, rss_kb, run_level, vocabulary_words,
};
use super::serve_load::{Lcg, Level, Request};
use crate::args::Args;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server, killed when dropped.
pub(super) struct Server(pub(super) Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The prompt both servers answer first, greedy (their texts printed side by side): 48
/// words cycling through the vocabulary. It also warms each server up before the levels
/// (a prompt long enough for the batched GEMM path: redco packs its weights then).
fn probe_prompt(words: &[String]) -> String {
    words.iter().cycle().take(48).cloned().collect::<Vec<_>>().join(" ")
}

/// The request set of a level of `c` clients: client i's requests from seed 1000 + i.
fn requests(c: usize, per_client: usize, words: &[String]) -> Vec<Vec<Request>> {
    (0..c)
        .map(|i| {
            let mut g = Lcg(1000 + i as u64);
            (0..per_client).map(|_| draw(&mut g, words)).collect()
        })
        .collect()
}

/// Runs every level against the server at `addr` (process `pid`), with the fields of
/// `extra` in every request.
fn levels(
    addr: &str,
    pid: u32,
    levels: &[usize],
    per_client: usize,
    words: &[String],
    max_s: f64,
    extra: &serde_json::Value,
) -> Result<Vec<Level>, String> {
    let mut rows = Vec::new();
    for &c in levels {
        eprintln!("xtask: concurrency {c}: {} requests", c * per_client);
        rows.push(run_level(addr, pid, &requests(c, per_client, words), max_s, extra)?);
    }
    Ok(rows)
}

/// `transformers serve` in its continuous-batching mode on `dir`, run by `py`, once its
/// `/health` answers (bounded: 10 minutes); its output in `dir/peer.log`.
fn start_peer(py: &str, dir: &Path, dtype: &str) -> Result<(Server, String), String> {
    let torch_dtype = match dtype {
        "bf16" => "bfloat16",
        "f16" => "float16",
        _ => "float32",
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let log_path = dir.join("peer.log");
    let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(py)
        .args(["-m", "transformers.cli.transformers", "serve", "--continuous-batching", "--device", "cpu"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--log-level", "warning", "--dtype", torch_dtype])
        .arg(dir)
        .envs(crate::machine::peer_isa_env())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{py}: {e}"))?;
    let addr = format!("127.0.0.1:{port}");
    wait_healthy(Server(child), &addr, &log_path, "transformers serve").map(|s| (s, addr))
}

/// `server` once `addr/health` answers (bounded: 10 minutes); an error with the tail of its
/// log `log_path` if it exits or does not answer in time.
pub(super) fn wait_healthy(mut server: Server, addr: &str, log_path: &Path, name: &str) -> Result<Server, String> {
    let t0 = Instant::now();
    let tail = || {
        let s = std::fs::read_to_string(log_path).unwrap_or_default();
        s.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    while !healthy(addr) {
        if let Ok(Some(status)) = server.0.try_wait() {
            return Err(format!("{name} exited ({status}) before serving:\n{}", tail()));
        }
        if t0.elapsed() > Duration::from_secs(600) {
            return Err(format!("{name} did not answer /health in 10 minutes:\n{}", tail()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(server)
}

/// The peer's torch and transformers versions (printed with its figures).
fn peer_versions(py: &str) -> String {
    Command::new(py)
        .args([
            "-c",
            "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)",
        ])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The soak level: `c` clients send requests until `soak` seconds are up, the server's RSS
/// sampled every 5 s; printed: requests served, first, largest and last RSS.
fn soak_level(addr: &str, pid: u32, c: usize, soak: f64, words: &[String]) {
    eprintln!("xtask: soak: {c} clients for {soak} s");
    let t0 = Instant::now();
    let (samples, served) = std::thread::scope(|sc| {
        let clients: Vec<_> = (0..c)
            .map(|i| {
                sc.spawn(move || {
                    let mut g = Lcg(5000 + i as u64);
                    let mut n = 0usize;
                    while t0.elapsed().as_secs_f64() < soak {
                        let (p, m) = draw(&mut g, words);
                        if super::serve_load::stream_one(addr, &p, m, &serde_json::Value::Null).is_ok() {
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        let mut samples = Vec::new();
        while t0.elapsed().as_secs_f64() < soak {
            samples.push((t0.elapsed().as_secs_f64(), rss_kb(pid).unwrap_or(0)));
            std::thread::sleep(Duration::from_secs(5));
        }
        let served: usize = clients.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        (samples, served)
    });
    let mb = |k: u64| k as f64 / 1024.0;
    let first = samples.first().map_or(0, |s| s.1);
    let last = samples.last().map_or(0, |s| s.1);
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    // after the first minute (the pool and the allocator warmed up)
    let warm: Vec<u64> = samples.iter().filter(|s| s.0 >= 60.0).map(|s| s.1).collect();
    let (wmin, wmax) = (warm.iter().min().copied().unwrap_or(0), warm.iter().max().copied().unwrap_or(0));
    println!(
        "soak: {served} requests by {c} clients in {soak:.0} s; server RSS first {:.1} MB, largest {:.1} MB, last {:.1} MB; after the first minute {:.1}-{:.1} MB",
        mb(first), mb(max), mb(last), mb(wmin), mb(wmax)
    );
}

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &[])?;
    a.only(&[
        "preset",
        "concurrency",
        "requests",
        "max-seconds",
        "kv-memory",
        "max-batch-tokens",
        "json",
        "soak",
        "soak-concurrency",
        "mesh",
        "peer",
        "peer-llama-cpp",
        "llama-vocab",
        "guided",
        "dtype",
        "kv-dtype",
        "quantize",
        "keep",
    ])?;
    if a.get("guided").is_some() && super::serve_llama::vocab_file(&a)?.is_none() {
        return Err("--guided needs a vocabulary that spells JSON: add --llama-vocab FILE (a SentencePiece GGUF, \
                    e.g. llama.cpp's models/ggml-vocab-llama-spm.gguf); the preset's word-level one cannot"
            .into());
    }
    let mesh = a.get("mesh").unwrap_or("1x1").to_string();
    let preset = a.get("preset").unwrap_or("llama-134m").to_string();
    let levels_: Vec<usize> = a
        .get("concurrency")
        .unwrap_or("1,8,32,128")
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("--concurrency: `{x}` is not a number")))
        .collect::<Result<_, _>>()?;
    let per_client = a.num("requests", 2)?;
    let max_s = a.num("max-seconds", 300)? as f64;
    let redco = redco_beside("cargo build --release -p redco", "bench serve")?;
    // --keep DIR: the model (and its GGUF files) written there and left for other tools
    let keep = a.get("keep").map(std::path::PathBuf::from);
    let dir =
        keep.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("redco-bench-serve-{}", std::process::id())));
    println!("machine: {}", crate::machine::describe());
    if let Some(vocab) = super::serve_llama::vocab_file(&a)? {
        eprintln!("xtask: writing the {preset} model (random weights) with the vocabulary of {}", vocab.display());
        super::serve_llama::write_model(&dir, &preset, &vocab)?;
    } else {
        eprintln!("xtask: writing the {preset} model (one training step)");
        let o = Command::new(&redco)
            .args(["train", "--preset", &preset, "--steps", "1", "--batch-size", "1", "--seq-len", "8"])
            .args(["--sample-tokens", "0"])
            .arg("--workdir")
            .arg(&dir)
            .output()
            .map_err(|e| format!("{}: {e}", redco.display()))?;
        if !o.status.success() {
            return Err(format!("redco train failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
    }
    let result = bench(&a, &redco, &dir, &mesh, &preset, &levels_, per_client, max_s);
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// `--dtype`: both servers' weights and KV cache (f32, the default; bf16; f16).
fn dtype(a: &Args) -> Result<&str, String> {
    match a.get("dtype").unwrap_or("f32") {
        d @ ("f32" | "bf16" | "f16") => Ok(d),
        d => Err(format!("--dtype: `{d}` is not f32, bf16 or f16")),
    }
}

/// `--kv-dtype`: redco's KV cache (default: `--dtype`).
fn kv_dtype(a: &Args) -> Result<&str, String> {
    match a.get("kv-dtype") {
        None => dtype(a),
        Some(d @ ("f32" | "bf16" | "f16")) => Ok(d),
        Some(d) => Err(format!("--kv-dtype: `{d}` is not f32, bf16 or f16")),
    }
}

/// The benchmark on the model written in `dir`.
#[allow(clippy::too_many_arguments)]
fn bench(
    a: &Args,
    redco: &Path,
    dir: &Path,
    mesh: &str,
    preset: &str,
    levels_: &[usize],
    per_client: usize,
    max_s: f64,
) -> Result<(), String> {
    let tok = dir.join("tokenizer.json");
    let tok_text = std::fs::read_to_string(&tok).map_err(|e| format!("{}: {e}", tok.display()))?;
    let words = if super::serve_llama::vocab_file(a)?.is_some() {
        super::serve_llama::words(&tok_text)?
    } else {
        vocabulary_words(&tok_text)?
    };
    // with --quantize and llama.cpp as the peer, both serve one file llama.cpp quantized
    let quant_gguf = match (a.get("quantize"), a.get("peer-llama-cpp")) {
        (Some(q), Some(bin)) => {
            let f32_file = super::serve_llama::convert(redco, dir, "f32")?;
            Some(super::serve_llama::quantize(Path::new(bin), &f32_file, q)?)
        }
        _ => None,
    };
    let mut cmd = Command::new(redco);
    cmd.args(["serve", "--model"]).arg(quant_gguf.as_deref().unwrap_or(dir));
    if let (Some(q), None) = (a.get("quantize"), &quant_gguf) {
        cmd.args(["--quantize", q]);
    }
    let mut child = cmd
        .args(["--port", "0", "--kv-memory", a.get("kv-memory").unwrap_or("2GB"), "--mesh", mesh])
        .args(["--dtype", dtype(a)?])
        .args(["--kv-dtype", kv_dtype(a)?])
        .args(["--max-batch-tokens", a.get("max-batch-tokens").unwrap_or("256"), "--max-running", "256"])
        .args(["--max-queue", "1024"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", redco.display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line).map_err(|e| e.to_string())?;
    let server = Server(child);
    let addr =
        line.split("http://").nth(1).and_then(|r| r.split_whitespace().next()).ok_or(format!("no address: {line}"))?;
    println!("{}", line.trim());
    println!(
        "redco serve --model {preset} (random weights, {}{}), greedy, streamed; prompts 16-128 words, outputs 16-64 tokens",
        dtype(a)?,
        a.get("quantize").map(|q| format!(", linear layers {q}")).unwrap_or_default()
    );
    let probe_text = probe_prompt(&words);
    let probe = complete(addr, &probe_text, 16)?;
    let pid = server.0.id();
    let rows = levels(addr, pid, levels_, per_client, &words, max_s, &serde_json::Value::Null)?;
    let guided = match a.get("guided") {
        None => None,
        Some("json") => {
            eprintln!("xtask: the same levels, every request constrained to JSON (response_format json_object)");
            let extra = serde_json::json!({"response_format": {"type": "json_object"}});
            // a warm-up request first, as for the unconstrained levels: the first constrained
            // request also sets the grammar up over the vocabulary, which is not its rate
            super::serve_load::stream_one(addr, &probe_text, 16, &extra)?;
            Some(levels(addr, pid, levels_, per_client, &words, max_s, &extra)?)
        }
        Some(g) => return Err(format!("--guided: `{g}` is not `json`")),
    };
    let soak = a.num("soak", 0)? as f64;
    if soak > 0.0 {
        soak_level(addr, pid, a.num("soak-concurrency", 8)?, soak, &words);
    }
    let preempted = metric(addr, "redco_preemptions_total").unwrap_or(0);
    drop(server);
    print_levels(&format!("redco serve (mesh {mesh}, weights {}, KV cache {})", dtype(a)?, kv_dtype(a)?), &rows);
    println!("preemptions: {preempted}");
    if let Some(g) = &guided {
        print_levels("redco serve, every request constrained to JSON (response_format json_object)", g);
        println!("\nconstrained / unconstrained, output tokens/s:");
        for (r, c) in rows.iter().zip(g) {
            println!(
                "  concurrency {:>3}: {:>7.1} / {:>7.1} = {:.2}x",
                r.concurrency,
                c.tok_s,
                r.tok_s,
                c.tok_s / r.tok_s
            );
        }
    }
    let mut doc = serde_json::json!({"machine": crate::machine::describe(), "preset": preset, "mesh": mesh,
        "rows": rows.iter().map(level_json).collect::<Vec<_>>()});
    if let Some(g) = &guided {
        doc["guided_json_rows"] = serde_json::json!(g.iter().map(level_json).collect::<Vec<_>>());
    }
    if let Some(py) = a.get("peer") {
        let versions = peer_versions(py);
        eprintln!("xtask: the peer: transformers serve --continuous-batching ({versions})");
        let (peer, paddr) = start_peer(py, dir, dtype(a)?)?;
        let peer_probe = complete(&paddr, &probe_text, 16)?;
        let peer_rows = levels(&paddr, peer.0.id(), levels_, per_client, &words, max_s, &serde_json::Value::Null)?;
        drop(peer);
        let name = format!("transformers serve --continuous-batching --device cpu ({versions})");
        compare(&name, "transformers", &rows, &peer_rows, [&probe_text, &probe, &peer_probe]);
        if kv_dtype(a)? != dtype(a)? {
            println!("  (redco's KV cache in {}, the peer's in {}: two configurations)", kv_dtype(a)?, dtype(a)?);
        }
        doc["peer"] = serde_json::json!({"versions": versions, "same_greedy_text": probe == peer_probe,
            "rows": peer_rows.iter().map(level_json).collect::<Vec<_>>()});
    }
    if let Some(bin) = a.get("peer-llama-cpp") {
        let bin = Path::new(bin);
        let version = super::serve_llama::version(bin);
        eprintln!("xtask: the peer: llama-server ({version}); converting the model to GGUF");
        let gguf = match &quant_gguf {
            Some(g) => g.clone(),
            None => super::serve_llama::convert(redco, dir, dtype(a)?)?,
        };
        let slots = levels_.iter().copied().max().unwrap_or(1);
        let (peer, paddr) = super::serve_llama::start(bin, &gguf, dir, slots, kv_dtype(a)?)?;
        let peer_probe = complete(&paddr, &probe_text, 16)?;
        let peer_rows = levels(&paddr, peer.0.id(), levels_, per_client, &words, max_s, &serde_json::Value::Null)?;
        drop(peer);
        let name = format!(
            "llama-server ({version}; GGUF {}, KV cache {}, {slots} slots, {} threads)",
            a.get("quantize").unwrap_or(dtype(a)?),
            kv_dtype(a)?,
            crate::machine::cores()
        );
        compare(&name, "llama.cpp", &rows, &peer_rows, [&probe_text, &probe, &peer_probe]);
        doc["peer_llama_cpp"] = serde_json::json!({"version": version, "same_greedy_text": probe == peer_probe,
            "rows": peer_rows.iter().map(level_json).collect::<Vec<_>>()});
    }
    if let Some(path) = a.get("json") {
        std::fs::write(path, doc.to_string()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// Prints a peer's table, the greedy texts of the probe (`probe`: prompt, redco's text, the
/// peer's), redco's output tokens/s against the peer's at each level, and the time to first
/// token at the first level.
fn compare(title: &str, peer: &str, rows: &[Level], peer_rows: &[Level], probe: [&str; 3]) {
    print_levels(title, peer_rows);
    let [prompt, ours, theirs] = probe;
    println!("\ngreedy text of `{prompt}`, 16 tokens:\n  redco:  {ours:?}\n  {peer}: {theirs:?}");
    println!("same text: {}", if ours == theirs { "yes" } else { "NO" });
    println!("\nredco / {peer}, output tokens/s:");
    for (r, p) in rows.iter().zip(peer_rows) {
        println!("  concurrency {:>3}: {:>7.1} / {:>7.1} = {:.2}x", r.concurrency, r.tok_s, p.tok_s, r.tok_s / p.tok_s);
    }
    for (r, p) in rows.iter().zip(peer_rows) {
        println!(
            "time to first token at concurrency {:>3}, p50: redco {:.3} s, {peer} {:.3} s ({:.2}x)",
            r.concurrency,
            r.ttft[0],
            p.ttft[0],
            r.ttft[0] / p.ttft[0]
        );
    }
}
