//! A safetensors file written tensor by tensor: the header first (from the names, dtypes and
//! shapes), then each tensor's bytes as it comes, hashed on the way. A checkpoint of a model
//! whose state is tens of gigabytes is written without a second copy of it in memory.

use super::integrity::FileSum;
use redco_core::{DType, Error, HostData, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

fn st_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::U8 => "U8",
    }
}

/// A safetensors file being written: [`StWriter::put`] each tensor in the order the
/// entries were given, then [`StWriter::finish`] (fsync, rename into place).
pub(crate) struct StWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    hash: Xxh3,
    written: u64,
    /// (name, dtype, bytes) of each entry still to come, in order.
    todo: std::collections::VecDeque<(String, DType, usize)>,
}

impl StWriter {
    /// Starts `path` (under a temporary name) for `entries` (name, dtype, shape), with
    /// header metadata `meta`.
    pub(crate) fn create(
        path: &Path,
        entries: &[(String, DType, Vec<usize>)],
        meta: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let mut header = serde_json::Map::new();
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(meta).map_err(|e| Error::invalid("safetensors", e.to_string()))?,
        );
        let mut at = 0usize;
        let mut todo = std::collections::VecDeque::new();
        for (name, dt, shape) in entries {
            let n = shape.iter().product::<usize>() * dt.size_in_bytes();
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": st_name(*dt), "shape": shape, "data_offsets": [at, at + n]}),
            );
            todo.push_back((name.clone(), *dt, n));
            at += n;
        }
        let mut head = serde_json::to_vec(&header).map_err(|e| Error::invalid("safetensors", e.to_string()))?;
        // the data starts 8-byte aligned
        while (head.len() + 8) % 8 != 0 {
            head.push(b' ');
        }
        let name = path.file_name().map_or_else(|| "file".into(), |f| f.to_string_lossy().to_string());
        let tmp = path.with_file_name(format!(".{name}.{}.part", std::process::id()));
        let file = File::create(&tmp).map_err(|e| Error::io("checkpoint", "cannot create", &tmp, e))?;
        let mut w = StWriter {
            path: path.to_path_buf(),
            tmp,
            out: BufWriter::with_capacity(8 << 20, file),
            hash: Xxh3::new(),
            written: 0,
            todo,
        };
        w.write(&(head.len() as u64).to_le_bytes())?;
        w.write(&head)?;
        Ok(w)
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        if let Err(e) = self.out.write_all(b) {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(Error::io("checkpoint", "cannot write", &self.tmp, e));
        }
        self.hash.update(b);
        self.written += b.len() as u64;
        Ok(())
    }

    /// Writes the next tensor, `name`, whose data is `h`.
    pub(crate) fn put(&mut self, name: &str, h: &HostData) -> Result<()> {
        let (want, dt, n) = self
            .todo
            .pop_front()
            .ok_or_else(|| Error::invalid("safetensors", format!("`{name}`: more tensors than announced")))?;
        let b = h.as_bytes();
        if want != name || dt != h.dtype() || b.len() != n {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(Error::invalid(
                "safetensors",
                format!(
                    "`{name}` ({:?}, {} bytes) written where `{want}` ({dt:?}, {n} bytes) was announced",
                    h.dtype(),
                    b.len()
                ),
            ));
        }
        self.write(b)
    }

    /// Completes the file (every announced tensor written): flushed, fsynced, renamed into
    /// place; its length and digest.
    pub(crate) fn finish(mut self) -> Result<FileSum> {
        if let Some((name, _, _)) = self.todo.front() {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(Error::invalid("safetensors", format!("`{name}` was announced but not written")));
        }
        let tmp = self.tmp.clone();
        let done = (|| -> std::io::Result<()> {
            self.out.flush()?;
            self.out.get_ref().sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = done {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io("checkpoint", "cannot write", &self.path, e));
        }
        sync_dir(self.path.parent().unwrap_or(Path::new(".")));
        Ok(FileSum { bytes: self.written, xxh3: format!("{:032x}", self.hash.digest128()) })
    }
}

/// Syncs `dir`'s entries (a rename into it) to disk, where the OS lets a directory be opened.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
