//! GEMM throughput of the CUDA backend on GPU 0: `n x n x n` products in f32 and bf16
//! (f32 accumulation), timed over several calls after a warm-up, printed one line each:
//! `gemm <dtype> <n>^3 <TFLOP/s> TFLOP/s`; then the device's copy rate (a 1 GiB buffer
//! copied on the device, bytes read plus written per second: `copy <GB/s> GB/s`), what a
//! memory-bound kernel such as AdamW is bounded by. Used by `cargo xtask gpu-check cuda`.
//!
//! `cargo run --release -p redco-cuda --example gemm_tflops [-- N...]` (default 4096 8192).

use redco_core::backend::MatmulSpec;
use redco_core::{Backend, DType};
use redco_cuda::Cuda;
use std::time::Instant;

fn main() -> Result<(), String> {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![4096, 8192] } else { sizes };
    let cuda = Cuda::new(0).map_err(|e| e.to_string())?;
    println!("device: {}", cuda.describe());
    for dt in [DType::F32, DType::BF16] {
        for &n in &sizes {
            let a = cuda.full(n * n, 0.5, dt).map_err(|e| e.to_string())?;
            let b = cuda.full(n * n, 0.25, dt).map_err(|e| e.to_string())?;
            let spec = MatmulSpec {
                batch: 1,
                m: n,
                n,
                k: n,
                trans_a: false,
                trans_b: false,
                a_batched: false,
                b_batched: false,
            };
            cuda.matmul(&a, &b, &spec).map_err(|e| e.to_string())?;
            cuda.sync().map_err(|e| e.to_string())?;
            let reps = if n >= 8192 { 10 } else { 30 };
            let t = Instant::now();
            for _ in 0..reps {
                cuda.matmul(&a, &b, &spec).map_err(|e| e.to_string())?;
            }
            cuda.sync().map_err(|e| e.to_string())?;
            let s = t.elapsed().as_secs_f64() / reps as f64;
            let c = cuda.matmul(&a, &b, &spec).map_err(|e| e.to_string())?;
            let v = cuda.download(&c).map_err(|e| e.to_string())?.to_f64_vec();
            let want = 0.125 * n as f64;
            if (v[0] - want).abs() > 1e-2 * want || (v[v.len() - 1] - want).abs() > 1e-2 * want {
                return Err(format!("gemm {dt:?} {n}: got {} and {}, want {want}", v[0], v[v.len() - 1]));
            }
            println!(
                "gemm {} {n}^3 {:.1} TFLOP/s",
                if dt == DType::F32 { "f32" } else { "bf16" },
                2.0 * (n as f64).powi(3) / s / 1e12
            );
        }
    }
    println!("copy {:.0} GB/s", cuda.copy_rate(1 << 30, 20).map_err(|e| e.to_string())? / 1e9);
    let m = cuda.memory();
    println!("allocator: peak {} MiB reserved, {} reused / {} fresh", m.peak_reserved >> 20, m.reused, m.fresh);
    Ok(())
}
