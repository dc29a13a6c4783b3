//! `redco train --lora-rank R`: LoRA adapters ([`redco_core::nn::lora`]) on the layers
//! `--lora-targets` names, the rest of the model frozen; after training, the adapters are
//! merged into the exported weights (a plain Hugging Face directory) or, with
//! `--lora-export peft`, written alone in PEFT's layout (`adapter_config.json` and
//! `adapter_model.safetensors`, loaded with `PeftModel.from_pretrained(base, dir)`).

use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::nn::lora::{merge, LoraConfig, DEFAULT_TARGETS};
use redco_core::Tensor;
use redco_cpu::Cpu;
use redco_models::hf::safetensors::read_all;
use redco_pipeline::checkpoint::{export_safetensors, write_atomic};
use std::collections::BTreeMap;
use std::path::Path;

/// The LoRA options of `redco train`.
#[derive(Args, Clone, Debug)]
pub struct LoraArgs {
    /// Train LoRA adapters of this rank instead of every weight (the base model frozen: no
    /// gradients and no optimizer state for it).
    #[arg(long, value_parser = super::check::count)]
    pub lora_rank: Option<usize>,
    /// LoRA alpha: the adapters' output is scaled by alpha / rank (default: the rank).
    #[arg(long, value_parser = super::check::positive, requires = "lora_rank")]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapters' input during training.
    #[arg(long, default_value_t = 0.0, requires = "lora_rank")]
    pub lora_dropout: f64,
    /// A regex matching the whole names of the linear layers that get adapters (PEFT's
    /// `target_modules`); default: the attention's query and value projections.
    #[arg(long, requires = "lora_rank")]
    pub lora_targets: Option<String>,
    /// After training: `merged` writes the adapted weights as a plain Hugging Face model;
    /// `peft` writes the adapters alone in PEFT's layout.
    #[arg(long, default_value = "merged", requires = "lora_rank")]
    pub lora_export: String,
}

impl LoraArgs {
    /// The adapters' configuration, when `--lora-rank` is given.
    pub fn config(&self) -> CliResult<Option<LoraConfig>> {
        let Some(rank) = self.lora_rank else { return Ok(None) };
        if !["merged", "peft"].contains(&self.lora_export.as_str()) {
            return Err(format!("--lora-export {}: use merged or peft", self.lora_export).into());
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(format!("--lora-dropout {} is not in [0, 1)", self.lora_dropout).into());
        }
        Ok(Some(LoraConfig {
            rank,
            alpha: self.lora_alpha.unwrap_or(rank as f64),
            dropout: self.lora_dropout,
            targets: self.lora_targets.clone().unwrap_or_else(|| DEFAULT_TARGETS.to_string()),
        }))
    }

    /// Whether the adapters are exported alone (PEFT).
    pub fn peft(&self) -> bool {
        self.lora_export == "peft"
    }
}

/// What makes a LoRA run this run (for the resume check).
pub fn identity(cfg: &LoraConfig) -> String {
    format!("rank {} alpha {} dropout {} targets {}", cfg.rank, cfg.alpha, cfg.dropout, cfg.targets)
}

/// After training: the Trainer's export in `w` (frozen base and adapters) becomes the merged
/// model (`model.safetensors`), and with `peft` the adapters are also written in PEFT's
/// layout (`base` is the model directory they adapt; `task` PEFT's task type). Prints the
/// trainable-parameter and optimizer-state counts against full fine-tuning.
pub fn finish(w: &Path, cfg: &LoraConfig, peft: bool, base: &Path, task: &str) -> CliResult<()> {
    let path = w.join("model.safetensors");
    let b = Cpu::new(1);
    let mut all = BTreeMap::new();
    for (name, t) in read_all(&path)? {
        all.insert(name, Tensor::from_host(&b, &t.data, t.shape.clone())?);
    }
    let adapters: BTreeMap<String, Tensor<Cpu>> =
        all.iter().filter(|(k, _)| k.contains(".lora_")).map(|(k, v)| (k.clone(), v.clone())).collect();
    let trainable: usize = adapters.values().map(Tensor::elem_count).sum();
    let total: usize = all.values().map(Tensor::elem_count).sum::<usize>() - trainable;
    crate::outln!(
        "LoRA (rank {}, alpha {}, {} adapted layers): {trainable} trainable parameters of {total} ({:.2}%); AdamW \
         state {} against {} for full fine-tuning",
        cfg.rank,
        cfg.alpha,
        adapters.len() / 2,
        100.0 * trainable as f64 / total.max(1) as f64,
        bytes(8 * trainable),
        bytes(8 * total)
    );
    let merged = merge(&all, cfg.scale())?;
    export_safetensors(None, &merged, &path)?;
    if peft {
        let named: BTreeMap<String, Tensor<Cpu>> =
            adapters.into_iter().map(|(k, v)| (format!("base_model.model.{k}"), v)).collect();
        export_safetensors(None, &named, &w.join("adapter_model.safetensors"))?;
        let base = base.canonicalize().unwrap_or_else(|_| base.to_path_buf());
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": task,
            "base_model_name_or_path": base.display().to_string(),
            "r": cfg.rank,
            "lora_alpha": cfg.alpha,
            "lora_dropout": cfg.dropout,
            "target_modules": cfg.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
        });
        let text = serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?;
        write_atomic(&w.join("adapter_config.json"), text.as_bytes())?;
    }
    Ok(())
}

fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GB", n as f64 / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.2} MB", n as f64 / f64::from(1u32 << 20)),
        n => format!("{:.1} kB", n as f64 / 1024.0),
    }
}

/// Lists the run's outputs in `w`; with a PEFT export, the merged weights the sample used
/// are removed first (the directory then holds the adapters alone, beside the tokenizer).
pub fn print_outputs(w: &Path, peft: bool) -> CliResult<()> {
    let mut files = vec![
        ("metrics.jsonl", "metrics, one JSON line per step"),
        ("loss.png", "loss and learning-rate plot"),
        ("tensorboard", "TensorBoard scalars (tensorboard --logdir DIR)"),
        ("redco.log", "the run's log"),
        ("checkpoints", "sharded checkpoints (resume with --resume)"),
    ];
    if peft {
        std::fs::remove_file(w.join("model.safetensors")).map_err(|e| format!("remove the merged weights: {e}"))?;
        files.push(("adapter_model.safetensors", "LoRA adapters, PEFT layout"));
        files.push(("adapter_config.json", "PEFT adapter config (PeftModel.from_pretrained(base, dir))"));
    } else {
        files.push(("model.safetensors", "trained weights, Hugging Face layout (with config.json, tokenizer.json)"));
    }
    crate::outln!("\nwrote:");
    for (p, what) in files {
        crate::outln!("  {:<40} {what}", w.join(p).display());
    }
    Ok(())
}
