//! Parallelism tests: collectives, the SPMD runner, failure handling.

mod architectures;
mod collectives;
mod experts;
mod llama;
mod rules;
mod sharded_ops;
mod tensor_parallel;
mod training;
