//! `redco train --data` on the files Hugging Face `datasets` writes (the committed fixtures
//! of tests/fixtures/datasets, from xtask/python/gen_datasets.py): a Parquet file, a
//! `save_to_disk` directory and a `DatasetDict` train the same model to the same losses,
//! step by step, as the same records in JSONL, for a LLaMA on text and a T5 on pairs; a
//! missing column, a missing split and a corrupt file are one-line errors naming them.

use crate::common::{fixture_named, redco, s};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    crate::common::scratch_dir("datasets", name)
}

fn data(name: &str) -> PathBuf {
    fixture_named("datasets").join(name)
}

/// Every logged (step, loss) of a finished run in `w`.
fn losses(w: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(w.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            Some((v["step"].as_u64()?, v["loss"].as_f64()?))
        })
        .collect()
}

/// `redco train` on `--data data` with `args`, into a fresh workdir named `name`.
fn train(name: &str, data: &Path, args: &[&str]) -> (i32, String, PathBuf) {
    let w = tmp(name);
    let mut all = vec!["train", "--data", s(data), "--steps", "3", "--batch-size", "4", "--seq-len", "16"];
    all.extend(["--threads", "2", "--checkpoint-every", "1000", "--workdir", s(&w)]);
    all.extend(args);
    let (code, out, err) = redco(&all);
    (code, format!("{out}\n{err}"), w)
}

fn same_losses_as_jsonl(what: &str, jsonl: &str, others: &[&str], args: &[&str]) {
    let (code, log, w) = train(&format!("{what}-jsonl"), &data(jsonl), args);
    assert_eq!(code, 0, "{log}");
    let want = losses(&w);
    assert_eq!(want.len(), 3, "{log}");
    for other in others {
        let (code, log, w2) = train(&format!("{what}-{other}"), &data(other), args);
        assert_eq!(code, 0, "{other}: {log}");
        assert_eq!(losses(&w2), want, "{other}: the same losses as {jsonl}");
        let _ = std::fs::remove_dir_all(&w2);
    }
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn a_llama_trains_on_parquet_and_datasets_directories_as_on_jsonl() {
    let others = ["texts.parquet", "texts_disk", "texts_rowgroups.parquet", "texts_stream.arrow", "texts_file.arrow"];
    same_losses_as_jsonl("llama", "texts.jsonl", &others, &["--preset", "llama-tiny"]);
}

#[test]
fn a_t5_trains_on_parquet_pairs_and_a_pairs_directory_as_on_jsonl() {
    let t5 = fixture_named("t5-tiny");
    let args = ["--model", s(&t5), "--source-field", "source", "--target-field", "target"];
    same_losses_as_jsonl("t5", "pairs.jsonl", &["pairs.parquet", "pairs_disk"], &args);
    // each encoder and decoder block recomputed (whole or selectively): the same losses
    let (code, log, w) = train("t5-kept", &data("pairs.jsonl"), &args);
    assert_eq!(code, 0, "{log}");
    let kept = losses(&w);
    let _ = std::fs::remove_dir_all(&w);
    for r in ["block", "selective"] {
        let (code, log, w) =
            train(&format!("t5-{r}"), &data("pairs.jsonl"), &[&args[..], &["--recompute", r]].concat());
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("recomputed in the backward pass"), "{log}");
        let got = losses(&w);
        assert_eq!(got.len(), kept.len());
        for ((i, a), (j, b)) in kept.iter().zip(&got) {
            assert_eq!(i, j);
            assert!((a - b).abs() <= 1e-6 * a.abs(), "--recompute {r}: step {i}: {a} kept, {b} recomputed");
        }
        let _ = std::fs::remove_dir_all(&w);
    }
}

#[test]
fn columns_splits_and_corrupt_files_are_named() {
    let llama = ["--preset", "llama-tiny"];
    let dir = tmp("bad");
    std::fs::create_dir_all(&dir).expect("scratch");
    let bytes = std::fs::read(data("texts.parquet")).expect("fixture");
    let cut = dir.join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() - 20]).expect("write");
    let flipped = dir.join("flipped.arrow");
    let mut b = std::fs::read(data("texts_stream.arrow")).expect("fixture");
    b[4] ^= 0x7f;
    std::fs::write(&flipped, &b).expect("write");
    let unknown = dir.join("texts.csv");
    std::fs::write(&unknown, "text\nhello\n").expect("write");
    let t5 = fixture_named("t5-tiny");
    let cases: Vec<(PathBuf, Vec<&str>, Vec<&str>)> = vec![
        (data("texts.parquet"), vec!["--text-field", "body"], vec!["`body`", "`id`, `text`", "--text-field"]),
        (data("texts_disk"), vec!["--text-field", "body"], vec!["`body`", "texts_disk"]),
        (data("texts_dict"), vec!["--data-split", "validation"], vec!["`validation`", "`train`, `test`"]),
        (cut.clone(), vec![], vec!["cut.parquet"]),
        (flipped.clone(), vec![], vec!["flipped.arrow"]),
        (unknown.clone(), vec![], vec!["texts.csv", "unknown data format"]),
        (
            data("pairs.parquet"),
            vec!["--model", s(&t5), "--source-field", "en", "--target-field", "target"],
            vec!["`en`", "--source-field", "`source`, `target`"],
        ),
    ];
    for (i, (path, extra, says)) in cases.into_iter().enumerate() {
        let mut args: Vec<&str> = if extra.contains(&"--model") { vec![] } else { llama.to_vec() };
        args.extend(extra);
        let (code, log, w) = train(&format!("bad-{i}"), &path, &args);
        assert_eq!(code, 2, "{path:?}: {log}");
        let err = log.trim_end().lines().last().unwrap_or_default();
        assert!(err.starts_with("redco: error: "), "{path:?}: {log}");
        for want in says {
            assert!(err.contains(want), "{path:?}: wants {want}: {log}");
        }
        let _ = std::fs::remove_dir_all(&w);
    }
    // the train split is the default, and the test split trains when chosen
    let (code, log, w) = train("split", &data("texts_dict"), &["--preset", "llama-tiny", "--data-split", "test"]);
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&w);
    let _ = std::fs::remove_dir_all(&dir);
}
