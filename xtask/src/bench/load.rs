//! `cargo xtask bench load`: peak resident memory of one rank loading its slice of a LLaMA
//! checkpoint at model-parallel size `--mp`, each rank in its own process (so its peak is its
//! own), next to loading the whole model in one process.
//!
//! The parent writes a random checkpoint, then runs `bench load --child` once per rank. A
//! child is one rank of a `1 x mp` mesh whose peers live elsewhere: loading needs no
//! communication, so its communicator refuses any. With `--mpi` (xtask's `mpi` feature)
//! the ranks run together instead, one MPI process each (`mpirun -np mp`), with the MPI
//! communicator.
//!
//! At real size: `--dtype bf16` writes the checkpoint in bf16 tensor by tensor
//! ([`super::random_ckpt`]) and loads it in bf16; `--heads N --kv-heads N` shape the
//! attention; `--decode N` (with `--mpi`) has the ranks decode N tokens greedily after loading
//! (batch 1, an 8-token prompt, the KV cache split over heads) and reports the decode tokens/s
//! next to its bound: this machine's read bandwidth (measured here, every core summing a
//! 1 GiB buffer) over the bytes each token reads (the whole model, read by the ranks
//! together). The 7B config: `--hidden 4096 --layers 32 --inter 11008 --heads 32 --kv-heads 32
//! --vocab 32000 --dtype bf16 --mp 4 --mpi --decode 8`.

use crate::args::Args;
use redco_core::nn::ModuleExt;
use redco_core::planning::heuristics::plan_by_names;
use redco_core::runtime::{Collective, Comm, CommGuard, Mesh, ReduceKind};
use redco_core::{DType, Error, MeshAxis, Result};
use redco_cpu::Cpu;
use redco_models::hf::config::HfConfig;
use redco_models::hf::save::save_pretrained;
use redco_models::llama::Llama;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// One rank of a mesh whose other ranks are in other processes; it cannot communicate.
struct Detached {
    mesh: Mesh,
    rank: usize,
}

impl Detached {
    fn refuse(&self) -> Error {
        Error::invalid("bench load", "a detached rank cannot communicate (loading needs no collectives)")
    }
}

impl Collective<Cpu> for Detached {
    fn mesh(&self) -> Mesh {
        self.mesh
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce(
        &self,
        _: MeshAxis,
        _: &<Cpu as redco_core::Backend>::Storage,
        _: ReduceKind,
    ) -> Result<<Cpu as redco_core::Backend>::Storage> {
        Err(self.refuse())
    }
    fn all_gather(
        &self,
        _: MeshAxis,
        _: &<Cpu as redco_core::Backend>::Storage,
    ) -> Result<<Cpu as redco_core::Backend>::Storage> {
        Err(self.refuse())
    }
    fn reduce_scatter(
        &self,
        _: MeshAxis,
        _: &<Cpu as redco_core::Backend>::Storage,
    ) -> Result<<Cpu as redco_core::Backend>::Storage> {
        Err(self.refuse())
    }
    fn broadcast(
        &self,
        _: MeshAxis,
        _: &<Cpu as redco_core::Backend>::Storage,
        _: usize,
    ) -> Result<<Cpu as redco_core::Backend>::Storage> {
        Err(self.refuse())
    }
    fn barrier(&self) -> Result<()> {
        Err(self.refuse())
    }
}

/// `VmHWM` (peak resident set) and `VmRSS` of this process, in bytes.
fn memory() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The model's shape: hidden, layers, intermediate, vocab, heads, key/value heads.
type Dims = (usize, usize, usize, usize, usize, usize);

fn config((hidden, layers, inter, vocab, heads, kv): Dims, dtype: DType) -> String {
    let torch = if dtype == DType::BF16 { "bfloat16" } else { "float32" };
    format!(
        r#"{{"model_type":"llama","hidden_size":{hidden},"intermediate_size":{inter},"num_attention_heads":{heads},
"num_key_value_heads":{kv},"num_hidden_layers":{layers},"vocab_size":{vocab},"tie_word_embeddings":false,
"max_position_embeddings":2048,"rms_norm_eps":1e-5,"torch_dtype":"{torch}"}}"#
    )
}

/// The checkpoint's dtype, from its config.
fn dtype_of(cfg: &HfConfig) -> DType {
    if cfg.raw.get("torch_dtype").and_then(|v| v.as_str()) == Some("bfloat16") {
        DType::BF16
    } else {
        DType::F32
    }
}

/// Greedy decoding of `new` tokens after an 8-token prompt at batch 1: the tokens/s after the
/// first (the prompt's forward excluded).
#[cfg(feature = "mpi")]
fn decode_rate<M: redco_models::generate::CausalLm<Cpu> + Sync>(b: &Cpu, m: &M, new: usize) -> Result<f64> {
    use redco_models::generate::{generate_with, GenerationConfig, Sampling};
    let prompt = redco_core::Tensor::from_vec(b, (1..=8).collect::<Vec<i64>>(), [1, 8])?;
    let cfg = GenerationConfig { max_new_tokens: new, sampling: Sampling::Greedy, stop_tokens: vec![], pad_token: 0 };
    let mut times = Vec::new();
    generate_with(m, &prompt, None, &cfg, |_, _| times.push(std::time::Instant::now()))?;
    match (times.first(), times.last()) {
        (Some(a), Some(z)) if times.len() > 1 => Ok((times.len() - 1) as f64 / z.duration_since(*a).as_secs_f64()),
        _ => Ok(0.0),
    }
}

fn child(dir: &Path, rank: usize, mp: usize) -> std::result::Result<(), String> {
    let (base, _) = memory();
    let b = Cpu::try_new(1).map_err(|e| e.to_string())?;
    let cfg = HfConfig::from_dir(dir).map_err(|e| e.to_string())?;
    let mesh = Mesh::new(1, mp).map_err(|e| e.to_string())?;
    let plan = plan_by_names(&cfg.param_shapes().map_err(|e| e.to_string())?, mesh);
    let _guard = (mp > 1).then(|| CommGuard::install(Comm::<Cpu>::new(Arc::new(Detached { mesh, rank }))));
    let dtype = dtype_of(&cfg);
    let plan = plan.at_rank(rank).map_err(|e| e.to_string())?;
    let m = Llama::from_pretrained_split(&b, dir, dtype, (mp > 1).then_some(&plan)).map_err(|e| e.to_string())?;
    let (peak, rss) = memory();
    let local: usize =
        m.named_parameters().iter().map(|(_, p)| p.local_shape().elem_count() * dtype.size_in_bytes()).sum();
    println!("{{\"base\":{base},\"peak\":{peak},\"rss\":{rss},\"local\":{local}}}");
    Ok(())
}

/// One rank of a `1 x mp` mesh whose ranks are MPI processes (`mpirun -np mp`), loading
/// its slice with the MPI communicator installed; prints its JSON line with its rank. The
/// baseline is taken after MPI starts (MPI's own memory is not the model's).
#[cfg(feature = "mpi")]
fn child_mpi(dir: &Path, mp: usize, decode: usize) -> std::result::Result<(), String> {
    use redco_core::runtime::{spmd_with, CommFactory, SpmdOptions};
    let mpi = redco_mpi::Mpi::init().map_err(|e| e.to_string())?;
    let (base, _) = memory();
    let cfg = HfConfig::from_dir(dir).map_err(|e| e.to_string())?;
    let mesh = Mesh::new(1, mp).map_err(|e| e.to_string())?;
    let plan = plan_by_names(&cfg.param_shapes().map_err(|e| e.to_string())?, mesh);
    let f: &dyn CommFactory<Cpu> = &*mpi;
    let opts = SpmdOptions { threads_per_rank: Some(1), ..Default::default() };
    spmd_with(
        f,
        mesh,
        &opts,
        |_, t| Cpu::try_new(t),
        |rk| {
            let dtype = dtype_of(&cfg);
            let m = Llama::from_pretrained_split(&rk.backend, dir, dtype, Some(&plan.at_rank(rk.rank)?))?;
            let (peak, rss) = memory();
            let local: usize =
                m.named_parameters().iter().map(|(_, p)| p.local_shape().elem_count() * dtype.size_in_bytes()).sum();
            let rate = if decode > 0 { decode_rate(&rk.backend, &m, decode)? } else { 0.0 };
            let (decode_peak, _) = memory();
            println!(
                "{{\"rank\":{},\"base\":{base},\"peak\":{peak},\"rss\":{rss},\"local\":{local},\"decode_tok_s\":{rate},\"decode_peak\":{decode_peak}}}",
                rk.rank
            );
            rk.comm.barrier()
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn child_mpi(_: &Path, _: usize, _: usize) -> std::result::Result<(), String> {
    Err("--mpi needs xtask's `mpi` feature: cargo run --release -p xtask --features mpi -- bench load --mpi".into())
}

/// Runs `bench load`.
pub fn run(argv: &[String]) -> std::result::Result<(), String> {
    let a = Args::parse(argv, &["mpi"])?;
    if let Some(dir) = a.get("child") {
        return child(Path::new(dir), a.num("rank", 0)?, a.num("mp", 1)?);
    }
    if let Some(dir) = a.get("child-mpi") {
        return child_mpi(Path::new(dir), a.num("mp", 1)?, a.num("decode", 0)?);
    }
    let mp = a.num("mp", 4)?;
    let (heads, kv) = (a.num("heads", 16)?, a.num("kv-heads", a.num("heads", 16)?)?);
    let dims = (a.num("hidden", 1024)?, a.num("layers", 12)?, a.num("inter", 2816)?, a.num("vocab", 32000)?, heads, kv);
    let dtype = match a.get("dtype").unwrap_or("f32") {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        d => return Err(format!("--dtype {d}: f32 or bf16")),
    };
    let decode = a.num("decode", 0)?;
    if decode > 0 && !a.has("mpi") {
        return Err("--decode runs the ranks together: add --mpi".into());
    }
    let dir = PathBuf::from(a.get("dir").unwrap_or("target/bench-load-llama"));
    let text = config(dims, dtype);
    let cfg = HfConfig::from_json(&text).map_err(|e| e.to_string())?;
    let shapes = cfg.param_shapes().map_err(|e| e.to_string())?;
    let model_bytes: usize = shapes.iter().map(|(_, s)| s.elem_count() * dtype.size_in_bytes()).sum();
    let largest = shapes.iter().map(|(_, s)| s.elem_count() * dtype.size_in_bytes()).max().unwrap_or(0);
    if HfConfig::from_dir(&dir).map(|c| c.raw != cfg.raw).unwrap_or(true) {
        eprintln!("writing a random {:.0} MB checkpoint to {}", model_bytes as f64 / 1e6, dir.display());
        if dtype == DType::BF16 {
            super::random_ckpt::write(&dir, &text, &shapes)?;
        } else {
            let b = Cpu::try_new(crate::machine::cores()).map_err(|e| e.to_string())?;
            let m = Llama::new(&b, &cfg, DType::F32, 1).map_err(|e| e.to_string())?;
            save_pretrained(&m, &cfg, &dir, 2_000_000_000, None).map_err(|e| e.to_string())?;
        }
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mb = |x: f64| x / 1e6;
    println!("machine: {}", crate::machine::describe());
    println!(
        "model {:.1} MB ({dtype:?}), largest tensor {:.1} MB, 1/{mp} of the model {:.1} MB",
        mb(model_bytes as f64),
        mb(largest as f64),
        mb(model_bytes as f64 / mp as f64)
    );
    println!(
        "{:<10} {:>14} {:>16} {:>14} {:>18}",
        "process", "kept (MB)", "peak - base (MB)", "peak (MB)", "vs 1/mp + largest"
    );
    let runs: Vec<(String, usize, usize)> = std::iter::once(("whole".to_string(), 0, 1))
        .chain((0..mp).map(|r| (format!("rank {r}/{mp}"), r, mp)))
        .collect();
    let row = |label: &str, v: &serde_json::Value, m: usize| {
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        let grown = f("peak") - f("base");
        let bound = model_bytes as f64 / m as f64 + largest as f64;
        println!(
            "{label:<10} {:>14.1} {:>16.1} {:>14.1} {:>17.2}x",
            mb(f("local")),
            mb(grown),
            mb(f("peak")),
            grown / bound
        );
    };
    if a.has("mpi") {
        // the ranks together, one MPI process each, the communicator real
        let d = dir.to_str().unwrap_or(".");
        let mps = mp.to_string();
        let dec = decode.to_string();
        let args = ["bench", "load", "--child-mpi", d, "--mp", &mps, "--decode", &dec];
        let out = super::mpi::run_under_mpirun(&exe, &args, mp)?;
        let mut lines: Vec<serde_json::Value> =
            out.lines().filter_map(|l| serde_json::from_str(l.trim()).ok()).collect();
        lines.sort_by_key(|v| v["rank"].as_u64());
        if lines.len() != mp {
            return Err(format!("expected {mp} ranks' lines from mpirun, got:\n{out}"));
        }
        for v in &lines {
            row(&format!("mpi {}/{mp}", v["rank"]), v, mp);
        }
        if decode > 0 {
            let peak = lines.iter().filter_map(|v| v["decode_peak"].as_f64()).fold(0.0, f64::max);
            let rate = lines[0]["decode_tok_s"].as_f64().unwrap_or(0.0);
            let bw = super::random_ckpt::read_bandwidth(1 << 30, crate::machine::cores());
            let bound = bw / model_bytes as f64;
            println!(
                "decode at batch 1 over {mp} processes: {rate:.3} tok/s (largest peak RSS of a process while \
                 decoding {:.1} MB); bound: read bandwidth {:.1} GB/s / {:.1} MB read per token = {bound:.3} tok/s; \
                 {:.2}x of the bound",
                mb(peak),
                bw / 1e9,
                mb(model_bytes as f64),
                rate / bound
            );
        }
        return Ok(());
    }
    for (label, rank, m) in runs {
        let out = Command::new(&exe)
            .args([
                "bench",
                "load",
                "--child",
                dir.to_str().unwrap_or("."),
                "--rank",
                &rank.to_string(),
                "--mp",
                &m.to_string(),
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("{label}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        row(&label, &v, m);
    }
    Ok(())
}
