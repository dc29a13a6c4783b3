//! Matmul throughput, wgpu next to the CPU backend (not a timed test: `#[ignore]`, run with
//! `cargo test --release -p redco-wgpu --test matmul_gflops -- --ignored --nocapture`).

use redco_core::backend::MatmulSpec;
use redco_core::cpu::Cpu;
use redco_core::{Backend, DType, HostData};
use redco_wgpu::{wgpu, Wgpu};
use std::time::Instant;

fn gflops<B: Backend>(b: &B, n: usize, reps: usize) -> f64 {
    let v: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let a = b.upload(&HostData::F32(v.clone())).expect("upload");
    let c = b.upload(&HostData::F32(v)).expect("upload");
    let spec = MatmulSpec { batch: 1, m: n, n, k: n, trans_a: false, trans_b: false, a_batched: true, b_batched: true };
    // warm-up: kernel compilation, pools
    let r = b.matmul(&a, &c, &spec).expect("matmul");
    b.download(&r).expect("download");
    let t = Instant::now();
    let mut last = None;
    for _ in 0..reps {
        last = Some(b.matmul(&a, &c, &spec).expect("matmul"));
    }
    b.sync().expect("sync");
    if let Some(r) = last {
        assert_eq!(b.storage_dtype(&r), DType::F32);
        b.download(&r).expect("download");
    }
    2.0 * (n * n * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
}

#[test]
#[ignore]
fn matmul_1024_gflops() {
    let w = match Wgpu::new() {
        Ok(w) => w,
        Err(e) if std::env::var("REDCO_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("REDCO_REQUIRE_WGPU=1 but no wgpu adapter: {e}")
        }
        Err(e) => {
            eprintln!("no wgpu adapter: {e}");
            return;
        }
    };
    let info = w.adapter_info();
    let n = 1024;
    // a GPU finishes one in about a millisecond: time more of them
    let reps = if info.device_type == wgpu::DeviceType::Cpu { 5 } else { 50 };
    let gw = gflops(&w, n, reps);
    let gc = gflops(&Cpu::default(), n, 5);
    println!(
        "matmul {n}^3 f32: wgpu ({} {:?}) {gw:.1} GFLOP/s, cpu {gc:.1} GFLOP/s, ratio {:.2}",
        info.name,
        info.device_type,
        gw / gc
    );
}
