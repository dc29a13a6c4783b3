//! Example sources: a `Vec`, an iterator (collected), a JSONL file streamed from disk, and
//! (feature `datasets`) the files Hugging Face `datasets` writes: Parquet, Arrow IPC and
//! `save_to_disk` directories, streamed a row group or record batch at a time.
//!
//! Training reads examples by index in a seeded order, so a resumed run sees exactly the
//! examples the interrupted one would have. [`open`] picks the reader from the path.

mod jsonl;
pub use jsonl::JsonlDataset;

#[cfg(feature = "datasets")]
mod hf_disk;
#[cfg(feature = "datasets")]
mod ipc;
#[cfg(feature = "datasets")]
mod parquet;
#[cfg(feature = "datasets")]
mod table;
#[cfg(feature = "datasets")]
mod value;
#[cfg(feature = "datasets")]
pub use hf_disk::DEFAULT_SPLIT;
#[cfg(feature = "datasets")]
pub use table::TableDataset;

use redco_core::{Error, Result};
use std::path::Path;

/// Indexable examples.
pub trait Dataset<E>: Sync {
    /// The number of examples.
    fn len(&self) -> usize;
    /// True when there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Example `i` (`i < len()`).
    fn get(&self, i: usize) -> Result<E>;
    /// Checks up front that every example has the field `name`, where the source knows its
    /// schema (a table's columns): an error names the source and lists the fields it has.
    /// Sources without a schema (a `Vec`, JSONL) accept any name here and find out example
    /// by example.
    fn require_field(&self, name: &str) -> Result<()> {
        let _ = name;
        Ok(())
    }
}

impl<E: Clone + Sync> Dataset<E> for Vec<E> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn get(&self, i: usize) -> Result<E> {
        self.as_slice()
            .get(i)
            .cloned()
            .ok_or_else(|| Error::invalid("dataset", format!("index {i} out of {} examples", self.as_slice().len())))
    }
}

/// Collects an iterator of examples into an indexable dataset.
pub fn from_iter<E, I: IntoIterator<Item = E>>(it: I) -> Vec<E> {
    it.into_iter().collect()
}

/// What [`open`] returns: examples as JSON objects, one per line or row.
pub type JsonDataset = Box<dyn Dataset<serde_json::Value> + Send + Sync>;

/// The kind of data source a path names, from its extension or, for a directory, its
/// contents (nothing is decoded yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// A JSONL file (`.jsonl`, `.json`): one JSON object per line.
    Jsonl,
    /// A Parquet file (`.parquet`).
    Parquet,
    /// An Arrow IPC file, in the file or the streaming format (`.arrow`, `.ipc`, `.feather`).
    Arrow,
    /// A directory written by `datasets`' `Dataset.save_to_disk` or `DatasetDict.save_to_disk`.
    HfDisk,
}

impl SourceKind {
    /// The kind of `path`, or an error naming the path and the kinds there are.
    pub fn of(path: &Path) -> Result<SourceKind> {
        if path.is_dir() {
            return Ok(SourceKind::HfDisk);
        }
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("jsonl" | "json") => Ok(SourceKind::Jsonl),
            Some("parquet") => Ok(SourceKind::Parquet),
            Some("arrow" | "ipc" | "feather") => Ok(SourceKind::Arrow),
            _ => match sniff(path) {
                Some(kind) => Ok(kind),
                None => Err(Error::invalid(
                    "data",
                    format!(
                        "{}: unknown data format (expected a .jsonl/.json file, a .parquet file, an Arrow \
                     .arrow/.ipc/.feather file, or a directory written by datasets' save_to_disk)",
                        path.display()
                    ),
                )),
            },
        }
    }
}

/// The kind of a file with another extension, from its first bytes: Parquet's and Arrow's
/// magic numbers, or JSONL when the first non-blank byte opens an object (so a JSONL file
/// named `.txt` reads as it did before the other formats existed); `None` otherwise.
fn sniff(path: &Path) -> Option<SourceKind> {
    use std::io::Read;
    let mut head = [0u8; 512];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut head).ok()?;
    let head = &head[..n];
    if head.starts_with(b"PAR1") {
        return Some(SourceKind::Parquet);
    }
    // the file format's magic, or the streaming format's continuation marker
    if head.starts_with(b"ARROW1") || head.starts_with(&[0xff, 0xff, 0xff, 0xff]) {
        return Some(SourceKind::Arrow);
    }
    match head.iter().find(|c| !c.is_ascii_whitespace()) {
        Some(b'{') => Some(SourceKind::Jsonl),
        _ => None,
    }
}

/// Opens the training data at `path`, choosing the reader by the path: a directory written
/// by `datasets`' `save_to_disk` (a `DatasetDict`'s `train` split), `.parquet`,
/// `.arrow`/`.ipc`/`.feather` (Arrow IPC, file or streaming format), or `.jsonl`/`.json`
/// (one JSON object per line). Every example is a JSON object of the row's columns.
/// Without the `datasets` feature, Parquet, Arrow and directories are an error that says so.
pub fn open(path: &Path) -> Result<JsonDataset> {
    open_split(path, None)
}

/// [`open`], choosing the split of a `DatasetDict` directory (`None`: `train`); a split
/// that is not there is an error listing the splits. Other sources have no splits: a
/// split named for one is an error.
pub fn open_split(path: &Path, split: Option<&str>) -> Result<JsonDataset> {
    let kind = SourceKind::of(path)?;
    if let (Some(s), false) = (split, kind == SourceKind::HfDisk) {
        return Err(Error::invalid(
            "data",
            format!("{}: split `{s}` asked for, but only a DatasetDict directory has splits", path.display()),
        ));
    }
    match kind {
        SourceKind::Jsonl => Ok(Box::new(JsonlDataset::open(path)?)),
        #[cfg(feature = "datasets")]
        SourceKind::Parquet => Ok(Box::new(TableDataset::parquet(path)?)),
        #[cfg(feature = "datasets")]
        SourceKind::Arrow => Ok(Box::new(TableDataset::arrow(path)?)),
        #[cfg(feature = "datasets")]
        SourceKind::HfDisk => Ok(Box::new(TableDataset::hf_disk(path, split)?)),
        #[cfg(not(feature = "datasets"))]
        _ => Err(Error::invalid(
            "data",
            format!(
                "{}: reading Parquet, Arrow and save_to_disk data needs redco built with the `datasets` feature",
                path.display()
            ),
        )),
    }
}

#[cfg(all(test, feature = "datasets"))]
mod tests;

#[cfg(all(test, not(feature = "datasets")))]
mod without_datasets {
    use super::open;
    use std::path::Path;

    #[test]
    fn tables_say_they_need_the_feature() {
        for p in ["t.parquet", "t.arrow", "."] {
            let e = open(Path::new(p)).err().expect("refused").to_string();
            assert!(e.contains(p) && e.contains("`datasets` feature"), "{e}");
        }
    }
}
