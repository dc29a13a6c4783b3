//! Why the engine refused a request: the kind decides the HTTP status, so it is a type, not
//! a message to search.

use std::fmt;

/// A request the engine did not queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The waiting queue is full: the same request may succeed later (HTTP 429).
    Busy(String),
    /// The request cannot run on this engine (empty prompt, no room in the context or the
    /// cache, bad sampling, a grammar that does not compile): HTTP 400.
    Invalid(String),
    /// The engine has stopped (HTTP 503).
    Stopped,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Busy(m) | Refused::Invalid(m) => f.write_str(m),
            Refused::Stopped => f.write_str("the engine has stopped"),
        }
    }
}

impl std::error::Error for Refused {}
