//! `cargo xtask bench [<what>]`: benchmarks that report ratios measured side by side; with no
//! name (or flags only), the LLM benchmark (`llm`).

mod backends;
mod decode;
mod decode_llama;
mod gemm;
pub(crate) mod gemm_cuda;
mod llm;
mod llm_child;
#[cfg(feature = "tpu")]
mod llm_pjrt;
mod load;
mod memory;
mod mpi;
mod peak;
pub(crate) mod random_ckpt;
mod real_size;
mod serve;
mod serve_llama;
mod serve_load;
pub(crate) mod stats;
pub(crate) mod torch;
mod zero;

/// Dispatches `bench <what> [flags]`.
pub fn run(argv: &[String]) -> Result<(), String> {
    match argv.first().map(String::as_str) {
        Some("gemm") => gemm::run(&argv[1..]),
        Some("decode") => decode::run(&argv[1..]),
        Some("load") => load::run(&argv[1..]),
        Some("memory") => memory::run(&argv[1..]),
        Some("llm") => llm::run(&argv[1..]),
        Some("real-size") => real_size::run(&argv[1..]),
        Some("zero") => zero::run(&argv[1..]),
        Some("serve") => serve::run(&argv[1..]),
        Some(flag) if flag.starts_with("--") => llm::run(argv),
        Some(other) => Err(format!(
            "unknown benchmark `{other}` (available: llm, gemm, decode, load, memory, real-size, zero, serve)"
        )),
        None => llm::run(&[]),
    }
}
