//! llama.cpp as the peer of `bench serve` (`--peer-llama-cpp BIN`, BIN a `llama-server`).
//!
//! llama.cpp reads no word-level tokenizer, so with this peer the model gets a SentencePiece
//! vocabulary both servers read: `--llama-vocab FILE` (a GGUF file holding one, e.g.
//! llama.cpp's `models/ggml-vocab-llama-spm.gguf`, LLaMA's 32,000 pieces; by default that
//! file of the llama.cpp tree BIN was built in). The preset is written with that
//! vocabulary's size, random weights (uniform in ±0.035) and the vocabulary as
//! `tokenizer.json` (`redco_models::gguf::vocab`); `redco convert --to gguf` then writes the
//! same model for llama.cpp at the benchmark's `--dtype`. Prompts are whole-word pieces of the
//! vocabulary joined by spaces, so both servers see the same tokens.
//!
//! `llama-server` runs with as many slots as the largest concurrency level (512 tokens
//! each), the machine's cores as threads, and its KV cache in redco's `--kv-dtype`.

use super::serve::Server;
use crate::args::Args;
use redco_models::gguf::{format::Gguf, vocab};
use redco_models::hf::config::HfConfig;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The SentencePiece vocabulary the model gets: `--llama-vocab`, else with
/// `--peer-llama-cpp BIN` `models/ggml-vocab-llama-spm.gguf` of the llama.cpp source tree
/// whose `build/bin` holds BIN; None without either (the preset's word-level vocabulary).
pub(super) fn vocab_file(a: &Args) -> Result<Option<PathBuf>, String> {
    if let Some(v) = a.get("llama-vocab") {
        return Ok(Some(PathBuf::from(v)));
    }
    let Some(bin) = a.get("peer-llama-cpp").map(Path::new) else { return Ok(None) };
    let bin = bin.canonicalize().map_err(|e| format!("{}: {e}", bin.display()))?;
    let found = bin.ancestors().map(|d| d.join("models").join("ggml-vocab-llama-spm.gguf")).find(|p| p.is_file());
    found.map(Some).ok_or_else(|| {
        format!(
            "no SentencePiece vocabulary for the llama.cpp peer: pass --llama-vocab FILE \
                 (llama.cpp's models/ggml-vocab-llama-spm.gguf; none was found above {})",
            bin.display()
        )
    })
}

/// Writes `preset` into `dir` with the SentencePiece vocabulary of GGUF file `vocab_gguf`:
/// `config.json`, random bf16 weights, `tokenizer.json` and `tokenizer_config.json`.
pub(super) fn write_model(dir: &Path, preset: &str, vocab_gguf: &Path) -> Result<(), String> {
    let (g, _map) = Gguf::open(vocab_gguf).map_err(|e| e.to_string())?;
    let v = vocab::spm_from_gguf(&g).map_err(|e| e.to_string())?;
    let text = redco_models::presets::config(preset, v.tokens.len()).map_err(|e| e.to_string())?.to_string();
    let cfg = HfConfig::from_json(&text).map_err(|e| e.to_string())?;
    super::random_ckpt::write(dir, &text, &cfg.param_shapes().map_err(|e| e.to_string())?)?;
    let json = vocab::hf_json_from_spm(&v).map_err(|e| e.to_string())?;
    let write = |f: &str, v: &serde_json::Value| {
        std::fs::write(dir.join(f), v.to_string()).map_err(|e| format!("{}: {e}", dir.join(f).display()))
    };
    write("tokenizer.json", &json)?;
    write("tokenizer_config.json", &vocab::hf_config_from_spm(&v))
}

/// The whole-word pieces of a SentencePiece `tokenizer.json` (`▁` then 3 or more ASCII
/// lowercase letters), without the `▁`, sorted.
pub(super) fn words(tokenizer_json: &str) -> Result<Vec<String>, String> {
    let t: serde_json::Value = serde_json::from_str(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
    let mut words: Vec<String> = t["model"]["vocab"]
        .as_object()
        .map(|v| {
            v.keys()
                .filter_map(|k| k.strip_prefix('▁'))
                .filter(|w| w.len() >= 3 && w.bytes().all(|b| b.is_ascii_lowercase()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    words.sort();
    if words.len() < 100 {
        return Err(format!("the vocabulary has only {} whole-word pieces to draw prompts from", words.len()));
    }
    Ok(words)
}

/// `redco convert --to gguf` of `dir` at `dtype`: the file written.
pub(super) fn convert(redco: &Path, dir: &Path, dtype: &str) -> Result<PathBuf, String> {
    let out = dir.join(format!("model-{dtype}.gguf"));
    let o = Command::new(redco)
        .args(["convert", "--to", "gguf", "--dtype", dtype, "--input"])
        .arg(dir)
        .arg("--out")
        .arg(&out)
        .output()
        .map_err(|e| format!("{}: {e}", redco.display()))?;
    if !o.status.success() {
        return Err(format!("redco convert --to gguf failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(out)
}

/// `llama-quantize` (beside `server`, a `llama-server`) of `f32_file` to llama.cpp's type
/// `ty` (`q8_0`, `q4_k_m`, ...): the file written beside it.
pub(super) fn quantize(server: &Path, f32_file: &Path, ty: &str) -> Result<PathBuf, String> {
    let tool = server.with_file_name("llama-quantize");
    let out = f32_file.with_file_name(format!("model-{}.gguf", ty.to_lowercase()));
    let o = Command::new(&tool)
        .arg(f32_file)
        .arg(&out)
        .arg(ty.to_uppercase())
        .output()
        .map_err(|e| format!("{} (llama-quantize is looked for beside the llama-server): {e}", tool.display()))?;
    if !o.status.success() {
        return Err(format!("llama-quantize {ty} failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(out)
}

/// llama.cpp's version line (`BIN --version`).
pub(super) fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            let s = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            s.lines().find(|l| l.starts_with("version")).unwrap_or("version unknown").trim().to_string()
        })
        .unwrap_or_default()
}

/// Starts `llama-server` on `gguf` with `slots` slots and its KV cache in `kv_dtype`, once
/// its `/health` answers (bounded: 10 minutes); its output in `dir/llama-server.log`.
pub(super) fn start(
    bin: &Path,
    gguf: &Path,
    dir: &Path,
    slots: usize,
    kv_dtype: &str,
) -> Result<(Server, String), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let log_path = dir.join("llama-server.log");
    let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let threads = crate::machine::cores().to_string();
    let child = Command::new(bin)
        .arg("-m")
        .arg(gguf)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-t", &threads, "-tb", &threads])
        .args(["-np", &slots.to_string(), "-c", &(slots * 512).to_string()])
        .args(["-ctk", kv_dtype, "-ctv", kv_dtype, "--metrics"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let addr = format!("127.0.0.1:{port}");
    super::serve::wait_healthy(Server(child), &addr, &log_path, "llama-server").map(|s| (s, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_the_whole_word_pieces() {
        let mut vocab = serde_json::Map::new();
        for (i, w) in ["▁the", "▁of", "▁Cat", "ing", "▁dog1"].iter().enumerate() {
            vocab.insert(w.to_string(), serde_json::json!(i));
        }
        for i in 0..100 {
            vocab.insert(
                format!("▁w{}", "abcdefghij".chars().nth(i % 10).unwrap().to_string().repeat(2 + i / 10)),
                serde_json::json!(10 + i),
            );
        }
        let t = serde_json::json!({"model": {"vocab": vocab}}).to_string();
        let w = words(&t).unwrap();
        assert!(w.contains(&"the".to_string()));
        assert!(!w.iter().any(|x| x == "of" || x == "Cat" || x == "ing" || x == "dog1"));
        assert_eq!(w.len(), 101);
    }
}
