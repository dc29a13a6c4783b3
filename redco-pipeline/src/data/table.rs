//! A table of rows kept on disk in one or more files of record batches (Parquet row groups,
//! Arrow IPC record batches): a row index from the files' metadata, and the last decoded
//! chunk cached, so memory holds one chunk of rows at a time whatever the table's size.

use super::{value, Dataset};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use redco_core::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One file of a table, read a block (row group, record batch) at a time.
pub(crate) trait Blocks: Send + Sync {
    /// The file.
    fn path(&self) -> &Path;
    /// Its columns.
    fn schema(&self) -> &SchemaRef;
    /// Rows per block, from the file's metadata.
    fn block_rows(&self) -> &[usize];
    /// Rows decoded at a time: a block is read in chunks of this many rows.
    fn chunk_rows(&self) -> usize;
    /// Rows `offset..offset + n` of block `b` (a chunk), decoded.
    fn read(&self, b: usize, offset: usize, n: usize) -> Result<RecordBatch>;
}

/// Runs a decoder call, turning a panic inside it (arrow and parquet may panic on some
/// corrupt inputs instead of answering an error) into an error naming `path`.
pub(crate) fn guard<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::data("data", format!("{}: the decoder failed on this file (corrupt data?)", path.display())))
    })
}

/// A block of a table: which file, which block in it, and the table row it starts at.
struct Unit {
    part: usize,
    block: usize,
    start: usize,
    rows: usize,
}

/// The last decoded chunk: (unit, chunk index in it) and its rows.
type Cached = Option<((usize, usize), RecordBatch)>;

/// Rows of Parquet files, Arrow IPC files or a `datasets` `save_to_disk` directory as JSON
/// objects (column name to value), streamed: only the row index lives in memory, and one
/// decoded chunk (a row group or record batch, Parquet's cut to at most 16384 rows).
pub struct TableDataset {
    name: PathBuf,
    parts: Vec<Box<dyn Blocks>>,
    units: Vec<Unit>,
    len: usize,
    columns: Vec<String>,
    cache: Mutex<Cached>,
}

impl TableDataset {
    /// A table of the files `parts` (all with the same columns), named `name` in errors.
    pub(crate) fn new(name: &Path, parts: Vec<Box<dyn Blocks>>) -> Result<Self> {
        let columns: Vec<String> = match parts.first() {
            Some(p) => p.schema().fields().iter().map(|f| f.name().clone()).collect(),
            None => return Err(Error::invalid("data", format!("{}: no data files", name.display()))),
        };
        let mut units = Vec::new();
        let mut len = 0usize;
        for (pi, p) in parts.iter().enumerate() {
            let cols: Vec<&String> = p.schema().fields().iter().map(|f| f.name()).collect();
            if cols.len() != columns.len() || cols.iter().zip(&columns).any(|(a, b)| *a != b) {
                return Err(Error::invalid(
                    "data",
                    format!(
                        "{} has columns {} but {} has {}",
                        p.path().display(),
                        list(cols.iter().map(|c| c.as_str())),
                        parts[0].path().display(),
                        list(columns.iter().map(String::as_str))
                    ),
                ));
            }
            for (block, &rows) in p.block_rows().iter().enumerate() {
                if rows > 0 {
                    units.push(Unit { part: pi, block, start: len, rows });
                }
                len = len
                    .checked_add(rows)
                    .ok_or_else(|| Error::invalid("data", format!("{}: row counts overflow", p.path().display())))?;
            }
        }
        Ok(TableDataset { name: name.to_path_buf(), parts, units, len, columns, cache: Mutex::new(None) })
    }

    /// The column names, in schema order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The decoded blocks' count (row groups or record batches over all files).
    pub fn blocks(&self) -> usize {
        self.units.len()
    }

    /// The file or directory the table was opened from.
    pub fn path(&self) -> &Path {
        &self.name
    }
}

/// Names as "`a`, `b`".
fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

impl Dataset<serde_json::Value> for TableDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, i: usize) -> Result<serde_json::Value> {
        if i >= self.len {
            return Err(Error::invalid("data", format!("{}: index {i} out of {} rows", self.name.display(), self.len)));
        }
        let u = self.units.partition_point(|u| u.start <= i) - 1;
        let unit = &self.units[u];
        let part = &self.parts[unit.part];
        let chunk_rows = part.chunk_rows().max(1);
        let in_unit = i - unit.start;
        let chunk = in_unit / chunk_rows;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.as_ref().map(|(k, _)| *k) != Some((u, chunk)) {
            *cache = None;
            let offset = chunk * chunk_rows;
            let n = chunk_rows.min(unit.rows - offset);
            let batch = guard(part.path(), || part.read(unit.block, offset, n))?;
            if batch.num_rows() != n {
                return Err(Error::invalid(
                    "data",
                    format!(
                        "{}: block {} decoded {} rows where its metadata promises {n} (corrupt file?)",
                        part.path().display(),
                        unit.block,
                        batch.num_rows()
                    ),
                ));
            }
            *cache = Some(((u, chunk), batch));
        }
        let Some((_, batch)) = cache.as_ref() else {
            return Err(Error::data("data", format!("{}: no decoded rows", part.path().display())));
        };
        let row = in_unit - chunk * chunk_rows;
        let why = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| value::row(batch, row))) {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => strip(&e),
            Err(_) => "the decoder failed on this row (corrupt data?)".into(),
        };
        Err(Error::data("data", format!("{} row {i}: {why}", self.name.display())))
    }

    fn require_field(&self, name: &str) -> Result<()> {
        if self.columns.iter().any(|c| c == name) {
            return Ok(());
        }
        Err(Error::invalid(
            "data",
            format!(
                "{}: no field `{name}`; its columns are {}",
                self.name.display(),
                list(self.columns.iter().map(String::as_str))
            ),
        ))
    }
}

/// An error's message without its `op: ` prefix.
fn strip(e: &Error) -> String {
    match e {
        Error::Invalid { msg, .. } | Error::Data { msg, .. } => msg.clone(),
        other => other.to_string(),
    }
}
