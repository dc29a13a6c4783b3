//! JSONL: one JSON object per line, streamed from disk by byte offset.

use super::Dataset;
use redco_core::{Error, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A JSONL file read line by line from disk: only the byte offset of each line is kept in
/// memory. Each line parses into `serde_json::Value`; a malformed line is an error that
/// names the file and the line number.
pub struct JsonlDataset {
    path: PathBuf,
    offsets: Vec<(u64, usize)>,
    file: Mutex<File>,
}

impl JsonlDataset {
    /// Indexes `path` (one pass over the file, skipping blank lines).
    pub fn open(path: &Path) -> Result<Self> {
        let err = |e: std::io::Error| Error::io("jsonl", "cannot read", path, e);
        let f = File::open(path).map_err(err)?;
        let mut r = BufReader::new(f);
        let mut offsets = Vec::new();
        let (mut pos, mut line_no) = (0u64, 0usize);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf).map_err(err)?;
            if n == 0 {
                break;
            }
            line_no += 1;
            if buf.iter().any(|c| !c.is_ascii_whitespace()) {
                offsets.push((pos, line_no));
            }
            pos += n as u64;
        }
        Ok(JsonlDataset { path: path.to_path_buf(), offsets, file: Mutex::new(File::open(path).map_err(err)?) })
    }

    /// Checks every line now (instead of when it is first read).
    pub fn validate(&self) -> Result<()> {
        (0..self.offsets.len()).try_for_each(|i| self.get(i).map(|_| ()))
    }
}

impl Dataset<serde_json::Value> for JsonlDataset {
    fn len(&self) -> usize {
        self.offsets.len()
    }
    fn get(&self, i: usize) -> Result<serde_json::Value> {
        let (off, line) = *self
            .offsets
            .as_slice()
            .get(i)
            .ok_or_else(|| Error::invalid("jsonl", format!("index {i} out of range")))?;
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let err = |e: std::io::Error| Error::io("jsonl", "cannot read", &self.path, e);
        f.seek(SeekFrom::Start(off)).map_err(err)?;
        let mut text = String::new();
        BufReader::new(&mut *f).take(1 << 30).read_line(&mut text).map_err(err)?;
        serde_json::from_str(text.trim_end())
            .map_err(|e| Error::data("jsonl", format!("{} line {line}: malformed JSON: {e}", self.path.display())))
    }
}
