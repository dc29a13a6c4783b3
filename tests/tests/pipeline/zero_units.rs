//! ZeRO-3 units of several layers: the planner may have consecutive decoder layers gathered
//! together (`TrainConfig::unit_layers`), one collective each way and one recompute block
//! per unit. On a LLaMA of three layers, units of two: `{0, 1}` and `{2}`.

use super::zero::zero3::{cfg_layers, placed_trainer_of, train_config};
use super::{corpus, read_model, workdir};
use redco_core::nn::{Module, ModuleExt, ParamGather};
use redco_core::planning::planner::{predict_comm, unit_of, Workload};
use redco_core::runtime::CollectiveKind;
use redco_core::{DType, MeshAxis, Recompute, Result, Tensor};
use redco_cpu::Cpu;
use redco_models::llama::Llama;
use redco_pipeline::{Deployer, FitReport, TrainConfig, ZeroStage};
use std::sync::{Arc, Mutex};

/// Decoder layers of the test model, and the layers of a unit.
const LAYERS: usize = 3;
const UNIT: usize = 2;
const STEPS: u64 = 12;

fn fit(name: &str, mesh: &str, zero: ZeroStage, dtype: DType, recompute: Recompute) -> (FitReport, Vec<Vec<u8>>) {
    let data = corpus().sequences(0, 256);
    let dep = Deployer::new(mesh.parse().unwrap(), 3, &workdir(name)).unwrap();
    let cfg = TrainConfig { unit_layers: UNIT, ..train_config(zero, dtype, STEPS) };
    let r = placed_trainer_of(cfg_layers(LAYERS), cfg, recompute, true, None).fit(&dep, &data, false).unwrap();
    (r, read_model(&dep.workdir).into_iter().map(|(_, v)| v).collect())
}

fn floats(v: &[u8]) -> Vec<f64> {
    v.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
}

/// Units of two layers train as DDP does (every loss within 1e-5 relative, the final
/// parameters within 1e-5), with and without recompute, f32 and bf16, at 4x1 and 2x2; and
/// per step they move one all-gather per unit for the forward (two with recompute), one
/// reduce-scatter per unit, as the planner predicts with `unit_layers = 2`.
#[test]
fn units_of_two_layers_train_as_ddp_and_move_one_collective_per_unit() {
    let model = Llama::<Cpu>::new(&Cpu::default(), &cfg_layers(LAYERS), DType::F32, 9).unwrap();
    let plan = {
        use redco_core::planning::trace::plan_from_trace;
        let ids = Tensor::from_vec(&Cpu::default(), (0..10).map(|i| i % 16).collect::<Vec<i64>>(), [2, 5]).unwrap();
        let loss = model.loss(&ids, None, &ids).unwrap();
        plan_from_trace(&model.named_parameters(), &[&loss], "4x1".parse().unwrap(), true).unwrap()
    };
    let units = LAYERS.div_ceil(UNIT) as u64;
    let others = model.named_parameters().iter().filter(|(n, _)| unit_of(n).is_none()).count() as u64;
    for (mesh, dtype, recompute) in [
        ("4x1", DType::F32, Recompute::None),
        ("4x1", DType::BF16, Recompute::Block),
        ("2x2", DType::F32, Recompute::Selective),
    ] {
        let tag = format!("{mesh}-{dtype:?}-{}", recompute.name());
        let (a, ma) = fit(&format!("units-ddp-{tag}"), mesh, ZeroStage::Off, dtype, recompute);
        let (b, mb) = fit(&format!("units-z3-{tag}"), mesh, ZeroStage::Parameters, dtype, recompute);
        assert_eq!(a.losses.len(), STEPS as usize);
        for (i, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
            assert!((x - y).abs() <= 1e-5 * x.abs(), "{tag}: step {i}: DDP {x}, ZeRO-3 in units of {UNIT} {y}");
        }
        assert_eq!(ma.len(), mb.len());
        for (i, (x, y)) in ma.iter().zip(&mb).enumerate() {
            redco_tests::check::assert_close(&floats(x), &floats(y), 1e-5, &format!("{tag}: tensor {i}"));
        }
        let per_unit = if recompute.on() { 2 } else { 1 };
        let work =
            Workload { batch: 8, seq: 32, dtype_bytes: dtype.size_in_bytes(), zero: 3, recompute, unit_layers: UNIT };
        let predicted = predict_comm(&plan, &cfg_layers(LAYERS).dims(), &work);
        for (rank, st) in &b.comm {
            let (ag, rs) =
                (st.get(CollectiveKind::AllGather, MeshAxis::Dp), st.get(CollectiveKind::ReduceScatter, MeshAxis::Dp));
            assert_eq!(ag.calls, STEPS * (units * per_unit + others), "{tag}: rank {rank}: all-gathers");
            assert_eq!(rs.calls, STEPS * (units + others), "{tag}: rank {rank}: reduce-scatters");
            if mesh == "4x1" {
                for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
                    let (p, m) = (predicted.get(kind, MeshAxis::Dp), st.get(kind, MeshAxis::Dp));
                    assert_eq!((p.calls * STEPS, p.bytes * STEPS), (m.calls, m.bytes), "{tag}: the planner's {kind:?}");
                }
            }
        }
    }
}

/// The gather order with units of two: the forward gathers `{0, 1}` and starts `{2}`'s
/// gather ahead; recomputing, the backward gathers `{2}` again and starts `{0, 1}`'s; every
/// prefetched unit is the next one gathered.
#[test]
fn units_of_two_are_gathered_and_prefetched_together() {
    struct Log(Mutex<Vec<String>>);
    fn units(params: &[(String, Tensor<Cpu>)]) -> String {
        let mut u: Vec<&str> = params.iter().filter_map(|(n, _)| unit_of(n)).collect();
        u.dedup();
        u.join("+")
    }
    impl ParamGather<Cpu> for Log {
        fn gather(&self, _: &str, p: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
            Ok(p.clone())
        }
        fn gather_all(&self, params: &[(String, Tensor<Cpu>)]) -> Result<Vec<Tensor<Cpu>>> {
            self.0.lock().unwrap().push(format!("gather {}", units(params)));
            Ok(params.iter().map(|(_, p)| p.clone()).collect())
        }
        fn prefetch(&self, params: &[(String, Tensor<Cpu>)]) -> Result<()> {
            self.0.lock().unwrap().push(format!("prefetch {}", units(params)));
            Ok(())
        }
        fn units_per_gather(&self) -> usize {
            UNIT
        }
    }
    let ids = Tensor::from_vec(&Cpu::default(), (0..12).map(|i| i % 16).collect::<Vec<i64>>(), [2, 6]).unwrap();
    let (first, last) = ("model.layers.0+model.layers.1", "model.layers.2");
    for recompute in [Recompute::None, Recompute::Block, Recompute::Selective] {
        let mut m = Llama::<Cpu>::new(&Default::default(), &cfg_layers(LAYERS), DType::F32, 9).unwrap();
        m.set_recompute(recompute);
        let log = Arc::new(Log(Mutex::new(Vec::new())));
        m.set_param_gather(Some(log.clone())).unwrap();
        m.loss(&ids, None, &ids).unwrap().backward().unwrap();
        let got = log.0.lock().unwrap().clone();
        let mut want = vec![format!("gather {first}"), format!("prefetch {last}"), format!("gather {last}")];
        if recompute.on() {
            want.extend([format!("gather {last}"), format!("prefetch {first}"), format!("gather {first}")]);
        }
        assert_eq!(got, want, "{recompute:?}");
    }
}
