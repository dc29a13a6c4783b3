//! Writing to stdout and stderr without panicking.
//!
//! `println!` panics when stdout is a closed pipe (`redco plan | head -1`) or a full disk
//! (`redco info > /dev/full`). The commands print through [`out!`](crate::out) and
//! [`outln!`](crate::outln) instead: a closed pipe silently ends the output (the command
//! itself goes on: a training run piped into `head` still trains and saves), any other
//! write error ends it too and is reported once at exit ([`finish`]), which then fails.
//! [`warn`] writes a line to stderr, ignoring errors there (there is nowhere left to say so).

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};
use std::sync::Mutex;

/// The state of stdout: still open, closed by the reader, or failed with an error.
enum State {
    Open,
    Closed,
    Failed(std::io::Error),
}

static STDOUT: Mutex<State> = Mutex::new(State::Open);

/// Writes `args` to stdout (flushed, so that streamed tokens show); after a closed pipe or
/// an error, does nothing.
pub fn write(args: Arguments) {
    let mut st = STDOUT.lock().unwrap_or_else(|p| p.into_inner());
    if !matches!(*st, State::Open) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        *st = if e.kind() == ErrorKind::BrokenPipe { State::Closed } else { State::Failed(e) };
    }
}

/// A line on stderr; write errors are ignored.
pub fn warn(args: Arguments) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// The error stdout failed with, if it failed other than by its reader closing it: for the
/// command's exit status.
pub fn finish() -> Option<String> {
    let st = STDOUT.lock().unwrap_or_else(|p| p.into_inner());
    match &*st {
        State::Failed(e) => Some(format!("cannot write to stdout: {e}")),
        _ => None,
    }
}

/// `print!` that never panics (see the module doc).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::cmd::out::write(format_args!($($t)*)) };
}

/// `println!` that never panics (see the module doc).
#[macro_export]
macro_rules! outln {
    () => { $crate::cmd::out::write(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cmd::out::write(format_args!("{}\n", format_args!($($t)*))) };
}
