//! Compiled greedy decoding on PJRT against the CPU backend's `generate` (a growing KV
//! cache, op by op): the same tokens for the committed LLaMA fixture and a batch of two
//! random-weight prompts, and bad sizes refused.

use redco_core::{Backend, DType, Tensor};
use redco_cpu::Cpu;
use redco_models::generate::{generate, FixedKvCache, GenerationConfig};
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tpu::{CacheShape, CompiledDecode, KvPair, Pjrt, Tracer};

fn fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny")
}

fn greedy<B: Backend>(m: &Llama<B>, ids: &Tensor<B>, new: usize) -> Vec<Vec<i64>> {
    let cfg = GenerationConfig { max_new_tokens: new, ..GenerationConfig::default() };
    let g = generate(m, ids, None, &cfg).unwrap();
    let p = ids.dims()[1];
    g.rows.iter().map(|row| row[p..].to_vec()).collect()
}

fn logits(
    m: &Llama<Tracer>,
    ids: &Tensor<Tracer>,
    kv: Vec<KvPair>,
    len: Tensor<Tracer>,
) -> redco_core::Result<(Tensor<Tracer>, Vec<KvPair>, Tensor<Tracer>)> {
    let mut c = FixedKvCache::from_parts(kv, len)?;
    let h = m.hidden_states_fixed(ids, None, &mut c)?;
    let l = m.head(&h)?;
    let (kv, len) = c.into_parts();
    Ok((l, kv, len))
}

fn compiled(b: &Pjrt, m: &Llama<Pjrt>, cfg: &HfConfig, batch: usize, prompt: usize, capacity: usize) -> CompiledDecode {
    let shape = CacheShape { layers: cfg.layers, batch, kv_heads: cfg.kv_heads, capacity, head_dim: cfg.head_dim };
    CompiledDecode::new(b, m, shape, prompt, |t| Llama::new(t, cfg, DType::F32, 0), logits).unwrap()
}

#[test]
fn compiled_greedy_decoding_gives_the_cpu_tokens() {
    let b = Pjrt::from_env(1).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cfg = HfConfig::from_dir(&fixture()).unwrap();
    let cpu = Cpu::new(2);
    // the committed fixture, one prompt
    let prompt: Vec<i64> = vec![5, 17, 3, 42, 8, 23];
    let (mc, mp) = (
        Llama::from_pretrained(&cpu, &fixture(), DType::F32).unwrap(),
        Llama::from_pretrained(&b, &fixture(), DType::F32).unwrap(),
    );
    let want = greedy(&mc, &Tensor::from_vec(&cpu, prompt.clone(), [1, 6]).unwrap(), 10);
    let dec = compiled(&b, &mp, &cfg, 1, 6, 32);
    let p = Tensor::from_vec(&b, prompt, [1, 6]).unwrap();
    assert_eq!(dec.generate(&p, 10).unwrap(), want);
    // again: nothing compiled; one program execution per token (and one zero fill per
    // cache tensor)
    let before = b.stats();
    assert_eq!(dec.generate(&p, 10).unwrap(), want);
    let after = b.stats();
    assert_eq!((after.compiled - before.compiled, after.executed - before.executed), (0, 10 + 2 * cfg.layers as u64));
    // random weights, a batch of two prompts
    let (rc, rp) = (Llama::new(&cpu, &cfg, DType::F32, 3).unwrap(), Llama::new(&b, &cfg, DType::F32, 3).unwrap());
    let ids: Vec<i64> = (0..8).map(|i| (i * 11 + 2) % cfg.vocab as i64).collect();
    let want = greedy(&rc, &Tensor::from_vec(&cpu, ids.clone(), [2, 4]).unwrap(), 6);
    let got = compiled(&b, &rp, &cfg, 2, 4, 16).generate(&Tensor::from_vec(&b, ids, [2, 4]).unwrap(), 6).unwrap();
    assert_eq!(got, want);
}

#[test]
fn bad_decode_sizes_are_refused() {
    let b = Pjrt::from_env(1).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cfg = HfConfig::from_dir(&fixture()).unwrap();
    let m = Llama::new(&b, &cfg, DType::F32, 3).unwrap();
    let dec = compiled(&b, &m, &cfg, 1, 4, 8);
    let p = Tensor::from_vec(&b, vec![1i64, 2, 3, 4], [1, 4]).unwrap();
    let e = dec.generate(&p, 5).unwrap_err().to_string();
    assert!(e.contains("exceed the cache's 8 positions"), "{e}");
    let q = Tensor::from_vec(&b, vec![1i64, 2, 3], [1, 3]).unwrap();
    let e = dec.generate(&q, 2).unwrap_err().to_string();
    assert!(e.contains("is not the I64 [1, 4]"), "{e}");
}
