//! `redco train --model T5DIR --data pairs.jsonl --source-field SRC --target-field TGT` as a
//! user runs it: the t5-tiny fixture fine-tuned on a word-substitution pairs task (each
//! word replaced by its partner, the order kept): the loss falls below 0.05, most held-out
//! greedy outputs equal their targets, the workdir is a T5 directory that loads back; and
//! the pair flags' mistakes are one-line errors.

use crate::common::{fixture_named, redco, s};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    crate::common::scratch_dir("seq2seq", name)
}

/// `n` pairs `{"en": ..., "xx": ...}` of 3 to 7 words over t5-tiny's whole-word tokens.
fn write_pairs(path: &Path, n: usize) {
    let swap = [
        ("the", "a"),
        ("a", "the"),
        ("cat", "dogs"),
        ("dogs", "cat"),
        ("dog", "mat"),
        ("mat", "dog"),
        ("play", "walk"),
        ("walk", "play"),
        ("on", "on"),
    ];
    let mut x = 5u64;
    let mut next = move |m: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 33) % m) as usize
    };
    let mut lines = String::new();
    for _ in 0..n {
        let words: Vec<usize> = (0..3 + next(5)).map(|_| next(swap.len() as u64)).collect();
        let en: Vec<&str> = words.iter().map(|&w| swap[w].0).collect();
        let xx: Vec<&str> = words.iter().map(|&w| swap[w].1).collect();
        lines += &serde_json::json!({"en": en.join(" "), "xx": xx.join(" ")}).to_string();
        lines.push('\n');
    }
    std::fs::write(path, lines).expect("write pairs");
}

#[test]
fn t5_fine_tunes_on_pairs_and_generates_the_targets() {
    let w = tmp("run");
    std::fs::create_dir_all(&w).expect("scratch");
    let data = w.with_extension("jsonl");
    write_pairs(&data, 2000);
    let t5 = fixture_named("t5-tiny");
    let (code, out, err) = redco(&[
        "train",
        "--model",
        s(&t5),
        "--data",
        s(&data),
        "--source-field",
        "en",
        "--target-field",
        "xx",
        "--steps",
        "1500",
        "--batch-size",
        "32",
        "--seq-len",
        "16",
        "--lr",
        "1e-2",
        "--workdir",
        s(&w),
        "--overwrite",
        "--threads",
        "2",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    for f in ["metrics.jsonl", "model.safetensors", "config.json", "tokenizer.json"] {
        assert!(w.join(f).exists(), "{f} missing:\n{out}");
    }
    let losses: Vec<f64> = std::fs::read_to_string(w.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .collect();
    let tail: f64 = losses[losses.len() - 20..].iter().sum::<f64>() / 20.0;
    assert!(losses[0] > 3.0 && tail < 0.05, "loss {} -> {tail}", losses[0]);
    // "held-out pairs, greedy: N of 64 outputs equal their target"
    let line = out.lines().find(|l| l.starts_with("held-out pairs, greedy:")).unwrap_or_else(|| panic!("{out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let (exact, of): (usize, usize) = (words[3].parse().expect("count"), words[5].parse().expect("count"));
    assert!(of == 64 && exact >= 56, "{line}");
    // the workdir is a T5 directory: it generates
    let (code, gen, err) =
        redco(&["generate", "--model", s(&w), "--prompt", "the cat on a mat", "--max-new-tokens", "8"]);
    assert_eq!(code, 0, "{gen}\n{err}");
    let _ = std::fs::remove_dir_all(&w);
    let _ = std::fs::remove_file(&data);
}

#[test]
fn pair_flags_mistakes_are_one_line_errors() {
    let w = tmp("bad");
    let data = w.with_extension("jsonl");
    std::fs::create_dir_all(w.parent().expect("tmp")).expect("tmp");
    write_pairs(&data, 10);
    let t5 = fixture_named("t5-tiny");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--model", s(&t5), "--data", s(&data), "--source-field", "en"], "--target-field"),
        (vec!["--model", s(&t5), "--source-field", "en", "--target-field", "xx"], "--data"),
        (vec!["--model", s(&t5), "--data", s(&data), "--source-field", "de", "--target-field", "xx"], "no field `de`"),
        (vec!["--preset", "llama-tiny", "--source-field", "en", "--target-field", "xx"], "encoder-decoder"),
    ];
    for (args, want) in cases {
        let mut all = vec!["train"];
        all.extend(args);
        all.extend(["--steps", "1", "--workdir", s(&w), "--overwrite"]);
        let (code, out, err) = redco(&all);
        assert_eq!(code, 2, "{all:?}: {out} {err}");
        assert!(err.starts_with("redco: error: ") && err.trim_end().lines().count() == 1, "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&w);
    let _ = std::fs::remove_file(&data);
}
