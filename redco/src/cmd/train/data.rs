//! `redco train --data`: the records of a JSONL file, a Parquet or Arrow IPC file or a
//! `datasets` `save_to_disk` directory (through [`redco_pipeline::data::open`]), their
//! text fields, the digest that identifies them in a run, and the decoder-only packing.

use redco_core::{Error, Result};
use redco_models::hf::tokenizer::Tokenizer;
use redco_pipeline::data::{self, Dataset, JsonDataset, SourceKind};
use redco_pipeline::integrity::FileSum;
use std::path::{Path, PathBuf};

/// The records at `path` (a DatasetDict's split `split`, default train), refused when there
/// are none, with each `(field, flag)` checked up front where the source has a schema (a
/// missing column is then an error listing the columns; JSONL finds out record by record).
pub(super) fn open_data(path: &Path, split: Option<&str>, fields: &[(&str, &str)]) -> Result<JsonDataset> {
    let data = data::open_split(path, split)?;
    if data.is_empty() {
        let what = if SourceKind::of(path)? == SourceKind::Jsonl { "JSON lines" } else { "rows" };
        return Err(Error::invalid("data", format!("{} holds no {what}", path.display())));
    }
    for (field, flag) in fields {
        if let Err(e) = data.require_field(field) {
            let msg = match e {
                Error::Invalid { msg, .. } | Error::Data { msg, .. } => msg,
                other => other.to_string(),
            };
            return Err(Error::invalid("data", format!("{msg} (see {flag})")));
        }
    }
    Ok(data)
}

/// The length and digest of the data at `path`: a file's own, or for a directory the digest
/// of its files' names, lengths and digests (in name order, subdirectories included); the
/// length is their total.
pub(super) fn data_sum(path: &Path) -> Result<FileSum> {
    if !path.is_dir() {
        return FileSum::of_file(path);
    }
    let mut files = Vec::new();
    walk(path, path, 0, &mut files)?;
    files.sort();
    let (mut manifest, mut bytes) = (String::new(), 0u64);
    for rel in files {
        let sum = FileSum::of_file(&path.join(&rel))?;
        manifest += &format!("{}\t{}\t{}\n", rel.display(), sum.bytes, sum.xxh3);
        bytes += sum.bytes;
    }
    Ok(FileSum { bytes, ..FileSum::of(manifest.as_bytes()) })
}

/// The files under `dir` (at most 4 levels down), as paths relative to `root`.
fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
    let err = |e: std::io::Error| Error::invalid("data", format!("cannot read {}: {e}", dir.display()));
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let p = entry.map_err(err)?.path();
        if p.is_dir() && depth < 4 {
            walk(root, &p, depth + 1, out)?;
        } else if p.is_file() {
            out.push(p.strip_prefix(root).unwrap_or(&p).to_path_buf());
        }
    }
    Ok(())
}

/// Tokenises every text of `data` (read from `path`; with `<s>`, then `</s>` after it), concatenates and
/// cuts the stream into sequences of `len` tokens. Texts of any length are tokenised in
/// pieces ([`Tokenizer::encode_long`]), so memory follows the token count, not the longest
/// line's tokenizer bookkeeping; a field of the wrong type and a file of empty texts are
/// errors, some empty texts a warning.
pub(super) fn pack_text(
    data: &dyn Dataset<serde_json::Value>,
    path: &Path,
    field: &str,
    tok: &Tokenizer,
    len: usize,
) -> Result<Vec<Vec<i64>>> {
    let mut stream = Vec::new();
    let mut empty = 0usize;
    for i in 0..data.len() {
        let v = data.get(i)?;
        let text = string_field(&v, field, path, i, "--text-field")?;
        if text.trim().is_empty() {
            empty += 1;
            continue;
        }
        stream.extend(tok.encode_long(text, true)?);
        stream.extend(tok.eos_id());
    }
    if empty == data.len() {
        return Err(Error::invalid("data", format!("every `{field}` in {} is empty", path.display())));
    }
    if empty > 0 {
        crate::cmd::out::warn(format_args!(
            "redco: warning: {empty} of {} records of {} have an empty `{field}` and are skipped",
            data.len(),
            path.display()
        ));
    }
    let seqs: Vec<Vec<i64>> = stream.chunks_exact(len).map(<[i64]>::to_vec).collect();
    if seqs.len() < 2 {
        return Err(Error::invalid(
            "data",
            format!("{} holds {} tokens: too few for two sequences of {len}", path.display(), stream.len()),
        ));
    }
    Ok(seqs)
}

/// Record `i`'s string field `field` (`flag` names the option that chose it), or an error
/// that says what it holds instead.
pub(super) fn string_field<'a>(
    v: &'a serde_json::Value,
    field: &str,
    path: &Path,
    i: usize,
    flag: &str,
) -> Result<&'a str> {
    match v.get(field) {
        Some(serde_json::Value::String(t)) => Ok(t),
        Some(other) => {
            let kind = match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Array(_) => "an array",
                _ => "an object",
            };
            Err(Error::invalid(
                "data",
                format!("{} record {}: `{field}` is {kind}, not a string (see {flag})", path.display(), i + 1),
            ))
        }
        None => {
            Err(Error::invalid("data", format!("{} record {}: no field `{field}` (see {flag})", path.display(), i + 1)))
        }
    }
}
