//! The observer seam: the logging rank calls each hook once per event, with the steps a
//! resumed run continues from, and a failing observer is detached without failing the run.

use super::{config, corpus, trainer, workdir};
use redco_core::{Error, Result};
use redco_pipeline::metrics::StepMetrics;
use redco_pipeline::observe::TrainObserver;
use redco_pipeline::Deployer;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Records every call, as text, into a shared list.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl TrainObserver for Recorder {
    fn on_start(&mut self, workdir: &Path, first_step: u64, total_steps: u64) -> Result<()> {
        assert!(workdir.join("metrics.jsonl").exists(), "metrics.jsonl is open before on_start");
        self.0.lock().unwrap().push(format!("start {first_step} {total_steps}"));
        Ok(())
    }
    fn on_step(&mut self, m: &StepMetrics) -> Result<()> {
        assert!(m.loss.is_finite() && m.lr > 0.0);
        self.0.lock().unwrap().push(format!("step {}", m.step));
        Ok(())
    }
    fn on_end(&mut self, _: &Path, curve: &[StepMetrics]) -> Result<()> {
        let steps: Vec<String> = curve.iter().map(|m| m.step.to_string()).collect();
        self.0.lock().unwrap().push(format!("end {}", steps.join(",")));
        Ok(())
    }
}

/// Fails at its second step.
struct Failing(u32, Arc<Mutex<u32>>);

impl TrainObserver for Failing {
    fn on_step(&mut self, _: &StepMetrics) -> Result<()> {
        self.0 += 1;
        *self.1.lock().unwrap() += 1;
        if self.0 == 2 {
            return Err(Error::invalid("tensorboard", "No space left on device"));
        }
        Ok(())
    }
    fn name(&self) -> String {
        "failing".into()
    }
}

#[test]
fn rank_zero_calls_each_hook_and_a_resumed_run_reports_the_whole_curve() {
    let data = corpus().sequences(0, 64);
    let dir = workdir("observe");
    // four thread ranks, one caller
    let dep = Deployer::new("2x2".parse().unwrap(), 3, &dir).unwrap();
    let mut cfg = config(4, 8, 1);
    cfg.checkpoint_every = Some(2);
    let rec = Recorder::default();
    let calls = Arc::new(Mutex::new(0));
    let r =
        trainer(cfg.clone()).observe(rec.clone()).observe(Failing(0, calls.clone())).fit(&dep, &data, false).unwrap();
    assert_eq!(
        *rec.0.lock().unwrap(),
        ["start 0 4", "step 1", "step 2", "step 3", "step 4", "end 1,2,3,4"],
        "the run goes on past the failing observer"
    );
    assert_eq!(*calls.lock().unwrap(), 2, "the failing observer is detached at its error");
    assert_eq!(r.observer_errors.len(), 1, "{:?}", r.observer_errors);
    assert!(r.observer_errors[0].contains("failing (on_step)") && r.observer_errors[0].contains("No space left"));
    assert!(!dir.join("loss.png").exists(), "core draws no plot");

    // a longer run resumed from step 4 starts there and ends with the whole curve
    cfg.steps = 6;
    cfg.schedule.total = 6;
    let rec = Recorder::default();
    let r = trainer(cfg).observe(rec.clone()).fit(&dep, &data, true).unwrap();
    assert_eq!(r.start_step, 4);
    assert_eq!(*rec.0.lock().unwrap(), ["start 4 6", "step 5", "step 6", "end 1,2,3,4,5,6"]);
    assert!(r.observer_errors.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
