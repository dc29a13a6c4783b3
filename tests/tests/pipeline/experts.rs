//! A mixture of experts through the Trainer under expert parallelism with every ZeRO
//! stage and activation recompute: the experts split over `dp` are each rank's own (never
//! sliced or gathered by ZeRO), everything else is sliced as usual, and the routers'
//! statistics leave each recomputed block as its outputs (the load-balancing loss
//! differentiates into the recomputed routers); every run trains as the run with every
//! expert on every rank, ZeRO off and every activation kept (losses and exported weights
//! within 1e-5), and a checkpoint of split experts resumes at another stage and `ep`.

use super::{corpus, read_model, workdir};
use redco_core::nn::{ModuleExt, ParamPlacer};
use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::planning::heuristics::plan_by_names;
use redco_core::planning::planner::{predict_comm, Workload};
use redco_core::runtime::CollectiveKind;
use redco_core::{Backend, DType, MeshAxis, Recompute, Result, Tensor};
use redco_cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::hf::config::HfConfig;
use redco_pipeline::{Batch, Deployer, FitReport, OptimizerConfig, StepCtx, TrainConfig, Trainer, ZeroStage};

/// Steps of every run.
const STEPS: u64 = 12;

/// Tokens per example of the corpus.
const SEQ: usize = 12;

/// A Mixtral of 2 layers and 4 experts (2 per token), with the load-balancing loss.
fn model_cfg() -> HfConfig {
    HfConfig::from_json(
        r#"{"model_type":"mixtral","hidden_size":32,"intermediate_size":24,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":16,"num_local_experts":4,
            "num_experts_per_tok":2,"output_router_logits":true,"router_aux_loss_coef":0.02,
            "tie_word_embeddings":false,"max_position_embeddings":64}"#,
    )
    .unwrap()
}

fn collate<B: Backend>(b: &B, ex: &[Vec<i64>]) -> Result<Batch<B>> {
    let t = ex[0].len();
    let ids: Vec<i64> = ex.iter().flatten().copied().collect();
    Ok(Batch::from([("input_ids".to_string(), Tensor::from_vec(b, ids, [ex.len(), t])?)]))
}

fn config(zero: ZeroStage, ep: usize, steps: u64, every: Option<u64>) -> TrainConfig {
    TrainConfig {
        batch_size: 8,
        steps,
        schedule: Schedule { peak: 3e-3, warmup: 2, total: STEPS, decay: Decay::Cosine },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.01, ..Default::default() }),
        clip_norm: Some(1.0),
        log_every: 100,
        zero,
        ep,
        checkpoint_every: every,
        keep_last: 0,
        ..Default::default()
    }
}

fn trainer(cfg: TrainConfig, recompute: Recompute) -> Trainer<AutoModel<Cpu>, Vec<i64>> {
    let model = model_cfg();
    Trainer::for_backend_placed(
        move |b: &Cpu, placer: &dyn ParamPlacer<Cpu>| {
            let mut m = AutoModel::new_placed(b, &model, DType::F32, 9, placer)?;
            m.set_recompute(recompute);
            Ok(m)
        },
        collate,
        |_: &StepCtx<_>, m: &AutoModel<_>, b: &Batch<_>| m.loss(&b["input_ids"], None, &b["input_ids"]),
        cfg,
    )
}

fn run(mesh: &str, zero: ZeroStage, ep: usize, recompute: Recompute) -> (FitReport, Vec<(String, Vec<u8>)>) {
    let tag = format!("moe-{mesh}-{zero:?}-ep{ep}-{}", recompute.name());
    let dep = Deployer::new(mesh.parse().unwrap(), 3, &workdir(&tag)).unwrap();
    let r = trainer(config(zero, ep, STEPS, None), recompute).fit(&dep, &corpus().sequences(0, 256), false).unwrap();
    let model = read_model(&dep.workdir);
    let _ = std::fs::remove_dir_all(&dep.workdir);
    (r, model)
}

fn floats(v: &[u8]) -> Vec<f64> {
    v.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
}

fn same(a: &(FitReport, Vec<(String, Vec<u8>)>), b: &(FitReport, Vec<(String, Vec<u8>)>), tag: &str) {
    assert_eq!(a.0.losses.len(), b.0.losses.len(), "{tag}: steps");
    for (i, (x, y)) in a.0.losses.iter().zip(&b.0.losses).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "{tag}: step {i}: reference {x}, this run {y}");
    }
    assert_eq!(a.1.len(), b.1.len(), "{tag}: exported tensors");
    for ((n, x), (m, y)) in a.1.iter().zip(&b.1) {
        assert_eq!(n, m);
        redco_tests::check::assert_close(&floats(x), &floats(y), 1e-5, &format!("{tag}: {n}"));
    }
}

/// Expert parallelism at ep = dp under ZeRO-1, 2 and 3 (at 2x1, 4x1 and 2x2, tensor
/// parallelism inside the experts), with and without block and selective recompute (the
/// load-balancing loss on), trains as every expert on every rank with ZeRO off and every
/// activation kept:
/// every step's loss and every exported weight within 1e-5. Under ZeRO-2 and 3 the bytes
/// reduce-scattered and all-gathered over dp are the planner's to the byte (no expert
/// stack sliced or gathered), and under ZeRO-3 fewer than with every expert sliced.
#[test]
fn expert_parallelism_composes_with_every_zero_stage() {
    let (mut reference, mut sliced_experts) = (std::collections::HashMap::new(), std::collections::HashMap::new());
    let cases = [
        ("1x1", ZeroStage::Off, 1, Recompute::Block),
        ("1x1", ZeroStage::Off, 1, Recompute::Selective),
        ("2x1", ZeroStage::Optimizer, 2, Recompute::None),
        ("2x1", ZeroStage::Gradients, 2, Recompute::None),
        ("2x1", ZeroStage::Parameters, 2, Recompute::None),
        ("2x1", ZeroStage::Off, 2, Recompute::Block),
        ("4x1", ZeroStage::Gradients, 4, Recompute::Selective),
        ("4x1", ZeroStage::Parameters, 4, Recompute::None),
        ("4x1", ZeroStage::Parameters, 4, Recompute::Block),
        ("2x2", ZeroStage::Parameters, 2, Recompute::Selective),
    ];
    for (mesh, zero, ep, recompute) in cases {
        let base = reference.entry(mesh).or_insert_with(|| run(mesh, ZeroStage::Off, 1, Recompute::None)).clone();
        assert!(base.0.losses[STEPS as usize - 1] < base.0.losses[0], "it learns: {:?}", base.0.losses);
        let this = run(mesh, zero, ep, recompute);
        let tag = format!("{mesh} ZeRO-{} ep {ep} recompute {}", zero.number(), recompute.name());
        same(&base, &this, &tag);
        let whole_zero3 = match zero {
            ZeroStage::Parameters => *sliced_experts.entry(mesh).or_insert_with(|| zero3_gathers(mesh)),
            _ => 0,
        };
        // (ZeRO-1 with clipping sums the gradients for the norm first: its moves are DDP's)
        let predicted = if zero == ZeroStage::Optimizer { Vec::new() } else { predicted_dp(mesh, zero, ep, recompute) };
        for (rank, st) in &this.0.comm {
            let all_to_alls = st.get(CollectiveKind::AllToAll, MeshAxis::Dp).calls;
            assert_eq!(all_to_alls > 0, ep > 1, "{tag}: rank {rank}: all-to-alls");
            for (kind, want) in &predicted {
                assert_eq!(st.get(*kind, MeshAxis::Dp).bytes, STEPS * want, "{tag}: rank {rank}: {kind:?} bytes");
            }
            if zero == ZeroStage::Parameters {
                // the experts are not gathered: fewer bytes than with every expert sliced
                let ag = st.get(CollectiveKind::AllGather, MeshAxis::Dp).bytes;
                assert!(ag < whole_zero3, "{tag}: rank {rank}: {ag} bytes gathered, {whole_zero3} with ep 1");
            }
        }
    }
}

/// The planner's bytes per step over dp of ZeRO's collectives (reduce-scatters and
/// all-gathers: the experts split over dp neither; the routers' count gathers), for the
/// run at `mesh`, `zero`, `ep`, `recompute`.
fn predicted_dp(mesh: &str, zero: ZeroStage, ep: usize, recompute: Recompute) -> Vec<(CollectiveKind, u64)> {
    let cfg = model_cfg();
    let shapes: Vec<_> = AutoModel::<Cpu>::new(&Cpu::new(1), &cfg, DType::F32, 9)
        .unwrap()
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.shape().clone()))
        .collect();
    let plan = plan_by_names(&shapes, mesh.parse().unwrap()).with_ep(ep).unwrap();
    let work = Workload { batch: 8, seq: SEQ, dtype_bytes: 4, zero: zero.number(), recompute, unit_layers: 1 };
    let st = predict_comm(&plan, &cfg.dims(), &work);
    [CollectiveKind::ReduceScatter, CollectiveKind::AllGather]
        .into_iter()
        .map(|k| (k, st.get(k, MeshAxis::Dp).bytes))
        .collect()
}

/// The all-gather bytes over dp of rank 0 of a ZeRO-3 run at `mesh` with every expert on
/// every rank (ep 1): what ZeRO-3 gathers when the experts are sliced like the rest.
fn zero3_gathers(mesh: &str) -> u64 {
    let r = run(mesh, ZeroStage::Parameters, 1, Recompute::None);
    r.0.comm.values().next().map(|st| st.get(CollectiveKind::AllGather, MeshAxis::Dp).bytes).unwrap_or(0)
}

/// A ZeRO-2 run at ep 2 checkpoints its split experts (each dp rank's own, recorded as
/// split in the manifest) and resumes exactly; the same checkpoint resumes at ZeRO-0 with
/// every expert on every rank (reassembled from both ranks' files) and at ZeRO-3 at 4x1
/// with ep 4, each continuing the uninterrupted run's losses within 1e-5; a ZeRO-0
/// checkpoint at ep 2 resumes at the same mesh and stage with every expert on every rank.
#[test]
fn split_experts_checkpoint_and_resume_at_another_stage_and_ep() {
    let data = corpus().sequences(0, 256);
    let whole = Deployer::new("2x1".parse().unwrap(), 5, &workdir("moe-ckpt-whole")).unwrap();
    let all = trainer(config(ZeroStage::Gradients, 2, 8, Some(4)), Recompute::None).fit(&whole, &data, false).unwrap();
    let manifest = std::fs::read_to_string(whole.workdir.join("checkpoints/step-00000004/manifest.json")).unwrap();
    assert!(manifest.contains("dp_split") && manifest.contains("block_sparse_moe.experts.*.w1.weight"), "{manifest}");
    for (name, saved, mesh, zero, ep) in [
        ("moe-ckpt-same", ZeroStage::Gradients, "2x1", ZeroStage::Gradients, 2),
        ("moe-ckpt-z0", ZeroStage::Gradients, "2x1", ZeroStage::Off, 1),
        ("moe-ckpt-z3", ZeroStage::Gradients, "4x1", ZeroStage::Parameters, 4),
        // the same mesh and stage, another split of the experts
        ("moe-ckpt-ep", ZeroStage::Off, "2x1", ZeroStage::Off, 1),
    ] {
        let first = Deployer::new("2x1".parse().unwrap(), 5, &workdir(name)).unwrap();
        trainer(config(saved, 2, 4, Some(4)), Recompute::None).fit(&first, &data, false).unwrap();
        let dep = Deployer::new(mesh.parse().unwrap(), 5, &first.workdir).unwrap();
        let resumed = trainer(config(zero, ep, 8, Some(4)), Recompute::None).fit(&dep, &data, true).unwrap();
        assert_eq!(resumed.start_step, 4, "{name}");
        if name == "moe-ckpt-same" {
            assert_eq!(resumed.losses, all.losses[4..].to_vec(), "{name}: the continued losses");
            assert_eq!(read_model(&dep.workdir), read_model(&whole.workdir), "{name}: the exported model");
        }
        for (i, (x, y)) in all.losses[4..].iter().zip(&resumed.losses).enumerate() {
            assert!((x - y).abs() <= 1e-5 * x.abs(), "{name}: step {}: {x} against {y}", i + 4);
        }
        let _ = std::fs::remove_dir_all(&dep.workdir);
    }
    let _ = std::fs::remove_dir_all(&whole.workdir);
}
