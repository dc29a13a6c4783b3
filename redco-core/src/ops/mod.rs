//! Tensor ops, one file per op family: the op on [`Tensor`](crate::Tensor), its gradient
//! and, for fused ops, the composite default that [`Backend`](crate::Backend) falls back to.

pub mod adamw;
pub mod attention;
pub mod attention_grad;
pub mod cross_entropy;
pub mod elementwise;
pub mod gather_unit;
pub mod grouped_matmul;
pub mod index;
pub mod layout;
pub mod matmul;
pub mod norm;
pub mod paged_attention;
pub mod quant_matmul;
pub mod random;
pub mod reduce;
pub mod rotary;
pub mod softmax;
