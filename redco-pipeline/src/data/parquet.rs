//! Parquet files: the footer's metadata (schema, rows per row group) read once, a row group
//! decoded a chunk at a time when one of its rows is asked for.

use super::table::{guard, Blocks, TableDataset};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use redco_core::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Rows decoded at a time from one row group (a row group may hold millions of rows).
const CHUNK_ROWS: usize = 16384;

/// One Parquet file.
pub(crate) struct ParquetFile {
    path: PathBuf,
    file: Mutex<File>,
    meta: ArrowReaderMetadata,
    rows: Vec<usize>,
}

fn bad(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::data("data", format!("{}: not a readable Parquet file: {what}", path.display()))
}

impl ParquetFile {
    /// Reads `path`'s footer.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io("data", "cannot read", path, e))?;
        let meta =
            guard(path, || ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(|e| bad(path, e)))?;
        let rows = meta
            .metadata()
            .row_groups()
            .iter()
            .enumerate()
            .map(|(i, rg)| {
                usize::try_from(rg.num_rows())
                    .map_err(|_| bad(path, format!("row group {i} claims {} rows", rg.num_rows())))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ParquetFile { path: path.to_path_buf(), file: Mutex::new(file), meta, rows })
    }
}

impl Blocks for ParquetFile {
    fn path(&self) -> &Path {
        &self.path
    }
    fn schema(&self) -> &SchemaRef {
        self.meta.schema()
    }
    fn block_rows(&self) -> &[usize] {
        &self.rows
    }
    fn chunk_rows(&self) -> usize {
        CHUNK_ROWS
    }
    fn read(&self, b: usize, offset: usize, n: usize) -> Result<RecordBatch> {
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let input = f.try_clone().map_err(|e| bad(&self.path, e))?;
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(input, self.meta.clone())
            .with_row_groups(vec![b])
            .with_offset(offset)
            .with_limit(n)
            .with_batch_size(n.max(1))
            .build()
            .map_err(|e| bad(&self.path, format!("row group {b}: {e}")))?;
        let batch = reader
            .next()
            .transpose()
            .map_err(|e| bad(&self.path, format!("row group {b}: {e}")))?
            .ok_or_else(|| bad(&self.path, format!("row group {b} holds fewer rows than its metadata says")))?;
        Ok(batch)
    }
}

impl TableDataset {
    /// The rows of the Parquet file `path` (as `datasets`' `to_parquet` and pyarrow write
    /// it: any of the usual codecs, snappy, gzip, lz4, zstd).
    pub fn parquet(path: &Path) -> Result<Self> {
        TableDataset::new(path, vec![Box::new(ParquetFile::open(path)?)])
    }
}
