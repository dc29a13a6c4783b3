//! The CUDA backend in the CLI (the `cuda` feature): one GPU per rank (the rank's index
//! among this process's ranks, or the process's local rank under a launcher), NCCL
//! between them.

use redco_core::runtime::CommFactory;
use redco_cuda::{Cuda, NcclFactory};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `--cuda-tf32`, recorded once at start-up.
static TF32: AtomicBool = AtomicBool::new(false);

/// Records `--cuda-tf32` for every GPU the command opens.
pub fn set_tf32(on: bool) {
    TF32.store(on, Ordering::Relaxed);
}

/// The GPU of `rank`.
pub fn backend(rank: usize) -> redco_core::Result<Cuda> {
    let w = super::launch::world();
    let ordinal = if w.size > 1 { w.local_rank } else { rank };
    let gpu = Cuda::new(ordinal)?;
    gpu.set_tf32(TF32.load(Ordering::Relaxed));
    Ok(gpu)
}

/// The NCCL collectives over this process's placement of the ranks.
pub fn factory() -> Arc<dyn CommFactory<Cuda>> {
    Arc::new(NcclFactory::new(super::launch::factory::<Cuda>()))
}

/// Prints the GPUs (or why there are none) for `redco info`.
pub fn describe() {
    match redco_cuda::devices() {
        Ok(list) if list.is_empty() => crate::outln!("cuda: the driver sees no GPU"),
        Ok(list) => {
            for g in list {
                crate::outln!("cuda: {g}");
            }
            let cudnn = match redco_cuda::cudnn::cudnn() {
                Ok(c) => format!("{}.{}.{} ({})", c.version.0, c.version.1, c.version.2, c.file),
                Err(_) => "missing".into(),
            };
            crate::outln!(
                "cuda libraries: nvrtc {}, cublas {}, nccl {}, cudnn {cudnn}",
                yes(redco_cuda::nvrtc_present()),
                yes(redco_cuda::cublas_present()),
                yes(redco_cuda::nccl_present())
            );
        }
        Err(e) => crate::outln!("cuda: {e}"),
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "found"
    } else {
        "missing"
    }
}
