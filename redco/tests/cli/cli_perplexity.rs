//! `redco perplexity` on the committed LLaMA fixture: the perplexity it prints is
//! `exp` of the mean negative log-likelihood of the second half of each chunk, computed
//! here in f64 from the logits `eval-dump` writes for the same chunks (whose first token is
//! `<s>`, as llama.cpp cuts them); the same at mesh 1x2; near it under `--quantize q8_0`;
//! too short a text and a chunk past the model's context are refused by name.

use crate::common::{fixture_named, redco, s, scratch_dir};
use redco_models::hf::safetensors::read_all;
use redco_models::hf::tokenizer::Tokenizer;

const TEXT: &str = "the cat sat on the mat. a dog ran after the rat and the cat sat on a dog. ";

/// The final estimate and mean NLL a `redco perplexity` run printed.
fn printed(out: &str) -> (f64, f64) {
    let line = out.lines().find(|l| l.starts_with("Final estimate: PPL = ")).unwrap_or_else(|| panic!("{out}"));
    let ppl = line["Final estimate: PPL = ".len()..].split(' ').next().unwrap().parse().unwrap();
    let mean = line.split("mean NLL ").nth(1).unwrap().trim_end_matches(')').parse().unwrap();
    (ppl, mean)
}

#[test]
fn perplexity_is_the_mean_nll_of_each_chunks_second_half() {
    let d = scratch_dir("perplexity", "llama");
    std::fs::create_dir_all(&d).unwrap();
    let model = fixture_named("llama-tiny");
    let text = d.join("text.txt");
    std::fs::write(&text, TEXT.repeat(4)).unwrap();
    let ctx = 16usize;
    let run = |extra: &[&str]| {
        let (code, out, err) =
            redco(&[&["perplexity", "--model", s(&model), "--text", s(&text), "--seq-len", "16"][..], extra].concat());
        assert_eq!(code, 0, "{extra:?}: {err}");
        out
    };
    let out = run(&[]);
    // the reference: the same chunks through eval-dump's logits, scored here in f64
    let tok = Tokenizer::from_dir(&model).unwrap();
    let ids = tok.encode_long(&TEXT.repeat(4), true).unwrap();
    assert_eq!(ids[0], 1);
    let n = ids.len() / ctx;
    assert!(n >= 3, "{} tokens", ids.len());
    assert!(
        out.contains(&format!(
            "perplexity: {} tokens, {n} chunks of 16 (the last 7 predictions of each scored)",
            ids.len()
        )),
        "{out}"
    );
    let mut chunks: Vec<i64> = Vec::new();
    for c in ids.chunks_exact(ctx) {
        chunks.push(1);
        chunks.extend(&c[1..]);
    }
    let inputs = d.join("inputs.safetensors");
    let t = vec![("input_ids".to_string(), redco_core::HostData::I64(chunks.clone()), vec![n, ctx])];
    std::fs::write(&inputs, redco_pipeline::checkpoint::safetensors_bytes(&t, Default::default()).unwrap()).unwrap();
    let dump = d.join("dump.safetensors");
    let (code, _, err) = redco(&["eval-dump", "--model", s(&model), "--inputs", s(&inputs), "--out", s(&dump)]);
    assert_eq!(code, 0, "{err}");
    let logits = read_all(&dump).unwrap()["logits"].data.to_f64_vec();
    let v = logits.len() / (n * ctx);
    let mut nll = Vec::new();
    for c in 0..n {
        for p in ctx / 2..ctx - 1 {
            let row = &logits[(c * ctx + p) * v..(c * ctx + p + 1) * v];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            nll.push(lse - row[chunks[c * ctx + p + 1] as usize]);
        }
    }
    assert_eq!(nll.len(), n * 7);
    let mean = nll.iter().sum::<f64>() / nll.len() as f64;
    let (ppl, got) = printed(&out);
    assert!((got - mean).abs() < 1e-5, "mean NLL {got}, reference {mean}");
    assert!((ppl - mean.exp()).abs() < 1e-3 * ppl, "PPL {ppl}, reference {}", mean.exp());
    // a random model of 62 tokens is near uniform
    assert!(ppl > 20.0 && ppl < 200.0, "{ppl}");
    // the same split over two ranks; --chunks limits; --batch runs chunks together
    let (_, two) = printed(&run(&["--mesh", "1x2", "--batch-size", "2"]));
    assert!((two - got).abs() < 1e-5, "1x2: {two}, 1x1: {got}");
    let one_chunk = run(&["--chunks", "1"]);
    let first: f64 = nll[..7].iter().sum::<f64>() / 7.0;
    assert!((printed(&one_chunk).1 - first).abs() < 1e-5, "{one_chunk}");
    // Q8_0 blocks (the rows of 32 inputs) move it a little
    let (_, q8) = printed(&run(&["--quantize", "q8_0"]));
    assert!((q8 - got).abs() < 0.02 && q8 != got, "q8_0: {q8}, f32: {got}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn perplexity_refuses_short_texts_and_chunks_past_the_context() {
    let d = scratch_dir("perplexity", "refusals");
    std::fs::create_dir_all(&d).unwrap();
    let model = fixture_named("llama-tiny");
    let text = d.join("text.txt");
    std::fs::write(&text, TEXT).unwrap();
    let (code, _, err) = redco(&["perplexity", "--model", s(&model), "--text", s(&text), "--seq-len", "16"]);
    assert_ne!(code, 0);
    assert!(err.contains("needs at least 32"), "{err}");
    let (code, _, err) = redco(&["perplexity", "--model", s(&model), "--text", s(&text), "--seq-len", "128"]);
    assert_ne!(code, 0);
    assert!(err.contains("--seq-len 128") && err.contains("context of 64"), "{err}");
    let (code, _, err) = redco(&["perplexity", "--model", s(&model), "--text", s(&d.join("none.txt"))]);
    assert_ne!(code, 0);
    assert!(err.contains("none.txt"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}
