//! A workdir as a careless user treats it, and the command line's bad values and closed
//! outputs: every case ends with a clear message naming the culprit and exit code 2, or
//! succeeds, and none panics or silently replaces data.

use crate::common::{redco, s};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn tmp(name: &str) -> PathBuf {
    crate::common::scratch_dir("workdir", name)
}

fn train(w: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut a = vec!["train", "--preset", "llama-tiny", "--batch-size", "4", "--seq-len", "16", "--threads", "2"];
    a.extend(["--workdir", s(w)]);
    a.extend(extra);
    redco(&a)
}

fn steps(w: &Path) -> Vec<u64> {
    std::fs::read_to_string(w.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_workdir_keeps_its_run_refuses_strangers_and_corrupt_checkpoints() {
    let w = tmp("own");
    let (code, out, err) = train(&w, &["--steps", "6", "--checkpoint-every", "2"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let model = std::fs::read(w.join("model.safetensors")).unwrap();

    // a second fresh run into it: refused, and the first run's files are untouched
    let (code, _, err) = train(&w, &["--steps", "3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("earlier run") && err.contains("--overwrite") && err.contains(s(&w)), "{err}");
    assert_eq!(std::fs::read(w.join("model.safetensors")).unwrap(), model);
    assert_eq!(steps(&w), (1..=6).collect::<Vec<_>>());

    // resuming a run that is already past --steps (--steps 4 after 6): said so, exit 0, and
    // nothing in the workdir is rewritten (the export, the metrics, the log, the checkpoints)
    let listing = |w: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        let mut stack = vec![w.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.file_name() != Some(std::ffi::OsStr::new(".redco.lock")) {
                    // (the lock file only names the last process that held the workdir)
                    files.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        files.sort();
        files
    };
    let before = listing(&w);
    let mtime = std::fs::metadata(w.join("model.safetensors")).unwrap().modified().unwrap();
    for extra in
        [&["--steps", "4", "--resume"][..], &["--steps", "6", "--resume"], &["--epochs", "0.00001", "--resume"]]
    {
        let (code, out, err) = train(&w, extra);
        assert_eq!(code, 0, "{extra:?}: {out}\n{err}");
        assert!(out.contains("already at step 6") && out.contains("nothing to train"), "{extra:?}: {out}\n{err}");
        assert!(!out.contains("NaN") && !err.contains("NaN"), "{out}\n{err}");
    }
    let after = listing(&w);
    let changed: Vec<_> = before.iter().zip(&after).filter(|(a, b)| a != b).map(|(a, _)| a.0.clone()).collect();
    assert!(before.len() == after.len() && changed.is_empty(), "a resume past --steps rewrote {changed:?}");
    assert_eq!(std::fs::metadata(w.join("model.safetensors")).unwrap().modified().unwrap(), mtime);

    // while another process holds the workdir: refused, naming it
    let lock = std::fs::File::options().read(true).write(true).open(w.join(".redco.lock")).unwrap();
    lock.try_lock().unwrap();
    let (code, _, err) = train(&w, &["--steps", "8", "--resume"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("in use"), "{err}");
    drop(lock);

    // resuming with another seed (it also generates the bundled corpus) or dtype: refused
    for (flag, value, says) in
        [("--seed", "7", "seed was 42, is now 7"), ("--dtype", "bf16", "dtype was f32, is now bf16")]
    {
        let (code, _, err) = train(&w, &["--steps", "8", "--resume", flag, value]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says) && err.contains("step-00000006"), "{err}");
    }

    // one flipped bit in the newest shard: refused on resume and on convert, naming the file
    let shard = w.join("checkpoints/step-00000006/rank-0.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    let (code, _, err) = train(&w, &["--steps", "8", "--resume"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("rank-0.safetensors is corrupt") && err.contains("step-00000004"), "{err}");
    let out_dir = tmp("own-hf");
    let (code, _, err) = redco(&["convert", "--to", "hf", "--input", s(&w), "--out", s(&out_dir)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("rank-0.safetensors is corrupt"), "{err}");
    assert!(!out_dir.join("model.safetensors").exists());

    // the user picks the older verified one: it resumes, and the metrics of the re-run
    // steps appear once
    let older = w.join("checkpoints/step-00000004");
    let (code, out, err) = train(&w, &["--steps", "8", "--resume-from", s(&older)]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(steps(&w), (1..=8).collect::<Vec<_>>());
    // and --overwrite replaces the run
    let (code, out, err) = train(&w, &["--steps", "2", "--overwrite"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(steps(&w), vec![1, 2]);
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn bad_numeric_flags_are_refused_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["train", "--lr=-1"], "--lr"),
        (&["train", "--lr", "nan"], "--lr"),
        (&["train", "--steps", "0"], "--steps"),
        (&["train", "--epochs", "0"], "--epochs"),
        (&["train", "--batch-size", "0"], "--batch-size"),
        (&["train", "--seq-len", "0"], "--seq-len"),
        (&["train", "--clip-norm", "nan"], "--clip-norm"),
        (&["train", "--clip-norm", "-1"], "--clip-norm"),
        (&["train", "--weight-decay=-0.1"], "--weight-decay"),
        (&["train", "--checkpoint-every", "0"], "--checkpoint-every"),
        (&["train", "--threads", "100000"], "--threads"),
        (&["train", "--threads", "0"], "--threads"),
        (&["train", "--timeout", "inf"], "--timeout"),
        (&["generate", "--model", "m", "--temperature=-1"], "--temperature"),
        (&["generate", "--model", "m", "--num-beams", "0"], "--num-beams"),
        (&["generate", "--model", "m", "--num-beams", "1000000"], "--num-beams"),
        (&["generate", "--model", "m", "--top-p", "1.5"], "--top-p"),
        (&["generate", "--model", "m", "--top-k", "0"], "--top-k"),
        (&["plan", "--model", "m", "--seq", "0"], "--seq"),
        (&["plan", "--model", "m", "--batch", "0"], "--batch"),
        (&["eval-dump", "--model", "m", "--threads", "0"], "--threads"),
    ];
    for (args, flag) in cases {
        let (code, _, err) = redco(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(flag) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_closed_or_full_stdout_is_not_a_panic() {
    // stdout closed by its reader before anything is written: the command still succeeds
    let mut child = Command::new(env!("CARGO_BIN_EXE_redco"))
        .arg("info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // a full disk: a one-line error and exit code 2
    if let Ok(full) = std::fs::File::options().write(true).open("/dev/full") {
        let out = Command::new(env!("CARGO_BIN_EXE_redco")).arg("info").stdout(full).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("cannot write to stdout") && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn absurd_sizes_and_wrong_types_are_refused_before_anything_is_allocated() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    let d = tmp("sizes");
    std::fs::create_dir_all(&d).unwrap();
    let cases: &[(&str, serde_json::Value, &str)] = &[
        ("num_hidden_layers", serde_json::json!(1_000_000_000u64), "`num_hidden_layers` = 1000000000"),
        ("vocab_size", serde_json::json!(1u64 << 40), "`vocab_size`"),
        ("hidden_size", serde_json::json!("32"), "`hidden_size` is \"32\": expected a whole number"),
        ("rms_norm_eps", serde_json::json!("x"), "`rms_norm_eps` is \"x\": expected a finite number"),
        ("tie_word_embeddings", serde_json::json!(1), "`tie_word_embeddings` is 1: expected true or false"),
        ("num_key_value_heads", serde_json::json!(3), "`num_key_value_heads` = 3"),
        (
            "rope_scaling",
            serde_json::json!({"type": "yarn", "factor": 4.0}),
            "`rope_scaling` of type `yarn` is not supported",
        ),
    ];
    for (key, value, says) in cases {
        let mut c = base.clone();
        c[*key] = value.clone();
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
        let (code, _, err) = redco(&["plan", "--model", s(&d)]);
        assert_eq!(code, 2, "{key}: {err}");
        assert!(err.contains(says), "{key}: {err}");
    }
    // a sharded index may name only files of its own directory
    std::fs::write(d.join("config.json"), base.to_string()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(f), d.join(f)).unwrap();
    }
    for target in ["../../etc/passwd", "/etc/passwd", "sub/model.safetensors"] {
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": target}});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let (code, _, err) = redco(&["generate", "--model", s(&d), "--prompt", "hi", "--max-new-tokens", "1"]);
        assert_eq!(code, 2, "{target}: {err}");
        assert!(err.contains(target) && err.contains("not a file of"), "{target}: {err}");
    }
    let (code, _, err) = redco(&["plan", "--model", s(&fixture), "--seq", "1000000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--seq") && err.contains("context"), "{err}");
    let w = tmp("sizes-train");
    let t =
        |flag: &str, v: &str| redco(&["train", "--preset", "llama-tiny", "--steps", "1", "--workdir", s(&w), flag, v]);
    let (code, _, err) = t("--batch-size", "1000000000");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--batch-size 1000000000") && err.contains("needs about"), "{err}");
    let (code, _, err) = t("--seq-len", "1000000000");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--seq-len 1000000000") && err.contains("context"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn data_files_of_nothing_or_the_wrong_shape_are_named() {
    let d = tmp("data");
    std::fs::create_dir_all(&d).unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("empty.jsonl", "", "holds no JSON lines"),
        ("blank.jsonl", "{\"text\": \"\"}\n{\"text\": \"   \"}\n", "every `text`"),
        ("number.jsonl", "{\"text\": 5}\n", "record 1: `text` is a number"),
        ("missing.jsonl", "{\"body\": \"hello\"}\n", "record 1: no field `text`"),
        ("broken.jsonl", "{\"text\": \"a\"}\n{\"text\": \n", "line 2"),
    ];
    for (name, body, says) in cases {
        let f = d.join(name);
        std::fs::write(&f, body).unwrap();
        let w = d.join(format!("w-{name}"));
        let (code, _, err) = train(&w, &["--steps", "1", "--data", s(&f)]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(err.contains(says) && err.contains(name), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(&d);
}
