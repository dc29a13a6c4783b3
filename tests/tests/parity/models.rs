//! GPT-J, OPT (both layer-norm placements, with project_in/out) and T5 (v1.0 and v1.1)
//! against transformers: logits, loss, every gradient and greedy tokens (T5 also 4-beam
//! tokens), on padded batches, at 1x1, 1x2 and 2x2 with the plan from the traced step; and
//! the rules' placements equal Megatron's split with every parameter renamed. Mixtral and
//! Qwen3-MoE (sparse mixtures of experts) at 1x1, their loss with the router's load-balancing
//! term.

use redco_core::nn::ModuleExt;
use redco_core::planning::trace::plan_from_trace;
use redco_core::{
    planning::ShardPlan,
    runtime::{Mesh, SpmdOptions},
};
use redco_core::{DType, Placement, Result, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::generate::{generate, BeamConfig, GenerationConfig};
use redco_models::hf::config::HfConfig;
use redco_models::hf::safetensors::{read_all, HostTensor};
use redco_models::hf::save::{hf_tensors, save_pretrained};
use redco_models::t5::T5;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

type Inputs = BTreeMap<String, HostTensor>;

fn inputs(name: &str) -> Inputs {
    read_all(&dir(name).join("inputs.safetensors")).unwrap()
}

fn t(b: &Cpu, i: &Inputs, k: &str) -> Tensor<Cpu> {
    Tensor::from_host(b, &i[k].data, i[k].shape.clone()).unwrap()
}

struct Out {
    logits: Vec<f64>,
    loss: f64,
    grads: BTreeMap<String, Vec<f64>>,
    generated: Vec<i64>,
    beams: Option<Vec<i64>>,
}

fn grads_of<M: ModuleExt<Cpu>>(m: &M, loss: &Tensor<Cpu>) -> Result<BTreeMap<String, Vec<f64>>> {
    let g = loss.backward()?;
    let mut out = BTreeMap::new();
    for (n, p) in m.named_parameters() {
        let gp = g.get(&p).ok_or_else(|| redco_core::Error::invalid("test", format!("no gradient for {n}")))?;
        // a gradient stacked over experts compares expert by expert, under the file's names
        for (n, gp) in hf_tensors(vec![(n, gp.clone())])? {
            out.insert(n, gp.replicate()?.to_vec_f64()?);
        }
    }
    Ok(out)
}

fn run(name: &str, b: &Cpu, plan: Option<&ShardPlan>) -> Result<Out> {
    let i = inputs(name);
    let cfg = HfConfig::from_dir(&dir(name))?;
    let (ids, mask, labels) = (t(b, &i, "input_ids"), t(b, &i, "attention_mask"), t(b, &i, "labels"));
    let (gids, gmask) = (t(b, &i, "gen_input_ids"), t(b, &i, "gen_attention_mask"));
    // the model's stop tokens; the fixtures were generated with `pad_token_id=0` where the
    // config has none (transformers' default would pad with the eos token)
    let greedy = GenerationConfig {
        max_new_tokens: 8,
        pad_token: cfg.pad_token_id.unwrap_or(0),
        ..GenerationConfig::for_model(&cfg)
    };
    if cfg.model_type == "t5" {
        let m = T5::from_pretrained(b, &dir(name), DType::F32, plan)?;
        let dec = t(b, &i, "decoder_input_ids");
        assert_eq!(m.shift_right(&labels)?.to_vec_i64()?, dec.to_vec_i64()?, "shifted labels");
        let logits = m.forward(&ids, Some(&mask), &dec)?.replicate()?.to_vec_f64()?;
        let loss = m.loss(&ids, Some(&mask), &labels, None)?;
        let grads = grads_of(&m, &loss)?;
        let generated = m.generate(&gids, Some(&gmask), &greedy)?.concat();
        let bc = BeamConfig { max_new_tokens: 8, early_stopping: true, ..BeamConfig::for_model(&cfg, 4) };
        let beams = Some(m.generate_beam(&gids, Some(&gmask), &bc)?.concat());
        return Ok(Out { logits, loss: loss.replicate()?.to_scalar()?, grads, generated, beams });
    }
    let mut m = AutoModel::from_pretrained(b, &dir(name), DType::F32, plan)?;
    if let Some(p) = plan {
        // what the loader left whole (a mixture's stacked experts) is cut as planned
        p.apply(&mut m, redco_core::runtime::current_comm::<Cpu>().as_ref())?;
    }
    let logits = m.forward(&ids, Some(&mask))?.replicate()?.to_vec_f64()?;
    let loss = m.loss(&ids, Some(&mask), &labels)?;
    let grads = grads_of(&m, &loss)?;
    let generated = generate(&m, &gids, Some(&gmask), &greedy)?.rows.concat();
    Ok(Out { logits, loss: loss.replicate()?.to_scalar()?, grads, generated, beams: None })
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

fn check(name: &str, o: &Out, what: &str) {
    let r = read_all(&dir(name).join("reference.safetensors")).unwrap();
    let e = rel_l2(&o.logits, &r["logits"].data.to_f64_vec());
    assert!(e <= 1e-4, "{name} {what}: logits relative L2 error {e}");
    let want = r["loss"].data.to_f64_vec()[0];
    assert!((o.loss - want).abs() <= 1e-4 * want.abs(), "{name} {what}: loss {} vs {want}", o.loss);
    assert_eq!(o.grads.len(), r.keys().filter(|k| k.starts_with("grad.")).count(), "{name}: gradient count");
    let mut worst = 0.0f64;
    for (n, g) in &o.grads {
        let w = r[&format!("grad.{n}")].data.to_f64_vec();
        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
        // gradients that are zero in exact arithmetic (e.g. a key bias) compare absolutely
        let err =
            if norm < 1e-5 { g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) } else { rel_l2(g, &w) };
        worst = worst.max(err);
        assert!(err <= 1e-3, "{name} {what}: gradient of {n}: error {err}");
    }
    let ids = |k: &str| r[k].data.to_f64_vec().into_iter().map(|x| x as i64).collect::<Vec<_>>();
    assert_eq!(o.generated, ids("generated_ids"), "{name} {what}: greedy tokens");
    if let Some(b) = &o.beams {
        assert_eq!(b, &ids("beam_generated_ids"), "{name} {what}: beam tokens");
    }
    eprintln!("{name} {what}: logits {e:.1e}, loss {} vs {want}, worst gradient {worst:.1e}", o.loss);
}

/// The rules' plan from one traced step with every parameter renamed `p<i>`.
fn opaque_plan(name: &str, mesh: Mesh) -> ShardPlan {
    let b = Cpu::new(1);
    let i = inputs(name);
    let cfg = HfConfig::from_dir(&dir(name)).unwrap();
    let (ids, mask, labels) = (t(&b, &i, "input_ids"), t(&b, &i, "attention_mask"), t(&b, &i, "labels"));
    let (named, loss) = if cfg.model_type == "t5" {
        let m = T5::from_pretrained(&b, &dir(name), DType::F32, None).unwrap();
        let loss = m.loss(&ids, Some(&mask), &labels, None).unwrap();
        (m.named_parameters(), loss)
    } else {
        let m = AutoModel::from_pretrained(&b, &dir(name), DType::F32, None).unwrap();
        let loss = m.loss(&ids, Some(&mask), &labels).unwrap();
        (m.named_parameters(), loss)
    };
    let hidden: Vec<(String, Tensor<Cpu>)> =
        named.iter().enumerate().map(|(i, (_, p))| (format!("p{i}"), p.clone())).collect();
    let mut plan = plan_from_trace(&hidden, &[&loss], mesh, true).unwrap();
    let back: BTreeMap<String, String> =
        named.iter().enumerate().map(|(i, (n, _))| (format!("p{i}"), n.clone())).collect();
    plan.params = plan.params.into_iter().map(|(k, v)| (back[&k].clone(), v)).collect();
    plan
}

/// Megatron's split by transformers' names.
fn megatron(name: &str) -> Placement {
    let mut it = name.rsplit('.');
    let (leaf, owner) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
    let col =
        ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "fc_in", "fc1", "q", "k", "v", "wi", "wi_0", "wi_1"];
    let row = ["o_proj", "down_proj", "out_proj", "fc_out", "fc2", "o", "wo"];
    if name.contains(".*.") {
        // a stack of experts `[E, out, in]`: each expert split like a pair
        return match owner {
            "w1" | "w3" | "gate_proj" | "up_proj" => Placement::Shard(1),
            "w2" | "down_proj" => Placement::Shard(2),
            _ => Placement::Replicate,
        };
    }
    let vocab = ["wte", "embed_tokens", "embed_positions", "shared", "lm_head"];
    if owner == "relative_attention_bias" {
        Placement::Shard(1)
    } else if col.contains(&owner) || (vocab.contains(&owner) && leaf == "weight") {
        Placement::Shard(0)
    } else if row.contains(&owner) && leaf == "weight" {
        Placement::Shard(1)
    } else if owner == "lm_head" && leaf == "bias" {
        Placement::Shard(0)
    } else {
        Placement::Replicate
    }
}

fn parity(name: &str) {
    check(name, &run(name, &Cpu::new(2), None).unwrap(), "1x1");
    for mesh in ["1x2", "2x2"] {
        let mesh: Mesh = mesh.parse().unwrap();
        let plan = opaque_plan(name, mesh);
        for (n, p) in &plan.params {
            assert_eq!(p.placement, megatron(n), "{name}: {n} at {mesh}:\n{plan}");
        }
        let outs = spmd_cpu(mesh, &SpmdOptions::default(), |rk| run(name, &rk.backend, Some(&plan.at_rank(rk.rank)?)))
            .unwrap();
        for o in &outs {
            check(name, o, &mesh.to_string());
        }
    }
}

#[test]
fn gptj_matches_transformers_at_1x1_1x2_2x2() {
    parity("gptj-tiny");
}

#[test]
fn opt_matches_transformers_at_1x1_1x2_2x2() {
    parity("opt-tiny");
}

#[test]
fn opt_350m_shape_matches_transformers_at_1x1_1x2_2x2() {
    parity("opt-350m-shape");
}

#[test]
fn t5_matches_transformers_at_1x1_1x2_2x2() {
    parity("t5-tiny");
}

#[test]
fn t5_v1_1_matches_transformers_at_1x1_1x2_2x2() {
    parity("t5-v1_1-tiny");
}

/// A mixture of experts against transformers at 1x1, 1x2 and 2x2 (the rules split the
/// attention; each rank runs its experts whole): logits, the loss with 0.02 x the
/// load-balancing loss over the padded batch, every gradient (router and each expert),
/// greedy tokens; its aux loss alone; and `save_pretrained` writes the checkpoint's own
/// tensor names (one per expert), which load back to the same logits.
fn moe_parity(name: &str) {
    parity(name);
    let b = Cpu::new(2);
    let i = inputs(name);
    let (ids, mask) = (t(&b, &i, "input_ids"), t(&b, &i, "attention_mask"));
    let m = redco_models::llama::Llama::from_pretrained(&b, &dir(name), DType::F32).unwrap();
    let aux = m.router_aux_loss(&ids, Some(&mask)).unwrap().to_scalar().unwrap();
    let r = read_all(&dir(name).join("reference.safetensors")).unwrap();
    let want = r["aux_loss"].data.to_f64_vec()[0];
    assert!((aux - want).abs() <= 1e-5 * want.abs(), "{name}: aux loss {aux} vs {want}");
    let out = std::env::temp_dir().join(format!("redco-{name}-save-{}", std::process::id()));
    save_pretrained(&m, &m.cfg, &out, usize::MAX, None).unwrap();
    let names = |d: &std::path::Path| read_all(&d.join("model.safetensors")).unwrap().into_keys().collect::<Vec<_>>();
    assert_eq!(names(&out), names(&dir(name)), "{name}: the saved tensor names");
    let back = redco_models::llama::Llama::from_pretrained(&b, &out, DType::F32).unwrap();
    let (l1, l2) = (m.forward(&ids, Some(&mask), None).unwrap(), back.forward(&ids, Some(&mask), None).unwrap());
    assert_eq!(l1.to_vec_f64().unwrap(), l2.to_vec_f64().unwrap(), "{name}: logits after a save and load");
    let _ = std::fs::remove_dir_all(&out);
    // under block and selective recompute the routers' statistics leave each recomputed
    // layer as its outputs: the loss with the load-balancing term and every gradient equal
    // the run keeping its activations
    let labels = t(&b, &i, "labels");
    let kept = m.loss(&ids, Some(&mask), &labels).unwrap();
    let kept_grads = kept.backward().unwrap();
    let mut m = m;
    for mode in [redco_core::Recompute::Block, redco_core::Recompute::Selective] {
        m.set_recompute(mode);
        let loss = m.loss(&ids, Some(&mask), &labels).unwrap();
        let (x, y) = (loss.to_scalar().unwrap(), kept.to_scalar().unwrap());
        assert!((x - y).abs() <= 1e-6 * y.abs(), "{name} recompute {}: loss {x} vs {y}", mode.name());
        let grads = loss.backward().unwrap();
        for (n, p) in m.named_parameters() {
            let (g, want) = (grads.get(&p).unwrap(), kept_grads.get(&p).unwrap());
            let what = format!("{name} recompute {}: gradient of {n}", mode.name());
            redco_tests::check::assert_close(&g.to_vec_f64().unwrap(), &want.to_vec_f64().unwrap(), 1e-5, &what);
        }
    }
    // a config with absurdly many experts is refused before anything is sized from it
    let mut raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir(name).join("config.json")).unwrap()).unwrap();
    raw["num_local_experts"] = serde_json::json!(1_000_000_000u64);
    raw["num_experts"] = serde_json::json!(1_000_000_000u64);
    let e = HfConfig::from_json(&raw.to_string()).unwrap_err();
    assert!(e.to_string().contains("experts"), "{name}: {e}");
}

/// Mixtral: 4 experts, 2 per token, renormalised.
#[test]
fn mixtral_matches_transformers_at_1x1_1x2_2x2_and_saves_its_checkpoint_names() {
    moe_parity("mixtral-tiny");
}

/// Qwen3-MoE: QK-norm, an explicit head_dim, top-2 of 4 experts not renormalised, a dense
/// MLP in layer 1 (`mlp_only_layers`) beside the sparse ones.
#[test]
fn qwen3_moe_matches_transformers_at_1x1_1x2_2x2_and_saves_its_checkpoint_names() {
    moe_parity("qwen3-moe-tiny");
}
