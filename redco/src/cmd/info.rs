//! `redco info`.

/// Prints the backends compiled in and the CPU threads.
pub fn run() -> Result<(), String> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("redco {}", env!("CARGO_PKG_VERSION"));
    println!("backends: cpu (embedded)");
    println!(
        "cpu: {threads} threads, AVX-512 GEMM {}",
        if redco_core::cpu::sgemm::is_supported() { "on" } else { "off (portable GEMM)" }
    );
    Ok(())
}
