//! The compiled training step against the eager PJRT backend and the CPU backend on a tiny
//! LLaMA: 10 AdamW steps, the same losses (1e-5 relative) and parameters (1e-4); over
//! meshes of several devices (data and tensor parallel) the same as on one.

use redco_core::nn::ModuleExt;
use redco_core::optim::{clip_grad_norm, AdamW, AdamWConfig};
use redco_core::planning::trace::plan_from_trace;
use redco_core::{
    planning::ShardPlan,
    runtime::{CollectiveKind, Mesh},
};
use redco_core::{Backend, DType, MeshAxis, Placement, Tensor};
use redco_cpu::Cpu;
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tpu::{CompiledTrainStep, Pjrt, StepInputs};

const STEPS: usize = 10;
const CFG: AdamWConfig = AdamWConfig { lr: 1e-2, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.01, zero1: false };

fn config() -> HfConfig {
    HfConfig::from_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny")).unwrap()
}

fn ids(vocab: usize) -> Vec<i64> {
    (0..2 * 12).map(|i| ((i * 7 + 3) % vocab) as i64).collect()
}

/// Losses and final parameters of `STEPS` eager steps with the core AdamW.
fn eager<B: Backend>(b: &B) -> (Vec<f64>, Vec<Vec<f64>>) {
    let cfg = config();
    let mut model = Llama::new(b, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(b, ids(cfg.vocab), [2, 12]).unwrap();
    let mut opt = AdamW::new(CFG);
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let loss = model.loss(&x, None, &x).unwrap();
        losses.push(loss.to_scalar().unwrap());
        let g = loss.backward().unwrap();
        opt.step(&mut model, &g).unwrap();
    }
    (losses, params(&model))
}

fn params<B: Backend>(m: &Llama<B>) -> Vec<Vec<f64>> {
    m.named_parameters().iter().map(|(_, p)| p.to_host().unwrap().to_f64_vec()).collect()
}

/// The compiled step of the test LLaMA on the mesh of `plan`, for batches like `x`.
fn compile(b: &Pjrt, plan: &ShardPlan, model: &Llama<Pjrt>, x: &Tensor<Pjrt>) -> CompiledTrainStep {
    let cfg = config();
    CompiledTrainStep::on_mesh(
        b,
        plan,
        model,
        CFG,
        &[x],
        |t| Llama::new(t, &cfg, DType::F32, 7),
        |m, bt| m.loss(&bt[0], None, &bt[0]),
    )
    .unwrap()
}

fn pjrt() -> Pjrt {
    Pjrt::from_env(1).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin")
}

#[test]
fn the_compiled_step_equals_the_eager_and_cpu_steps() {
    let b = pjrt();
    let cfg = config();
    let mut model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
    let mut step =
        compile(&b, &ShardPlan { mesh: Mesh::single(), params: Default::default(), rank: None, ep: 1 }, &model, &x);
    let before = b.stats();
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        losses.push(step.step(&[&x]).unwrap().loss);
    }
    let after = b.stats();
    // one program for the whole step, compiled when the step was made, replayed STEPS times
    assert_eq!((after.compiled - before.compiled, after.executed - before.executed), (0, STEPS as u64), "{after:?}");
    assert!(step.program().contains("stablehlo.dot_general") && step.program().contains("tf.aliasing_output"));
    step.load_into(&mut model).unwrap();
    let got = params(&model);
    for (name, (want_l, want_p)) in [("eager pjrt", eager(&b)), ("cpu", eager(&Cpu::new(2)))] {
        for (a, w) in losses.iter().zip(&want_l) {
            assert!((a - w).abs() <= 1e-5 * w.abs(), "losses: compiled {losses:?} {name} {want_l:?}");
        }
        for (i, (g, w)) in got.iter().zip(&want_p).enumerate() {
            let e = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(e <= 1e-4, "{name}: parameter {} differs by {e}", step.names()[i]);
        }
    }
    assert!(losses[STEPS - 1] < losses[0], "{losses:?}");
}

#[test]
fn a_batch_of_another_shape_is_refused() {
    let b = pjrt();
    let cfg = config();
    let model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
    let mut step =
        compile(&b, &ShardPlan { mesh: Mesh::single(), params: Default::default(), rank: None, ep: 1 }, &model, &x);
    let y = Tensor::from_vec(&b, ids(cfg.vocab), [4, 6]).unwrap();
    let e = step.step(&[&y]).unwrap_err().to_string();
    assert!(e.contains("differs from the one the step was compiled for"), "{e}");
}

#[test]
fn the_step_over_two_devices_equals_one_device_and_its_collectives_are_the_programs_own() {
    let b = Pjrt::from_env(2).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cfg = config();
    let run = |dp: usize| {
        let model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
        let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
        let mut step = CompiledTrainStep::data_parallel(
            &b,
            dp,
            &model,
            CFG,
            &[&x],
            |t| Llama::new(t, &cfg, DType::F32, 7),
            |m, bt| m.loss(&bt[0], None, &bt[0]),
        )
        .unwrap();
        if std::env::var_os("DUMP").is_some() {
            std::fs::write(format!("/tmp/step-dp{dp}.mlir"), step.program()).unwrap();
        }
        let losses: Vec<f64> = (0..STEPS).map(|_| step.step(&[&x]).unwrap().loss).collect();
        let mut model = model;
        step.load_into(&mut model).unwrap();
        (losses, params(&model), step.all_reduces(), step.names().len())
    };
    let (l1, p1, ar1, _) = run(1);
    let (l2, p2, ar2, n) = run(2);
    // one all-reduce per parameter gradient and one for the loss; none on one device
    assert_eq!((ar1, ar2), (0, n + 1));
    for (a, w) in l2.iter().zip(&l1) {
        assert!((a - w).abs() <= 1e-5 * w.abs(), "dp 2 {l2:?} dp 1 {l1:?}");
    }
    for (g, w) in p2.iter().zip(&p1) {
        let e = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(e <= 1e-4, "parameters differ by {e}");
    }
}

/// Losses, final parameters and the step of `STEPS` compiled steps on the mesh of `plan`.
fn on_mesh(b: &Pjrt, plan: &ShardPlan) -> (Vec<f64>, Vec<Vec<f64>>, CompiledTrainStep) {
    let cfg = config();
    let mut model = Llama::new(b, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(b, ids(cfg.vocab), [2, 12]).unwrap();
    let mut step = compile(b, plan, &model, &x);
    let losses: Vec<f64> = (0..STEPS).map(|_| step.step(&[&x]).unwrap().loss).collect();
    step.load_into(&mut model).unwrap();
    (losses, params(&model), step)
}

/// The plan the Trainer derives for `mesh`: the two rules on the traced loss.
fn plan(mesh: Mesh) -> ShardPlan {
    let cpu = Cpu::new(1);
    let cfg = config();
    let m = Llama::new(&cpu, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(&cpu, ids(cfg.vocab), [2, 12]).unwrap();
    let loss = m.loss(&x, None, &x).unwrap();
    plan_from_trace(&m.named_parameters(), &[&loss], mesh, false).unwrap()
}

#[test]
fn the_step_on_1x2_and_2x2_equals_1x1_with_megatron_collectives_in_its_program() {
    let b = Pjrt::from_env(4).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cfg = config();
    let (l1, p1, _) = on_mesh(&b, &plan(Mesh::single()));
    for mesh in ["1x2", "2x2"] {
        let mesh: Mesh = mesh.parse().unwrap();
        let plan = plan(mesh);
        assert!(plan.params.values().any(|p| p.placement != Placement::Replicate), "{plan}");
        let (l, p, step) = on_mesh(&b, &plan);
        for (a, w) in l.iter().zip(&l1) {
            assert!((a - w).abs() <= 1e-5 * w.abs(), "{mesh}: {l:?} 1x1: {l1:?}");
        }
        for (i, (g, w)) in p.iter().zip(&p1).enumerate() {
            let e = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(e <= 1e-4, "{mesh}: parameter {} differs by {e}", step.names()[i]);
        }
        // Megatron's count over mp: forward, one all-reduce after the embedding and after
        // each attention and MLP block; backward, one per norm input; three in the
        // vocabulary-parallel cross-entropy. Over dp: one per parameter and the loss.
        // And one scalar over mp for the gradient norm's split shards.
        let s = step.comm_stats();
        let l = cfg.layers as u64;
        let mp = s.get(CollectiveKind::AllReduce, MeshAxis::Mp).calls;
        let dp = s.get(CollectiveKind::AllReduce, MeshAxis::Dp).calls;
        assert_eq!(mp, (2 * l + 1) * 2 + 3 + 1, "{mesh}:\n{s}");
        let want_dp = if mesh.dp > 1 { step.names().len() as u64 + 1 } else { 0 };
        assert_eq!(dp, want_dp, "{mesh}:\n{s}");
        // every one is the program's own op, and nothing else moves data
        assert_eq!(step.ops("all_reduce") as u64, mp + dp, "{mesh}");
        assert_eq!((step.ops("all_gather"), step.ops("reduce_scatter")), (0, 0), "{mesh}");
        assert_eq!(s.total_calls(), mp + dp, "{mesh}:\n{s}");
        assert!(step.ops("replica_id") > 0, "{mesh}: rank offsets come from the replica id");
    }
}

#[test]
fn an_id_outside_the_vocabulary_is_refused_before_the_step_runs() {
    let b = Pjrt::from_env(2).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cfg = config();
    for mesh in [Mesh::single(), "1x2".parse().unwrap()] {
        let model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
        let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
        let mut step = compile(&b, &plan(mesh), &model, &x);
        let mut bad = ids(cfg.vocab);
        bad[5] = cfg.vocab as i64;
        let y = Tensor::from_vec(&b, bad, [2, 12]).unwrap();
        let e = step.step(&[&y]).unwrap_err().to_string();
        assert!(e.contains(&format!("index {} out of range", cfg.vocab)), "{mesh}: {e}");
        // the refused batch changed nothing: the next good step is the first step
        let first = step.step(&[&x]).unwrap().loss;
        let (l1, _, _) = on_mesh(&b, &plan(mesh));
        assert!((first - l1[0]).abs() <= 1e-6 * l1[0].abs(), "{mesh}: {first} vs {}", l1[0]);
    }
}

const CLIP: f64 = 0.05;
const SCALE: f64 = 1024.0;

/// Losses, gradient norms and final parameters of `STEPS` CPU steps clipped to `CLIP`.
fn clipped_cpu() -> (Vec<f64>, Vec<f64>, Vec<Vec<f64>>) {
    let b = Cpu::new(2);
    let cfg = config();
    let mut model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
    let mut opt = AdamW::new(CFG);
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let loss = model.loss(&x, None, &x).unwrap();
        losses.push(loss.to_scalar().unwrap());
        let mut g = loss.backward().unwrap();
        let ps: Vec<Tensor<Cpu>> = model.named_parameters().into_iter().map(|(_, p)| p).collect();
        norms.push(clip_grad_norm(None, &ps, &mut g, CLIP).unwrap());
        opt.step(&mut model, &g).unwrap();
    }
    (losses, norms, params(&model))
}

#[test]
fn clipping_and_a_loss_scale_are_runtime_inputs_and_give_the_cpu_update() {
    let b = Pjrt::from_env(2).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let cfg = config();
    let (want_l, want_n, want_p) = clipped_cpu();
    assert!(want_n.iter().all(|&n| n > CLIP), "the test must clip: {want_n:?}");
    for mesh in [Mesh::single(), "1x2".parse().unwrap()] {
        let mut model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
        let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
        let mut step = compile(&b, &plan(mesh), &model, &x);
        let inputs = StepInputs { lr: CFG.lr, loss_scale: SCALE, clip_norm: Some(CLIP) };
        let before = b.stats().compiled;
        let reports: Vec<_> = (0..STEPS).map(|_| step.step_with(&[&x], &inputs).unwrap()).collect();
        assert_eq!(b.stats().compiled, before, "{mesh}: new runtime inputs compile nothing");
        for (r, (l, n)) in reports.iter().zip(want_l.iter().zip(&want_n)) {
            assert!(r.finite, "{mesh}: {r:?}");
            assert!((r.loss - l).abs() <= 1e-5 * l.abs(), "{mesh}: loss {} cpu {l}", r.loss);
            assert!((r.grad_norm - n).abs() <= 1e-4 * n, "{mesh}: norm {} cpu {n}", r.grad_norm);
        }
        step.load_into(&mut model).unwrap();
        for (i, (g, w)) in params(&model).iter().zip(&want_p).enumerate() {
            let e = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(e <= 1e-4, "{mesh}: parameter {} differs by {e}", step.names()[i]);
        }
    }
}

#[test]
fn a_step_with_overflowing_gradients_changes_nothing_and_says_so() {
    let b = pjrt();
    let cfg = config();
    let mut model = Llama::new(&b, &cfg, DType::F32, 7).unwrap();
    let x = Tensor::from_vec(&b, ids(cfg.vocab), [2, 12]).unwrap();
    let start = params(&model);
    let mut step =
        compile(&b, &ShardPlan { mesh: Mesh::single(), params: Default::default(), rank: None, ep: 1 }, &model, &x);
    // scaled, the embedding's gradient (about 1.2 x the scale) overflows f32
    let huge = StepInputs { lr: CFG.lr, loss_scale: 3e38, clip_norm: None };
    let r = step.step_with(&[&x], &huge).unwrap();
    assert!(!r.finite && !r.grad_norm.is_finite() && r.loss.is_finite(), "{r:?}");
    assert_eq!(step.steps(), 0);
    step.load_into(&mut model).unwrap();
    assert_eq!(params(&model), start, "a skipped step must leave the parameters as they were");
    // the next step is the first step
    let (want, _) = eager(&Cpu::new(2));
    let first = step.step(&[&x]).unwrap();
    assert!(first.finite && (first.loss - want[0]).abs() <= 1e-5 * want[0], "{first:?} vs {}", want[0]);
    let second = step.step(&[&x]).unwrap();
    assert!((second.loss - want[1]).abs() <= 1e-5 * want[1], "{second:?} vs {}", want[1]);
    assert_eq!(step.steps(), 2);
    let bad = StepInputs { lr: CFG.lr, loss_scale: 0.0, clip_norm: None };
    let e = step.step_with(&[&x], &bad).unwrap_err().to_string();
    assert!(e.contains("loss scale must be positive"), "{e}");
}
