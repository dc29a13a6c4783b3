//! `--model FILE.gguf` for `generate`, `serve` and `eval-dump`: a LLaMA-family GGUF file
//! (as llama.cpp and its converters write them) is read into a Hugging Face model
//! directory once, the linear layers' quantized blocks (`Q8_0`, `Q4_0`, `Q4_1`, `Q4_K`, `Q6_K`)
//! kept as they are on the backends that read them in place (CPU and CUDA,
//! `Tensor::matmul_quant`) and dequantized to the run's dtype on the others and for the rest, its vocabulary and chat template as `tokenizer.json` and
//! `chat_template.jinja` ([`redco_models::gguf::llama::import`]), and the command runs on
//! that directory. The directory is kept in the user's cache (`~/.cache/redco/gguf`, or
//! under `$XDG_CACHE_HOME`) under a name made from the file (its path, length and
//! modification time), the dtype and redco's version, so the next run on the same file
//! starts at once (delete the directory to reclaim its space); a type or layout the reader
//! does not know is refused by name before anything else runs.

use crate::cmd::error::CliResult;
use redco_core::DType;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// Whether `model` names a GGUF file.
pub fn is_gguf(model: &Path) -> bool {
    model.is_file() && model.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The model directory the command runs on: `model` itself, or for a GGUF file the
/// directory it was read into, dequantized to `dtype` apart from the linear layers' blocks
/// when `keep_blocks` (read now when not read before).
pub fn resolve(model: &Path, dtype: DType, keep_blocks: bool) -> CliResult<PathBuf> {
    if !is_gguf(model) {
        return Ok(model.to_path_buf());
    }
    let meta = std::fs::metadata(model).map_err(|e| format!("cannot read {}: {e}", model.display()))?;
    let canon = model.canonicalize().unwrap_or_else(|_| model.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let version = env!("CARGO_PKG_VERSION");
    (canon.as_path(), meta.len(), meta.modified().ok(), format!("{dtype:?}"), version, keep_blocks).hash(&mut h);
    let stem = model.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let root = cache_root()?;
    let kind = if keep_blocks { "blocks-" } else { "" };
    let dir = root.join(format!("{stem}-{kind}{}-{:016x}", format!("{dtype:?}").to_lowercase(), h.finish()));
    if dir.join(DONE).exists() {
        return Ok(dir);
    }
    crate::cmd::out::warn(format_args!(
        "redco: reading {} into {} ({})",
        model.display(),
        dir.display(),
        if keep_blocks {
            format!("the linear layers' blocks kept, the rest dequantized to {dtype:?}")
        } else {
            format!("quantized blocks dequantized to {dtype:?}")
        }
    ));
    // each process reads into its own directory and publishes it by a rename: several
    // ranks starting at once each read, and the first rename wins
    let tmp = root.join(format!(".{stem}-{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let read = redco_models::gguf::llama::import(model, &tmp, dtype, keep_blocks).and_then(|()| {
        std::fs::write(tmp.join(DONE), b"")
            .map_err(|e| redco_core::Error::io("gguf", "cannot write", tmp.join(DONE), e))
    });
    if let Err(e) = read {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(format!("{}: {e}", model.display()).into());
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // another process published it first
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join(DONE).exists() {
            return Err(format!("cannot publish {} as {}", tmp.display(), dir.display()).into());
        }
    }
    Ok(dir)
}

/// The user's own directory for models read from GGUF files: `$XDG_CACHE_HOME/redco/gguf`
/// or `~/.cache/redco/gguf`, created readable by the user alone (a directory in a shared
/// temporary directory could be planted by another user).
fn cache_root() -> CliResult<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
        .ok_or("--model FILE.gguf: neither XDG_CACHE_HOME nor HOME is set, so there is no cache to read it into")?;
    let root = base.join("redco").join("gguf");
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    Ok(root)
}

/// The marker of a directory read completely.
const DONE: &str = ".redco-gguf-complete";
