//! llama.cpp as `bench decode`'s peer on the same GGUF file (`--peer-llama-cpp BIN`): its
//! own `llama-bench`, one repetition at a time between redco's, for decode (`tg` at the
//! prompt's depth) and prompt processing (`pp`), on the CPU (`-ngl 0`: a llama.cpp built
//! with a GPU backend would otherwise offload every layer).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `llama-bench` on one GGUF file with a thread count.
pub(super) struct LlamaBench {
    bin: PathBuf,
    model: String,
    threads: usize,
    /// `build_commit` and `build_number` as llama-bench reports them.
    pub info: String,
}

impl LlamaBench {
    /// `arg`: the `llama-bench` binary, or a directory holding it (llama.cpp's `build/bin`).
    pub(super) fn new(arg: &str, model: &str, threads: usize) -> Result<Self, String> {
        let mut me = LlamaBench { bin: Self::binary(arg)?, model: model.to_string(), threads, info: String::new() };
        let v = me.run(1, 1, 0)?;
        me.info = format!(
            "llama.cpp {} (build {}), {}",
            v["build_commit"].as_str().unwrap_or("?"),
            v["build_number"].as_i64().unwrap_or(0),
            v["cpu_info"].as_str().unwrap_or("?")
        );
        Ok(me)
    }

    /// The `llama-bench` binary `arg` names (itself, or the directory holding it).
    pub(super) fn binary(arg: &str) -> Result<PathBuf, String> {
        let p = Path::new(arg);
        let bin = if p.is_dir() { p.join("llama-bench") } else { p.to_path_buf() };
        if !bin.is_file() {
            return Err(format!(
                "--peer-llama-cpp {arg}: no llama-bench there (give the binary or llama.cpp's build/bin)"
            ));
        }
        Ok(bin)
    }

    /// The JSON row of one `llama-bench` run of `p` prompt tokens or `n` new tokens at
    /// depth `d` (one of `p`, `n` is 0).
    fn run(&self, p: usize, n: usize, d: usize) -> Result<serde_json::Value, String> {
        let out = Command::new(&self.bin)
            .args(["-m", &self.model, "-t", &self.threads.to_string(), "-r", "1", "-o", "json", "-ngl", "0"])
            .args(["-p", &p.to_string(), "-n", &n.to_string(), "-d", &d.to_string()])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!("{} failed: {}", self.bin.display(), err.lines().last().unwrap_or("")));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("{}: its JSON output: {e}", self.bin.display()))?;
        let rows = v.as_array().ok_or_else(|| format!("{}: no rows in its output", self.bin.display()))?;
        rows.last().cloned().ok_or_else(|| format!("{}: no rows in its output", self.bin.display()))
    }

    /// Seconds a token of decode takes after `depth` tokens of context (`tg new @ d depth`).
    pub(super) fn decode_s(&self, new: usize, depth: usize) -> Result<f64, String> {
        let ts = self.run(0, new, depth)?["avg_ts"].as_f64().ok_or("llama-bench: no avg_ts")?;
        Ok(1.0 / ts)
    }

    /// Tokens per second of a `tokens`-token prompt (`pp tokens`).
    pub(super) fn prefill_tok_s(&self, tokens: usize) -> Result<f64, String> {
        self.run(tokens, 0, 0)?["avg_ts"].as_f64().ok_or_else(|| "llama-bench: no avg_ts".to_string())
    }
}
