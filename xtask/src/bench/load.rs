//! `cargo xtask bench load`: peak resident memory of one rank loading its slice of a LLaMA
//! checkpoint at model-parallel size `--mp`, each rank in its own process (so its peak is its
//! own), next to loading the whole model in one process.
//!
//! The parent writes a random checkpoint, then runs `bench load --child` once per rank. A
//! child is one rank of a `1 x mp` mesh whose peers live elsewhere: loading needs no
//! communication, so its communicator refuses any. With `--mpi` (xtask's `mpi` feature)
//! the ranks run together instead, one MPI process each (`mpirun -np mp`), with the MPI
//! communicator.

use crate::args::Args;
use redco_core::cpu::Cpu;
use redco_core::nn::ModuleExt;
use redco_core::planning::heuristics::plan_by_names;
use redco_core::runtime::{Collective, Comm, CommGuard, Mesh, ReduceKind};
use redco_core::{DType, Error, MeshAxis, Result};
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

fn config(hidden: usize, layers: usize, inter: usize, vocab: usize) -> String {
    format!(
        r#"{{"model_type":"llama","hidden_size":{hidden},"intermediate_size":{inter},"num_attention_heads":16,
"num_key_value_heads":16,"num_hidden_layers":{layers},"vocab_size":{vocab},"tie_word_embeddings":false,
"max_position_embeddings":2048,"rms_norm_eps":1e-5,"torch_dtype":"float32"}}"#
    )
}

fn child(dir: &Path, rank: usize, mp: usize) -> std::result::Result<(), String> {
    let (base, _) = memory();
    let b = Cpu::try_new(1).map_err(|e| e.to_string())?;
    let cfg = HfConfig::from_dir(dir).map_err(|e| e.to_string())?;
    let mesh = Mesh::new(1, mp).map_err(|e| e.to_string())?;
    let plan = plan_by_names(&cfg.param_shapes().map_err(|e| e.to_string())?, mesh);
    let _guard = (mp > 1).then(|| CommGuard::install(Comm::<Cpu>::new(Arc::new(Detached { mesh, rank }))));
    let m = Llama::from_pretrained_split(&b, dir, DType::F32, (mp > 1).then_some(&plan)).map_err(|e| e.to_string())?;
    let (peak, rss) = memory();
    let local: usize = m.named_parameters().iter().map(|(_, p)| p.local_shape().elem_count() * 4).sum();
    println!("{{\"base\":{base},\"peak\":{peak},\"rss\":{rss},\"local\":{local}}}");
    Ok(())
}

/// One rank of a `1 x mp` mesh whose ranks are MPI processes (`mpirun -np mp`), loading
/// its slice with the MPI communicator installed; prints its JSON line with its rank. The
/// baseline is taken after MPI starts (MPI's own memory is not the model's).
#[cfg(feature = "mpi")]
fn child_mpi(dir: &Path, mp: usize) -> std::result::Result<(), String> {
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
            let m = Llama::from_pretrained_split(&rk.backend, dir, DType::F32, Some(&plan))?;
            let (peak, rss) = memory();
            let local: usize = m.named_parameters().iter().map(|(_, p)| p.local_shape().elem_count() * 4).sum();
            println!("{{\"rank\":{},\"base\":{base},\"peak\":{peak},\"rss\":{rss},\"local\":{local}}}", rk.rank);
            rk.comm.barrier()
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn child_mpi(_: &Path, _: usize) -> std::result::Result<(), String> {
    Err("--mpi needs xtask's `mpi` feature: cargo run --release -p xtask --features mpi -- bench load --mpi".into())
}

/// Runs `bench load`.
pub fn run(argv: &[String]) -> std::result::Result<(), String> {
    let a = Args::parse(argv, &["mpi"])?;
    if let Some(dir) = a.get("child") {
        return child(Path::new(dir), a.num("rank", 0)?, a.num("mp", 1)?);
    }
    if let Some(dir) = a.get("child-mpi") {
        return child_mpi(Path::new(dir), a.num("mp", 1)?);
    }
    let mp = a.num("mp", 4)?;
    let (hidden, layers, inter, vocab) =
        (a.num("hidden", 1024)?, a.num("layers", 12)?, a.num("inter", 2816)?, a.num("vocab", 32000)?);
    let dir = PathBuf::from(a.get("dir").unwrap_or("target/bench-load-llama"));
    let cfg = HfConfig::from_json(&config(hidden, layers, inter, vocab)).map_err(|e| e.to_string())?;
    let shapes = cfg.param_shapes().map_err(|e| e.to_string())?;
    let model_bytes: usize = shapes.iter().map(|(_, s)| s.elem_count() * 4).sum();
    let largest = shapes.iter().map(|(_, s)| s.elem_count() * 4).max().unwrap_or(0);
    if HfConfig::from_dir(&dir).map(|c| c.raw != cfg.raw).unwrap_or(true) {
        eprintln!("writing a random {:.0} MB checkpoint to {}", model_bytes as f64 / 1e6, dir.display());
        let b = Cpu::try_new(crate::machine::cores()).map_err(|e| e.to_string())?;
        let m = Llama::new(&b, &cfg, DType::F32, 1).map_err(|e| e.to_string())?;
        save_pretrained(&m, &cfg, &dir, 2_000_000_000).map_err(|e| e.to_string())?;
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mb = |x: f64| x / 1e6;
    println!("machine: {}", crate::machine::describe());
    println!(
        "model {:.1} MB (f32), largest tensor {:.1} MB, 1/{mp} of the model {:.1} MB",
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
        let out = super::mpi::run_under_mpirun(&exe, &["bench", "load", "--child-mpi", d, "--mp", &mps], mp)?;
        let mut lines: Vec<serde_json::Value> =
            out.lines().filter_map(|l| serde_json::from_str(l.trim()).ok()).collect();
        lines.sort_by_key(|v| v["rank"].as_u64());
        if lines.len() != mp {
            return Err(format!("expected {mp} ranks' lines from mpirun, got:\n{out}"));
        }
        for v in &lines {
            row(&format!("mpi {}/{mp}", v["rank"]), v, mp);
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
