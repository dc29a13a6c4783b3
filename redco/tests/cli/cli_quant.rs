//! `--quantize` on the committed LLaMA fixture: the linear layers quantized to llama.cpp's
//! blocks at load and multiplied from them in place give logits near transformers' f32
//! ones (Q8_0 within a few percent, Q4_0 further, in that order); the layers whose rows
//! are not whole blocks are named and left in floats; an unknown type, and checkpoints
//! quantized by methods redco does not read (bitsandbytes), are refused by name.

use crate::common::{eval_dump_args, fixture_named, redco, s, scratch_dir};
use redco_models::hf::safetensors::read_all;

/// Relative L2 distance of the logits of `dump` from transformers' at the unpadded positions.
fn logits_error(dump: &std::path::Path) -> f64 {
    let f = fixture_named("llama-tiny");
    let want = read_all(&f.join("reference.safetensors")).unwrap()["logits"].clone();
    let got = read_all(dump).unwrap()["logits"].data.to_f64_vec();
    let mask = read_all(&f.join("inputs.safetensors")).unwrap()["attention_mask"].data.to_f64_vec();
    let v = want.shape.dims()[2];
    let (mut num, mut den) = (0.0, 0.0);
    for ((g, w), m) in got.chunks(v).zip(want.data.to_f64_vec().chunks(v)).zip(&mask) {
        if *m != 0.0 {
            num += g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
            den += w.iter().map(|b| b * b).sum::<f64>();
        }
    }
    (num / den).sqrt()
}

#[test]
fn quantized_linear_layers_stay_near_the_float_model() {
    let d = scratch_dir("quant", "llama");
    std::fs::create_dir_all(&d).unwrap();
    let mut errs = Vec::new();
    for q in ["q8_0", "q4_0"] {
        let out = d.join(format!("{q}.safetensors"));
        let args = eval_dump_args("llama-tiny", &out, &["--quantize", q]);
        let (code, _, err) = redco(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{err}");
        // intermediate 48 is not whole blocks of 32: both down projections stay floats
        assert!(
            err.contains("2 of 15 linear layers left in floats") && err.contains("layers.1.mlp.down_proj"),
            "{err}"
        );
        errs.push(logits_error(&out));
    }
    assert!(errs[0] < 0.06, "Q8_0 logits: relative L2 {}", errs[0]);
    assert!(errs[1] < 0.6 && errs[1] > errs[0], "Q4_0 logits: relative L2 {} (Q8_0 {})", errs[1], errs[0]);
    // the K formats need rows of 256: none of this model's are
    let out = d.join("k.safetensors");
    let args = eval_dump_args("llama-tiny", &out, &["--quantize", "q4_k"]);
    let (code, _, err) = redco(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(code, 0);
    assert!(err.contains("Q4_K") && err.contains("256"), "{err}");
    let args = eval_dump_args("llama-tiny", &out, &["--quantize", "q3_k"]);
    let (code, _, err) = redco(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(code, 0);
    assert!(err.contains("q3_k"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn checkpoints_quantized_by_other_methods_are_refused_by_name() {
    let d = scratch_dir("quant", "awq");
    std::fs::create_dir_all(&d).unwrap();
    let f = fixture_named("llama-tiny");
    for name in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        if f.join(name).exists() {
            std::fs::copy(f.join(name), d.join(name)).unwrap();
        }
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    let (code, _, err) = redco(&["generate", "--model", s(&d), "--prompt", "the cat", "--max-new-tokens", "2"]);
    assert_ne!(code, 0);
    assert!(err.contains("bitsandbytes") && err.contains("not"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn quantized_layers_split_over_mp_by_whole_blocks_give_the_one_rank_logits() {
    // the llama-tiny preset: hidden 128 (row-parallel layers split into 64 values, two
    // blocks of 32, a rank) and intermediate 344 (not whole blocks: floats at both meshes)
    let d = scratch_dir("quant", "mp");
    let w = d.join("model");
    let (code, _, err) = redco(&[
        "train",
        "--preset",
        "llama-tiny",
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--sample-tokens",
        "0",
        "--workdir",
        s(&w),
    ]);
    assert_eq!(code, 0, "{err}");
    // one row of 8 tokens (the integer dots) and three (24 rows: the f32 panels)
    for rows in [1usize, 3] {
        let ids: Vec<i64> = (0..rows as i64 * 8).map(|i| (i * 7 + 3) % 40).collect();
        let inputs = d.join(format!("inputs-{rows}.safetensors"));
        let t = vec![("input_ids".to_string(), redco_core::HostData::I64(ids), vec![rows, 8])];
        std::fs::write(&inputs, redco_pipeline::checkpoint::safetensors_bytes(&t, Default::default()).unwrap())
            .unwrap();
        for q in ["q8_0", "q4_0"] {
            let dump = |mesh: &str| {
                let out = d.join(format!("{q}-{rows}-{mesh}.safetensors"));
                let (code, _, err) = redco(&[
                    "eval-dump",
                    "--model",
                    s(&w),
                    "--inputs",
                    s(&inputs),
                    "--out",
                    s(&out),
                    "--quantize",
                    q,
                    "--mesh",
                    mesh,
                ]);
                assert_eq!(code, 0, "{err}");
                assert!(err.contains("down_proj") && !err.contains("o_proj"), "{mesh}: {err}");
                read_all(&out).unwrap()["logits"].data.to_f64_vec()
            };
            let (one, two) = (dump("1x1"), dump("1x2"));
            for (i, (a, b)) in one.iter().zip(&two).enumerate() {
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{q}, {rows} rows: logit {i}: {a} at 1x1, {b} at 1x2");
            }
        }
    }
    std::fs::remove_dir_all(&d).ok();
}
