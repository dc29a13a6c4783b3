//! Checkpoints: saving back in transformers' layout (whole and sharded files, from a split
//! model) and refusing broken files and configs with errors that say what is wrong.

use redco_core::nn::ModuleExt;
use redco_core::runtime::{Mesh, SpmdOptions};
use redco_core::{DType, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_models::generate::{generate, GenerationConfig};
use redco_models::hf::checkpoint::Checkpoint;
use redco_models::hf::config::HfConfig;
use redco_models::hf::save::save_pretrained;
use redco_models::llama::Llama;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/llama-tiny")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn params(dir: &Path) -> Vec<(String, Vec<f64>)> {
    let m = Llama::from_pretrained(&Cpu::new(1), dir, DType::F32).unwrap();
    m.named_parameters().into_iter().map(|(n, p)| (n, p.to_vec_f64().unwrap())).collect()
}

#[test]
fn a_split_model_saves_back_whole_and_in_shards() {
    let want = params(&fixture());
    let mesh: Mesh = "1x2".parse().unwrap();
    let plan = {
        let m = Llama::from_pretrained(&Cpu::new(1), &fixture(), DType::F32).unwrap();
        let shapes: Vec<_> = m.named_parameters().into_iter().map(|(n, p)| (n, p.shape().clone())).collect();
        redco_core::planning::heuristics::plan_by_names(&shapes, mesh)
    };
    for (name, shard_bytes) in [("whole", usize::MAX), ("sharded", 20_000)] {
        let out = tmp(name);
        spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
            let m = Llama::from_pretrained_split(&rk.backend, &fixture(), DType::F32, Some(&plan.at_rank(rk.rank)?))?;
            save_pretrained(&m, &m.cfg, &out, shard_bytes, Some(&rk.comm))
        })
        .unwrap();
        let index = out.join("model.safetensors.index.json");
        assert_eq!(index.exists(), name == "sharded");
        if name == "sharded" {
            let files = std::fs::read_dir(&out)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with("safetensors"));
            assert!(files.count() > 2, "several shard files");
        }
        assert_eq!(params(&out), want, "{name}: reloaded parameters equal the original");
        assert_eq!(HfConfig::from_dir(&out).unwrap().raw, HfConfig::from_dir(&fixture()).unwrap().raw);
    }
}

fn open_err(bytes: &[u8]) -> String {
    let d = tmp("bad");
    std::fs::write(d.join("model.safetensors"), bytes).unwrap();
    Checkpoint::open(&d).err().expect("the file is refused").to_string()
}

fn with_header(header: &str, data: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data));
    v
}

#[test]
fn truncated_and_inconsistent_safetensors_files_are_refused() {
    let good = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let e = open_err(&good[..good.len() / 2]);
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
    let e = open_err(&good[..5]);
    assert!(e.contains("truncated"), "{e}");
    let overlap = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let e = open_err(&with_header(overlap, 12));
    assert!(e.contains("overlap") && e.contains("`b`"), "{e}");
    let past_end = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let e = open_err(&with_header(past_end, 8));
    assert!(e.contains("past the end"), "{e}");
    let e = open_err(&with_header("{not json", 0));
    assert!(e.contains("header"), "{e}");
}

#[test]
fn bad_configs_and_prompts_longer_than_the_context_are_refused() {
    let e = HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":30,"num_attention_heads":4,"num_hidden_layers":1,"vocab_size":8}"#,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("4 attention heads do not divide the hidden size 30"), "{e}");
    let b = Cpu::new(1);
    let m = Llama::from_pretrained(&b, &fixture(), DType::F32).unwrap();
    let ctx = m.cfg.max_positions.unwrap();
    let ids = Tensor::from_vec(&b, vec![3i64; ctx + 1], [1, ctx + 1]).unwrap();
    let e = generate(&m, &ids, None, &GenerationConfig::default()).err().unwrap().to_string();
    assert!(e.contains(&format!("{} tokens, longer than the model's context of {ctx}", ctx + 1)), "{e}");
    // a prompt that fits but leaves less room than asked stops at the context
    let ids = Tensor::from_vec(&b, vec![3i64; ctx - 2], [1, ctx - 2]).unwrap();
    let g = generate(&m, &ids, None, &GenerationConfig { max_new_tokens: 10, ..Default::default() }).unwrap();
    assert!(g.hit_context);
    assert_eq!(g.rows[0].len(), ctx);
}

#[test]
fn checkpoints_convert_dtypes_on_load_both_ways() {
    let b = Cpu::new(1);
    let f32m = params(&fixture());
    // f32 checkpoint -> bf16 and f16 parameters
    for dt in [DType::BF16, DType::F16] {
        let m = Llama::from_pretrained(&b, &fixture(), dt).unwrap();
        for ((n, p), (_, want)) in m.named_parameters().into_iter().zip(&f32m) {
            assert_eq!(p.dtype(), dt, "{n}");
            let got = p.to_vec_f64().unwrap();
            let tol = if dt == DType::BF16 { 1.0 / 128.0 } else { 1.0 / 1024.0 };
            assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() <= tol * w.abs() + 1e-6), "{n} as {dt:?}");
        }
    }
    // bf16 and f16 checkpoints (saved from such models) -> f32 parameters holding the same
    // values (widened while they are copied out of the file)
    for dt in [DType::BF16, DType::F16] {
        let m = Llama::from_pretrained(&b, &fixture(), dt).unwrap();
        let out = tmp(&format!("{dt:?}"));
        save_pretrained(&m, &m.cfg, &out, usize::MAX, None).unwrap();
        let stored: Vec<_> = Checkpoint::open(&out).unwrap().tensors().map(|(_, _, d)| d).collect();
        assert!(stored.iter().all(|d| *d == dt));
        let back = Llama::from_pretrained(&b, &out, DType::F32).unwrap();
        for ((n, p), (_, q)) in back.named_parameters().into_iter().zip(m.named_parameters()) {
            assert_eq!(p.dtype(), DType::F32);
            assert_eq!(p.to_vec_f64().unwrap(), q.to_vec_f64().unwrap(), "{n} from {dt:?}");
        }
    }
}
