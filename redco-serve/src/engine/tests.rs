//! The engine's tests: continuous batching against `generate`, prefix sharing, preemption,
//! prompt log-probabilities and constrained decoding, on a small random LLaMA.

use super::*;
use redco_cpu::Cpu;
use redco_models::generate::{generate, GenerationConfig, Padded};
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use std::collections::BTreeMap;

fn model(b: &Cpu) -> Llama<Cpu> {
    let cfg = HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":50,"max_position_embeddings":64}"#,
    )
    .unwrap();
    Llama::new(b, &cfg, DType::F32, 7).unwrap()
}

fn prompts() -> Vec<Vec<i64>> {
    vec![vec![1, 2, 3], (0..11).map(|i| (i * 7 % 50) as i64).collect(), vec![4; 6], (5..23).collect(), vec![9]]
}

/// Greedy tokens of `prompt` from `generate` (batch of one), run as a padded batch over the
/// concatenating cache: a reference that shares neither the paged cache nor its kernel.
fn generated(b: &Cpu, m: &Llama<Cpu>, prompt: &[i64], n: usize) -> Vec<i64> {
    let ids = Tensor::from_vec(b, prompt.to_vec(), [1, prompt.len()]).unwrap();
    let cfg = GenerationConfig { max_new_tokens: n, stop_tokens: vec![], ..GenerationConfig::for_model(m.config()) };
    let g = generate(&Padded(m), &ids, None, &cfg).unwrap();
    g.rows[0][prompt.len()..].to_vec()
}

/// Runs every prompt through `engine` to the end: each request's tokens.
fn serve(engine: &mut Engine<Cpu, Llama<Cpu>>, n: usize) -> BTreeMap<u64, Vec<i64>> {
    for (i, p) in prompts().into_iter().enumerate() {
        let req = Request {
            id: i as u64,
            prompt: p,
            max_tokens: n,
            sampling: Sampling::Greedy,
            stop_tokens: vec![],
            logprobs: None,
            prompt_logprobs: None,
            guide: None,
        };
        engine.add(req).unwrap();
    }
    let mut out: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    let mut ended = 0;
    for _ in 0..1000 {
        for e in engine.step().unwrap() {
            match e {
                Event::Token { id, token, .. } => out.entry(id).or_default().push(token),
                Event::Finished { reason, .. } => {
                    assert_eq!(reason, Finish::Length);
                    ended += 1;
                }
                Event::PromptLogprobs { .. } => panic!("no request asked for prompt log-probabilities"),
            }
        }
        if !engine.has_work() {
            break;
        }
    }
    assert_eq!(ended, prompts().len(), "every request ends");
    out
}

/// Requests of different lengths batched together, prompts prefilled in chunks, give
/// each the greedy tokens `generate` gives it alone; and they still do when the cache
/// is too small for all of them at once (sequences preempted and recomputed).
#[test]
fn continuous_batches_give_each_request_what_generate_gives_it_alone() {
    let b = Cpu::new(1);
    let m = model(&b);
    let n = 9;
    let want: Vec<Vec<i64>> = prompts().iter().map(|p| generated(&b, &m, p, n)).collect();
    let cfg = EngineConfig { max_batch_tokens: 8, max_running: 8, max_waiting: 16, block_size: 4, blocks: 64 };
    let mut engine = Engine::new(&b, model(&b), cfg, DType::F32).unwrap();
    let got = serve(&mut engine, n);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i as u64)], w, "request {i}");
    }
    let s = engine.stats();
    assert_eq!((s.running, s.waiting, s.kv.used, s.preemptions), (0, 0, 0, 0));
    assert!(s.steps > 5, "several requests ran in each step: {s:?}");
    // a cache of 9 blocks of 4 tokens: not every sequence fits at once
    let small = EngineConfig { blocks: 9, ..cfg };
    let mut engine = Engine::new(&b, model(&b), small, DType::F32).unwrap();
    let got = serve(&mut engine, n);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i as u64)], w, "request {i}, small cache");
    }
    let s = engine.stats();
    assert!(s.preemptions > 0, "the small cache preempted: {s:?}");
    assert_eq!(s.kv.used, 0, "every block released");
}

/// A mixture of experts (Mixtral: 4 experts, 2 per token) served in continuous batches: the
/// router sees ragged batches of prefill chunks and decode tokens, and each request still
/// gets what `generate` gives it alone.
#[test]
fn a_mixture_of_experts_serves_each_request_what_generate_gives_it_alone() {
    let b = Cpu::new(1);
    let cfg = HfConfig::from_json(
        r#"{"model_type":"mixtral","hidden_size":32,"intermediate_size":24,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":50,"max_position_embeddings":64,
            "num_local_experts":4,"num_experts_per_tok":2}"#,
    )
    .unwrap();
    let m = Llama::new(&b, &cfg, DType::F32, 11).unwrap();
    let n = 7;
    let want: Vec<Vec<i64>> = prompts().iter().map(|p| generated(&b, &m, p, n)).collect();
    let ecfg = EngineConfig { max_batch_tokens: 8, max_running: 8, max_waiting: 16, block_size: 4, blocks: 64 };
    let mut engine = Engine::new(&b, Llama::new(&b, &cfg, DType::F32, 11).unwrap(), ecfg, DType::F32).unwrap();
    let got = serve(&mut engine, n);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i as u64)], w, "request {i}");
    }
}

/// Prompt log-probabilities: every prompt token from the second is scored once, by the
/// whole prompt's forward pass's logits at the position before it, whatever the
/// chunking, with the same prompt already cached (it is computed again, not skipped),
/// and across preemption (recomputed positions are not reported twice).
#[test]
fn prompt_logprobs_are_the_forward_pass_s_at_every_position_once() {
    let b = Cpu::new(1);
    let m = model(&b);
    let top = 3;
    let want: Vec<Vec<(i64, Logprob)>> = prompts()
        .iter()
        .map(|p| {
            let ids = Tensor::from_vec(&b, p.clone(), [1, p.len()]).unwrap();
            let logits = m.forward(&ids, None, None).unwrap().to_vec_f32().unwrap();
            (1..p.len()).map(|k| (p[k], Logprob::of(&logits[(k - 1) * 50..k * 50], p[k] as usize, top))).collect()
        })
        .collect();
    let base = EngineConfig { max_batch_tokens: 5, max_running: 8, max_waiting: 32, block_size: 4, blocks: 64 };
    for cfg in [base, EngineConfig { blocks: 9, ..base }] {
        let mut engine = Engine::new(&b, model(&b), cfg, DType::F32).unwrap();
        // each prompt twice: the second finds the first's blocks cached
        for (i, p) in prompts().into_iter().chain(prompts()).enumerate() {
            let req = Request {
                id: i as u64,
                prompt: p,
                max_tokens: 4,
                sampling: Sampling::Greedy,
                stop_tokens: vec![],
                logprobs: Some(top),
                prompt_logprobs: Some(top),
                guide: None,
            };
            engine.add(req).unwrap();
        }
        let mut got: BTreeMap<u64, Vec<(i64, Logprob)>> = BTreeMap::new();
        let mut tokens: BTreeMap<u64, usize> = BTreeMap::new();
        for _ in 0..2000 {
            for e in engine.step().unwrap() {
                match e {
                    Event::PromptLogprobs { id, first, logprobs } => {
                        let g = got.entry(id).or_default();
                        assert_eq!(first, g.len() + 1, "request {id}: positions in order, each once");
                        assert!(!tokens.contains_key(&id), "request {id}: the prompt is scored before any token");
                        g.extend(logprobs);
                    }
                    Event::Token { id, .. } => *tokens.entry(id).or_default() += 1,
                    Event::Finished { .. } => {}
                }
            }
            if !engine.has_work() {
                break;
            }
        }
        let n = prompts().len();
        for id in 0..2 * n as u64 {
            let (w, g) = (&want[id as usize % n], got.remove(&id).unwrap_or_default());
            assert_eq!(g.len(), w.len(), "request {id}: every position from 1 ({cfg:?})");
            for ((gt, gl), (wt, wl)) in g.iter().zip(w) {
                assert_eq!(gt, wt);
                assert!((gl.logprob - wl.logprob).abs() < 1e-4, "request {id}: {gl:?} vs {wl:?}");
                let ids = |l: &Logprob| l.top.iter().map(|t| t.0).collect::<Vec<_>>();
                assert_eq!(ids(gl), ids(wl), "request {id}: the same alternatives");
            }
            assert_eq!(tokens[&id], 4, "request {id} generated as asked");
        }
        if cfg.blocks == 9 {
            assert!(engine.stats().preemptions > 0, "the small cache preempted");
        }
    }
}

/// Constrained requests on random weights, greedy and sampled, batched with an
/// unconstrained one: every constrained output is one its grammar accepts (a JSON
/// object valid against its schema, a regex match, one of the choices), ended by the
/// grammar; the unconstrained request gets what `generate` gives it alone.
#[test]
fn constrained_requests_give_what_their_grammar_accepts_whatever_the_weights() {
    use crate::guide::Guides;
    let b = Cpu::new(1);
    let dir = std::env::temp_dir().join(format!("redco-engine-guide-{}", std::process::id()));
    redco_models::presets::write_byte_tokenizer(&dir).unwrap();
    let tok = redco_models::hf::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let cfg = HfConfig::from_json(&format!(
        r#"{{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":{},"max_position_embeddings":512}}"#,
        tok.vocab_size()
    ))
    .unwrap();
    let model = || Llama::new(&b, &cfg, DType::F32, 11).unwrap();
    let guides = Arc::new(Guides::from_dir(&dir, cfg.vocab, &[2]).unwrap());
    let ecfg = EngineConfig { max_batch_tokens: 16, max_running: 8, max_waiting: 16, block_size: 4, blocks: 256 };
    let mut engine = Engine::new(&b, model(), ecfg, DType::F32).unwrap().with_guides(guides);
    let schema = serde_json::json!({"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"type": "string", "enum": ["red", "green"]}},
        "required": ["n", "ok", "tag"], "additionalProperties": false});
    let specs = [
        Some(GuideSpec::JsonSchema(schema)),
        Some(GuideSpec::Regex("[a-c]{2,4}x".into())),
        Some(GuideSpec::Choice(vec!["yes".into(), "no".into(), "maybe so".into()])),
        None,
    ];
    let prompt = tok.encode("Answer:", false).unwrap();
    let samplings = [Sampling::Greedy, Sampling::Sample { temperature: 1.0, top_k: None, top_p: None, seed: 5 }];
    let mut id = 0;
    let mut asked = BTreeMap::new();
    for sampling in &samplings {
        for spec in &specs {
            let req = Request {
                id,
                prompt: prompt.clone(),
                max_tokens: 64,
                sampling: sampling.clone(),
                stop_tokens: vec![2],
                logprobs: None,
                prompt_logprobs: None,
                guide: spec.clone().map(Arc::new),
            };
            engine.add(req).unwrap();
            asked.insert(id, (spec.clone(), sampling.clone()));
            id += 1;
        }
    }
    let mut out: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    let mut ended = BTreeMap::new();
    for _ in 0..2000 {
        for e in engine.step().unwrap() {
            match e {
                Event::Token { id, token, .. } => out.entry(id).or_default().push(token),
                Event::Finished { id, reason } => drop(ended.insert(id, reason)),
                Event::PromptLogprobs { .. } => unreachable!(),
            }
        }
        if !engine.has_work() {
            break;
        }
    }
    for (id, (spec, sampling)) in asked {
        let ids: Vec<i64> = out[&id].iter().copied().filter(|&t| t != 2).collect();
        let text = tok.decode(&ids, true).unwrap();
        match spec {
            Some(GuideSpec::JsonSchema(_)) => {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
                let n = v["n"].as_i64().unwrap_or(-1);
                assert!((0..=99).contains(&n) && v["ok"].is_boolean(), "{v}");
                assert!(["red", "green"].contains(&v["tag"].as_str().unwrap_or("")), "{v}");
                assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
            }
            Some(GuideSpec::Regex(_)) => {
                let (body, x) = text.split_at(text.len().saturating_sub(1));
                assert!(
                    x == "x" && (2..=4).contains(&body.len()) && body.chars().all(|c| "abc".contains(c)),
                    "{text:?}"
                );
            }
            Some(GuideSpec::Choice(c)) => assert!(c.contains(&text), "{text:?}"),
            None => {
                if sampling == Sampling::Greedy {
                    // generate's tokens, up to the stop token the request has
                    let want = generated(&b, &model(), &prompt, 64);
                    assert_eq!(out[&id], want[..out[&id].len()], "the unconstrained request");
                }
                continue;
            }
        }
        assert_eq!(ended[&id], Finish::Stop, "request {id} ended by its grammar: {text:?}");
    }
    // a grammar llguidance refuses is refused when added
    let bad = Request {
        id: 99,
        prompt: prompt.clone(),
        max_tokens: 4,
        sampling: Sampling::Greedy,
        stop_tokens: vec![],
        logprobs: None,
        prompt_logprobs: None,
        guide: Some(Arc::new(GuideSpec::Regex("(".into()))),
    };
    assert!(engine.add(bad.clone()).is_err());
    // as is any grammar on an engine without the model's vocabulary
    let mut plain = Engine::new(&b, model(), ecfg, DType::F32).unwrap();
    let e = plain.add(Request { guide: Some(Arc::new(GuideSpec::Regex("a".into()))), ..bad }).unwrap_err();
    assert!(e.to_string().contains("constrained decoding"), "{e}");
}

/// Requests sharing a long prompt prefix, all queued at once: the prefix is computed
/// once (the others find its blocks in the cache), and each still gets `generate`'s
/// tokens.
#[test]
fn a_shared_prefix_is_computed_once_for_requests_arriving_together() {
    let b = Cpu::new(1);
    let m = model(&b);
    let prefix: Vec<i64> = (0..32).map(|i| (i * 3 % 50) as i64).collect();
    let prompts: Vec<Vec<i64>> = (0..8).map(|i| prefix.iter().copied().chain([i, i + 1]).collect()).collect();
    let want: Vec<Vec<i64>> = prompts.iter().map(|p| generated(&b, &m, p, 4)).collect();
    let cfg = EngineConfig { max_batch_tokens: 16, max_running: 8, max_waiting: 16, block_size: 4, blocks: 64 };
    let mut engine = Engine::new(&b, model(&b), cfg, DType::F32).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let req = Request {
            id: i as u64,
            prompt: p.clone(),
            max_tokens: 4,
            sampling: Sampling::Greedy,
            stop_tokens: vec![],
            logprobs: None,
            prompt_logprobs: None,
            guide: None,
        };
        engine.add(req).unwrap();
    }
    let mut out: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    while engine.has_work() {
        for e in engine.step().unwrap() {
            if let Event::Token { id, token, .. } = e {
                out.entry(id).or_default().push(token);
            }
        }
    }
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&out[&(i as u64)], w, "request {i}");
    }
    // the 32-token prefix (8 full blocks) computed by the first request only
    let s = engine.stats().kv;
    assert_eq!(s.prefix_hit_tokens, 7 * 32, "{s:?}");
    assert_eq!(s.prompt_tokens, 8 * 34);
}

/// 32 requests sharing a 256-token prefix: its prefill runs once (the first request's),
/// counted in the tokens the model ran and in the cache's hits, and each request still
/// gets `generate`'s tokens.
#[test]
fn thirty_two_requests_sharing_a_256_token_prefix_prefill_it_once() {
    let b = Cpu::new(1);
    let cfg = HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":50,"max_position_embeddings":512}"#,
    )
    .unwrap();
    let m = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
    let prefix: Vec<i64> = (0..256).map(|i| (i * 7 % 50) as i64).collect();
    let prompts: Vec<Vec<i64>> =
        (0..32).map(|i| prefix.iter().copied().chain([i % 50, (i + 1) % 50]).collect()).collect();
    let ecfg = EngineConfig { max_batch_tokens: 128, max_running: 32, max_waiting: 64, block_size: 16, blocks: 256 };
    let mut engine = Engine::new(&b, Llama::new(&b, &cfg, DType::F32, 7).unwrap(), ecfg, DType::F32).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let req = Request {
            id: i as u64,
            prompt: p.clone(),
            max_tokens: 3,
            sampling: Sampling::Greedy,
            stop_tokens: vec![],
            logprobs: None,
            prompt_logprobs: None,
            guide: None,
        };
        engine.add(req).unwrap();
    }
    let mut out: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    while engine.has_work() {
        for e in engine.step().unwrap() {
            if let Event::Token { id, token, .. } = e {
                out.entry(id).or_default().push(token);
            }
        }
    }
    for i in [0usize, 1, 17, 31] {
        assert_eq!(out[&(i as u64)], generated(&b, &m, &prompts[i], 3), "request {i}");
    }
    assert_eq!(out.len(), 32);
    let s = engine.stats();
    // the first request's 258 prompt tokens, then each other's 2 after the 16 shared blocks
    assert_eq!(s.prefilled, 258 + 31 * 2, "{s:?}");
    assert_eq!(s.kv.prefix_hit_tokens, 31 * 256, "{s:?}");
    assert_eq!(s.preemptions, 0);
}

#[test]
fn logprobs_are_the_log_softmax_of_the_logits_with_the_most_likely_first() {
    let logits = [1.0f32, 3.0, 2.0, 3.0];
    let lse = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln() as f32;
    let l = Logprob::of(&logits, 2, 3);
    assert!((l.logprob - (2.0 - lse)).abs() < 1e-6);
    // ties broken by the lower id
    assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
    assert!((l.top[0].1 - (3.0 - lse)).abs() < 1e-6);
    assert!(Logprob::of(&logits, 0, 0).top.is_empty());
    let total: f64 = Logprob::of(&logits, 0, 4).top.iter().map(|t| (t.1 as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
}

#[test]
fn bad_requests_are_refused_and_a_full_queue_says_so() {
    let b = Cpu::new(1);
    let cfg = EngineConfig { max_batch_tokens: 8, max_running: 2, max_waiting: 1, block_size: 4, blocks: 4 };
    let mut engine = Engine::new(&b, model(&b), cfg, DType::F32).unwrap();
    let req = |id, prompt: Vec<i64>| Request {
        id,
        prompt,
        max_tokens: 4,
        sampling: Sampling::Greedy,
        stop_tokens: vec![],
        logprobs: None,
        prompt_logprobs: None,
        guide: None,
    };
    assert!(engine.add(req(0, vec![])).is_err(), "empty prompt");
    assert!(engine.add(req(0, vec![1; 64])).is_err(), "the whole context");
    assert!(engine.add(req(0, vec![1; 17])).unwrap_err().to_string().contains("KV blocks"));
    let bad = Request {
        sampling: Sampling::Sample { temperature: 0.0, top_k: None, top_p: None, seed: 1 },
        ..req(0, vec![1])
    };
    assert!(engine.add(bad).is_err(), "temperature 0");
    engine.add(req(1, vec![1, 2])).unwrap();
    assert!(engine.add(req(2, vec![1, 2])).unwrap_err().to_string().contains("queue is full"));
    // the kind says what the HTTP layer answers: 429 for a full queue, 400 for the rest
    assert!(matches!(engine.add(req(3, vec![1, 2])), Err(Refused::Busy(_))));
    assert!(matches!(engine.add(req(3, vec![])), Err(Refused::Invalid(_))));
    assert!(engine.cancel(1) && !engine.cancel(1));
    assert!(!engine.has_work());
}
