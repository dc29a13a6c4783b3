//! `redco-core`: the backend-agnostic heart of redco-rs.
//!
//! - [`DType`], [`Shape`], [`Placement`] and [`Error`]: the vocabulary every crate speaks;
//! - [`Backend`]: opaque contiguous storage, a small primitive op set, and fused ops
//!   (softmax, norms, rotary embedding, cross-entropy, attention) with composite defaults;
//! - [`Tensor`]: a global shape, a dtype, a placement per mesh axis, and reverse-mode
//!   autograd ([`Tensor::backward`], [`no_grad`]);
//! - [`nn`]: layers and the [`nn::Module`] parameter tree with Hugging Face-style names;
//! - [`optim`], [`sharding`], [`runtime`] and [`planning`]: optimizers, the sharding
//!   vocabulary and the two rules, ranks and collectives, and the planner.
//!
//! The core has no backend of its own: `redco-cpu` is the embedded default, and the
//! training pipeline (trainer, checkpoints, datasets) is `redco-pipeline`.
//!
//! ```
//! use redco_core::{DType, Tensor};
//! use redco_cpu::Cpu;
//! let dev = Cpu::new(1);
//! let w = Tensor::from_vec(&dev, vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap().into_var();
//! let x = Tensor::from_vec(&dev, vec![1.0f32, -1.0], [1, 2]).unwrap();
//! let loss = x.matmul(&w).unwrap().square().unwrap().sum_all().unwrap();
//! let grads = loss.backward().unwrap();
//! // d/dW sum((x W)^2) = x^T 2 (x W), with x W = [-2, -2]
//! assert_eq!(grads.get(&w).unwrap().to_vec_f32().unwrap(), vec![-4.0, -4.0, 4.0, 4.0]);
//! # let _ = DType::F32;
//! ```

#![warn(missing_docs)]

pub mod autograd;
pub mod backend;
pub mod display;
pub mod dtype;
pub mod error;
pub mod host_simd;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod placement;
pub mod planning;
pub mod quant;
pub mod recompute;
pub mod runtime;
pub mod shape;
pub mod sharding;
pub mod tensor;

pub use autograd::{is_grad_enabled, no_grad, GradModeGuard, GradStore, OpMeta};
pub use backend::{Backend, BinaryOp, CmpOp, GroupedSpec, MatmulSpec, ReduceOp, RotaryMode, UnaryOp};
pub use dtype::{DType, Element, HostData};
pub use error::{Error, Result};
pub use placement::{MeshAxis, PartialOp, Placement, Placements};
pub use recompute::Recompute;
pub use shape::Shape;
pub use tensor::{Tensor, TensorId};
