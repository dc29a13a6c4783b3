//! TensorBoard scalars: an event file of `Event` protobufs in TFRecord framing, written
//! without TensorFlow (the few messages are derived here, the framing is 30 lines).

use redco_core::{Error, Result};
use redco_pipeline::metrics::StepMetrics;
use redco_pipeline::observe::TrainObserver;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `tensorflow.Event` (tensorflow/core/util/event.proto), with the members of its `what`
/// oneof that a scalar log needs as optional fields (the same bytes on the wire).
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    /// Seconds since the epoch.
    #[prost(double, tag = "1")]
    wall_time: f64,
    /// The global step.
    #[prost(int64, tag = "2")]
    step: i64,
    /// `brain.Event:2` in a file's first event.
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    /// The scalars of a step.
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`: a list of tagged values.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with its `simple_value` member: one scalar.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// The event-file version TensorBoard expects in a file's first event.
pub const FILE_VERSION: &str = "brain.Event:2";

/// CRC32C of `data`, masked as TFRecord stores it (a CRC of data holding CRCs is weak).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: the length (u64, little-endian), the masked CRC32C of those 8 bytes, the
/// data, the masked CRC32C of the data.
pub fn tfrecord(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// Writes TensorBoard scalar events to one event file; each [`EventWriter::scalars`] call
/// is one record written straight to the file (no buffer: a crash keeps every step logged).
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` and a new event file in it,
    /// `events.out.tfevents.<seconds>.<host>.<pid>.<n>` (`n` counts the files this process
    /// made, so two runs in one second get two files), starting with the file-version event.
    pub fn create(dir: &Path) -> Result<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(dir).map_err(|e| Error::io("tensorboard", "cannot create", dir, e))?;
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("events.out.tfevents.{secs}.{}.{}.{n}", host(), std::process::id()));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io("tensorboard", "cannot create", &path, e))?;
        let mut w = EventWriter { file, path };
        let first = Event { wall_time: now(), step: 0, file_version: Some(FILE_VERSION.into()), summary: None };
        w.write(&first)?;
        Ok(w)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Logs `values` (tag, value) at `step`, stamped with the wall time now, as one event.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<()> {
        let value = values
            .iter()
            .map(|(tag, v)| SummaryValue { tag: tag.to_string(), simple_value: Some(*v as f32) })
            .collect();
        let ev = Event { wall_time: now(), step: step as i64, file_version: None, summary: Some(Summary { value }) };
        self.write(&ev)
    }

    fn write(&mut self, ev: &Event) -> Result<()> {
        let rec = tfrecord(&prost::Message::encode_to_vec(ev));
        self.file
            .write_all(&rec)
            .and_then(|()| self.file.flush())
            .map_err(|e| Error::io("tensorboard", "cannot write", &self.path, e))
    }
}

/// The [`TrainObserver`] that logs every step's scalars for TensorBoard in
/// `<workdir>/tensorboard/` (`tensorboard --logdir <workdir>/tensorboard`): `loss`,
/// `learning_rate`, `grad_norm`, `tokens_per_s`, and `eval` (and `moe_dropped`) on the steps that have it,
/// each with its step and wall time. Non-finite values (e.g. a gradient norm that was not
/// measured) are left out.
///
/// Each run (a resumed one too) adds a new event file; TensorBoard reads a directory's
/// files in order and drops the points that a resumed run repeats. A run that starts at
/// step 0 replaced any earlier run in the workdir (the trainer refuses it otherwise), so
/// it removes the earlier runs' event files from the directory first.
#[derive(Debug, Default)]
pub struct TensorBoard {
    dir: Option<PathBuf>,
    writer: Option<EventWriter>,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter").field("path", &self.path).finish()
    }
}

impl TensorBoard {
    /// Event files in `<workdir>/tensorboard/`.
    pub fn new() -> Self {
        TensorBoard::default()
    }

    /// Event files in `dir` instead.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        TensorBoard { dir: Some(dir.into()), writer: None }
    }

    /// The current run's event file, once the run started.
    pub fn path(&self) -> Option<&Path> {
        self.writer.as_ref().map(EventWriter::path)
    }
}

impl TrainObserver for TensorBoard {
    fn on_start(&mut self, workdir: &Path, first_step: u64, _total: u64) -> Result<()> {
        let dir = self.dir.clone().unwrap_or_else(|| workdir.join("tensorboard"));
        if first_step == 0 {
            remove_event_files(&dir)?;
        }
        self.writer = Some(EventWriter::create(&dir)?);
        Ok(())
    }

    fn on_step(&mut self, m: &StepMetrics) -> Result<()> {
        let Some(w) = self.writer.as_mut() else {
            return Err(Error::invalid("tensorboard", "on_step before on_start"));
        };
        let mut values = vec![
            ("loss", m.loss),
            ("learning_rate", m.lr),
            ("grad_norm", m.grad_norm),
            ("tokens_per_s", m.tokens_per_s),
        ];
        values.extend(m.eval.map(|e| ("eval", e)));
        values.extend(m.moe_dropped.map(|d| ("moe_dropped", d)));
        values.retain(|(_, v)| v.is_finite());
        w.scalars(m.step, &values)
    }

    fn on_end(&mut self, _workdir: &Path, _curve: &[StepMetrics]) -> Result<()> {
        if let Some(w) = self.writer.take() {
            w.file.sync_all().map_err(|e| Error::io("tensorboard", "cannot sync", &w.path, e))?;
        }
        Ok(())
    }

    fn name(&self) -> String {
        "tensorboard".into()
    }
}

/// Removes the `events.out.tfevents.*` files of `dir` (nothing else).
fn remove_event_files(dir: &Path) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with("events.out.tfevents.") {
            let p = e.path();
            std::fs::remove_file(&p).map_err(|e| Error::io("tensorboard", "cannot remove", &p, e))?;
        }
    }
    Ok(())
}

/// Seconds since the epoch.
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The host's name for the file name (letters, digits, `-` and `_` only).
fn host() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let h: String = raw.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect();
    if h.is_empty() {
        "localhost".into()
    } else {
        h
    }
}
