//! GPT-J-, OPT- and T5-shaped models built only from `redco-core` `nn` and ops, to show
//! that the rules find Megatron's split from the dataflow for each architecture of the
//! Redco paper. Parameter names follow transformers.

use redco_core::nn::{self, join, Embedding, LayerNorm, Linear, Module, RmsNorm, RotaryEmbedding};
use redco_core::{Backend, DType, HostData, Result, RotaryMode, Tensor};

const DT: DType = DType::F32;

fn lin<B: Backend>(b: &B, i: usize, o: usize, bias: bool, seed: u64) -> Result<Linear<B>> {
    Linear::new(b, i, o, bias, DT, seed)
}

/// `[b, t, h*d] -> [b, h, t, d]`
fn heads<B: Backend>(x: &Tensor<B>, h: usize) -> Result<Tensor<B>> {
    let (b, t, hd) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    x.reshape([b, t, h, hd / h])?.transpose(1, 2)
}

/// `[b, h, t, d] -> [b, t, h*d]`
fn merge<B: Backend>(x: &Tensor<B>) -> Result<Tensor<B>> {
    let (b, h, t, d) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    x.transpose(1, 2)?.reshape([b, t, h * d])
}

use redco_core::module;

/// A GPT-J block: parallel attention and MLP from one LayerNorm, partial interleaved rotary.
pub struct GptJBlock<B: Backend> {
    ln_1: LayerNorm<B>,
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    fc_in: Linear<B>,
    fc_out: Linear<B>,
}
module!(GptJBlock {
    ln_1: "ln_1",
    q_proj: "attn.q_proj",
    k_proj: "attn.k_proj",
    v_proj: "attn.v_proj",
    out_proj: "attn.out_proj",
    fc_in: "mlp.fc_in",
    fc_out: "mlp.fc_out"
});

/// A tiny GPT-J.
pub struct GptJ<B: Backend> {
    wte: Embedding<B>,
    h: Vec<GptJBlock<B>>,
    ln_f: LayerNorm<B>,
    lm_head: Linear<B>,
    heads: usize,
}
module!(GptJ { wte: "transformer.wte", h: "transformer.h", ln_f: "transformer.ln_f", lm_head: "lm_head" });

impl<B: Backend> GptJ<B> {
    /// hidden 32, 4 heads of 8 with rotary_dim 4, 2 layers, vocab 40.
    pub fn new(b: &B) -> Result<Self> {
        let (hd, v) = (32, 40);
        let h = (0..2u64)
            .map(|l| {
                Ok(GptJBlock {
                    ln_1: LayerNorm::new(b, hd, true, true, 1e-5, DT)?,
                    q_proj: lin(b, hd, hd, false, 10 * l + 1)?,
                    k_proj: lin(b, hd, hd, false, 10 * l + 2)?,
                    v_proj: lin(b, hd, hd, false, 10 * l + 3)?,
                    out_proj: lin(b, hd, hd, false, 10 * l + 4)?,
                    fc_in: lin(b, hd, 4 * hd, true, 10 * l + 5)?,
                    fc_out: lin(b, 4 * hd, hd, true, 10 * l + 6)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(GptJ {
            wte: Embedding::new(b, v, hd, 0.5, DT, 99)?,
            h,
            ln_f: LayerNorm::new(b, hd, true, true, 1e-5, DT)?,
            lm_head: lin(b, hd, v, true, 98)?,
            heads: 4,
        })
    }

    /// Mean next-token loss of `ids` against themselves (the rules only need the graph).
    pub fn loss(&self, ids: &Tensor<B>) -> Result<Tensor<B>> {
        let t = ids.dims()[1];
        let pos = Tensor::arange(ids.backend(), t)?;
        let rope = RotaryEmbedding::new(4, 10000.0, RotaryMode::Interleaved)?;
        let mut x = self.wte.forward(ids)?;
        for blk in &self.h {
            let n = blk.ln_1.forward(&x)?;
            let q = rope.forward(&heads(&blk.q_proj.forward(&n)?, self.heads)?, &pos)?;
            let k = rope.forward(&heads(&blk.k_proj.forward(&n)?, self.heads)?, &pos)?;
            let v = heads(&blk.v_proj.forward(&n)?, self.heads)?;
            let a = blk.out_proj.forward(&merge(&nn::scaled_dot_product_attention(&q, &k, &v, None, true, None)?)?)?;
            let m = blk.fc_out.forward(&blk.fc_in.forward(&n)?.gelu_tanh()?)?;
            x = x.add(&a)?.add(&m)?;
        }
        nn::cross_entropy(&self.lm_head.forward(&self.ln_f.forward(&x)?)?, ids)
    }
}

/// An OPT decoder layer (pre-LayerNorm, biased projections, ReLU).
pub struct OptLayer<B: Backend> {
    self_attn_layer_norm: LayerNorm<B>,
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    final_layer_norm: LayerNorm<B>,
    fc1: Linear<B>,
    fc2: Linear<B>,
}
module!(OptLayer {
    self_attn_layer_norm: "self_attn_layer_norm",
    q_proj: "self_attn.q_proj",
    k_proj: "self_attn.k_proj",
    v_proj: "self_attn.v_proj",
    out_proj: "self_attn.out_proj",
    final_layer_norm: "final_layer_norm",
    fc1: "fc1",
    fc2: "fc2",
});

/// A tiny OPT with learned positions (offset 2) and the head tied to the token embedding.
pub struct Opt<B: Backend> {
    embed_tokens: Embedding<B>,
    embed_positions: Embedding<B>,
    layers: Vec<OptLayer<B>>,
    final_layer_norm: LayerNorm<B>,
}
module!(Opt {
    embed_tokens: "model.decoder.embed_tokens",
    embed_positions: "model.decoder.embed_positions",
    layers: "model.decoder.layers",
    final_layer_norm: "model.decoder.final_layer_norm",
});

impl<B: Backend> Opt<B> {
    /// hidden 24, 4 heads, ffn 48, 2 layers, vocab 40, 16 positions.
    pub fn new(b: &B) -> Result<Self> {
        let hd = 24;
        let layers = (0..2u64)
            .map(|l| {
                Ok(OptLayer {
                    self_attn_layer_norm: LayerNorm::new(b, hd, true, true, 1e-5, DT)?,
                    q_proj: lin(b, hd, hd, true, 10 * l + 1)?,
                    k_proj: lin(b, hd, hd, true, 10 * l + 2)?,
                    v_proj: lin(b, hd, hd, true, 10 * l + 3)?,
                    out_proj: lin(b, hd, hd, true, 10 * l + 4)?,
                    final_layer_norm: LayerNorm::new(b, hd, true, true, 1e-5, DT)?,
                    fc1: lin(b, hd, 48, true, 10 * l + 5)?,
                    fc2: lin(b, 48, hd, true, 10 * l + 6)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Opt {
            embed_tokens: Embedding::new(b, 40, hd, 0.5, DT, 97)?,
            embed_positions: Embedding::new(b, 16 + 2, hd, 0.5, DT, 96)?,
            layers,
            final_layer_norm: LayerNorm::new(b, hd, true, true, 1e-5, DT)?,
        })
    }

    /// Mean next-token loss of `ids` against themselves.
    pub fn loss(&self, ids: &Tensor<B>) -> Result<Tensor<B>> {
        let t = ids.dims()[1];
        let pos = Tensor::from_vec(ids.backend(), (2..t as i64 + 2).collect::<Vec<_>>(), [t])?;
        let mut x = self.embed_tokens.forward(ids)?.add(&self.embed_positions.forward(&pos)?)?;
        for l in &self.layers {
            let n = l.self_attn_layer_norm.forward(&x)?;
            let (q, k, v) = (
                heads(&l.q_proj.forward(&n)?, 4)?,
                heads(&l.k_proj.forward(&n)?, 4)?,
                heads(&l.v_proj.forward(&n)?, 4)?,
            );
            x =
                x.add(&l.out_proj.forward(&merge(&nn::scaled_dot_product_attention(&q, &k, &v, None, true, None)?)?)?)?;
            let n = l.final_layer_norm.forward(&x)?;
            x = x.add(&l.fc2.forward(&l.fc1.forward(&n)?.relu()?)?)?;
        }
        let logits = self.final_layer_norm.forward(&x)?.matmul_t(&self.embed_tokens.weight)?;
        nn::cross_entropy(&logits, ids)
    }
}

/// T5 attention: q, k, v, o without biases and without score scaling, plus an optional
/// relative-position bias.
pub struct T5Attention<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    relative_attention_bias: Option<Embedding<B>>,
}
module!(T5Attention { q: "q", k: "k", v: "v", o: "o", relative_attention_bias: "relative_attention_bias" });

/// A T5 layer: self-attention, optional cross-attention, ReLU feed-forward (wi, wo).
pub struct T5Layer<B: Backend> {
    ln0: RmsNorm<B>,
    sa: T5Attention<B>,
    ln1: RmsNorm<B>,
    ca: Option<T5Attention<B>>,
    ln2: RmsNorm<B>,
    wi: Linear<B>,
    wo: Linear<B>,
}

impl<B: Backend> Module<B> for T5Layer<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        let ff = if self.ca.is_some() { 2 } else { 1 };
        self.ln0.visit(&join(p, "layer.0.layer_norm"), f);
        self.sa.visit(&join(p, "layer.0.SelfAttention"), f);
        self.ln1.visit(&join(p, "layer.1.layer_norm"), f);
        self.ca.visit(&join(p, "layer.1.EncDecAttention"), f);
        if self.ca.is_some() {
            self.ln2.visit(&join(p, "layer.2.layer_norm"), f);
        }
        self.wi.visit(&join(p, &format!("layer.{ff}.DenseReluDense.wi")), f);
        self.wo.visit(&join(p, &format!("layer.{ff}.DenseReluDense.wo")), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        let ff = if self.ca.is_some() { 2 } else { 1 };
        self.ln0.visit_mut(&join(p, "layer.0.layer_norm"), f);
        self.sa.visit_mut(&join(p, "layer.0.SelfAttention"), f);
        self.ln1.visit_mut(&join(p, "layer.1.layer_norm"), f);
        self.ca.visit_mut(&join(p, "layer.1.EncDecAttention"), f);
        if self.ca.is_some() {
            self.ln2.visit_mut(&join(p, "layer.2.layer_norm"), f);
        }
        self.wi.visit_mut(&join(p, &format!("layer.{ff}.DenseReluDense.wi")), f);
        self.wo.visit_mut(&join(p, &format!("layer.{ff}.DenseReluDense.wo")), f);
    }
}

/// A tiny T5 (one encoder and one decoder layer, shared embedding, tied head).
pub struct T5<B: Backend> {
    shared: Embedding<B>,
    enc: Vec<T5Layer<B>>,
    enc_ln: RmsNorm<B>,
    dec: Vec<T5Layer<B>>,
    dec_ln: RmsNorm<B>,
}
module!(T5 {
    shared: "shared",
    enc: "encoder.block",
    enc_ln: "encoder.final_layer_norm",
    dec: "decoder.block",
    dec_ln: "decoder.final_layer_norm"
});

const T5_D: usize = 24;
const T5_H: usize = 4;

fn t5_attn<B: Backend>(b: &B, seed: u64, rel: bool) -> Result<T5Attention<B>> {
    Ok(T5Attention {
        q: lin(b, T5_D, T5_D, false, seed)?,
        k: lin(b, T5_D, T5_D, false, seed + 1)?,
        v: lin(b, T5_D, T5_D, false, seed + 2)?,
        o: lin(b, T5_D, T5_D, false, seed + 3)?,
        relative_attention_bias: if rel { Some(Embedding::new(b, 8, T5_H, 0.5, DT, seed + 4)?) } else { None },
    })
}

fn t5_layer<B: Backend>(b: &B, seed: u64, cross: bool) -> Result<T5Layer<B>> {
    Ok(T5Layer {
        ln0: RmsNorm::new(b, T5_D, 1e-6, DT)?,
        sa: t5_attn(b, seed, true)?,
        ln1: RmsNorm::new(b, T5_D, 1e-6, DT)?,
        ca: if cross { Some(t5_attn(b, seed + 10, false)?) } else { None },
        ln2: RmsNorm::new(b, T5_D, 1e-6, DT)?,
        wi: lin(b, T5_D, 48, false, seed + 20)?,
        wo: lin(b, 48, T5_D, false, seed + 21)?,
    })
}

impl<B: Backend> T5Attention<B> {
    fn forward(&self, x: &Tensor<B>, kv: &Tensor<B>, causal: bool) -> Result<Tensor<B>> {
        let (q, k, v) =
            (heads(&self.q.forward(x)?, T5_H)?, heads(&self.k.forward(kv)?, T5_H)?, heads(&self.v.forward(kv)?, T5_H)?);
        let mut s = q.matmul_t(&k)?;
        let (tq, tk) = (q.dims()[2], k.dims()[2]);
        if let Some(rel) = &self.relative_attention_bias {
            // bucket = clamp(j - i) into 8 buckets (a stand-in for T5's log buckets)
            let ids: Vec<i64> = (0..tq * tk).map(|p| ((p % tk) as i64 - (p / tk) as i64 + 4).clamp(0, 7)).collect();
            let ids = Tensor::from_host(x.backend(), &HostData::I64(ids), [tq, tk])?;
            let bias = rel.forward(&ids)?.permute(&[2, 0, 1])?.unsqueeze(0)?;
            s = s.add(&bias)?;
        }
        if causal {
            let keep = redco_core::ops::attention::causal_mask(x.backend(), tq, tk)?;
            let fill = Tensor::scalar(x.backend(), -1e9, s.dtype())?;
            s = keep.where_cond(&s, &fill)?;
        }
        self.o.forward(&merge(&s.softmax(-1)?.matmul(&v)?)?)
    }
}

impl<B: Backend> T5<B> {
    /// The model.
    pub fn new(b: &B) -> Result<Self> {
        Ok(T5 {
            shared: Embedding::new(b, 40, T5_D, 0.5, DT, 95)?,
            enc: vec![t5_layer(b, 100, false)?],
            enc_ln: RmsNorm::new(b, T5_D, 1e-6, DT)?,
            dec: vec![t5_layer(b, 200, true)?],
            dec_ln: RmsNorm::new(b, T5_D, 1e-6, DT)?,
        })
    }

    fn ff(l: &T5Layer<B>, x: &Tensor<B>) -> Result<Tensor<B>> {
        let n = if l.ca.is_some() { l.ln2.forward(x)? } else { l.ln1.forward(x)? };
        x.add(&l.wo.forward(&l.wi.forward(&n)?.relu()?)?)
    }

    /// Mean loss of decoding `labels` from `ids`.
    pub fn loss(&self, ids: &Tensor<B>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        let mut e = self.shared.forward(ids)?;
        for l in &self.enc {
            let n = l.ln0.forward(&e)?;
            e = e.add(&l.sa.forward(&n, &n, false)?)?;
            e = Self::ff(l, &e)?;
        }
        let e = self.enc_ln.forward(&e)?;
        let mut d = self.shared.forward(labels)?;
        for l in &self.dec {
            let n = l.ln0.forward(&d)?;
            d = d.add(&l.sa.forward(&n, &n, true)?)?;
            let n = l.ln1.forward(&d)?;
            d = d.add(&l.ca.as_ref().expect("decoder layer").forward(&n, &e, false)?)?;
            d = Self::ff(l, &d)?;
        }
        let h = self.dec_ln.forward(&d)?.scale((T5_D as f64).powf(-0.5))?;
        nn::cross_entropy(&h.matmul_t(&self.shared.weight)?, labels)
    }
}
