//! The other architectures refuse bad checkpoints by name: a config of one architecture given
//! to another's loader, a T5 without its relative-attention tables, an OPT without its
//! position table; and every model saves back to a directory it (and transformers) reloads.

use redco_core::nn::ModuleExt;
use redco_core::DType;
use redco_cpu::Cpu;
use redco_models::gptj::GptJ;
use redco_models::hf::config::HfConfig;
use redco_models::hf::safetensors::read_all;
use redco_models::hf::save::save_pretrained;
use redco_models::llama::Llama;
use redco_models::opt::Opt;
use redco_models::t5::T5;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-fail-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A copy of fixture `name` without the tensors `drop`.
fn without(name: &str, drop: &dyn Fn(&str) -> bool) -> PathBuf {
    let d = tmp(name);
    std::fs::copy(dir(name).join("config.json"), d.join("config.json")).unwrap();
    let tensors: Vec<(String, redco_core::HostData, Vec<usize>)> = read_all(&dir(name))
        .unwrap()
        .into_iter()
        .filter(|(n, _)| !drop(n))
        .map(|(n, t)| (n, t.data, t.shape.dims().to_vec()))
        .collect();
    let bytes = redco_pipeline::checkpoint::safetensors_bytes(&tensors, BTreeMap::new()).unwrap();
    std::fs::write(d.join("model.safetensors"), bytes).unwrap();
    d
}

fn err<T>(r: redco_core::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_config_of_another_architecture_is_refused() {
    let b = Cpu::new(1);
    let e = err(GptJ::from_pretrained(&b, &dir("opt-tiny"), DType::F32, None));
    assert!(e.contains("model_type `opt`") && e.contains("gptj"), "{e}");
    let e = err(Opt::from_pretrained(&b, &dir("t5-tiny"), DType::F32, None));
    assert!(e.contains("model_type `t5`") && e.contains("opt"), "{e}");
    let e = err(T5::from_pretrained(&b, &dir("gptj-tiny"), DType::F32, None));
    assert!(e.contains("model_type `gptj`") && e.contains("t5"), "{e}");
    let e = err(Llama::from_pretrained(&b, &dir("gptj-tiny"), DType::F32));
    assert!(e.contains("model_type `gptj`, not llama"), "{e}");
}

#[test]
fn a_t5_without_its_relative_attention_tables_is_refused_by_name() {
    let d = without("t5-tiny", &|n| n.contains("relative_attention_bias"));
    let e = err(T5::from_pretrained(&Cpu::new(1), &d, DType::F32, None));
    for stack in ["encoder", "decoder"] {
        let name = format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        assert!(e.contains(&name) && e.contains("missing"), "{e}");
    }
}

#[test]
fn an_opt_without_its_position_table_is_refused_by_name() {
    let d = without("opt-tiny", &|n| n == "model.decoder.embed_positions.weight");
    let e = err(Opt::from_pretrained(&Cpu::new(1), &d, DType::F32, None));
    assert!(e.contains("model.decoder.embed_positions.weight") && e.contains("missing"), "{e}");
}

fn same(a: &Path, b: &Path) {
    let (x, y) = (read_all(a).unwrap(), read_all(b).unwrap());
    assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
    assert_eq!(x, y);
}

#[test]
fn every_architecture_saves_back_what_it_loaded() {
    let b = Cpu::new(1);
    for name in ["gptj-tiny", "opt-tiny", "opt-350m-shape", "t5-tiny", "t5-v1_1-tiny"] {
        let out = tmp(&format!("save-{name}"));
        let cfg = HfConfig::from_dir(&dir(name)).unwrap();
        match cfg.model_type.as_str() {
            "t5" => save_pretrained(
                &T5::from_pretrained(&b, &dir(name), DType::F32, None).unwrap(),
                &cfg,
                &out,
                50_000,
                None,
            ),
            "opt" => save_pretrained(
                &Opt::from_pretrained(&b, &dir(name), DType::F32, None).unwrap(),
                &cfg,
                &out,
                50_000,
                None,
            ),
            _ => save_pretrained(
                &GptJ::from_pretrained(&b, &dir(name), DType::F32, None).unwrap(),
                &cfg,
                &out,
                50_000,
                None,
            ),
        }
        .unwrap();
        assert!(out.join("model.safetensors.index.json").exists(), "{name}: sharded at 50 kB");
        same(&out, &dir(name));
        // and it loads again
        let n = match cfg.model_type.as_str() {
            "t5" => T5::from_pretrained(&b, &out, DType::F32, None).unwrap().num_parameters(),
            "opt" => Opt::from_pretrained(&b, &out, DType::F32, None).unwrap().num_parameters(),
            _ => GptJ::from_pretrained(&b, &out, DType::F32, None).unwrap().num_parameters(),
        };
        assert!(n > 0);
    }
}
