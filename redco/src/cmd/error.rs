//! The command line's one error type ([`CliError`]): a library error keeps its kind
//! ([`redco_core::Error`]: a bad config value, an unsupported feature, an IO failure with its
//! path, ...); what the command line itself refuses (a flag value, a combination of flags)
//! is [`CliError::Usage`] with its message. Every error ends `redco` with exit status 2,
//! its message on stderr after `redco: error:` (see `main.rs`).
//!
//! The flag parsers of [`check`](super::check) return `Result<_, String>` as clap's value
//! parsers do; a `String` becomes a [`CliError::Usage`].

/// An error of a `redco` command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An error from the library, with its kind.
    #[error(transparent)]
    Redco(#[from] redco_core::Error),
    /// A flag value, a combination of flags or an input the command line refuses.
    #[error("{0}")]
    Usage(String),
}

impl From<String> for CliError {
    fn from(msg: String) -> Self {
        CliError::Usage(msg)
    }
}

impl From<&str> for CliError {
    fn from(msg: &str) -> Self {
        CliError::Usage(msg.to_string())
    }
}

impl CliError {
    /// This error where a library `Result` is expected (inside a rank's closure): a library
    /// error as it is, a usage error as [`redco_core::Error::Invalid`] of `op`.
    pub fn into_redco(self, op: &'static str) -> redco_core::Error {
        match self {
            CliError::Redco(e) => e,
            CliError::Usage(msg) => redco_core::Error::invalid(op, msg),
        }
    }
}

/// `Result` with [`CliError`].
pub type CliResult<T> = std::result::Result<T, CliError>;
