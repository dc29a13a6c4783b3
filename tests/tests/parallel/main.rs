//! Parallelism tests: collectives, the SPMD runner, failure handling.

mod collectives;
mod tensor_parallel;
