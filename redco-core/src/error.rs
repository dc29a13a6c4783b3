//! The one error type of redco-rs: every fallible call returns [`Result`].

use crate::{DType, Shape};

/// Errors raised by tensor ops, backends, layers and checkpoints.
///
/// Messages name the op, the shapes, the dtypes or the parameter at fault, so a user can
/// find the line of model code that caused them.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Two operands whose shapes are incompatible for `op`.
    #[error("{op}: shape mismatch between {lhs} and {rhs}")]
    ShapeMismatch {
        /// The op that failed.
        op: &'static str,
        /// Left operand shape.
        lhs: Shape,
        /// Right operand shape.
        rhs: Shape,
    },
    /// Two operands whose dtypes differ where `op` needs them equal.
    #[error("{op}: dtype mismatch between {lhs:?} and {rhs:?} (cast one operand first)")]
    DTypeMismatch {
        /// The op that failed.
        op: &'static str,
        /// Left operand dtype.
        lhs: DType,
        /// Right operand dtype.
        rhs: DType,
    },
    /// A matmul whose inner dimensions disagree.
    #[error("matmul: inner dimensions differ: lhs {lhs} has k={lhs_k}, rhs {rhs} has k={rhs_k}")]
    MatmulInnerDim {
        /// Left operand shape.
        lhs: Shape,
        /// Right operand shape.
        rhs: Shape,
        /// Inner dim of the left operand.
        lhs_k: usize,
        /// Inner dim of the right operand.
        rhs_k: usize,
    },
    /// An index (embedding id, gather index, target class) outside `0..size`.
    #[error("{op}: index {index} out of range for dimension of size {size}")]
    IndexOutOfRange {
        /// The op that failed.
        op: &'static str,
        /// The offending index.
        index: i64,
        /// The size of the indexed dimension.
        size: usize,
    },
    /// A dimension argument outside the tensor's rank.
    #[error("{op}: dimension {dim} is out of range for a tensor of shape {shape}")]
    DimOutOfRange {
        /// The op that failed.
        op: &'static str,
        /// The requested dimension.
        dim: isize,
        /// The tensor's shape.
        shape: Shape,
    },
    /// An op that does not accept a dtype.
    #[error("{op}: dtype {dtype:?} is not supported here")]
    UnsupportedDType {
        /// The op that failed.
        op: &'static str,
        /// The rejected dtype.
        dtype: DType,
    },
    /// A buffer whose length does not match the shape it is given.
    #[error("{op}: shape {shape} needs {expected} elements, got {got}")]
    ElementCount {
        /// The op that failed.
        op: &'static str,
        /// The shape.
        shape: Shape,
        /// Elements the shape needs.
        expected: usize,
        /// Elements provided.
        got: usize,
    },
    /// A parameter map that does not match a module.
    #[error("parameter `{name}`: {msg}")]
    Parameter {
        /// Dotted parameter name (Hugging Face style).
        name: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A configuration value out of range or inconsistent with the rest: a model's
    /// `config.json` field, a training or mesh setting.
    #[error("{op}: {msg}")]
    Config {
        /// Where the value was read (`config`, `train`, `mesh`, ...).
        op: &'static str,
        /// Which value and what is wrong with it.
        msg: String,
    },
    /// A feature, model variant or combination that redco does not support (yet): the
    /// input may be valid, redco cannot run it.
    #[error("{op}: {msg}")]
    Unsupported {
        /// The op or component that refuses.
        op: &'static str,
        /// What is not supported, and what to do instead where there is a way.
        msg: String,
    },
    /// Input data that is malformed: a corrupt or truncated checkpoint, GGUF or dataset file,
    /// a row without a field the run needs, a token id out of the vocabulary. The program
    /// is fine; the file or the data must change.
    #[error("{op}: {msg}")]
    Data {
        /// The reader or check that refused it (`safetensors`, `gguf`, `jsonl`, `data`, ...).
        op: &'static str,
        /// What is wrong and where (the file, line, row or tensor).
        msg: String,
    },
    /// A file-system or stream operation that failed, with the path and the OS error.
    #[error("{op}: {what} {}: {source}", path.display())]
    Io {
        /// The component that did the IO (`checkpoint`, `workdir`, `tensorboard`, ...).
        op: &'static str,
        /// What it was doing (`cannot read`, `cannot create`, ...).
        what: String,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The OS error (shared, so the error stays `Clone`).
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// Any other invalid argument, described by `msg`.
    #[error("{op}: {msg}")]
    Invalid {
        /// The op that failed.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// A collective that failed: a timeout, a rank that failed or disagreed.
    #[error("collective {op} on rank {rank}: {msg}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// The rank reporting the failure.
        rank: usize,
        /// What went wrong.
        msg: String,
    },
    /// A rank of an SPMD run that returned an error or panicked.
    #[error("rank {rank} failed: {msg}")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its error or panic message.
        msg: String,
    },
    /// A failure inside a backend (device lost, allocation failed, kernel error).
    #[error("backend {backend}: {msg}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What failed.
        msg: String,
    },
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Invalid { op, msg: msg.into() }
    }
    /// Shorthand for [`Error::Config`].
    pub fn config(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Config { op, msg: msg.into() }
    }
    /// Shorthand for [`Error::Data`].
    pub fn data(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Data { op, msg: msg.into() }
    }
    /// Shorthand for [`Error::Unsupported`].
    pub fn unsupported(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Unsupported { op, msg: msg.into() }
    }
    /// Shorthand for [`Error::Io`]: `op` failed to do `what` on `path`.
    pub fn io(
        op: &'static str,
        what: impl Into<String>,
        path: impl Into<std::path::PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io { op, what: what.into(), path: path.into(), source: std::sync::Arc::new(source) }
    }
    /// The OS error kind of an [`Error::Io`], `None` for every other error.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

/// `Result` with the redco [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
