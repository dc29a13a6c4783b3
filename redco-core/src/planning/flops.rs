//! The model FLOPs of training, as model-FLOPs utilisation (MFU) counts them: PaLM's
//! Appendix B, `6N + 12 L H Q T` per token, where `N` is the parameters a token's matmuls
//! use (every weight but the input embedding table, which is a lookup), `L` the layers,
//! `H` the heads, `Q` the head size and `T` the sequence length (the attention scores and
//! their weighted sum, forward and backward, counted whole as PaLM does, not halved for
//! the causal mask). Recomputation is not counted: MFU is the model's work, not the
//! device's.

use super::planner::ModelDims;

/// The parameters a token's matmuls use in a LLaMA-shaped decoder of `dims` (attention
/// projections with grouped key/value heads, a SwiGLU MLP, RMSNorm weights, the final
/// norm and the output projection; not the input embedding table).
pub fn matmul_params(dims: &ModelDims) -> u64 {
    let (h, i, v) = (dims.hidden as u64, dims.intermediate as u64, dims.vocab as u64);
    let head = h / dims.heads.max(1) as u64;
    let kv = dims.kv_heads as u64 * head;
    let attention = 2 * h * h + 2 * h * kv;
    let mlp = 3 * h * i;
    let norms = 2 * h;
    dims.layers as u64 * (attention + mlp + norms) + h + h * v
}

/// Model FLOPs of training one token of sequences of `seq` tokens (forward and backward):
/// `6 N + 12 L H Q T`.
pub fn train_flops_per_token(dims: &ModelDims, seq: usize) -> f64 {
    let head = dims.hidden / dims.heads.max(1);
    6.0 * matmul_params(dims) as f64 + 12.0 * (dims.layers * dims.heads * head * seq) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_07b_preset_costs_6n_plus_attention() {
        // llama-0.7b: hidden 1536, 25 layers, 16 heads, intermediate 4096, vocab 32000
        let d = ModelDims {
            layers: 25,
            hidden: 1536,
            heads: 16,
            kv_heads: 16,
            vocab: 32000,
            intermediate: 4096,
            moe: None,
        };
        let per_layer = 4 * 1536 * 1536 + 3 * 1536 * 4096 + 2 * 1536;
        assert_eq!(matmul_params(&d), 25 * per_layer + 1536 + 1536 * 32000);
        let f = train_flops_per_token(&d, 1024);
        let want = 6.0 * matmul_params(&d) as f64 + 12.0 * 25.0 * 16.0 * 96.0 * 1024.0;
        assert_eq!(f, want);
        assert!((f / 1e9 - 5.01).abs() < 0.01, "{f}");
        // grouped heads: fewer key/value parameters
        let g = ModelDims { kv_heads: 4, ..d };
        assert_eq!(matmul_params(&d) - matmul_params(&g), 25 * 2 * 1536 * (1536 - 4 * 96));
        // the 7B shape: 6.7B parameters less its 131M-parameter embedding table
        let b7 = ModelDims {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 32,
            vocab: 32000,
            intermediate: 11008,
            moe: None,
        };
        assert!((matmul_params(&b7) as f64 / 1e9 - 6.61).abs() < 0.01, "{}", matmul_params(&b7));
    }
}
