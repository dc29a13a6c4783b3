//! Directories written by Hugging Face `datasets`' `save_to_disk`: a `Dataset` (`state.json`
//! listing the Arrow shards in `_data_files`, `dataset_info.json` describing the features,
//! the shards `data-0000X-of-0000N.arrow` in the Arrow streaming format), or a `DatasetDict`
//! (`dataset_dict.json` listing the `splits`, one `Dataset` directory per split).

use super::table::TableDataset;
use redco_core::{Error, Result};
use serde_json::Value;
use std::path::{Component, Path, PathBuf};

/// The split a `DatasetDict` is read from when none is chosen.
pub const DEFAULT_SPLIT: &str = "train";

fn invalid(msg: String) -> Error {
    Error::invalid("data", msg)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| invalid(format!("{}: malformed JSON: {e}", path.display())))
}

/// True for a name that stays inside its directory (one plain path component).
fn plain(name: &str) -> bool {
    let mut c = Path::new(name).components();
    matches!((c.next(), c.next()), (Some(Component::Normal(_)), None))
}

fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// The splits `dataset_dict.json` lists.
fn splits(dir: &Path) -> Result<Vec<String>> {
    let path = dir.join("dataset_dict.json");
    let v = read_json(&path)?;
    let list = v
        .get("splits")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid(format!("{}: no `splits` list", path.display())))?;
    list.iter()
        .map(|s| match s.as_str() {
            Some(s) if plain(s) => Ok(s.to_owned()),
            _ => Err(invalid(format!("{}: `splits` holds {s}, not a split name", path.display()))),
        })
        .collect()
}

/// The Arrow shards `state.json` of the `Dataset` directory `dir` lists, in order.
fn data_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let path = dir.join("state.json");
    let v = read_json(&path)?;
    let files = v
        .get("_data_files")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid(format!("{}: no `_data_files` list", path.display())))?;
    if files.is_empty() {
        return Err(invalid(format!("{}: `_data_files` lists no files", path.display())));
    }
    files
        .iter()
        .map(|f| match f.get("filename").and_then(Value::as_str) {
            Some(name) if plain(name) => Ok(dir.join(name)),
            _ => Err(invalid(format!("{}: `_data_files` holds {f}, not {{\"filename\": NAME}}", path.display()))),
        })
        .collect()
}

/// Checks that the features `dataset_info.json` describes (where it is there) are columns.
fn check_features(dir: &Path, t: &TableDataset) -> Result<()> {
    let path = dir.join("dataset_info.json");
    if !path.is_file() {
        return Ok(());
    }
    let info = read_json(&path)?;
    if let Some(features) = info.get("features").and_then(Value::as_object) {
        let missing: Vec<String> = features.keys().filter(|k| !t.columns().contains(k)).cloned().collect();
        if !missing.is_empty() {
            return Err(invalid(format!(
                "{}: the features {} are not columns of its data files (which hold {})",
                path.display(),
                quoted(&missing),
                quoted(t.columns())
            )));
        }
    }
    Ok(())
}

fn dataset_dir(dir: &Path) -> Result<TableDataset> {
    let t = TableDataset::arrow_files(dir, &data_files(dir)?)?;
    check_features(dir, &t)?;
    Ok(t)
}

impl TableDataset {
    /// The rows of a directory written by `datasets`' `save_to_disk`: a `Dataset`'s, or a
    /// `DatasetDict`'s split `split` (`None`: `train`; a split that is not there is an
    /// error listing those that are).
    pub fn hf_disk(dir: &Path, split: Option<&str>) -> Result<Self> {
        if dir.join("dataset_dict.json").is_file() {
            let splits = splits(dir)?;
            let want = split.unwrap_or(DEFAULT_SPLIT);
            if !splits.iter().any(|s| s == want) {
                let how = if split.is_none() { " (choose one)" } else { "" };
                return Err(invalid(format!(
                    "{}: a DatasetDict without a `{want}` split; its splits are {}{how}",
                    dir.display(),
                    quoted(&splits)
                )));
            }
            return dataset_dir(&dir.join(want));
        }
        if dir.join("state.json").is_file() {
            if let Some(s) = split {
                return Err(invalid(format!(
                    "{}: split `{s}` asked for, but this is one Dataset (state.json), not a DatasetDict",
                    dir.display()
                )));
            }
            return dataset_dir(dir);
        }
        Err(invalid(format!(
            "{}: a directory, but not one written by datasets' save_to_disk (no state.json, no dataset_dict.json)",
            dir.display()
        )))
    }
}
