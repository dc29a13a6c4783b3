//! A text classifier from a JSONL file streamed from disk, through the three functions:
//! a bag-of-embeddings model (mean-pooled token embeddings, then a linear head), trained
//! on a synthetic sentiment task, with accuracy on held-out lines as the eval metric.
//!
//! `cargo run --release -p redco --example classifier -- [MESH] [STEPS] [WORKDIR]`

use redco::cpu::Cpu;
use redco::nn::{join, Embedding, Linear, Module};
use redco::pipeline::data::JsonlDataset;
use redco::pipeline::{Batch, Deployer, StepCtx, TrainConfig, Trainer};
use redco::{DType, Result, Tensor};
use serde_json::Value;

const VOCAB: usize = 64;
const LEN: usize = 12;

/// Token embeddings, mean-pooled, then two logits.
struct BagClassifier {
    embed: Embedding<Cpu>,
    head: Linear<Cpu>,
}

impl Module<Cpu> for BagClassifier {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<Cpu>)) {
        self.embed.visit(&join(p, "embed"), f);
        self.head.visit(&join(p, "head"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<Cpu>)) {
        self.embed.visit_mut(&join(p, "embed"), f);
        self.head.visit_mut(&join(p, "head"), f);
    }
}

impl BagClassifier {
    fn logits(&self, ids: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
        self.head.forward(&self.embed.forward(ids)?.mean(1, false)?)
    }
}

/// Words hash into the vocabulary; texts are cut or padded (with word 0) to LEN.
fn collate_fn(b: &Cpu, ex: &[Value]) -> Result<Batch<Cpu>> {
    let mut ids = Vec::new();
    let mut labels = Vec::new();
    for e in ex {
        let words: Vec<i64> = e["text"]
            .as_str()
            .unwrap_or("")
            .split_whitespace()
            .map(|w| (w.bytes().fold(7u64, |h, c| h * 31 + c as u64) % VOCAB as u64) as i64)
            .collect();
        ids.extend((0..LEN).map(|i| words.get(i).copied().unwrap_or(0)));
        labels.push(
            e["label"].as_i64().ok_or_else(|| redco::Error::invalid("collate", format!("no integer label in {e}")))?,
        );
    }
    Ok(Batch::from([
        ("input_ids".into(), Tensor::from_vec(b, ids, [ex.len(), LEN])?),
        ("labels".into(), Tensor::from_vec(b, labels, [ex.len()])?),
    ]))
}

fn loss_fn(_: &StepCtx<Cpu>, m: &BagClassifier, b: &Batch<Cpu>) -> Result<Tensor<Cpu>> {
    m.logits(&b["input_ids"])?.cross_entropy(&b["labels"], -100)
}

fn accuracy(_: &StepCtx<Cpu>, m: &BagClassifier, b: &Batch<Cpu>) -> Result<f64> {
    let pred = m.logits(&b["input_ids"])?.replicate()?.argmax(-1, false)?.to_vec_i64()?;
    let gold = b["labels"].replicate()?.to_vec_i64()?;
    Ok(pred.iter().zip(&gold).filter(|(p, g)| p == g).count() as f64 / gold.len() as f64)
}

/// Writes `n` lines: texts mixing "good"/"bad" words with neutral ones; the label says
/// which sentiment word is more frequent.
fn write_jsonl(path: &std::path::Path, n: usize, seed: u64) -> std::io::Result<()> {
    let (good, bad, neutral) =
        (["great", "fine", "lovely"], ["awful", "poor", "dull"], ["the", "a", "movie", "plot", "was", "and"]);
    let mut s = seed;
    let mut next = |m: usize| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 33) % m as u64) as usize
    };
    let mut out = String::new();
    for _ in 0..n {
        let label = next(2);
        let words: Vec<&str> = (0..LEN)
            .map(|_| match next(3) {
                0 => {
                    if label == 1 {
                        good[next(3)]
                    } else {
                        bad[next(3)]
                    }
                }
                _ => neutral[next(6)],
            })
            .collect();
        out.push_str(&serde_json::json!({"text": words.join(" "), "label": label}).to_string());
        out.push('\n');
    }
    std::fs::write(path, out)
}

fn main() -> Result<()> {
    redco::cpu::malloc::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mesh = args.first().map_or("2x1", String::as_str).parse()?;
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(150);
    let workdir = std::path::PathBuf::from(args.get(2).map_or("workdir-cls", String::as_str));
    std::fs::create_dir_all(&workdir).map_err(|e| redco::Error::invalid("example", e.to_string()))?;
    let io = |e: std::io::Error| redco::Error::invalid("example", e.to_string());
    write_jsonl(&workdir.join("train.jsonl"), 2000, 1).map_err(io)?;
    write_jsonl(&workdir.join("test.jsonl"), 200, 2).map_err(io)?;
    let train = JsonlDataset::open(&workdir.join("train.jsonl"))?;
    let test = JsonlDataset::open(&workdir.join("test.jsonl"))?;
    let config = TrainConfig { batch_size: 32, steps, tokens_key: None, ..Default::default() };
    let model = |b: &Cpu| {
        Ok(BagClassifier {
            embed: Embedding::new(b, VOCAB, 16, 0.1, DType::F32, 0)?,
            head: Linear::new(b, 16, 2, true, DType::F32, 1)?,
        })
    };
    let trainer = Trainer::new(model, collate_fn, loss_fn, config).with_eval(test, accuracy, 50, false);
    let r = trainer.fit(&Deployer::new(mesh, 3, &workdir)?, &train, false)?;
    println!(
        "loss {:.3} -> {:.3}; held-out accuracy in {}/metrics.jsonl (\"eval\")",
        r.losses[0],
        r.losses[r.losses.len() - 1],
        workdir.display()
    );
    Ok(())
}
