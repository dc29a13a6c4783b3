//! The PJRT backend in the CLI (the `tpu` feature): the plugin from `--pjrt-plugin` or
//! `REDCO_PJRT_PLUGIN`, one client per process, one device per rank.

use redco_tpu::{Api, Pjrt};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

static PLUGIN: OnceLock<PathBuf> = OnceLock::new();

/// Records `--pjrt-plugin` (it wins over `REDCO_PJRT_PLUGIN`).
pub fn set_plugin(path: Option<PathBuf>) {
    if let Some(p) = path {
        let _ = PLUGIN.set(p);
    }
}

fn api() -> redco_core::Result<&'static Api> {
    match PLUGIN.get() {
        Some(p) => Api::load(p),
        None => Api::from_env(),
    }
}

/// The backend of `rank` on a process-wide client with at least `devices` devices (the CPU
/// plugin is asked for that many); ranks take the devices in order.
pub fn backend(rank: usize, devices: usize) -> redco_core::Result<Pjrt> {
    static BASE: Mutex<Option<Pjrt>> = Mutex::new(None);
    let mut base = BASE.lock().unwrap_or_else(|p| p.into_inner());
    match base.as_ref() {
        Some(b) if b.client().devices().len() >= devices => b.on_device(rank % b.client().devices().len()),
        _ => {
            let b = Pjrt::open(api()?, devices)?;
            let r = b.on_device(rank % b.client().devices().len());
            *base = Some(b);
            r
        }
    }
}

/// Prints the plugin and its devices for `redco info`.
pub fn describe() {
    match api().and_then(|api| Pjrt::open(api, 1).map(|b| (api, b))) {
        Err(e) => crate::outln!("pjrt: {e}"),
        Ok((api, b)) => {
            let c = b.client();
            crate::outln!(
                "pjrt: {} (PJRT C API {}.{}), platform {}, {} device(s)",
                api.path().display(),
                api.version().0,
                api.version().1,
                c.platform(),
                c.devices().len()
            );
            for d in c.devices() {
                let mem = d
                    .memory_bytes
                    .map_or("memory unknown".to_string(), |m| format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64));
                crate::outln!("pjrt device {}: id {}, {}, {mem}", d.index, d.id, d.kind);
            }
        }
    }
}

/// PJRT compiles a decoder-only model's whole training step into one program, unless the
/// run must go op by op (said on the leader's output either way).
impl super::backends::CliBackend for Pjrt {
    fn with_lm_step(
        trainer: redco_pipeline::Trainer<redco_models::auto::AutoModel<Pjrt>, Vec<i64>, Pjrt>,
        step: &super::backends::LmStep,
    ) -> redco_pipeline::Trainer<redco_models::auto::AutoModel<Pjrt>, Vec<i64>, Pjrt> {
        use redco_models::auto::AutoModel;
        use redco_tpu::Tracer;
        if let Some(why) = &step.blocked {
            if step.leader {
                crate::outln!("pjrt: every op runs as its own program ({why})");
            }
            return trainer;
        }
        if step.leader {
            crate::outln!("pjrt: the training step is compiled into one program");
        }
        let (cfg, seed) = (step.cfg.clone(), step.seed);
        let compiler = redco_tpu::PjrtStepCompiler::new(
            move |t: &Tracer| AutoModel::new(t, &cfg, redco_core::DType::F32, seed),
            // the next-token loss: the model shifts the labels internally
            |m: &AutoModel<Tracer>, b: &redco_pipeline::Batch<Tracer>| m.loss(&b["input_ids"], None, &b["input_ids"]),
            step.timeout,
        );
        trainer.with_compiled_step(std::sync::Arc::new(compiler))
    }
}
