//! The command-line tests: each module runs the `redco` binary (and the examples) on the
//! committed fixtures. One test binary for all of them, so the workspace links the
//! facade and its backends into one test executable rather than one per file.

mod common;

mod cli_bad_inputs;
mod cli_datasets;
mod cli_eval_dump;
mod cli_gguf;
mod cli_int4;
mod cli_kill;
mod cli_lora;
mod cli_mpi;
mod cli_perplexity;
mod cli_pjrt;
mod cli_plan;
mod cli_quant;
mod cli_seq2seq;
mod cli_serve;
mod cli_serve_cache;
mod cli_serve_clients;
mod cli_train;
mod cli_two_hosts;
mod cli_wgpu;
mod cli_workdir;
mod example_maml;
mod example_ppo;
