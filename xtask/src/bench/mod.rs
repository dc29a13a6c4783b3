//! `cargo xtask bench <what>`: benchmarks that report ratios measured side by side.

mod decode;
mod gemm;
mod load;
mod peak;
mod stats;
mod torch;

/// Dispatches `bench <what> [flags]`.
pub fn run(argv: &[String]) -> Result<(), String> {
    match argv.first().map(String::as_str) {
        Some("gemm") => gemm::run(&argv[1..]),
        Some("decode") => decode::run(&argv[1..]),
        Some("load") => load::run(&argv[1..]),
        Some(other) => Err(format!("unknown benchmark `{other}` (available: gemm, decode, load)")),
        None => Err("bench needs a benchmark name (available: gemm, decode, load)".into()),
    }
}
