//! The command line's logs: the library's `tracing` events on stderr (warnings and errors
//! by default) and, once a command has claimed its workdir, appended to
//! `<workdir>/redco.log` (info and above by default; under a launcher by the leader process
//! only, as it writes the run's other files). `RUST_LOG` (an `EnvFilter`: `info`, `debug`,
//! `redco_core=debug,warn`, `off`, ...) sets both.

use crate::cmd::error::CliResult;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::prelude::*;

/// The log file, once a command opened it.
static FILE: Mutex<Option<File>> = Mutex::new(None);

/// Writes to the log file, or nowhere before it is open.
struct FileWriter;

impl Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.write_all(buf).map(|()| buf.len()),
            None => Ok(buf.len()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// `RUST_LOG` when it is set and parses, else `default`.
fn filter(default: &str) -> EnvFilter {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v.trim()).ok())
        .unwrap_or_else(|| EnvFilter::new(default))
}

/// Installs the subscriber: stderr now, the file once [`log_to`] opens it.
pub fn init() {
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .with_filter(filter("warn"));
    let file = tracing_subscriber::fmt::layer().with_writer(|| FileWriter).with_ansi(false).with_filter(filter("info"));
    let _ = tracing_subscriber::registry().with(stderr).with(file).try_init();
}

/// Appends the logs from here on to `path` (e.g. `<workdir>/redco.log`), starting with
/// the command line.
pub fn log_to(path: &Path) -> CliResult<()> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open the log file {}: {e}", path.display()))?;
    *FILE.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    let args: Vec<String> = std::env::args().collect();
    tracing::info!(version = %super::info::version(), command = %args.join(" "), "redco started");
    Ok(())
}
