//! `cargo xtask bench gemm`: f32 GEMM GFLOP/s through redco's CPU backend, as a fraction of
//! the measured FMA peak (before and after the GEMMs), and against `torch.matmul` measured in
//! the same run. `--dtype bf16` multiplies bf16 operands (f32 accumulation: the kernel
//! family `redco info` names) against torch's bf16 `matmul`; the fraction stays of the f32
//! FMA peak, so above 100% the bf16 kernel beats what f32 can reach. `--backend cuda`
//! measures the CUDA backend instead (`gemm_cuda.rs`).

use super::stats::median;
use super::torch::TorchPeer;
use crate::args::Args;
use crate::machine;
use redco_core::{DType, HostData, Tensor};
use redco_cpu::Cpu;
use std::time::Instant;

/// (m, k, n): square sizes and the LLM shapes of the bench model (tokens 1024, hidden 512,
/// intermediate 1408, vocab 8000): up projection, down projection, LM head.
const SHAPES: [(usize, usize, usize); 6] =
    [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (1024, 512, 1408), (1024, 1408, 512), (1024, 512, 8000)];

/// Which operand is stored transposed: `C = A B` with both row-major, `A B^T` with `B` stored
/// `[n, k]` (a linear layer's forward: weights are `[out, in]`), or `A^T B` with `A` stored
/// `[k, m]` (its weight gradient, `dY^T X`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Nn,
    Bt,
    At,
}

impl Layout {
    fn suffix(self) -> &'static str {
        match self {
            Layout::Nn => "",
            Layout::Bt => ":bt",
            Layout::At => ":at",
        }
    }
}

/// A shape to measure: `(m, k, n)` and its layout.
type Case = ((usize, usize, usize), Layout);

/// `--shapes 1024x768x2048:bt,768x1024x2048:at,...` (`MxKxN`, optionally `:bt` or `:at`).
fn parse_shapes(list: &str) -> Result<Vec<Case>, String> {
    list.split(',')
        .map(|item| {
            let (dims, layout) = match item.split_once(':') {
                None => (item, Layout::Nn),
                Some((d, "bt")) => (d, Layout::Bt),
                Some((d, "at")) => (d, Layout::At),
                Some((_, l)) => return Err(format!("--shapes {item}: layout `{l}` is not bt or at")),
            };
            let v: Vec<usize> =
                dims.split('x').map(|x| x.parse().map_err(|_| ())).collect::<Result<_, ()>>().map_err(|_| {
                    format!("--shapes {item}: expected MxKxN with positive sizes, e.g. 1024x768x2048:bt")
                })?;
            match v[..] {
                [m, k, n] if m > 0 && k > 0 && n > 0 => Ok(((m, k, n), layout)),
                _ => Err(format!("--shapes {item}: expected MxKxN with positive sizes, e.g. 1024x768x2048:bt")),
            }
        })
        .collect()
}

fn operand(dev: &Cpu, rows: usize, cols: usize, seed: u64, dtype: DType) -> Result<Tensor<Cpu>, String> {
    let v: Vec<f64> = (0..(rows * cols) as u64).map(|i| redco_core::ops::random::uniform_at(seed, i)).collect();
    Tensor::from_host(dev, &HostData::from_f64(&v, dtype), [rows, cols]).map_err(|e| e.to_string())
}

fn reps_for(m: usize, n: usize, k: usize, base: usize) -> usize {
    let flop = 2.0 * (m * n * k) as f64;
    // about a second of work per shape and round at 200 GFLOP/s, at least 3 calls
    ((2e11 / flop) as usize).clamp(3, 50).min(base.max(3))
}

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &[])?;
    match args.get("backend") {
        Some("cuda") => return super::gemm_cuda::run(&args),
        Some(b) if b != "cpu" => return Err(format!("bench gemm --backend {b}: cpu or cuda")),
        _ => {}
    }
    args.only(&["threads", "reps", "torch", "json", "rounds", "dtype", "backend", "shapes"])?;
    let cases: Vec<Case> = match args.get("shapes") {
        Some(list) => parse_shapes(list)?,
        None => SHAPES.iter().map(|&s| (s, Layout::Nn)).collect(),
    };
    let (dtype, dname) = match args.get("dtype").unwrap_or("f32") {
        "f32" => (DType::F32, "f32"),
        "bf16" => (DType::BF16, "bf16"),
        d => return Err(format!("--dtype {d}: use f32 or bf16")),
    };
    let threads = args.num("threads", machine::cores())?;
    let base_reps = args.num("reps", 20)?;
    let rounds = args.num("rounds", 3)?.max(1);
    let dev = Cpu::new(threads);
    eprintln!("machine: {} | threads: {threads}", machine::describe());
    // The machine's speed drifts over a run (shared host, and the first calibration of a fresh
    // process often reads low): the peak is measured before and after the GEMMs and the higher
    // one is reported. Not between them: right after the all-FMA loop the cores run slower for a
    // while (512^3 measured at half speed), which would favour one side.
    let first = super::peak::measure(threads);
    eprintln!("measured f32 FMA peak: {first:.1} GFLOP/s");
    let mut torch = match args.get("torch") {
        Some(py) => {
            let p = TorchPeer::start(py, threads)?;
            eprintln!("torch peer: {}", p.info);
            Some(p)
        }
        None => None,
    };
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut theirs: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    // Interleave: every round measures each shape on redco then on torch.
    for round in 0..rounds {
        for (i, &((m, k, n), layout)) in cases.iter().enumerate() {
            let reps = reps_for(m, n, k, base_reps);
            let (ta, tb) = (layout == Layout::At, layout == Layout::Bt);
            let a = if ta { operand(&dev, k, m, 1, dtype)? } else { operand(&dev, m, k, 1, dtype)? };
            let b = if tb { operand(&dev, n, k, 2, dtype)? } else { operand(&dev, k, n, 2, dtype)? };
            let product = || a.matmul_ext(&b, ta, tb).map_err(|e| e.to_string());
            product()?; // warm-up
            for _ in 0..reps {
                let t = Instant::now();
                let c = product()?;
                ours[i].push(t.elapsed().as_secs_f64());
                drop(c);
            }
            if let Some(p) = torch.as_mut() {
                theirs[i].extend(p.gemm_times(m, n, k, reps, dname, (ta, tb))?);
            }
            eprintln!("round {}/{rounds}: {m}x{k}x{n}{} done", round + 1, layout.suffix());
        }
    }
    let last = super::peak::measure(threads);
    eprintln!("measured f32 FMA peak after the GEMMs: {last:.1} GFLOP/s");
    let peak = first.max(last);
    let mut rows = Vec::new();
    println!();
    println!("{dname} GEMM, {threads} threads, {} | f32 FMA peak {peak:.1} GFLOP/s (measured)", machine::describe());
    println!("{:>16} {:>12} {:>8} {:>12} {:>10}", "m x k x n", "redco GF/s", "% peak", "torch GF/s", "redco/torch");
    for (i, &((m, k, n), layout)) in cases.iter().enumerate() {
        let flop = 2.0 * (m * n * k) as f64;
        let g = flop / median(&ours[i]) / 1e9;
        let tg = (!theirs[i].is_empty()).then(|| flop / median(&theirs[i]) / 1e9);
        println!(
            "{:>16} {:>12.1} {:>7.1}% {:>12} {:>10}",
            format!("{m}x{k}x{n}{}", layout.suffix()),
            g,
            100.0 * g / peak,
            tg.map_or("-".into(), |t| format!("{t:.1}")),
            tg.map_or("-".into(), |t| format!("{:.2}x", g / t)),
        );
        rows.push(serde_json::json!({
            "m": m, "n": n, "k": k,
            "layout": match layout { Layout::Nn => "nn", Layout::Bt => "bt", Layout::At => "at" },
            "gflops": g,
            "fraction_of_peak": g / peak,
            "torch_gflops": tg,
            "ratio_vs_torch": tg.map(|t| g / t),
        }));
    }
    if let Some(path) = args.get("json") {
        let out = serde_json::json!({
            "machine": machine::describe(),
            "dtype": dname,
            "threads": threads,
            "peak_gflops": peak,
            "torch": torch.as_ref().map(|p| p.info.clone()),
            "results": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_shapes, Layout};

    #[test]
    fn shapes_parse_with_their_layouts_and_bad_ones_are_refused() {
        let got = parse_shapes("1024x768x2048:bt,768x1024x2048:at,8x9x10").unwrap();
        assert!(got == [((1024, 768, 2048), Layout::Bt), ((768, 1024, 2048), Layout::At), ((8, 9, 10), Layout::Nn)]);
        for bad in ["1024x768", "1024x768x0", "axbxc", "8x9x10:tt", "8x9x10x11", ""] {
            let e = parse_shapes(bad).err().unwrap_or_else(|| panic!("{bad} was accepted"));
            assert!(e.contains("--shapes"), "{e}");
        }
    }
}
