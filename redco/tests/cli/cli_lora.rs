//! `redco train --model DIR --lora-rank R` as a user runs it on the llama-tiny fixture under
//! 1x2: the adapters are the only trained weights (the counts printed exactly), the merged
//! export is a plain Hugging Face directory whose untargeted weights are the base's, the
//! PEFT export holds the adapters alone under PEFT's names; and, where Python has
//! transformers and peft, transformers' logits of the merged export equal redco's and
//! `PeftModel` over the base gives the same logits.

use crate::common::{fixture_named, redco, s};
use redco_core::{DType, Tensor};
use redco_cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::hf::safetensors::read_all;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGETS: &str = r".*\.(q_proj|v_proj|o_proj|down_proj)";

fn train(name: &str, export: &str) -> (PathBuf, String) {
    let w = crate::common::scratch_dir("lora", name);
    std::fs::create_dir_all(&w).expect("scratch");
    let data = w.join("text.jsonl");
    let words = ["the cat", "a dog", "plays", "walks", "on the mat", "dogs", "quickly", "rain"];
    let mut x = 7u64;
    let mut lines = String::new();
    for _ in 0..400 {
        let text: Vec<&str> = (0..12)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                words[((x >> 33) % words.len() as u64) as usize]
            })
            .collect();
        lines += &serde_json::json!({ "text": text.join(" ") }).to_string();
        lines.push('\n');
    }
    std::fs::write(&data, lines).expect("data");
    let out_dir = w.join("run");
    let base = fixture_named("llama-tiny");
    let (code, out, err) = redco(&[
        "train",
        "--model",
        s(&base),
        "--data",
        s(&data),
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--lora-targets",
        TARGETS,
        "--lora-export",
        export,
        "--mesh",
        "1x2",
        "--steps",
        "60",
        "--batch-size",
        "8",
        "--seq-len",
        "32",
        "--lr",
        "1e-2",
        "--workdir",
        s(&out_dir),
        "--threads",
        "2",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    (out_dir, out)
}

/// redco's logits of the model in `dir` for fixed ids.
fn logits(dir: &Path) -> Vec<f32> {
    let b = Cpu::new(1);
    let m = AutoModel::from_pretrained(&b, dir, DType::F32, None).expect("model");
    let ids = Tensor::from_vec(&b, vec![1i64, 5, 9, 14, 3, 2, 7, 11], [1, 8]).expect("ids");
    m.forward(&ids, None).expect("forward").to_vec_f32().expect("logits")
}

#[test]
fn lora_trains_the_adapters_alone_and_exports_merged_and_peft() {
    let (merged, out) = train("merged", "merged");
    // r * (in + out) per layer: q, o 32x32; v 32 -> 16; down 48 -> 32; two layers
    assert!(out.contains("2048 trainable parameters of 19616 (10.44%)"), "{out}");
    let base = read_all(&fixture_named("llama-tiny").join("model.safetensors")).expect("base");
    let export = read_all(&merged.join("model.safetensors")).expect("merged export");
    assert!(export.keys().all(|k| !k.contains("lora_")), "adapters left in the merged export");
    assert_eq!(export.len(), base.len());
    let same = |k: &str| export[k].data.to_f32_vec() == base[k].data.to_f32_vec();
    assert!(same("model.layers.1.self_attn.k_proj.weight") && same("model.layers.0.mlp.up_proj.weight"));
    assert!(!same("model.layers.0.self_attn.q_proj.weight") && !same("model.layers.1.mlp.down_proj.weight"));
    let ours = logits(&merged);

    let (peft, _) = train("peft", "peft");
    assert!(!peft.join("model.safetensors").exists());
    let adapters = read_all(&peft.join("adapter_model.safetensors")).expect("adapters");
    assert_eq!(adapters.len(), 16);
    assert!(adapters.contains_key("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(peft.join("adapter_config.json")).expect("config"))
            .expect("json");
    assert_eq!((cfg["r"].as_u64(), cfg["lora_alpha"].as_f64()), (Some(4), Some(8.0)));

    let python = std::env::var("REDCO_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", "import transformers, torch, peft"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        eprintln!("skipping the transformers/peft check: {python} lacks them (set REDCO_PYTHON)");
    } else {
        let script = format!(
            "import json,torch,transformers as t,peft\nids=torch.tensor([[1,5,9,14,3,2,7,11]])\n\
             m=t.AutoModelForCausalLM.from_pretrained({m:?},torch_dtype=torch.float32).eval()\n\
             b=t.AutoModelForCausalLM.from_pretrained({b:?},torch_dtype=torch.float32).eval()\n\
             p=peft.PeftModel.from_pretrained(b,{p:?}).eval()\nwith torch.no_grad():\n    x=m(ids).logits; y=p(ids).logits\n\
             print(json.dumps([x.flatten().tolist(), (x-y).abs().max().item()]))",
            m = s(&merged),
            b = s(&fixture_named("llama-tiny")),
            p = s(&peft)
        );
        let o = Command::new(&python).args(["-c", &script]).output().expect("python");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (theirs, peft_diff): (Vec<f32>, f64) = serde_json::from_slice(&o.stdout).expect("json");
        let worst = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "transformers against redco on the merged export: {worst}");
        assert!(peft_diff < 1e-4, "PeftModel over the base against the merged export: {peft_diff}");
        eprintln!("transformers: merged logits within {worst:e} of redco's; PeftModel within {peft_diff:e}");
    }
    // PEFT adapters need a base on disk
    let (code, _, err) = redco(&[
        "train",
        "--preset",
        "llama-tiny",
        "--lora-rank",
        "4",
        "--lora-export",
        "peft",
        "--steps",
        "1",
        "--workdir",
        s(&merged.with_extension("bad")),
    ]);
    assert!(code == 2 && err.contains("--model"), "{err}");
    for d in [merged, peft] {
        let _ = std::fs::remove_dir_all(d.parent().expect("scratch"));
    }
}
