//! The block-quantized products (every format, in place and dequantized), the attention
//! kernels, the paged attention of a serving step, the multi-tensor AdamW (and
//! its mixed-precision form over f32 masters), the split-row reductions, the multi-tensor
//! sum of squares,
//! LayerNorm and RMSNorm forward and backward, softmax and the fused cross-entropy run on
//! the host, on an emulation of the CUDA thread model (`emu/`: one fiber per CUDA thread,
//! barriers for `__syncthreads`, `__syncwarp` and the warp shuffles, 2-D grids), against
//! f64 references: the kernels' logic (tiling, online softmax, causal skipping, masks,
//! grouped heads, chunk tables, slot tables over a shared pool, block reductions over rows
//! longer or shorter than the block, grid-stride rows) is checked with no GPU. Needs a
//! C++20 compiler (`CXX`, else `c++`); skips, saying so, without one. What the emulation
//! cannot show (memory ordering, bank conflicts, occupancy, f16/bf16 conversions) is left
//! to `cargo xtask gpu-check cuda`.

use std::path::Path;
use std::process::Command;

#[test]
fn kernels_match_f64_on_the_emulated_thread_model() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        eprintln!("skipped: no C++ compiler ({cxx}) to build the emulated kernels");
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("emulated_kernels");
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-w", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(dir.join("emu"))
        .arg("-I")
        .arg(dir.join("kernels"))
        .arg(dir.join("emu/check.cpp"))
        .output()
        .expect("the compiler runs");
    assert!(built.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&built.stderr));
    let run = Command::new(&exe).output().expect("the check runs");
    let out = String::from_utf8_lossy(&run.stdout);
    println!("{out}");
    assert!(run.status.success(), "emulated kernels differ from the reference:\n{out}");
    assert!(
        out.contains("0 failures")
            && out.matches("ok  ").count()
                >= 2 + 7 * 2 * 2 * 4 + 4 * 2 * 10 + 6 + 4 * 2 + 3 + 3 * 2 * 3 + 3 + 2 * 5 * 3,
        "{out}"
    );
}
