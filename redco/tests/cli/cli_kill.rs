//! `kill -9` at arbitrary moments of a training run (most of them inside a checkpoint
//! write: it checkpoints every step), then `--resume`: every trial ends with the weights
//! of the uninterrupted run, byte for byte, and no trial leaves a workdir that refuses to
//! resume.

use crate::common::s;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const TRIALS: u64 = 20;

fn args(w: &Path, resume: bool) -> Vec<String> {
    let mut v: Vec<String> = [
        "train",
        "--preset",
        "llama-tiny",
        "--steps",
        "12",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--checkpoint-every",
        "1",
        "--threads",
        "2",
        "--sample-tokens",
        "1",
        "--workdir",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    v.push(s(w).to_string());
    if resume {
        v.push("--resume".into());
    }
    v
}

fn run_to_end(w: &Path, resume: bool) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_redco")).args(args(w, resume)).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

#[test]
fn kill_9_mid_run_then_resume_gives_the_uninterrupted_weights() {
    let whole = crate::common::scratch_dir("kill", "whole");
    run_to_end(&whole, false);
    let want = std::fs::read(whole.join("model.safetensors")).unwrap();
    // how long an uninterrupted run takes, to spread the kills over it
    let t = std::time::Instant::now();
    let probe = crate::common::scratch_dir("kill", "probe");
    run_to_end(&probe, false);
    let span = t.elapsed().as_millis().max(50) as u64;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut killed_mid_run = 0;
    for trial in 0..TRIALS {
        let w = crate::common::scratch_dir("kill", &format!("t{trial}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_redco"))
            .args(args(&w, false))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // from the start of training (a tenth in: past loading) to near the end
        let at = span / 10 + seed % (span * 9 / 10).max(1);
        std::thread::sleep(Duration::from_millis(at));
        let finished = child.try_wait().unwrap().is_some();
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        if !finished {
            killed_mid_run += 1;
        }
        let err = run_to_end(&w, true);
        let got = std::fs::read(w.join("model.safetensors")).unwrap();
        assert!(got == want, "trial {trial} (killed at {at} ms of {span}): resumed weights differ\n{err}");
        let _ = std::fs::remove_dir_all(&w);
    }
    eprintln!("kill -9 trials: {TRIALS}, {killed_mid_run} of them mid-run; every resume byte-identical");
    assert!(killed_mid_run >= TRIALS / 2, "only {killed_mid_run} of {TRIALS} kills landed mid-run");
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&probe);
}
