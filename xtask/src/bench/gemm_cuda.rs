//! `cargo xtask bench gemm --backend cuda [--torch PY] [--sizes N,N]`: GEMM TFLOP/s of the
//! CUDA backend on GPU 0 in f32 and bf16 (f32 accumulation), as a fraction of the device's
//! dense bf16 peak where it is known, next to `torch.matmul` on the same GPU (the peer runs
//! with `REDCO_TORCH_DEVICE=cuda`). The GPU side is `redco-cuda`'s `gemm_tflops` example,
//! run through cargo so this works from a build without the `cuda` feature; the CUDA
//! libraries must be on `LD_LIBRARY_PATH` (`cargo xtask gpu-check cuda` sets it up).

use crate::args::Args;
use crate::gpu_check::cargo;

/// Dense bf16 peaks (TFLOP/s) by device name, from the vendor's datasheets (the H200's is the
/// H100's: the same chip; redco's GEMM measured 888 on one, above the 790 first recorded here
/// from torch on random data).
const PEAKS: [(&str, f64); 3] = [("H200", 989.0), ("H100", 989.0), ("A100", 312.0)];

/// The `gemm <dtype> <n>^3 <x> TFLOP/s` lines of the example.
pub(crate) fn tflops(out: &str) -> Vec<(String, usize, f64)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 5 && f[0] == "gemm" {
                let n = f[2].trim_end_matches("^3").parse().ok()?;
                Some((f[1].to_string(), n, f[3].parse().ok()?))
            } else {
                None
            }
        })
        .collect()
}

/// The dense bf16 peak of the device the example names (`device: <name> ...`).
fn peak_of(out: &str) -> Option<(&'static str, f64)> {
    let device = out.lines().find_map(|l| l.strip_prefix("device: "))?;
    PEAKS.iter().find(|(name, _)| device.contains(name)).copied()
}

/// The measured rows: `(what, text, ok)` for each dtype and size; `envs` for the example
/// (the library path), `python` for the torch peer.
pub(crate) fn rows(
    envs: &[(&str, &str)],
    python: Option<&str>,
    sizes: &[usize],
) -> Result<Vec<(String, String, bool)>, String> {
    let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let mut a = vec!["run", "--release", "-q", "-p", "redco-cuda", "--example", "gemm_tflops", "--"];
    a.extend(sizes.iter().map(String::as_str));
    let (ok, out) = cargo(&a, envs, true)?;
    if tflops(&out).is_empty() {
        return Ok(vec![("GEMM on cuda".into(), "failed (see above)".into(), false)]);
    }
    std::env::set_var("REDCO_TORCH_DEVICE", "cuda");
    let mut peer = python.and_then(|py| crate::bench::torch::TorchPeer::start(py, 1).ok());
    let peak = peak_of(&out);
    let mut rows = Vec::new();
    for (dt, n, ours) in tflops(&out) {
        let theirs = peer
            .as_mut()
            .and_then(|p| p.gemm_times(n, n, n, 10, &dt, (false, false)).ok())
            .map(|t| crate::bench::stats::median(&t))
            .map(|s| 2.0 * (n as f64).powi(3) / s / 1e12);
        let ratio = theirs.map_or("torch: -".into(), |t| format!("torch {t:.1} TFLOP/s, {:.2}x", ours / t));
        let frac = match peak {
            Some((name, p)) if dt == "bf16" => format!(", {:.0}% of the {name}'s {p:.0}", 100.0 * ours / p),
            _ => String::new(),
        };
        rows.push((format!("GEMM {dt} {n}^3"), format!("{ours:.1} TFLOP/s{frac}; {ratio}"), ok));
    }
    Ok(rows)
}

/// `bench gemm --backend cuda`: prints the rows.
pub fn run(args: &Args) -> Result<(), String> {
    args.only(&["backend", "torch", "sizes"])?;
    let sizes = match args.get("sizes") {
        Some(s) => s
            .split(',')
            .map(|x| x.trim().parse().map_err(|_| format!("--sizes {s}: sizes like 4096,8192")))
            .collect::<Result<Vec<usize>, _>>()?,
        None => vec![4096, 8192],
    };
    let rows = rows(&[], args.get("torch"), &sizes)?;
    println!();
    for (what, text, ok) in &rows {
        println!("{:<18} {text}{}", what, if *ok { "" } else { "  (failed)" });
    }
    if rows.iter().all(|r| r.2) {
        Ok(())
    } else {
        Err("bench gemm --backend cuda: the run failed".into())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gemm_lines_and_the_device_peak_are_read() {
        let out =
            "device: NVIDIA H200 (sm_90)\ngemm f32 4096^3 48.2 TFLOP/s\ngemm bf16 8192^3 655.0 TFLOP/s\nallocator: ...";
        assert_eq!(super::tflops(out), vec![("f32".to_string(), 4096, 48.2), ("bf16".to_string(), 8192, 655.0)]);
        assert_eq!(super::peak_of(out), Some(("H200", 989.0)));
        assert_eq!(super::peak_of("device: NVIDIA GeForce RTX 4090 (sm_89)"), None);
    }
}
