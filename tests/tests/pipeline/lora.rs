//! LoRA through the Trainer on the llama-tiny fixture: exact trainable-parameter and
//! optimizer-state counts against full fine-tuning, a base that does not move, adapters
//! split like their base layers under 1x2 with the losses of 1x1, and a merged export that
//! computes the adapted model's logits.

use redco_core::nn::lora::{add_lora, merge, LoraConfig};
use redco_core::nn::{Module, ModuleExt};
use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::runtime::Mesh;
use redco_core::{DType, Placement, Tensor};
use redco_cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::hf::safetensors::read_all;
use redco_pipeline::synthetic::MarkovCorpus;
use redco_pipeline::{Deployer, FitReport, OptimizerConfig, StepCtx, TrainConfig, Trainer};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join("llama-tiny")
}

fn lora_cfg() -> LoraConfig {
    LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, targets: r".*\.(q_proj|v_proj|o_proj|down_proj)".into() }
}

fn model(b: &Cpu, lora: bool) -> redco_core::Result<AutoModel<Cpu>> {
    let mut m = AutoModel::from_pretrained(b, &fixture(), DType::F32, None)?;
    if lora {
        add_lora(&mut m, &lora_cfg(), 17)?;
    }
    Ok(m)
}

fn fit(name: &str, mesh: Mesh, lora: bool) -> (FitReport, PathBuf) {
    let dir = std::env::temp_dir().join(format!("redco-lora-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = TrainConfig {
        batch_size: 8,
        steps: 30,
        schedule: Schedule { peak: 1e-2, warmup: 0, total: 30, decay: Decay::Constant },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() }),
        checkpoint_every: Some(30),
        overwrite: true,
        ..Default::default()
    };
    let trainer = Trainer::new(
        move |b: &Cpu| model(b, lora),
        |b: &Cpu, ex: &[Vec<i64>]| {
            let t = ex[0].len();
            let ids: Vec<i64> = ex.iter().flatten().copied().collect();
            Ok(redco_pipeline::Batch::from([("input_ids".to_string(), Tensor::from_vec(b, ids, [ex.len(), t])?)]))
        },
        |_: &StepCtx<Cpu>, m: &AutoModel<Cpu>, batch: &redco_pipeline::Batch<Cpu>| {
            m.loss(&batch["input_ids"], None, &batch["input_ids"])
        },
        config,
    );
    let data = MarkovCorpus::new(64, 16, 5).sequences(0, 512);
    let dep = Deployer::new(mesh, 3, &dir).expect("deployer");
    (trainer.fit(&dep, &data, false).expect("training"), dir)
}

/// Elements of the checkpoint's optimizer state (`opt/*` entries) over all rank files.
fn optimizer_elements(dir: &std::path::Path) -> usize {
    let step = dir.join("checkpoints").join("step-00000030");
    let mut n = 0;
    for e in std::fs::read_dir(&step).expect("checkpoint") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            n += read_all(&p)
                .expect("rank file")
                .iter()
                .filter(|(k, _)| k.starts_with("opt/"))
                .map(|(_, t)| t.shape.elem_count())
                .sum::<usize>();
        }
    }
    n
}

#[test]
fn lora_trains_only_the_adapters_and_counts_them_exactly() {
    let b = Cpu::new(1);
    let base = model(&b, false).expect("model");
    let adapted = model(&b, true).expect("model");
    let total = base.num_parameters();
    // r * (in + out) per adapted layer: q, o 32x32; v 32 -> 16 (2 kv heads); down 48 -> 32
    let per_layer = 4 * (32 + 32) + 4 * (32 + 16) + 4 * (32 + 32) + 4 * (48 + 32);
    assert_eq!(adapted.num_trainable_parameters(), 2 * per_layer);
    assert_eq!(adapted.num_parameters(), total + 2 * per_layer);
    let (full, full_dir) = fit("full", Mesh::single(), false);
    let (lora, lora_dir) = fit("one", Mesh::single(), true);
    // AdamW keeps two moments per trained element: of the adapters alone under LoRA
    assert_eq!(optimizer_elements(&full_dir), 2 * total);
    assert_eq!(optimizer_elements(&lora_dir), 2 * 2 * per_layer);
    eprintln!(
        "llama-tiny: full fine-tuning {total} trainable, optimizer state {} B; LoRA r=4 {} trainable ({:.1}%), {} B",
        8 * total,
        2 * per_layer,
        200.0 * per_layer as f64 / total as f64,
        16 * per_layer
    );
    let (l0, l1) = (lora.losses[0], lora.losses[lora.losses.len() - 1]);
    assert!(l1 < l0 - 0.2, "LoRA loss {l0} -> {l1}");
    assert!(full.losses[29] < full.losses[0]);
    // the base did not move; the adapters did
    let export = read_all(&lora_dir.join("model.safetensors")).expect("export");
    let mut base_params = BTreeMap::new();
    base.visit("", &mut |n, t| {
        base_params.insert(n.to_string(), t.to_vec_f32().expect("values"));
    });
    for (name, v) in &base_params {
        assert_eq!(&export[name].data.to_f32_vec(), v, "{name} moved");
    }
    let moved = export["model.layers.0.self_attn.q_proj.lora_B.weight"].data.to_f32_vec();
    assert!(moved.iter().any(|x| *x != 0.0), "lora_B stayed zero");
    // the merged weights compute the adapted model's logits
    let trained: BTreeMap<String, Tensor<Cpu>> = export
        .iter()
        .map(|(k, t)| (k.clone(), Tensor::from_host(&b, &t.data, t.shape.clone()).expect("tensor")))
        .collect();
    let merged = merge(&trained, lora_cfg().scale()).expect("merge");
    assert!(merged.keys().all(|k| !k.contains("lora_")));
    let mut plain = model(&b, false).expect("model");
    plain.load_state_dict(&merged, true).expect("merged weights");
    let mut adapted = model(&b, true).expect("model");
    adapted.load_state_dict(&trained, true).expect("trained adapters");
    let ids = Tensor::from_vec(&b, vec![1i64, 5, 9, 14, 3, 2, 7, 11], [1, 8]).expect("ids");
    let (x, y) = (plain.forward(&ids, None).expect("merged"), adapted.forward(&ids, None).expect("adapted"));
    let (x, y) = (x.to_vec_f32().expect("merged"), y.to_vec_f32().expect("adapted"));
    let diff = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "merged against adapted logits: {diff}");
    for d in [full_dir, lora_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn lora_adapters_split_like_their_base_and_1x2_equals_1x1() {
    let (one, d1) = fit("1x1", Mesh::single(), true);
    let (two, d2) = fit("1x2", Mesh::new(1, 2).expect("mesh"), true);
    let p = &two.plan.params;
    let place = |n: &str| p[n].placement;
    let q = "model.layers.0.self_attn.q_proj";
    let o = "model.layers.0.self_attn.o_proj";
    assert_eq!(place(&format!("{q}.weight")), Placement::Shard(0));
    assert_eq!(place(&format!("{q}.lora_B.weight")), Placement::Shard(0));
    assert_eq!(place(&format!("{q}.lora_A.weight")), Placement::Replicate);
    assert_eq!(place(&format!("{o}.weight")), Placement::Shard(1));
    assert_eq!(place(&format!("{o}.lora_A.weight")), Placement::Shard(1));
    assert_eq!(place(&format!("{o}.lora_B.weight")), Placement::Replicate);
    for (s, (a, b)) in one.losses.iter().zip(&two.losses).enumerate() {
        assert!((a - b).abs() < 1e-4 * a.abs().max(1.0), "step {s}: 1x1 {a} against 1x2 {b}");
    }
    let (e1, e2) =
        (read_all(&d1.join("model.safetensors")).expect("1x1"), read_all(&d2.join("model.safetensors")).expect("1x2"));
    for (name, t) in &e1 {
        let (a, b) = (t.data.to_f32_vec(), e2[name].data.to_f32_vec());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{name}: 1x1 against 1x2 differ by {worst}");
    }
    for d in [d1, d2] {
        let _ = std::fs::remove_dir_all(d);
    }
}
