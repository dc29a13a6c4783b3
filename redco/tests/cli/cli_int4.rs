//! AWQ and GPTQ int4 checkpoints (fixtures packed by AutoAWQ and AutoGPTQ themselves, see
//! `xtask/python/gen_int4_fixtures.py`): read as `Q4_1` blocks (or as floats under GPTQ's
//! activation order), they give transformers' logits of the weights those libraries unpack;
//! split over mp they give the one-rank logits; unsupported variants and damaged files are
//! refused by name.

use crate::common::{fixture_named, redco, s, scratch_dir};
use redco_models::hf::safetensors::read_all;
use std::path::Path;

/// Relative L2 distance of `got` from `want` over the rows (of `v` logits) whose mask is 1.
fn masked_error(got: &[f64], want: &[f64], mask: &[f64], v: usize) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for ((g, w), m) in got.chunks(v).zip(want.chunks(v)).zip(mask) {
        if *m != 0.0 {
            num += g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
            den += w.iter().map(|b| b * b).sum::<f64>();
        }
    }
    (num / den).sqrt()
}

fn eval_dump(model: &Path, inputs: &Path, out: &Path, extra: &[&str]) -> (Vec<f64>, String) {
    let mut args = vec!["eval-dump", "--model", s(model), "--inputs", s(inputs), "--out", s(out)];
    args.extend_from_slice(extra);
    let (code, _, err) = redco(&args);
    assert_eq!(code, 0, "{err}");
    (read_all(out).unwrap()["logits"].data.to_f64_vec(), err)
}

#[test]
fn int4_checkpoints_give_the_logits_of_the_weights_their_libraries_unpack() {
    let d = scratch_dir("int4", "logits");
    std::fs::create_dir_all(&d).unwrap();
    for (name, said, bound) in [
        // the reference multiplies in f16 ((code - zero) * scale rounded), redco in f32 from
        // blocks whose offsets are rounded to f16: a few 1e-3 apart
        ("llama-awq-tiny", "AWQ int4 checkpoint: 14 linear layers as Q4_1 blocks", 6e-3),
        ("llama-gptq-tiny", "GPTQ int4 checkpoint: 14 linear layers as Q4_1 blocks", 6e-3),
        (
            "llama-gptq-actorder-tiny",
            "0 linear layers as Q4_1 blocks; 14 dequantized to floats (activation order)",
            3e-3,
        ),
    ] {
        let f = fixture_named(name);
        let want = read_all(&f.join("reference.safetensors")).unwrap()["logits"].clone();
        let v = want.shape.dims()[2];
        let want = want.data.to_f64_vec();
        let mask = read_all(&f.join("inputs.safetensors")).unwrap()["attention_mask"].data.to_f64_vec();
        // 32 rows: the f32 panels
        let (got, err) = eval_dump(&f, &f.join("inputs.safetensors"), &d.join(format!("{name}.safetensors")), &[]);
        assert!(err.contains(said), "{name}: {err}");
        let e = masked_error(&got, &want, &mask, v);
        assert!(e < bound, "{name}: logits' relative L2 {e}");
        // the first row alone (16 rows: activations rounded to bytes for the integer dots)
        let ids: Vec<i64> = read_all(&f.join("inputs.safetensors")).unwrap()["input_ids"].data.to_f64_vec()[..16]
            .iter()
            .map(|&x| x as i64)
            .collect();
        let one = d.join(format!("{name}-one.safetensors"));
        let t = vec![("input_ids".to_string(), redco_core::HostData::I64(ids), vec![1, 16])];
        std::fs::write(&one, redco_pipeline::checkpoint::safetensors_bytes(&t, Default::default()).unwrap()).unwrap();
        let (got, _) = eval_dump(&f, &one, &d.join(format!("{name}-one-out.safetensors")), &[]);
        let e1 = masked_error(&got, &want[..16 * v], &mask[..16], v);
        assert!(e1 < 0.06, "{name}, one row: logits' relative L2 {e1}");
    }
    // and it generates
    let (code, out, err) = redco(&[
        "generate",
        "--model",
        s(&fixture_named("llama-awq-tiny")),
        "--prompt",
        "the cat",
        "--max-new-tokens",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.trim().is_empty(), "{out}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn int4_layers_split_over_mp_by_whole_blocks_give_the_one_rank_logits() {
    let d = scratch_dir("int4", "mp");
    std::fs::create_dir_all(&d).unwrap();
    for name in ["llama-awq-tiny", "llama-gptq-actorder-tiny"] {
        let f = fixture_named(name);
        let inputs = f.join("inputs.safetensors");
        let (one, _) = eval_dump(&f, &inputs, &d.join(format!("{name}-1.safetensors")), &["--mesh", "1x1"]);
        let (two, _) = eval_dump(&f, &inputs, &d.join(format!("{name}-2.safetensors")), &["--mesh", "1x2"]);
        for (i, (a, b)) in one.iter().zip(&two).enumerate() {
            assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{name}: logit {i}: {a} at 1x1, {b} at 1x2");
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A copy of fixture `name` in `d` with its config changed by `cfg` and its tensors by `edit`.
fn altered(
    name: &str,
    d: &Path,
    cfg: impl Fn(&mut serde_json::Value),
    edit: impl Fn(&mut Vec<(String, redco_core::HostData, Vec<usize>)>),
) {
    let f = fixture_named(name);
    std::fs::create_dir_all(d).unwrap();
    for n in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(f.join(n), d.join(n)).unwrap();
    }
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.join("config.json")).unwrap()).unwrap();
    cfg(&mut c);
    std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    let mut t: Vec<_> = read_all(&f.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.data, t.shape.dims().to_vec()))
        .collect();
    edit(&mut t);
    std::fs::write(
        d.join("model.safetensors"),
        redco_pipeline::checkpoint::safetensors_bytes(&t, Default::default()).unwrap(),
    )
    .unwrap();
}

/// An edit for [`altered`]: element `at` of the i32 tensor `name` set to `value`.
fn set_i32(name: &'static str, at: usize, value: i32) -> impl Fn(&mut Vec<(String, redco_core::HostData, Vec<usize>)>) {
    move |t| {
        for (n, data, _) in t.iter_mut() {
            if let (true, redco_core::HostData::I32(v)) = (n == name, data) {
                v[at] = value;
            }
        }
    }
}

#[test]
fn int4_variants_not_read_and_damaged_files_are_refused_by_name() {
    let d = scratch_dir("int4", "bad");
    let run = |dir: &Path| {
        let (code, _, err) = redco(&["generate", "--model", s(dir), "--prompt", "the cat", "--max-new-tokens", "2"]);
        assert_ne!(code, 0, "{err}");
        err
    };
    let bits = d.join("bits");
    altered("llama-gptq-tiny", &bits, |c| c["quantization_config"]["bits"] = 8.into(), |_| {});
    assert!(run(&bits).contains("`bits` 8"), "{}", run(&bits));
    let gemv = d.join("gemv");
    altered("llama-awq-tiny", &gemv, |c| c["quantization_config"]["version"] = "gemv".into(), |_| {});
    assert!(run(&gemv).contains("gemv"));
    // a layer's codes missing
    let missing = d.join("missing");
    altered("llama-awq-tiny", &missing, |_| {}, |t| t.retain(|(n, _, _)| n != "model.layers.1.mlp.up_proj.qweight"));
    let err = run(&missing);
    assert!(err.contains("model.layers.1.mlp.up_proj.qweight") && err.contains("missing"), "{err}");
    // a group index past the groups
    let gidx = d.join("gidx");
    altered("llama-gptq-tiny", &gidx, |_| {}, set_i32("model.layers.0.self_attn.k_proj.g_idx", 5, 9));
    let err = run(&gidx);
    assert!(err.contains("g_idx[5]") && err.contains("9"), "{err}");
    // a group index out of the inputs' order though `desc_act` is false
    let order = d.join("order");
    altered("llama-gptq-tiny", &order, |_| {}, set_i32("model.layers.1.mlp.gate_proj.g_idx", 3, 1));
    let err = run(&order);
    assert!(err.contains("g_idx[3]") && err.contains("desc_act"), "{err}");
    // training updates floats
    let w = d.join("work");
    let (code, _, err) = redco(&[
        "train",
        "--model",
        s(&fixture_named("llama-awq-tiny")),
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--workdir",
        s(&w),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("int4"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}
