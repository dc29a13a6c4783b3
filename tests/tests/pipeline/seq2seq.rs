//! T5 trains through the Trainer on a learnable pairs task (each source token replaced by
//! its image under a fixed permutation, the order kept): the loss falls, greedy outputs on
//! held-out sources are exact, and the exported directory loads back (and, where Python
//! has transformers, generates the same tokens in transformers).

use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::runtime::Mesh;
use redco_core::{DType, Recompute, Result};
use redco_cpu::Cpu;
use redco_models::hf::config::HfConfig;
use redco_models::seq2seq::{collate_pairs, generate_targets, seq2seq_loss, Pair};
use redco_models::t5::T5;
use redco_pipeline::{Deployer, OptimizerConfig, StepCtx, TrainConfig, Trainer};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The t5-tiny fixture (T5 v1.0 shape: d_model 32, 2 + 2 layers, vocab 64).
fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join("t5-tiny")
}

/// The task's alphabet: token ids 3..30; the target maps each through a permutation.
fn image(x: i64) -> i64 {
    3 + ((x - 3) * 7 + 5) % 27
}

/// `n` pairs of 3 to 8 tokens (then the end of sequence, id 1) from `seed`.
fn pairs(n: usize, seed: u64) -> Vec<Pair> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as i64
    };
    (0..n)
        .map(|_| {
            let len = 3 + next() % 6;
            let src: Vec<i64> = (0..len).map(|_| 3 + next() % 27).collect();
            let tgt: Vec<i64> = src.iter().map(|&x| image(x)).collect();
            Pair { source: src.into_iter().chain([1]).collect(), target: tgt.into_iter().chain([1]).collect() }
        })
        .collect()
}

fn train(workdir: &Path, mesh: Mesh, steps: u64) -> Result<Vec<f64>> {
    train_recomputing(workdir, mesh, steps, Recompute::None)
}

/// [`train`] with each encoder and decoder block recomputing `recompute` in the backward
/// pass.
fn train_recomputing(workdir: &Path, mesh: Mesh, steps: u64, recompute: Recompute) -> Result<Vec<f64>> {
    let cfg = HfConfig::from_dir(&fixture())?;
    let config = TrainConfig {
        batch_size: 32,
        steps,
        schedule: Schedule { peak: 1e-2, warmup: 20, total: steps, decay: Decay::Cosine },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() }),
        clip_norm: Some(1.0),
        checkpoint_at_epoch_end: false,
        log_every: 100,
        tokens_key: Some("labels".into()),
        overwrite: true,
        ..Default::default()
    };
    let trainer = Trainer::new(
        move |b: &Cpu| {
            let mut m = T5::new(b, &cfg, DType::F32, 3)?;
            m.set_recompute(recompute);
            Ok(m)
        },
        |b: &Cpu, ex: &[Pair]| collate_pairs(b, ex, 0),
        |_: &StepCtx<Cpu>, m: &T5<Cpu>, batch| seq2seq_loss(m, batch),
        config,
    );
    let dep = Deployer::new(mesh, 11, workdir)?;
    Ok(trainer.fit(&dep, &pairs(4000, 1), false)?.losses)
}

#[test]
fn t5_learns_a_pairs_task_through_the_trainer_and_exports_for_transformers() {
    let dir = std::env::temp_dir().join(format!("redco-t5-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let losses = train(&dir, Mesh::new(1, 1).expect("mesh"), 1000).expect("training");
    let last: f64 = losses[losses.len() - 20..].iter().sum::<f64>() / 20.0;
    assert!(losses[0] > 3.0 && last < 0.05, "loss {} -> {last}", losses[0]);
    // the exported weights with the fixture's config are a Hugging Face directory
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).expect("config");
    let b = Cpu::new(2);
    let model = T5::from_pretrained(&b, &dir, DType::F32, None).expect("the exported model loads");
    let held = pairs(100, 99);
    let sources: Vec<Vec<i64>> = held.iter().map(|p| p.source.clone()).collect();
    let out = generate_targets(&b, &model, &sources, 12).expect("generation");
    let exact = held.iter().zip(&out).filter(|(p, o)| p.target[..p.target.len() - 1] == o[..]).count();
    eprintln!("t5 pairs task: loss {:.3} -> {last:.4}, {exact}/100 held-out outputs exact", losses[0]);
    assert!(exact >= 90, "{exact}/100 exact");
    // transformers, where it is installed, generates the same tokens from the export
    let python = std::env::var("REDCO_PYTHON").unwrap_or_else(|_| "python3".into());
    let has =
        Command::new(&python).args(["-c", "import transformers, torch"]).output().is_ok_and(|o| o.status.success());
    if !has {
        eprintln!("skipping the transformers check: {python} has no transformers/torch (set REDCO_PYTHON)");
    } else {
        let srcs = serde_json::to_string(&sources[..20]).expect("json");
        let script = format!(
            "import json,torch,transformers as t\nm=t.T5ForConditionalGeneration.from_pretrained({d:?}).eval()\n\
             out=[]\nfor s in json.loads({srcs:?}):\n    g=m.generate(torch.tensor([s]),max_new_tokens=12,do_sample=False,num_beams=1)\n    \
             out.append([x for x in g[0].tolist()[1:] if x not in (0,1)])\nprint(json.dumps(out))",
            d = dir.display().to_string()
        );
        let o = Command::new(&python).args(["-c", &script]).output().expect("python runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let theirs: Vec<Vec<i64>> = serde_json::from_slice(&o.stdout).expect("transformers' tokens");
        assert_eq!(theirs, out[..20].to_vec(), "transformers against redco on the exported model");
        eprintln!("transformers generates the same tokens for 20 held-out sources");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Block and selective recompute of every encoder and decoder block (the position bias
/// made once per stack and handed in, the cross-attention reading the encoder output as a
/// block input) train as keeping every activation, at 1x1 and tensor-parallel 1x2: every
/// step's loss within 1e-6 relative.
#[test]
fn t5_with_block_and_selective_recompute_trains_as_keeping_activations() {
    for mesh in ["1x1", "1x2"] {
        let run = |r: Recompute| {
            let w = std::env::temp_dir().join(format!("redco-t5-recompute-{mesh}-{}-{}", r.name(), std::process::id()));
            let l = train_recomputing(&w, mesh.parse().unwrap(), 12, r).unwrap();
            let _ = std::fs::remove_dir_all(&w);
            l
        };
        let kept = run(Recompute::None);
        assert_eq!(kept.len(), 12);
        for r in [Recompute::Block, Recompute::Selective] {
            let got = run(r);
            assert_eq!(got.len(), 12);
            for (i, (a, b)) in kept.iter().zip(&got).enumerate() {
                assert!((a - b).abs() <= 1e-6 * a.abs(), "{mesh} {}: step {i}: kept {a}, recomputed {b}", r.name());
            }
        }
    }
}
