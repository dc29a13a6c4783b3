//! Matmul throughput, wgpu next to the CPU backend, printed (a measurement, not a test):
//! `cargo run --release -p redco-wgpu --example matmul_gflops`. Exits non-zero when no wgpu
//! adapter exists.

use redco_core::backend::MatmulSpec;
use redco_core::{Backend, DType, HostData};
use redco_cpu::Cpu;
use redco_wgpu::{wgpu, Wgpu};
use std::time::Instant;

fn gflops<B: Backend>(b: &B, n: usize, reps: usize) -> redco_core::Result<f64> {
    let v: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let a = b.upload(&HostData::F32(v.clone()))?;
    let c = b.upload(&HostData::F32(v))?;
    let spec = MatmulSpec { batch: 1, m: n, n, k: n, trans_a: false, trans_b: false, a_batched: true, b_batched: true };
    // warm-up: kernel compilation, pools
    let r = b.matmul(&a, &c, &spec)?;
    b.download(&r)?;
    let t = Instant::now();
    let mut last = None;
    for _ in 0..reps {
        last = Some(b.matmul(&a, &c, &spec)?);
    }
    b.sync()?;
    if let Some(r) = last {
        if b.storage_dtype(&r) != DType::F32 {
            return Err(redco_core::Error::invalid("matmul_gflops", "the product is not f32"));
        }
        b.download(&r)?;
    }
    Ok(2.0 * (n * n * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
}

fn main() -> std::process::ExitCode {
    let w = match Wgpu::new() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("matmul_gflops: no wgpu adapter: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let info = w.adapter_info();
    let n = 1024;
    // a GPU finishes one in about a millisecond: time more of them
    let reps = if info.device_type == wgpu::DeviceType::Cpu { 5 } else { 50 };
    let (gw, gc) = match (gflops(&w, n, reps), gflops(&Cpu::default(), n, 5)) {
        (Ok(gw), Ok(gc)) => (gw, gc),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("matmul_gflops: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!(
        "matmul {n}^3 f32: wgpu ({} {:?}) {gw:.1} GFLOP/s, cpu {gc:.1} GFLOP/s, ratio {:.2}",
        info.name,
        info.device_type,
        gw / gc
    );
    std::process::ExitCode::SUCCESS
}
