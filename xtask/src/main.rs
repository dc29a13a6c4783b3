//! `cargo xtask`: redco-rs developer tasks.
//!
//! - `cargo xtask test`: the whole suite with its checks (fmt, clippy, tests, doc tests);
//! - `cargo xtask bench [llm] [--mesh 1x1,1x2,2x1] [--reps N] [--steps N] [--threads N]
//!   [--backend cpu,cpu-mpi,wgpu] [--overlap] [--torch PYTHON] [--json FILE] [--png FILE]`: the bench LLaMA's training,
//!   forward and decode tokens/s and peak memory per backend and mesh and, optionally,
//!   transformers + torch measured in the same run;
//! - `cargo xtask bench gemm [--threads N] [--reps N] [--dtype f32|bf16] [--torch PYTHON]
//!   [--json FILE]`: f32 (or bf16) GEMM throughput against the machine's measured f32 FMA
//!   peak and, optionally, `torch.matmul` measured in the same run;
//! - `cargo xtask bench decode [--prompt N] [--new N] [--reps N] [--threads N] [--torch PYTHON]
//!   [--json FILE] [--model DIR|FILE.gguf] [--peer-llama-cpp BIN [--prefill N]]`: batch-1 LLaMA
//!   decode tokens/s with the KV cache and, optionally, transformers' `generate` or (on a
//!   GGUF file) llama.cpp's `llama-bench` measured in the same run;
//! - `cargo xtask fixtures [--python PY] [--datasets]`: the transformers reference fixtures
//!   (with `--datasets`: only the Hugging Face `datasets` fixtures).
//! - `cargo xtask fuzz [--cases N] [--only NAME]`: the hostile-input properties with 100,000
//!   generated inputs per target (config.json, safetensors files and indexes, tokenizer
//!   files, checkpoint manifests, JSONL).
//! - `cargo xtask gpu-check wgpu [--allow-cpu-adapter]`: the wgpu checks on a real GPU;
//!   `cargo xtask gpu-check pjrt [--plugin PATH] [--allow-cpu]`: the PJRT checks with the
//!   CUDA plugin; `cargo xtask gpu-check cuda [--python PY]`: the CUDA backend's checks
//!   (conformance, LLaMA parity, GEMM and training next to torch on the same GPU).

mod args;
mod bench;
mod fixtures;
mod fuzz;
mod gpu_bundle;
mod gpu_check;
mod gpu_check_cuda;
mod gpu_check_pjrt;
mod gpu_check_real;
mod machine;
mod nvrtc;
mod pjrt;
mod test;

use std::process::ExitCode;

/// Large freed buffers are kept and reused instead of being mapped and faulted in again
/// each training step (see `redco_cpu::LargeBlocks`).
#[global_allocator]
static ALLOC: redco_cpu::LargeBlocks = redco_cpu::LargeBlocks::new();

fn main() -> ExitCode {
    // a program's choice, before any thread starts (see redco_cpu::malloc)
    redco_cpu::malloc::tune();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = match argv.first().map(String::as_str) {
        Some("test") => test::run(&argv[1..]),
        Some("bench") => bench::run(&argv[1..]),
        Some("fixtures") => fixtures::run(&argv[1..]),
        Some("fuzz") => fuzz::run(&argv[1..]),
        Some("gpu-check") => gpu_check::run(&argv[1..]),
        Some("-h" | "--help") | None => {
            println!("{}", USAGE);
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  test [--no-lint]                 fmt check, clippy -D warnings, the whole test suite
  bench [llm] [--mesh 1x1,1x2,2x1] [--reps N] [--steps N] [--threads N] [--dtype f32|bf16]
        [--backend cpu,cpu-mpi,wgpu] [--overlap] [--torch PYTHON] [--json FILE] [--png FILE]
                                   LLaMA (hidden 512, 6 layers) training, forward and decode
                                   tok/s and peak RSS per backend and mesh (wgpu: xtask's
                                   `wgpu` feature) and transformers + torch,
                                   interleaved repetitions, medians; a table, JSON and a PNG
                                   bar chart (default target/bench-llm.png)
  bench gemm [--threads N] [--reps N] [--dtype f32|bf16] [--torch PYTHON] [--json FILE]
                                   GEMM GFLOP/s vs the measured f32 FMA peak (and torch)
  bench decode [--prompt N] [--new N] [--reps N] [--threads N] [--torch PYTHON] [--json FILE]
                                   batch-1 LLaMA decode tok/s with the KV cache (and transformers)
  bench load [--mp N] [--mpi] [--hidden N] [--layers N] [--inter N] [--vocab N] [--heads N]
        [--kv-heads N] [--dtype f32|bf16] [--decode N]
                                   peak resident memory of each rank loading its checkpoint slice
                                   (--decode with --mpi: decode tok/s against the bandwidth bound)
  bench memory [--preset P] [--steps N] [--batch N] [--seq N] [--np N] [--json FILE]
                                   `redco train` unsharded vs NP MPI processes at ZeRO-3 + recompute:
                                   peak RSS per process, the planner's prediction, step time, tok/s
                                   (xtask's `mpi` feature; redco built with --features mpi)
  bench serve [--preset P] [--concurrency 1,8,32] [--requests N] [--max-seconds S] [--mesh 1xN]
              [--dtype f32|bf16|f16] [--peer PY] [--json FILE]
                                   `redco serve` on loopback: streamed greedy requests at each
                                   concurrency: requests/s, output tok/s, TTFT and inter-token p50/p99
                                   (--peer: transformers serve on the same model and requests)
  bench zero [--preset P] [--mesh M] [--steps N] [--batch N] [--seq N] [--reps N] [--procs] [--json FILE]
                                   `redco train` rows DDP, ZeRO-3, each with selective and block
                                   recompute: tok/s, step time and peak RSS against DDP's (thread
                                   ranks; --procs: MPI processes, xtask and redco with --features mpi)
  fixtures [--python PY] [--datasets]  regenerate tests/fixtures with transformers (--datasets: tests/fixtures/datasets with datasets; not in CI)
  fuzz [--cases N] [--only NAME]   the hostile-input properties, 100000 generated inputs per
                                   target (config, safetensors, index, tokenizer, manifest,
                                   JSONL); CI runs 256 each
  gpu-check wgpu [--allow-cpu-adapter] | pjrt [--plugin PATH] [--allow-cpu] | cuda [--python PY]
            | bundle [--out DIR]   (bundle: builds the cuda and pjrt checks' programs into DIR, for a
                                   GPU machine without Rust: REDCO_GPU_BUNDLE=DIR DIR/xtask gpu-check cuda)
                                   on a machine with a GPU: its wgpu adapter, the conformance
                                   suite, redco-wgpu's tests, the LLaMA check and matmul
                                   GFLOP/s on it, then a table (fails without a GPU adapter)";
