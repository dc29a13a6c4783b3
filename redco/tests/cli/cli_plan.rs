//! `redco plan` as a script sees it: output, exit codes and one-line errors.

use std::process::Command;

fn redco(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redco")).args(args).output().expect("run redco");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn model_dir(name: &str, heads: usize) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("redco-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let hidden = 32 * heads;
    let cfg = format!(
        r#"{{"model_type":"llama","hidden_size":{hidden},"intermediate_size":688,"num_attention_heads":{heads},"num_hidden_layers":4,"num_key_value_heads":{heads},"vocab_size":1000,"tie_word_embeddings":false}}"#
    );
    std::fs::write(d.join("config.json"), cfg).unwrap();
    d
}

#[test]
fn plan_prints_placements_communication_memory_and_the_smallest_mp() {
    let d = model_dir("ok", 8);
    let (code, out, err) = redco(&[
        "plan",
        "--model",
        d.to_str().unwrap(),
        "--mesh",
        "2x2",
        "--batch-size",
        "4",
        "--seq-len",
        "128",
        "--device-memory",
        "10MB",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model.layers.0.self_attn.q_proj.weight"), "{out}");
    assert!(out.contains("split dim 0") && out.contains("split dim 1"), "{out}");
    // 4 layers: 2 pairs each, plus embedding and head, plus 3 cross-entropy scalars
    assert!(out.contains("AllReduce over Mp: 21 calls"), "{out}");
    assert!(out.contains("memory per device, training"), "{out}");
    assert!(out.contains("smallest mp"), "{out}");
}

#[test]
fn the_sequence_length_defaults_to_the_models_context_and_says_so() {
    let fixture = |n: &str| format!("{}/../tests/fixtures/{n}", env!("CARGO_MANIFEST_DIR"));
    // llama-tiny's context is 64 tokens: the plan is made for 64, and says where that came from
    let (code, out, err) = redco(&["plan", "--model", &fixture("llama-tiny")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("sequence 64 (--seq-len default: the model's context of 64)"), "{out}");
    assert!(out.contains("batch 8, seq 64"), "{out}");
    let (code, out, err) = redco(&["plan", "--model", &fixture("llama-tiny"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["workload"]["seq_len"], 64);
    assert_eq!(v["workload"]["seq_len_from"], "the model's context of 64");
    // a context beyond the cap is capped at 2048; a model without one (no field) gets 512
    let d = model_dir("ctx", 2);
    let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
    std::fs::write(
        d.join("config.json"),
        cfg.replace("\"vocab_size\"", "\"max_position_embeddings\":8192,\"vocab_size\""),
    )
    .unwrap();
    let (_, out, _) = redco(&["plan", "--model", d.to_str().unwrap()]);
    assert!(out.contains("sequence 2048 (--seq-len default: the model's context of 8192, capped at 2048)"), "{out}");
    let (_, out, _) = redco(&["plan", "--model", &fixture("t5-tiny")]);
    assert!(out.contains("sequence 512 (--seq-len default: t5 has no fixed context; 512 assumed)"), "{out}");
    // a given --seq-len is taken as it is
    let (_, out, _) = redco(&["plan", "--model", &fixture("llama-tiny"), "--seq-len", "16"]);
    assert!(out.contains("batch 8, seq 16") && !out.contains("--seq-len default"), "{out}");
}

#[test]
fn a_missing_model_directory_is_a_one_line_error() {
    let (code, out, err) = redco(&["plan", "--model", "/definitely/not/here", "--mesh", "1x2"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn a_bad_mesh_and_unsplittable_heads_are_errors() {
    let d = model_dir("heads", 6);
    let (code, _, err) = redco(&["plan", "--model", d.to_str().unwrap(), "--mesh", "2by2"]);
    assert_eq!(code, 2);
    assert!(err.contains("DPxMP"), "{err}");
    let (code, _, err) = redco(&["plan", "--model", d.to_str().unwrap(), "--mesh", "1x4", "--strict"]);
    assert_eq!(code, 2);
    assert!(err.contains("do not split over mp=4"), "{err}");
}

#[test]
fn plan_json_parses_and_says_what_the_tables_say() {
    let d = model_dir("json", 8);
    let args = ["plan", "--model", d.to_str().unwrap(), "--mesh", "2x2", "--batch-size", "4", "--seq-len", "128"];
    let (code, out, err) = redco(&[&args[..], &["--json", "--device-memory", "10MB"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!((v["mesh"]["dp"].as_u64(), v["mesh"]["mp"].as_u64()), (Some(2), Some(2)));
    assert_eq!(v["workload"]["batch_size"].as_u64(), Some(4));
    let params = v["params"].as_array().expect("params");
    let q = params.iter().find(|p| p["name"] == "model.layers.0.self_attn.q_proj.weight").expect("q_proj");
    // [256, 256] split over mp = 2, bf16
    assert_eq!((q["placement"].as_str(), q["bytes_per_device"].as_u64()), (Some("shard(0)"), Some(256 * 128 * 2)));
    let mp_calls: u64 = v["comm_per_step"]
        .as_array()
        .expect("comm")
        .iter()
        .filter(|c| c["kind"] == "AllReduce" && c["axis"] == "Mp")
        .filter_map(|c| c["calls"].as_u64())
        .sum();
    assert_eq!(mp_calls, 21);
    assert!(v["fit"]["smallest_mp"].is_u64() || v["fit"]["smallest_mp"].is_null(), "{}", v["fit"]);
    // the old spellings still parse, as aliases
    let (code, old, _) =
        redco(&["plan", "--model", d.to_str().unwrap(), "--mesh", "2x2", "--batch", "4", "--seq", "128", "--json"]);
    assert_eq!(code, 0);
    let w: serde_json::Value = serde_json::from_str(&old).expect("json");
    assert_eq!(w["params"], v["params"]);
}

#[test]
fn info_json_parses_and_version_names_the_revision() {
    let (code, out, err) = redco(&["info", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["backends"].as_array().is_some_and(|b| b.iter().any(|x| x == "cpu")), "{v}");
    assert!(v["cpu"]["threads"].as_u64().is_some_and(|t| t >= 1));
    let (code, version, _) = redco(&["--version"]);
    assert_eq!(code, 0);
    assert!(version.contains("git ") && version.contains("backends: cpu"), "{version}");
    let (code, script, _) = redco(&["completions", "bash"]);
    assert!(code == 0 && script.contains("redco") && script.contains("--seq-len"), "bash completion");
}

#[test]
fn plan_lists_the_memory_tools_and_picks_the_cheapest_that_fits() {
    let d = model_dir("tools", 8);
    let m = d.to_str().unwrap();
    let base = ["plan", "--model", m, "--mesh", "2x1", "--batch-size", "8", "--seq-len", "256", "--dtype", "f32"];
    let rows = |mem: &str| -> serde_json::Value {
        let mut args = base.to_vec();
        args.extend(["--device-memory", mem, "--json"]);
        let (code, out, err) = redco(&args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["strategies"].clone()
    };
    // no limit that binds: everything fits and the pick keeps activations without ZeRO
    let s = rows("1TB");
    let all = s["rows"].as_array().unwrap().clone();
    assert_eq!(all.len(), 12, "ZeRO 0-3, each with recompute none, selective and block: {s}");
    assert!(all.iter().any(|r| r["zero"] == 2) && all.iter().any(|r| r["zero"] == 3), "{s}");
    let peak = |i: usize| all[i]["peak_bytes_per_rank"].as_u64().unwrap();
    let p = s["pick"].as_u64().unwrap() as usize;
    assert_eq!((all[p]["zero"].as_u64(), all[p]["recompute"].as_str()), (Some(0), Some("none")), "{s}");
    // selective recompute keeps less than none and more than block, recomputes less than
    // block, and moves what none moves
    let at = |z: u64, r: &str| all.iter().find(|x| x["zero"] == z && x["recompute"] == r).unwrap();
    let (none, sel, block) = (at(0, "none"), at(0, "selective"), at(0, "block"));
    let num = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    assert!(num(sel, "peak_bytes_per_rank") < num(none, "peak_bytes_per_rank"), "{s}");
    assert!(num(sel, "peak_bytes_per_rank") > num(block, "peak_bytes_per_rank"), "{s}");
    assert!(num(sel, "recomputed_bytes_per_step") < num(block, "recomputed_bytes_per_step"), "{s}");
    assert_eq!(num(sel, "comm_bytes_per_step"), num(none, "comm_bytes_per_step"), "{s}");
    // ZeRO-3's unit: this model's layers are 3.2 MB each in f32, so the planner gathers all
    // four together (short of a 25 MB collective); pinned to one layer, the same bytes move
    // and the peak is lower
    for r in &all {
        let want = if r["zero"] == 3 { 4 } else { 1 };
        assert_eq!(r["unit_layers"].as_u64(), Some(want), "{r}");
    }
    let mut args = base.to_vec();
    args.extend(["--device-memory", "1TB", "--json", "--unit-layers", "1"]);
    let (code, out, err) = redco(&args);
    assert_eq!(code, 0, "{err}");
    let one = serde_json::from_str::<serde_json::Value>(&out).unwrap()["strategies"]["rows"].clone();
    let one = one.as_array().unwrap();
    for (a, b) in all.iter().zip(one) {
        assert_eq!(b["unit_layers"].as_u64(), Some(1), "{b}");
        assert_eq!(a["comm_bytes_per_step"], b["comm_bytes_per_step"], "{a} against {b}");
        if a["zero"] == 3 {
            assert!(num(a, "peak_bytes_per_rank") > num(b, "peak_bytes_per_rank"), "{a} against {b}");
        }
    }
    // a budget just under the plain peak: the pick is the cheapest of those under it
    let plain = peak(0);
    let s = rows(&format!("{}B", plain - 1));
    let picked = &s["rows"][s["pick"].as_u64().unwrap() as usize];
    assert!(picked["peak_bytes_per_rank"].as_u64().unwrap() < plain, "{s}");
    let cost = |r: &serde_json::Value| {
        r["comm_bytes_per_step"].as_u64().unwrap() + r["recomputed_bytes_per_step"].as_u64().unwrap()
    };
    for r in s["rows"].as_array().unwrap() {
        assert!(!r["fits"].as_bool().unwrap() || cost(r) >= cost(picked), "{s}");
    }
    // with --offload (a device backend's): ZeRO-0, 2 and 3 offloaded; at ZeRO-0 8 bytes a
    // parameter moved, the moments off the device and on the host
    let mut args = base.to_vec();
    args.extend(["--device-memory", "1TB", "--json", "--offload"]);
    let (code, out, err) = redco(&args);
    assert_eq!(code, 0, "{err}");
    let with: serde_json::Value = serde_json::from_str::<serde_json::Value>(&out).unwrap()["strategies"].clone();
    let with = with["rows"].as_array().unwrap().clone();
    assert_eq!(with.len(), 21, "{out}");
    let off = with.iter().find(|r| r["offload"] == true && r["recompute"] == "none").unwrap();
    let moved = off["comm_bytes_per_step"].as_u64().unwrap() - all[0]["comm_bytes_per_step"].as_u64().unwrap();
    let saved = peak(0) - off["peak_bytes_per_rank"].as_u64().unwrap();
    assert!(moved > 0 && moved == saved, "8 bytes a parameter either way: {off}");
    assert_eq!(off["host_bytes_per_rank"].as_u64().unwrap(), saved / 8 * 12, "{off}");
    // nothing fits a tiny device: no pick, and the table says so
    assert!(rows("1KB")["pick"].is_null());
    let mut args = base.to_vec();
    args.extend(["--device-memory", "1KB"]);
    let (_, out, _) = redco(&args);
    assert!(out.contains("memory tools for training") && out.contains("none fits"), "{out}");
    let mut args = base.to_vec();
    args.extend(["--device-memory", "1TB"]);
    let (_, out, _) = redco(&args);
    assert!(out.contains("ZeRO-0, recompute none") && out.contains("<- pick"), "{out}");
    assert!(out.contains("ZeRO-3 (4 layers a unit), recompute block"), "{out}");
}

/// The real configs of Mixtral-8x7B and Qwen3-30B-A3B (config files only): the experts
/// listed once per projection, split over dp with `--ep`; the all-to-all of expert
/// parallelism counted; the smallest mesh that fits a device, for training and inference.
#[test]
fn plan_knows_experts_on_the_real_mixtral_and_qwen3_moe_configs() {
    let cfg = |n: &str| format!("{}/../tests/fixtures/configs/{n}", env!("CARGO_MANIFEST_DIR"));
    let (mixtral, qwen) = (cfg("mixtral-8x7b"), cfg("qwen3-30b-a3b"));
    let work = ["--batch-size", "8", "--seq-len", "4096"];
    let (code, out, err) = redco(
        &[&["plan", "--model", &mixtral, "--mesh", "8x1", "--ep", "8", "--recompute", "block"], &work[..]].concat(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("experts.*.w1.weight") && out.contains("1 per rank"), "{out}");
    assert!(out.contains("8 experts split over 8 ranks of dp (--ep 8)"), "{out}");
    // 32 layers: two all-to-alls forward, again under recompute, two backward
    assert!(out.contains("AllToAll over Dp: 192 calls"), "{out}");
    // ZeRO slices what the experts are not: stage 1 saves the shared layers' moments only
    // (2 x 4 bytes of 7/8 of the 1.6B shared elements a rank holds, f32 moments)
    let zero = |z: u8| -> f64 {
        let at = out.find(&format!("ZeRO-{z}, recompute block")).unwrap_or_else(|| panic!("ZeRO-{z} offered: {out}"));
        let gb = out[at..].split_whitespace().nth(3).unwrap();
        gb.parse().unwrap_or_else(|_| panic!("{gb}"))
    };
    let saved = zero(0) - zero(1);
    let shared: f64 = 2.0 * 32000.0 * 4096.0 + 32.0 * (2.0 * 4096.0 * 4096.0 + 2.0 * 1024.0 * 4096.0 + 8.0 * 4096.0);
    assert!((saved - 8.0 * shared * 7.0 / 8.0 / 1e9).abs() < 0.05, "ZeRO-1 saves {saved} GB: {out}");
    // one expert of 8 and the shared layers: the parameters a rank holds, in bf16
    let params: f64 = 32.0 * 3.0 * 14336.0 * 4096.0 + 32.0 * (2.0 * 4096.0 * 4096.0 + 2.0 * 1024.0 * 4096.0);
    let shared = 2.0 * 32000.0 * 4096.0 + 32.0 * (8.0 * 4096.0 + 2.0 * 4096.0) + 4096.0;
    let gb = format!("params {:.2} GB", (params + shared) * 2.0 / 1e9);
    assert!(out.contains(&gb), "{gb}: {out}");
    let train = |mem: &'static str| vec!["--recompute", "block", "--device-memory", mem];
    let infer = |mem: &'static str| vec!["--inference", "--device-memory", mem];
    for (model, flags, want) in [
        (
            &mixtral,
            train("80GB"),
            "for training: 4x4 (dp x mp), the experts split over its 4 dp ranks (--mesh 4x4 --ep 4; 57.50 GB",
        ),
        (&mixtral, train("141GB"), "for training: 2x4 (dp x mp), the experts split over its 2 dp ranks"),
        (&mixtral, infer("80GB"), "for inference: 1x2 (dp x mp; every expert on every rank"),
        (&qwen, train("80GB"), "for training: 2x4 (dp x mp), the experts split over its 2 dp ranks"),
        (&qwen, infer("80GB"), "for inference: 1x1 (dp x mp; every expert on every rank"),
    ] {
        let (code, out, err) = redco(&[&["plan", "--model", model.as_str()], &work[..], &flags[..]].concat());
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(want), "{model} {flags:?}: {out}");
    }
    let (code, _, err) = redco(&[&["plan", "--model", &mixtral, "--mesh", "4x1", "--ep", "2"], &work[..]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("part of dp"), "{err}");
}

#[test]
fn plan_counts_quantized_linear_layers_at_their_blocks_bytes() {
    // LLaMA-2-7B's shape: every linear layer's rows are whole blocks of 32 and of 256
    let d = std::env::temp_dir().join(format!("redco-cli-plan-7b-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("config.json"),
        r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":11008,"num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":32,"vocab_size":32000,"tie_word_embeddings":false}"#,
    )
    .unwrap();
    let infer = |extra: &[&str]| -> u64 {
        let mut args = vec!["plan", "--model", d.to_str().unwrap(), "--inference", "--json", "--batch", "1"];
        args.extend_from_slice(&["--seq-len", "64"]);
        args.extend_from_slice(extra);
        let (code, out, err) = redco(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["memory_per_device"]["inference"].as_u64().unwrap()
    };
    let (h, i, layers, vocab) = (4096u64, 11008u64, 32u64, 32000u64);
    let linear = layers * (4 * h * h + 3 * h * i) + vocab * h;
    let bf16 = infer(&[]);
    // 2 bytes a value in bf16; Q8_0 34 bytes a block of 32, Q4_K 144 a block of 256
    assert_eq!(infer(&["--quantize", "q8_0"]), bf16 - 2 * linear + linear / 32 * 34);
    assert_eq!(infer(&["--quantize", "q4_k"]), bf16 - 2 * linear + linear / 256 * 144);
    // at mp 2, the down projections' halves (5504 values) are not whole Q4_K blocks but
    // whole blocks of 32: held as Q8_0
    let q4_mp2 = infer(&["--quantize", "q4_k", "--mesh", "1x2"]);
    let down = layers * h * i / 2;
    let bf16_mp2 = infer(&["--mesh", "1x2"]);
    assert_eq!(q4_mp2, bf16_mp2 - 2 * (linear / 2) + (linear / 2 - down) / 256 * 144 + down / 32 * 34);
    // training is planned on floats
    let (code, _, err) = redco(&["plan", "--model", d.to_str().unwrap(), "--quantize", "q8_0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--inference"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}
