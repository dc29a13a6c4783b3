//! ZeRO-2 through the Trainer: the masters, the optimizer state and the gradients sliced
//! over `dp` train as the replicated (DDP) run does, with the collectives counted.

use super::{config, corpus, read_model, trainer, workdir, CFG};
use redco_core::nn::ModuleExt;
use redco_core::runtime::CollectiveKind;
use redco_core::{DType, MeshAxis};
use redco_cpu::Cpu;
use redco_pipeline::{Deployer, FitReport, OptimizerConfig, TrainConfig, ZeroStage};
use redco_tests::models::Lm;

fn run(name: &str, mesh: &str, cfg: TrainConfig) -> (FitReport, Vec<(String, Vec<f64>)>) {
    let data = corpus().sequences(0, 512);
    let dep = Deployer::new(mesh.parse().unwrap(), 11, &workdir(name)).unwrap();
    let r = trainer(cfg).fit(&dep, &data, false).unwrap();
    let model = read_model(&dep.workdir)
        .into_iter()
        .map(|(n, v)| (n, v.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()))
        .collect();
    (r, model)
}

fn same(a: &(FitReport, Vec<(String, Vec<f64>)>), b: &(FitReport, Vec<(String, Vec<f64>)>), what: &str) {
    assert_eq!(a.0.losses.len(), b.0.losses.len(), "{what}: steps");
    for (i, (x, y)) in a.0.losses.iter().zip(&b.0.losses).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-3), "{what}: step {i} loss {x} against {y}");
    }
    for ((n, x), (_, y)) in a.1.iter().zip(&b.1) {
        redco_tests::check::assert_close(x, y, 1e-5, &format!("{what}: {n} after training"));
    }
}

fn zero(stage: ZeroStage, dtype: DType, accumulate: usize) -> TrainConfig {
    TrainConfig { zero: stage, compute_dtype: dtype, ..config(20, 8, accumulate) }
}

#[test]
fn zero2_trains_as_ddp_does_at_2x1_4x1_2x2_in_f32_and_bf16() {
    for (mesh, dtype, k) in
        [("2x1", DType::F32, 2), ("4x1", DType::F32, 1), ("2x2", DType::F32, 1), ("2x2", DType::BF16, 2)]
    {
        let tag = format!("{mesh}-{dtype:?}-{k}");
        let ddp = run(&format!("ddp-{tag}"), mesh, zero(ZeroStage::Off, dtype, k));
        let z2 = run(&format!("z2-{tag}"), mesh, zero(ZeroStage::Gradients, dtype, k));
        same(&ddp, &z2, &format!("ZeRO-2 against DDP at {mesh}, {dtype:?}, {k} micro-batches"));
        eprintln!("{tag}: loss {:.5} -> {:.5}", z2.0.losses[0], z2.0.losses[19]);
    }
}

#[test]
fn zero2_with_sgd_trains_as_ddp_does() {
    let sgd = |stage| TrainConfig {
        optimizer: OptimizerConfig::Sgd { momentum: 0.9, weight_decay: 0.01 },
        zero: stage,
        ..config(20, 8, 1)
    };
    same(&run("sgd-ddp", "2x1", sgd(ZeroStage::Off)), &run("sgd-z2", "2x1", sgd(ZeroStage::Gradients)), "SGD");
    // ZeRO-1 shards AdamW's moments: SGD has none, and is refused before the run
    let dep = Deployer::new("2x1".parse().unwrap(), 11, &workdir("sgd-z1")).unwrap();
    let err = trainer(sgd(ZeroStage::Optimizer)).fit(&dep, &corpus().sequences(0, 64), false).unwrap_err().to_string();
    assert!(err.contains("ZeRO-1") && err.contains("SGD"), "{err}");
}

/// One reduce-scatter (f32) and one all-gather (compute dtype) per parameter per step, of
/// the padded slices: `ceil(n / dp) * dp` elements each.
#[test]
fn zero2_moves_one_reduce_scatter_and_one_all_gather_per_parameter_per_step() {
    let steps = 3u64;
    let model = Lm::<Cpu>::new(&Cpu::default(), CFG, DType::F32, 1).unwrap();
    let sizes: Vec<u64> = model.trainable_parameters().iter().map(|(_, p)| p.elem_count() as u64).collect();
    for (dp, dtype) in [(2u64, DType::F32), (4, DType::BF16)] {
        let mesh = format!("{dp}x1");
        let cfg = TrainConfig { steps, ..zero(ZeroStage::Gradients, dtype, 1) };
        let (r, _) = run(&format!("count-{dp}"), &mesh, cfg);
        let padded: u64 = sizes.iter().map(|n| n.div_ceil(dp) * dp).sum();
        for (rank, stats) in &r.comm {
            let rs = stats.get(CollectiveKind::ReduceScatter, MeshAxis::Dp);
            let ag = stats.get(CollectiveKind::AllGather, MeshAxis::Dp);
            let p = sizes.len() as u64 * steps;
            assert_eq!((rs.calls, ag.calls), (p, p), "rank {rank} at {mesh}: calls");
            assert_eq!(rs.bytes, padded * 4 * steps, "rank {rank} at {mesh}: reduce-scatter bytes (f32)");
            let width = dtype.size_in_bytes() as u64;
            assert_eq!(ag.bytes, padded * width * steps, "rank {rank} at {mesh}: all-gather bytes ({dtype:?})");
        }
    }
}

#[test]
fn zero2_resumes_exactly_and_a_checkpoint_of_another_stage_is_resharded() {
    let data = corpus().sequences(0, 512);
    let cfg = |steps, stage| TrainConfig {
        checkpoint_every: Some(4),
        keep_last: 0,
        ..TrainConfig { steps, ..zero(stage, DType::F32, 1) }
    };
    let whole = Deployer::new("2x1".parse().unwrap(), 5, &workdir("z2-whole")).unwrap();
    let all = trainer(cfg(8, ZeroStage::Gradients)).fit(&whole, &data, false).unwrap();
    for (name, stage) in [("z2-split", ZeroStage::Gradients), ("z2-to-z0", ZeroStage::Off)] {
        let split = Deployer::new("2x1".parse().unwrap(), 5, &workdir(name)).unwrap();
        trainer(cfg(4, ZeroStage::Gradients)).fit(&split, &data, false).unwrap();
        let resumed = trainer(cfg(8, stage)).fit(&split, &data, true).unwrap();
        assert_eq!(resumed.start_step, 4);
        if stage == ZeroStage::Gradients {
            assert_eq!(resumed.losses, all.losses[4..].to_vec(), "the continued losses");
            assert_eq!(read_model(&split.workdir), read_model(&whole.workdir), "masters and moments are checkpointed");
        }
        for (i, (x, y)) in all.losses[4..].iter().zip(&resumed.losses).enumerate() {
            assert!((x - y).abs() <= 1e-5 * x.abs(), "{name}: step {}: {x} against {y}", i + 4);
        }
    }
}

pub(super) mod zero3 {
    //! ZeRO-3 on the real LLaMA: its decoder layers held as f32 pieces and gathered per
    //! layer, against DDP at the same mesh.

    use super::{corpus, workdir};
    use redco_core::nn::{Module, ModuleExt, ParamPlacer};
    use redco_core::optim::{AdamWConfig, Decay, Schedule};
    use redco_core::runtime::CollectiveKind;
    use redco_core::{Backend, DType, MeshAxis, Recompute, Result, Tensor};
    use redco_cpu::Cpu;
    use redco_models::hf::config::HfConfig;
    use redco_models::llama::Llama;
    use redco_pipeline::{Batch, Deployer, FitReport, OptimizerConfig, StepCtx, TrainConfig, Trainer, ZeroStage};
    use std::sync::{Arc, Mutex};

    fn cfg() -> HfConfig {
        cfg_layers(2)
    }

    /// The test LLaMA with `layers` decoder layers.
    pub(in super::super) fn cfg_layers(layers: usize) -> HfConfig {
        HfConfig::from_json(&format!(
            r#"{{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_attention_heads":4,
                "num_key_value_heads":2,"num_hidden_layers":{layers},"vocab_size":16,"rope_theta":10000.0,
                "tie_word_embeddings":false,"max_position_embeddings":64}}"#
        ))
        .unwrap()
    }

    fn collate<B: Backend>(b: &B, ex: &[Vec<i64>]) -> Result<Batch<B>> {
        let t = ex[0].len();
        let ids: Vec<i64> = ex.iter().flatten().copied().collect();
        Ok(Batch::from([("input_ids".to_string(), Tensor::from_vec(b, ids, [ex.len(), t])?)]))
    }

    pub(in super::super) fn train_config(zero: ZeroStage, dtype: DType, steps: u64) -> TrainConfig {
        TrainConfig {
            batch_size: 8,
            steps,
            schedule: Schedule { peak: 3e-3, warmup: 2, total: steps, decay: Decay::Cosine },
            optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.01, ..Default::default() }),
            clip_norm: Some(1.0),
            log_every: 100,
            compute_dtype: dtype,
            zero,
            ..Default::default()
        }
    }

    /// Steps of the LLaMA runs.
    pub(super) const STEPS: u64 = 20;

    /// The LLaMA trainer at ZeRO stage `zero` (checkpointing every `every` steps).
    pub(super) fn llama_trainer(
        zero: ZeroStage,
        dtype: DType,
        recompute: Recompute,
        steps: u64,
        every: Option<u64>,
    ) -> Trainer<Llama<Cpu>, Vec<i64>> {
        let cfg = TrainConfig {
            schedule: Schedule { peak: 3e-3, warmup: 2, total: STEPS, decay: Decay::Cosine },
            checkpoint_every: every,
            keep_last: 0,
            ..train_config(zero, dtype, steps)
        };
        placed_trainer(cfg, recompute, true, None)
    }

    /// The LLaMA trainer with `cfg`: the model built through the trainer's placer (each
    /// parameter cut to the rank's part as it is made) or whole and cut afterwards; each
    /// built model's held elements pushed to `held`.
    fn placed_trainer(
        cfg: TrainConfig,
        recompute: Recompute,
        placed: bool,
        held: Option<Arc<Mutex<Vec<usize>>>>,
    ) -> Trainer<Llama<Cpu>, Vec<i64>> {
        placed_trainer_of(self::cfg(), cfg, recompute, placed, held)
    }

    /// [`placed_trainer`] of the LLaMA configured by `model`.
    pub(in super::super) fn placed_trainer_of(
        model: HfConfig,
        cfg: TrainConfig,
        recompute: Recompute,
        placed: bool,
        held: Option<Arc<Mutex<Vec<usize>>>>,
    ) -> Trainer<Llama<Cpu>, Vec<i64>> {
        Trainer::for_backend_placed(
            move |b: &Cpu, placer: &dyn ParamPlacer<Cpu>| {
                let mut m = match placed {
                    true => Llama::new_placed(b, &model, DType::F32, 9, placer)?,
                    false => Llama::new(b, &model, DType::F32, 9)?,
                };
                if let Some(h) = &held {
                    let mut n = 0;
                    m.visit("", &mut |_, t| n += t.local_shape().elem_count());
                    h.lock().unwrap().push(n);
                }
                m.set_recompute(recompute);
                Ok(m)
            },
            collate,
            |_: &StepCtx<_>, m: &Llama<_>, b: &Batch<_>| m.loss(&b["input_ids"], None, &b["input_ids"]),
            cfg,
        )
    }

    /// Built through the placer, each ZeRO-3 rank's model holds only its pieces of the
    /// layers from the moment it is built (never the whole model), the planning trace's
    /// model is whole in shape, and the run is the run of the model built whole and cut
    /// afterwards, bit for bit.
    #[test]
    fn zero3_built_through_the_placer_holds_only_pieces_and_trains_as_the_whole_build() {
        let model = Llama::<Cpu>::new(&Default::default(), &cfg(), DType::F32, 9).unwrap();
        let units = model.gather_units();
        let (mut total, mut expect) = (0, 0);
        for (name, t) in model.named_parameters() {
            let n = t.shape().elem_count();
            total += n;
            expect += if units.iter().any(|u| name.starts_with(&format!("{u}."))) { n.div_ceil(4) } else { n };
        }
        let data = corpus().sequences(0, 256);
        let mut runs = Vec::new();
        for placed in [true, false] {
            let held = Arc::new(Mutex::new(Vec::new()));
            let dep = Deployer::new("4x1".parse().unwrap(), 3, &workdir(&format!("z3-placed-{placed}"))).unwrap();
            let cfg = TrainConfig {
                schedule: Schedule { peak: 3e-3, warmup: 2, total: 8, decay: Decay::Cosine },
                ..train_config(ZeroStage::Parameters, DType::F32, 8)
            };
            let r = placed_trainer(cfg, Recompute::Block, placed, Some(held.clone())).fit(&dep, &data, false).unwrap();
            let held = held.lock().unwrap().clone();
            assert_eq!(held.len(), 5, "one trace and four ranks");
            assert_eq!(held[0], total, "the trace's model has every parameter's shape");
            let ranks = if placed { expect } else { total };
            assert_eq!(&held[1..], &[ranks; 4], "placed {placed}: elements each rank's model holds when built");
            runs.push((r.losses, super::read_model(&dep.workdir)));
        }
        assert!(expect * 2 < total, "the pieces are a fraction of the model");
        assert_eq!(runs[0].0, runs[1].0, "the losses");
        assert_eq!(runs[0].1, runs[1].1, "the exported weights");
    }

    /// Offload under ZeRO-2 and ZeRO-3 (each rank's host keeps its slice's f32 masters and
    /// AdamW state, and updates them; the device holds the compute copies of its slices or
    /// pieces): at 2x1, f32 and bf16, bit for bit the run without offload, and a run cut at
    /// step 4 and resumed (the host slices checkpointed) continues it exactly.
    #[test]
    fn offload_under_zero2_and_zero3_trains_as_without_it_and_resumes() {
        let data = corpus().sequences(0, 256);
        for (stage, dtype) in [
            (ZeroStage::Gradients, DType::F32),
            (ZeroStage::Gradients, DType::BF16),
            (ZeroStage::Parameters, DType::F32),
            (ZeroStage::Parameters, DType::BF16),
        ] {
            let tag = format!("{stage:?}-{dtype:?}");
            let cfg = |offload, steps| TrainConfig {
                offload,
                schedule: Schedule { peak: 3e-3, warmup: 2, total: 8, decay: Decay::Cosine },
                checkpoint_every: Some(4),
                keep_last: 0,
                ..train_config(stage, dtype, steps)
            };
            let dep = |name: &str| {
                Deployer::new("2x1".parse().unwrap(), 3, &workdir(&format!("z-off-{name}-{tag}"))).unwrap()
            };
            let fit = |dep: &Deployer, offload, steps, resume| {
                let r = placed_trainer(cfg(offload, steps), Recompute::Block, true, None).fit(dep, &data, resume);
                (r.unwrap(), super::read_model(&dep.workdir))
            };
            let (plain, plain_w) = fit(&dep("plain"), false, 8, false);
            let (off, off_w) = fit(&dep("on"), true, 8, false);
            assert_eq!(off.losses, plain.losses, "{tag}: losses with and without offload");
            assert_eq!(off_w, plain_w, "{tag}: exported weights");
            let half = dep("half");
            fit(&half, true, 4, false);
            let (resumed, resumed_w) = fit(&half, true, 8, true);
            assert_eq!(resumed.start_step, 4);
            assert_eq!(resumed.losses, off.losses[4..].to_vec(), "{tag}: resumed losses");
            assert_eq!(resumed_w, off_w, "{tag}: resumed weights");
        }
    }

    fn run(
        name: &str,
        mesh: &str,
        zero: ZeroStage,
        dtype: DType,
        recompute: Recompute,
    ) -> (FitReport, Vec<(String, Vec<u8>)>) {
        let data = corpus().sequences(0, 256);
        let dep = Deployer::new(mesh.parse().unwrap(), 3, &workdir(name)).unwrap();
        let r = llama_trainer(zero, dtype, recompute, STEPS, None).fit(&dep, &data, false).unwrap();
        (r, super::read_model(&dep.workdir))
    }

    fn floats(v: &[u8]) -> Vec<f64> {
        v.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
    }

    #[test]
    fn zero3_trains_as_ddp_does_with_and_without_recompute_at_4x1_and_2x2_in_f32_and_bf16() {
        let cases = [
            ("4x1", DType::F32, Recompute::None),
            ("4x1", DType::F32, Recompute::Block),
            ("4x1", DType::F32, Recompute::Selective),
            ("2x2", DType::F32, Recompute::Block),
            ("2x2", DType::BF16, Recompute::None),
            ("2x2", DType::BF16, Recompute::Selective),
            ("2x1", DType::BF16, Recompute::Block),
        ];
        for (mesh, dtype, recompute) in cases {
            let tag = format!("{mesh}-{dtype:?}-{}", recompute.name());
            let (a, ma) = run(&format!("z3-ddp-{tag}"), mesh, ZeroStage::Off, dtype, recompute);
            let (b, mb) = run(&format!("z3-{tag}"), mesh, ZeroStage::Parameters, dtype, recompute);
            for (i, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
                assert!((x - y).abs() <= 1e-5 * x.abs(), "{tag}: step {i}: DDP {x}, ZeRO-3 {y}");
            }
            assert_eq!(a.losses.len(), 20);
            for ((n, x), (m, y)) in ma.iter().zip(&mb) {
                assert_eq!(n, m);
                redco_tests::check::assert_close(&floats(x), &floats(y), 1e-5, &format!("{tag}: {n}"));
            }
        }
    }

    /// LoRA adapters on the attention projections of the real LLaMA: the base frozen, the
    /// adapters trained, under ZeRO-2 and ZeRO-3 (with block or selective recompute) as
    /// under DDP.
    #[test]
    fn lora_under_zero2_and_zero3_trains_as_ddp_does() {
        use redco_core::nn::lora::{add_lora, LoraConfig};
        let lora = |zero: ZeroStage, dtype: DType, recompute: Recompute| -> Trainer<Llama<Cpu>, Vec<i64>> {
            Trainer::new(
                move |b| {
                    let mut m = Llama::new(b, &self::cfg(), DType::F32, 9)?;
                    let targets = r"model\.layers\.\d+\.self_attn\.(q_proj|v_proj)".to_string();
                    add_lora(&mut m, &LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, targets }, 5)?;
                    m.set_recompute(recompute);
                    Ok(m)
                },
                collate,
                |_: &StepCtx<_>, m: &Llama<_>, b: &Batch<_>| m.loss(&b["input_ids"], None, &b["input_ids"]),
                TrainConfig { checkpoint_every: None, keep_last: 0, ..train_config(zero, dtype, STEPS) },
            )
        };
        let data = corpus().sequences(0, 256);
        for (mesh, dtype, recompute) in
            [("4x1", DType::F32, Recompute::Block), ("2x2", DType::BF16, Recompute::Selective)]
        {
            let fit = |stage: ZeroStage| {
                let dep =
                    Deployer::new(mesh.parse().unwrap(), 3, &workdir(&format!("z3-lora-{mesh}-{stage:?}"))).unwrap();
                let r = lora(stage, dtype, recompute).fit(&dep, &data, false).unwrap();
                (r, super::read_model(&dep.workdir))
            };
            let (a, ma) = fit(ZeroStage::Off);
            assert_eq!(a.losses.len(), STEPS as usize);
            assert!(a.losses[STEPS as usize - 1] < a.losses[0], "the adapters learn: {:?}", a.losses);
            for stage in [ZeroStage::Gradients, ZeroStage::Parameters] {
                let (b, mb) = fit(stage);
                let tag = format!("{mesh} {dtype:?} {stage:?} {recompute:?}");
                // ZeRO-2: one reduce-scatter per trainable parameter (two adapters of two
                // matrices in each of the two layers) per step, and an all-gather of each
                // after the update; ZeRO-3: a layer's adapters move together, gathered for
                // the forward and again for the recomputation, reduce-scattered once. The
                // frozen base has no master: each rank holds it whole, and it moves not at all
                let (gathers, scatters) = if stage == ZeroStage::Parameters { (4, 2) } else { (8, 8) };
                for (rank, st) in &b.comm {
                    let rs = st.get(CollectiveKind::ReduceScatter, MeshAxis::Dp).calls;
                    assert_eq!(rs, STEPS * scatters, "{tag}: rank {rank}: reduce-scatters");
                    let ag = st.get(CollectiveKind::AllGather, MeshAxis::Dp).calls;
                    assert_eq!(ag, STEPS * gathers, "{tag}: rank {rank}: all-gathers");
                }
                for (i, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
                    assert!((x - y).abs() <= 1e-5 * x.abs(), "{tag}: step {i}: DDP {x}, {y}");
                }
                assert_eq!(ma.len(), mb.len(), "{tag}");
                for ((n, x), (m, y)) in ma.iter().zip(&mb) {
                    assert_eq!(n, m);
                    redco_tests::check::assert_close(&floats(x), &floats(y), 1e-5, &format!("{tag}: {n}"));
                }
            }
        }
    }

    /// The model asks for each layer's gather one layer ahead (FSDP's prefetch): in the
    /// forward the next layer's, in the backward's recomputation the previous layer's, and
    /// every prefetched layer is the next one gathered (the contract a prefetching
    /// gatherer relies on: what it starts is consumed, in the same order on every rank).
    #[test]
    fn llama_prefetches_the_layer_it_gathers_next_forward_and_backward() {
        use redco_core::nn::ParamGather;
        struct Log(Mutex<Vec<String>>);
        impl ParamGather<Cpu> for Log {
            fn gather(&self, _: &str, p: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
                Ok(p.clone())
            }
            fn gather_all(&self, params: &[(String, Tensor<Cpu>)]) -> Result<Vec<Tensor<Cpu>>> {
                self.0.lock().unwrap().push(format!("gather {}", unit(&params[0].0)));
                Ok(params.iter().map(|(_, p)| p.clone()).collect())
            }
            fn prefetch(&self, params: &[(String, Tensor<Cpu>)]) -> Result<()> {
                self.0.lock().unwrap().push(format!("prefetch {}", unit(&params[0].0)));
                Ok(())
            }
        }
        fn unit(name: &str) -> String {
            redco_core::planning::planner::unit_of(name).unwrap().to_string()
        }
        let ids = Tensor::from_vec(&Cpu::default(), (0..12).map(|i| i % 16).collect::<Vec<i64>>(), [2, 6]).unwrap();
        for recompute in [Recompute::None, Recompute::Block, Recompute::Selective] {
            let mut m = Llama::<Cpu>::new(&Default::default(), &cfg(), DType::F32, 9).unwrap();
            m.set_recompute(recompute);
            let log = Arc::new(Log(Mutex::new(Vec::new())));
            m.set_param_gather(Some(log.clone())).unwrap();
            m.loss(&ids, None, &ids).unwrap().backward().unwrap();
            let got = log.0.lock().unwrap().clone();
            let (l0, l1) = ("model.layers.0", "model.layers.1");
            let mut want = vec![format!("gather {l0}"), format!("prefetch {l1}"), format!("gather {l1}")];
            if recompute.on() {
                // the last layer is recomputed first, and the first layer's gather started
                want.extend([format!("gather {l1}"), format!("prefetch {l0}"), format!("gather {l0}")]);
            }
            assert_eq!(got, want, "{recompute:?}");
        }
    }

    /// Per step at dp = 4 (one micro-batch): one all-gather per layer (all its parameters
    /// in one flat buffer) for the forward and one more where the layer is recomputed
    /// (whole or selectively: the recomputation needs the weights for its matmuls'
    /// gradients); one all-gather of every other parameter's compute copy after the update;
    /// one reduce-scatter per layer and one per other parameter. The bytes are the padded
    /// slices' (`ceil(n / dp) * dp` elements each), all-gathers in the compute dtype,
    /// reduce-scatters in f32, and the planner predicts every figure.
    #[test]
    fn zero3_gathers_each_layer_once_for_its_forward_and_again_for_its_recomputation() {
        use redco_core::planning::planner::{predict_comm, Workload};
        use redco_core::planning::trace::plan_from_trace;
        let model = Llama::<redco_cpu::Cpu>::new(&Default::default(), &cfg(), DType::F32, 9).unwrap();
        let units = model.gather_units();
        let pad = |n: usize| (n.div_ceil(4) * 4) as u64;
        let (mut unit_elems, mut other_elems, mut others) = (0u64, 0u64, 0u64);
        for (name, t) in model.named_parameters() {
            match units.iter().any(|u| name.starts_with(&format!("{u}."))) {
                true => unit_elems += pad(t.shape().elem_count()),
                false => (other_elems, others) = (other_elems + pad(t.shape().elem_count()), others + 1),
            }
        }
        let layers = units.len() as u64;
        assert!(layers > 1 && others > 0);
        let plan = {
            let ids = Tensor::from_vec(&Cpu::default(), (0..10).map(|i| i % 16).collect::<Vec<i64>>(), [2, 5]).unwrap();
            let loss = model.loss(&ids, None, &ids).unwrap();
            plan_from_trace(&model.named_parameters(), &[&loss], "4x1".parse().unwrap(), true).unwrap()
        };
        let dims = cfg().dims();
        for (recompute, dtype) in
            [(Recompute::None, DType::F32), (Recompute::Block, DType::BF16), (Recompute::Selective, DType::F32)]
        {
            let (r, _) = run(&format!("z3-count-{}", recompute.name()), "4x1", ZeroStage::Parameters, dtype, recompute);
            let steps = STEPS;
            let per_unit = if recompute.on() { 2 } else { 1 };
            let width = dtype.size_in_bytes() as u64;
            let work = Workload { batch: 8, seq: 32, dtype_bytes: width as usize, zero: 3, recompute, unit_layers: 1 };
            let predicted = predict_comm(&plan, &dims, &work);
            for (rank, st) in &r.comm {
                let tag = format!("rank {rank}, recompute {recompute:?}, {dtype:?}");
                let ag = st.get(CollectiveKind::AllGather, MeshAxis::Dp);
                let rs = st.get(CollectiveKind::ReduceScatter, MeshAxis::Dp);
                assert_eq!(ag.calls, steps * (layers * per_unit + others), "{tag}: all-gathers");
                assert_eq!(rs.calls, steps * (layers + others), "{tag}: reduce-scatters");
                assert_eq!(ag.bytes, steps * (unit_elems * per_unit + other_elems) * width, "{tag}: all-gather bytes");
                assert_eq!(rs.bytes, steps * (unit_elems + other_elems) * 4, "{tag}: reduce-scatter bytes");
                for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
                    let (p, m) = (predicted.get(kind, MeshAxis::Dp), st.get(kind, MeshAxis::Dp));
                    assert_eq!((p.calls * steps, p.bytes * steps), (m.calls, m.bytes), "{tag}: the planner's {kind:?}");
                }
            }
        }
    }
}

mod reshard {
    //! A checkpoint saved at one mesh and ZeRO stage resumes at another: the continued
    //! losses are the uninterrupted run's.

    use super::zero3::{llama_trainer, STEPS};
    use super::{corpus, read_model, workdir};
    use redco_core::{DType, Recompute};
    use redco_pipeline::{Deployer, ZeroStage};

    #[test]
    fn saved_at_4x1_zero3_resumes_at_2x2_1x1_2x1_zero1_and_2x2_zero2() {
        let data = corpus().sequences(0, 256);
        let half = STEPS / 2;
        let whole = Deployer::new("4x1".parse().unwrap(), 3, &workdir("rs-whole")).unwrap();
        let all = llama_trainer(ZeroStage::Parameters, DType::F32, Recompute::Block, STEPS, None)
            .fit(&whole, &data, false)
            .unwrap();
        for (mesh, stage) in [
            ("2x2", ZeroStage::Off),
            ("1x1", ZeroStage::Off),
            ("2x1", ZeroStage::Optimizer),
            ("2x2", ZeroStage::Gradients),
        ] {
            let tag = format!("{mesh}-{stage:?}");
            let dir = workdir(&format!("rs-{tag}"));
            let first = Deployer::new("4x1".parse().unwrap(), 3, &dir).unwrap();
            llama_trainer(ZeroStage::Parameters, DType::F32, Recompute::Block, half, Some(half))
                .fit(&first, &data, false)
                .unwrap();
            let then = Deployer::new(mesh.parse().unwrap(), 3, &dir).unwrap();
            let r =
                llama_trainer(stage, DType::F32, Recompute::Block, STEPS, Some(half)).fit(&then, &data, true).unwrap();
            assert_eq!(r.start_step, half, "{tag}");
            for (i, (x, y)) in all.losses[half as usize..].iter().zip(&r.losses).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs(),
                    "{tag}: step {}: uninterrupted {x}, resumed {y}",
                    half as usize + i
                );
            }
            for ((n, x), (_, y)) in read_model(&whole.workdir).iter().zip(read_model(&dir)) {
                let f = |v: &[u8]| -> Vec<f64> {
                    v.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
                };
                redco_tests::check::assert_close(&f(x), &f(&y), 1e-5, &format!("{tag}: {n}"));
            }
        }
    }
}
