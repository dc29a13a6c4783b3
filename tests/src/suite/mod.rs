//! The backend conformance suite: one module per op family, every test a generic
//! `pub fn name<B: Backend>(b: &B)` checking values (against f64 references), gradients
//! (against finite differences), half precision and errors.
//!
//! A backend runs the whole suite on its own device with one line in one of its test
//! files, as burn's backends do:
//!
//! ```ignore
//! redco_tests::suite!(my_backend());
//! ```
//!
//! which makes one `#[test]` per suite test (`attention::attention_values`, ...), each
//! calling `my_backend()` for its backend. A constructor that cannot open its device
//! should panic saying why: the test then fails, it never passes without running
//! (`cargo xtask test` provides the devices CI has, or leaves their tests out by name).

pub mod attention;
pub mod autograd;
pub mod cross_entropy;
pub mod elementwise;
pub mod grouped_matmul;
pub mod index;
pub mod layout;
pub mod matmul;
pub mod nn;
pub mod norm;
pub mod optim;
pub mod quant_matmul;
pub mod random;
pub mod reduce;
pub mod rotary;
pub mod second_order;
pub mod softmax;

/// Instantiates every suite test for the backend `$make` (an expression evaluated once
/// per test): one module per op family, one `#[test]` per test. See the module docs.
///
/// `suite!(@optional $make)` takes an `Option` of a backend instead and runs nothing when it
/// is `None` (the wgpu instantiations, whose constructor prints why and fails under
/// `REDCO_REQUIRE_WGPU=1`, as CI sets).
#[macro_export]
macro_rules! suite {
    (@optional $make:expr) => {
        $crate::suite!(match $make {
            Some(b) => b,
            None => return,
        });
    };
    ($make:expr) => {
        mod attention {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn paged_attention_values() {
                $crate::suite::attention::paged_attention_values(&$make)
            }
            #[test]
            fn attention_values() {
                $crate::suite::attention::attention_values(&$make)
            }
            #[test]
            fn attention_fully_masked() {
                $crate::suite::attention::attention_fully_masked(&$make)
            }
            #[test]
            fn attention_masks_and_half() {
                $crate::suite::attention::attention_masks_and_half(&$make)
            }
            #[test]
            fn attention_long() {
                $crate::suite::attention::attention_long(&$make)
            }
            #[test]
            fn attention_grads() {
                $crate::suite::attention::attention_grads(&$make)
            }
            #[test]
            fn attention_errors() {
                $crate::suite::attention::attention_errors(&$make)
            }
        }
        mod autograd {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn diamond_accumulates() {
                $crate::suite::autograd::diamond_accumulates(&$make)
            }
            #[test]
            fn backward_into_accumulates() {
                $crate::suite::autograd::backward_into_accumulates(&$make)
            }
            #[test]
            fn no_grad_and_non_grad_errors() {
                $crate::suite::autograd::no_grad_and_non_grad_errors(&$make)
            }
            #[test]
            fn detach_stops_gradients() {
                $crate::suite::autograd::detach_stops_gradients(&$make)
            }
            #[test]
            fn deep_chain() {
                $crate::suite::autograd::deep_chain(&$make)
            }
            #[test]
            fn recompute_matches_recorded() {
                $crate::suite::autograd::recompute_matches_recorded(&$make)
            }
            #[test]
            fn recompute_selective_matches_recorded() {
                $crate::suite::autograd::recompute_selective_matches_recorded(&$make)
            }
        }
        mod cross_entropy {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn cross_entropy_values() {
                $crate::suite::cross_entropy::cross_entropy_values(&$make)
            }
            #[test]
            fn cross_entropy_large_and_half() {
                $crate::suite::cross_entropy::cross_entropy_large_and_half(&$make)
            }
            #[test]
            fn cross_entropy_long_rows() {
                $crate::suite::cross_entropy::cross_entropy_long_rows(&$make)
            }
            #[test]
            fn cross_entropy_all_ignored() {
                $crate::suite::cross_entropy::cross_entropy_all_ignored(&$make)
            }
            #[test]
            fn cross_entropy_grads() {
                $crate::suite::cross_entropy::cross_entropy_grads(&$make)
            }
            #[test]
            fn cross_entropy_errors() {
                $crate::suite::cross_entropy::cross_entropy_errors(&$make)
            }
        }
        mod elementwise {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn unary_values() {
                $crate::suite::elementwise::unary_values(&$make)
            }
            #[test]
            fn unary_grads() {
                $crate::suite::elementwise::unary_grads(&$make)
            }
            #[test]
            fn binary_broadcast_values() {
                $crate::suite::elementwise::binary_broadcast_values(&$make)
            }
            #[test]
            fn binary_grads() {
                $crate::suite::elementwise::binary_grads(&$make)
            }
            #[test]
            fn compare_and_where() {
                $crate::suite::elementwise::compare_and_where(&$make)
            }
            #[test]
            fn casts() {
                $crate::suite::elementwise::casts(&$make)
            }
            #[test]
            fn half_precision_compute() {
                $crate::suite::elementwise::half_precision_compute(&$make)
            }
            #[test]
            fn elementwise_errors() {
                $crate::suite::elementwise::elementwise_errors(&$make)
            }
        }
        mod index {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn index_select_values() {
                $crate::suite::index::index_select_values(&$make)
            }
            #[test]
            fn write_rows_values() {
                $crate::suite::index::write_rows_values(&$make)
            }
            #[test]
            fn index_add_values() {
                $crate::suite::index::index_add_values(&$make)
            }
            #[test]
            fn gather_scatter_values() {
                $crate::suite::index::gather_scatter_values(&$make)
            }
            #[test]
            fn index_grads() {
                $crate::suite::index::index_grads(&$make)
            }
            #[test]
            fn index_errors() {
                $crate::suite::index::index_errors(&$make)
            }
        }
        mod layout {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn reshape_values_and_grads() {
                $crate::suite::layout::reshape_values_and_grads(&$make)
            }
            #[test]
            fn permute_values() {
                $crate::suite::layout::permute_values(&$make)
            }
            #[test]
            fn permute_grads() {
                $crate::suite::layout::permute_grads(&$make)
            }
            #[test]
            fn narrow_values_and_grads() {
                $crate::suite::layout::narrow_values_and_grads(&$make)
            }
            #[test]
            fn cat_values_and_grads() {
                $crate::suite::layout::cat_values_and_grads(&$make)
            }
            #[test]
            fn expand_values_and_grads() {
                $crate::suite::layout::expand_values_and_grads(&$make)
            }
            #[test]
            fn squeeze_unsqueeze() {
                $crate::suite::layout::squeeze_unsqueeze(&$make)
            }
            #[test]
            fn layout_errors() {
                $crate::suite::layout::layout_errors(&$make)
            }
        }
        mod matmul {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn matmul_values() {
                $crate::suite::matmul::matmul_values(&$make)
            }
            #[test]
            fn matmul_large_odd() {
                $crate::suite::matmul::matmul_large_odd(&$make)
            }
            #[test]
            fn matmul_half() {
                $crate::suite::matmul::matmul_half(&$make)
            }
            #[test]
            fn matmul_grads() {
                $crate::suite::matmul::matmul_grads(&$make)
            }
            #[test]
            fn matmul_errors() {
                $crate::suite::matmul::matmul_errors(&$make)
            }
        }
        mod grouped_matmul {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn grouped_matmul_values() {
                $crate::suite::grouped_matmul::grouped_matmul_values(&$make)
            }
            #[test]
            fn grouped_matmul_half() {
                $crate::suite::grouped_matmul::grouped_matmul_half(&$make)
            }
            #[test]
            fn grouped_matmul_grads() {
                $crate::suite::grouped_matmul::grouped_matmul_grads(&$make)
            }
            #[test]
            fn grouped_matmul_errors() {
                $crate::suite::grouped_matmul::grouped_matmul_errors(&$make)
            }
        }
        mod quant_matmul {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn quant_matmul_values() {
                $crate::suite::quant_matmul::quant_matmul_values(&$make)
            }
            #[test]
            fn quant_matmul_grads() {
                $crate::suite::quant_matmul::quant_matmul_grads(&$make)
            }
            #[test]
            fn quant_matmul_errors() {
                $crate::suite::quant_matmul::quant_matmul_errors(&$make)
            }
        }
        mod nn {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn linear_layer() {
                $crate::suite::nn::linear_layer(&$make)
            }
            #[test]
            fn embedding_layer() {
                $crate::suite::nn::embedding_layer(&$make)
            }
            #[test]
            fn norm_layers() {
                $crate::suite::nn::norm_layers(&$make)
            }
            #[test]
            fn rotary_layer() {
                $crate::suite::nn::rotary_layer(&$make)
            }
            #[test]
            fn activations() {
                $crate::suite::nn::activations(&$make)
            }
            #[test]
            fn mlp_layers() {
                $crate::suite::nn::mlp_layers(&$make)
            }
            #[test]
            fn dropout_layer() {
                $crate::suite::nn::dropout_layer(&$make)
            }
            #[test]
            fn sdpa() {
                $crate::suite::nn::sdpa(&$make)
            }
            #[test]
            fn cross_entropy_loss() {
                $crate::suite::nn::cross_entropy_loss(&$make)
            }
            #[test]
            fn module_names_and_counts() {
                $crate::suite::nn::module_names_and_counts(&$make)
            }
            #[test]
            fn state_dict_round_trip() {
                $crate::suite::nn::state_dict_round_trip(&$make)
            }
            #[test]
            fn load_state_dict_errors() {
                $crate::suite::nn::load_state_dict_errors(&$make)
            }
        }
        mod norm {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn layer_norm_values() {
                $crate::suite::norm::layer_norm_values(&$make)
            }
            #[test]
            fn rms_norm_values() {
                $crate::suite::norm::rms_norm_values(&$make)
            }
            #[test]
            fn norm_edge_cases() {
                $crate::suite::norm::norm_edge_cases(&$make)
            }
            #[test]
            fn norm_long_rows() {
                $crate::suite::norm::norm_long_rows(&$make)
            }
            #[test]
            fn norm_backward_values() {
                $crate::suite::norm::norm_backward_values(&$make)
            }
            #[test]
            fn norm_grads() {
                $crate::suite::norm::norm_grads(&$make)
            }
            #[test]
            fn norm_errors() {
                $crate::suite::norm::norm_errors(&$make)
            }
        }
        mod optim {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn adamw_step() {
                $crate::suite::optim::adamw_step(&$make)
            }
            #[test]
            fn adamw_many_step() {
                $crate::suite::optim::adamw_many_step(&$make)
            }
            #[test]
            fn adamw_master_many_step() {
                $crate::suite::optim::adamw_master_many_step(&$make)
            }
            #[test]
            fn sum_squares_many_value() {
                $crate::suite::optim::sum_squares_many_value(&$make)
            }
        }
        mod random {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn rand_uniform_values() {
                $crate::suite::random::rand_uniform_values(&$make)
            }
            #[test]
            fn dropout_values() {
                $crate::suite::random::dropout_values(&$make)
            }
            #[test]
            fn dropout_keep_rate() {
                $crate::suite::random::dropout_keep_rate(&$make)
            }
            #[test]
            fn dropout_grads() {
                $crate::suite::random::dropout_grads(&$make)
            }
            #[test]
            fn dropout_errors() {
                $crate::suite::random::dropout_errors(&$make)
            }
        }
        mod reduce {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn reduce_values() {
                $crate::suite::reduce::reduce_values(&$make)
            }
            #[test]
            fn reduce_half() {
                $crate::suite::reduce::reduce_half(&$make)
            }
            #[test]
            fn argmax_values() {
                $crate::suite::reduce::argmax_values(&$make)
            }
            #[test]
            fn reduce_grads() {
                $crate::suite::reduce::reduce_grads(&$make)
            }
            #[test]
            fn sum_to_values_and_grads() {
                $crate::suite::reduce::sum_to_values_and_grads(&$make)
            }
            #[test]
            fn reduce_errors() {
                $crate::suite::reduce::reduce_errors(&$make)
            }
        }
        mod rotary {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn rotary_values() {
                $crate::suite::rotary::rotary_values(&$make)
            }
            #[test]
            fn rotary_per_row_positions() {
                $crate::suite::rotary::rotary_per_row_positions(&$make)
            }
            #[test]
            fn rotary_half() {
                $crate::suite::rotary::rotary_half(&$make)
            }
            #[test]
            fn rotary_grads() {
                $crate::suite::rotary::rotary_grads(&$make)
            }
            #[test]
            fn rotary_errors() {
                $crate::suite::rotary::rotary_errors(&$make)
            }
        }
        mod softmax {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn softmax_values() {
                $crate::suite::softmax::softmax_values(&$make)
            }
            #[test]
            fn softmax_large_magnitude() {
                $crate::suite::softmax::softmax_large_magnitude(&$make)
            }
            #[test]
            fn softmax_half() {
                $crate::suite::softmax::softmax_half(&$make)
            }
            #[test]
            fn softmax_long_rows() {
                $crate::suite::softmax::softmax_long_rows(&$make)
            }
            #[test]
            fn softmax_grads() {
                $crate::suite::softmax::softmax_grads(&$make)
            }
            #[test]
            fn softmax_errors() {
                $crate::suite::softmax::softmax_errors(&$make)
            }
        }
        mod second_order {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn hvp_unary() {
                $crate::suite::second_order::hvp_unary(&$make)
            }
            #[test]
            fn hvp_binary_and_matmul() {
                $crate::suite::second_order::hvp_binary_and_matmul(&$make)
            }
            #[test]
            fn hvp_reduce_and_layout() {
                $crate::suite::second_order::hvp_reduce_and_layout(&$make)
            }
            #[test]
            fn hvp_softmax_and_cross_entropy() {
                $crate::suite::second_order::hvp_softmax_and_cross_entropy(&$make)
            }
            #[test]
            fn hvp_norm_and_rotary() {
                $crate::suite::second_order::hvp_norm_and_rotary(&$make)
            }
            #[test]
            fn hvp_attention_and_index() {
                $crate::suite::second_order::hvp_attention_and_index(&$make)
            }
            #[test]
            fn hvp_mlp_and_maml_step() {
                $crate::suite::second_order::hvp_mlp_and_maml_step(&$make)
            }
        }
    };
}
