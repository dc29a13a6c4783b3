//! nn layers against f64 references, their gradients with respect to inputs and
//! parameters, and the Module API (Hugging Face names, counting, state dicts).

use crate::check::{assert_close, check_dtype, grad_check, ids, tensor, tol, values};
use crate::reference as r;
use redco_core::nn::{
    self, join, Activation, Dropout, Embedding, GatedMlp, LayerNorm, Linear, Mlp, Module, ModuleExt, RmsNorm,
    RotaryEmbedding,
};
use redco_core::{Backend, DType, Error, Result, RotaryMode, Shape, Tensor};
use std::collections::BTreeMap;

/// `x [rows, in] @ w^T + b` in f64.
fn linear_ref(x: &[f64], w: &[f64], bias: Option<&[f64]>, (inp, out): (usize, usize)) -> Vec<f64> {
    let rows = x.len() / inp;
    let (y, _) = r::matmul(x, &[rows, inp], w, &[out, inp], false, true);
    y.iter().enumerate().map(|(i, v)| v + bias.map_or(0.0, |b| b[i % out])).collect()
}

fn act_ref(a: Activation) -> fn(f64) -> f64 {
    match a {
        Activation::Relu => |x| x.max(0.0),
        Activation::Gelu => r::gelu,
        Activation::GeluTanh => r::gelu_tanh,
        Activation::Silu => r::silu,
    }
}

const ACTS: [Activation; 4] = [Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu];

/// Linear with and without bias: values, gradients with respect to x, weight and bias;
/// construction checks.
pub fn linear_layer<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (inp, out) = (4, 5);
    let x = values(2 * 3 * inp, 1, -1.0, 1.0);
    let w = values(out * inp, 2, -1.0, 1.0);
    let bias = values(out, 3, -1.0, 1.0);
    for has_bias in [false, true] {
        let l =
            Linear::from_tensors(tensor(b, &w, [out, inp], dt), has_bias.then(|| tensor(b, &bias, [out], dt))).unwrap();
        let y = l.forward(&tensor(b, &x, [2, 3, inp], dt)).unwrap();
        assert_eq!(y.dims(), &[2, 3, out]);
        let e = linear_ref(&x, &w, has_bias.then_some(&bias[..]), (inp, out));
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("linear bias {has_bias}"));
        let mut inputs = vec![(x.clone(), Shape::new([2, 3, inp])), (w.clone(), Shape::new([out, inp]))];
        if has_bias {
            inputs.push((bias.clone(), Shape::new([out])));
        }
        grad_check(
            b,
            &inputs,
            |t| Linear::from_tensors(t[1].clone(), t.get(2).cloned())?.forward(&t[0]),
            1e-6,
            &format!("linear grad bias {has_bias}"),
        );
    }
    let l = Linear::new(b, 9, 3, true, dt, 5).unwrap();
    assert_eq!((l.weight.dims(), l.bias.as_ref().unwrap().dims()), (&[3, 9][..], &[3][..]));
    assert!(l.weight.is_var() && l.bias.as_ref().unwrap().is_var());
    let bound = 1.0 / 3.0;
    assert!(l.weight.to_vec_f64().unwrap().iter().all(|v| v.abs() <= bound), "PyTorch init bound 1/sqrt(in)");
    assert_eq!(Linear::new(b, 9, 3, false, dt, 5).unwrap().num_parameters(), 27);
    assert!(Linear::from_tensors(tensor(b, &w, [out * inp], dt), None).is_err(), "weight of rank 1");
    assert!(
        Linear::from_tensors(tensor(b, &w, [out, inp], dt), Some(tensor(b, &bias[..4], [4], dt))).is_err(),
        "bias [4] for out 5"
    );
}

/// Embedding: rows for ids of any shape, gradients that accumulate repeated ids,
/// out-of-range ids are `Error::IndexOutOfRange`.
pub fn embedding_layer<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (vocab, dim) = (7, 3);
    let w = values(vocab * dim, 4, -1.0, 1.0);
    let emb = Embedding { weight: tensor(b, &w, [vocab, dim], dt) };
    let id = [6i64, 0, 3, 3, 6, 1, 0, 6];
    let y = emb.forward(&ids(b, &id, [2, 4])).unwrap();
    assert_eq!(y.dims(), &[2, 4, dim]);
    let e: Vec<f64> = id.iter().flat_map(|&i| w[i as usize * dim..(i as usize + 1) * dim].to_vec()).collect();
    assert_eq!(y.to_vec_f64().unwrap(), e);
    let it = ids(b, &id, [2, 4]);
    grad_check(
        b,
        &[(w, Shape::new([vocab, dim]))],
        |t| Embedding { weight: t[0].clone() }.forward(&it),
        1e-6,
        "embedding grad",
    );
    for bad in [7i64, -1] {
        match emb.forward(&ids(b, &[0, bad], [2])) {
            Err(Error::IndexOutOfRange { index, size, .. }) => assert_eq!((index, size), (bad, vocab)),
            other => panic!("id {bad}: expected IndexOutOfRange, got {other:?}"),
        }
    }
    let e = Embedding::new(b, 50, 8, 0.02, dt, 1).unwrap();
    assert_eq!((e.weight.dims(), e.weight.dtype()), (&[50, 8][..], dt));
    let v = e.weight.to_vec_f64().unwrap();
    let std = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
    assert!((std - 0.02).abs() < 0.004, "init std {std}");
}

/// LayerNorm and RmsNorm layers: values with learned parameters, gradients with respect
/// to x and every parameter, and the identity initialisation.
pub fn norm_layers<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let d = 5;
    let x = values(3 * d, 5, -2.0, 2.0);
    let w = values(d, 6, 0.5, 1.5);
    let bias = values(d, 7, -1.0, 1.0);
    let eps = 1e-6;
    let ln = LayerNorm { weight: Some(tensor(b, &w, [d], dt)), bias: Some(tensor(b, &bias, [d], dt)), eps };
    let y = ln.forward(&tensor(b, &x, [3, d], dt)).unwrap();
    assert_close(
        &y.to_vec_f64().unwrap(),
        &r::rows(&x, d, |row| r::layer_norm(row, Some(&w), Some(&bias), eps)),
        tol(dt) * 10.0,
        "LayerNorm",
    );
    let rms = RmsNorm { weight: tensor(b, &w, [d], dt), eps };
    let y = rms.forward(&tensor(b, &x, [3, d], dt)).unwrap();
    assert_close(
        &y.to_vec_f64().unwrap(),
        &r::rows(&x, d, |row| r::rms_norm(row, Some(&w), eps)),
        tol(dt) * 10.0,
        "RmsNorm",
    );
    let (xs, ps) = (Shape::new([3, d]), Shape::new([d]));
    grad_check(
        b,
        &[(x.clone(), xs.clone()), (w.clone(), ps.clone()), (bias, ps.clone())],
        |t| LayerNorm { weight: Some(t[1].clone()), bias: Some(t[2].clone()), eps }.forward(&t[0]),
        1e-5,
        "LayerNorm grad",
    );
    grad_check(
        b,
        &[(x.clone(), xs.clone()), (w, ps)],
        |t| RmsNorm { weight: t[1].clone(), eps }.forward(&t[0]),
        1e-5,
        "RmsNorm grad",
    );
    grad_check(
        b,
        &[(x.clone(), xs)],
        |t| LayerNorm { weight: None, bias: None, eps }.forward(&t[0]),
        1e-5,
        "LayerNorm no affine",
    );
    // fresh layers are the plain normalisation (scale 1, bias 0)
    let xt = tensor(b, &x, [3, d], dt);
    for (affine, has_bias, count) in [(true, true, 2 * d), (true, false, d), (false, false, 0)] {
        let ln = LayerNorm::new(b, d, affine, has_bias, eps, dt).unwrap();
        assert_eq!(ln.num_parameters(), count);
        let y = ln.forward(&xt).unwrap();
        assert_close(
            &y.to_vec_f64().unwrap(),
            &r::rows(&x, d, |row| r::layer_norm(row, None, None, eps)),
            tol(dt) * 10.0,
            "LayerNorm::new",
        );
    }
    let y = RmsNorm::new(b, d, eps, dt).unwrap().forward(&xt).unwrap();
    assert_close(
        &y.to_vec_f64().unwrap(),
        &r::rows(&x, d, |row| r::rms_norm(row, None, eps)),
        tol(dt) * 10.0,
        "RmsNorm::new",
    );
}

/// RotaryEmbedding::forward in both conventions against the reference, and its gradient.
pub fn rotary_layer<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (heads, seq, d) = (2, 4, 8);
    let pos = [5i64, 6, 7, 8];
    let x = values(heads * seq * d, 8, -1.0, 1.0);
    for mode in [RotaryMode::Interleaved, RotaryMode::HalfSplit] {
        for (rot, theta) in [(8, 10000.0), (4, 500000.0)] {
            let rope = RotaryEmbedding::new(rot, theta, mode).unwrap();
            let p = ids(b, &pos, [seq]);
            let y = rope.forward(&tensor(b, &x, [1, heads, seq, d], dt), &p).unwrap();
            let e = r::rotary(&x, seq, d, &pos, rot, theta, mode == RotaryMode::Interleaved);
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("RotaryEmbedding {mode:?} rot {rot}"));
            grad_check(
                b,
                &[(x.clone(), Shape::new([1, heads, seq, d]))],
                |t| rope.forward(&t[0], &p),
                1e-6,
                &format!("RotaryEmbedding grad {mode:?}"),
            );
        }
    }
}

/// Every activation against its definition, by variant and by Hugging Face name, and
/// its gradient; unknown names are errors.
pub fn activations<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let names = [
        ("relu", Activation::Relu),
        ("gelu", Activation::Gelu),
        ("gelu_new", Activation::GeluTanh),
        ("gelu_pytorch_tanh", Activation::GeluTanh),
        ("gelu_fast", Activation::GeluTanh),
        ("silu", Activation::Silu),
        ("swish", Activation::Silu),
    ];
    for (name, a) in names {
        assert_eq!(Activation::from_hf(name).unwrap(), a, "{name}");
    }
    for bad in ["tanh_gelu", "GELU", ""] {
        assert!(matches!(Activation::from_hf(bad), Err(Error::Unsupported { op: "Activation", .. })), "{bad:?}");
    }
    // keep away from relu's kink at 0
    let x: Vec<f64> = values(9, 9, -4.0, 4.0).into_iter().map(|v| if v.abs() < 0.05 { v + 0.2 } else { v }).collect();
    for a in ACTS {
        let y = a.forward(&tensor(b, &x, [9], dt)).unwrap();
        let e: Vec<f64> = x.iter().map(|&v| act_ref(a)(v)).collect();
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("{a:?}"));
        grad_check(b, &[(x.clone(), Shape::new([9]))], |t| a.forward(&t[0]), 1e-6, &format!("{a:?} grad"));
    }
}

/// Mlp and GatedMlp (with and without biases, every activation) against the composed
/// reference, and gradients with respect to x and every weight and bias.
pub fn mlp_layers<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (dim, hidden, rows) = (4, 6, 3);
    let x = values(rows * dim, 10, -1.0, 1.0);
    let (w1, w2, w3) =
        (values(hidden * dim, 11, -1.0, 1.0), values(dim * hidden, 12, -1.0, 1.0), values(hidden * dim, 13, -1.0, 1.0));
    let (b1, b2, b3) = (values(hidden, 14, -1.0, 1.0), values(dim, 15, -1.0, 1.0), values(hidden, 16, -1.0, 1.0));
    let lin = |w: &[f64], bias: Option<&[f64]>, o: usize, i: usize| {
        Linear::from_tensors(tensor(b, w, [o, i], dt), bias.map(|v| tensor(b, v, [o], dt))).unwrap()
    };
    let xt = tensor(b, &x, [rows, dim], dt);
    for act in ACTS {
        for bias in [false, true] {
            let (bb1, bb2, bb3) = if bias { (Some(&b1[..]), Some(&b2[..]), Some(&b3[..])) } else { (None, None, None) };
            let f = act_ref(act);
            let mlp = Mlp { fc_in: lin(&w1, bb1, hidden, dim), fc_out: lin(&w2, bb2, dim, hidden), act };
            let h: Vec<f64> = linear_ref(&x, &w1, bb1, (dim, hidden)).into_iter().map(f).collect();
            let e = linear_ref(&h, &w2, bb2, (hidden, dim));
            assert_close(
                &mlp.forward(&xt).unwrap().to_vec_f64().unwrap(),
                &e,
                tol(dt) * 10.0,
                &format!("Mlp {act:?} bias {bias}"),
            );
            let gated = GatedMlp {
                gate_proj: lin(&w1, bb1, hidden, dim),
                up_proj: lin(&w3, bb3, hidden, dim),
                down_proj: lin(&w2, bb2, dim, hidden),
                act,
            };
            let g: Vec<f64> = linear_ref(&x, &w1, bb1, (dim, hidden)).into_iter().map(f).collect();
            let u = linear_ref(&x, &w3, bb3, (dim, hidden));
            let gu: Vec<f64> = g.iter().zip(&u).map(|(a, c)| a * c).collect();
            let e = linear_ref(&gu, &w2, bb2, (hidden, dim));
            assert_close(
                &gated.forward(&xt).unwrap().to_vec_f64().unwrap(),
                &e,
                tol(dt) * 10.0,
                &format!("GatedMlp {act:?} bias {bias}"),
            );
        }
    }
    let s = |d: &[usize]| Shape::new(d.to_vec());
    grad_check(
        b,
        &[
            (x.clone(), s(&[rows, dim])),
            (w1.clone(), s(&[hidden, dim])),
            (b1, s(&[hidden])),
            (w2.clone(), s(&[dim, hidden])),
            (b2, s(&[dim])),
        ],
        |t| {
            let fc_in = Linear::from_tensors(t[1].clone(), Some(t[2].clone()))?;
            let fc_out = Linear::from_tensors(t[3].clone(), Some(t[4].clone()))?;
            Mlp { fc_in, fc_out, act: Activation::Gelu }.forward(&t[0])
        },
        1e-6,
        "Mlp grad",
    );
    grad_check(
        b,
        &[(x, s(&[rows, dim])), (w1, s(&[hidden, dim])), (w3, s(&[hidden, dim])), (w2, s(&[dim, hidden]))],
        |t| {
            let l = |i: usize| Linear::from_tensors(t[i].clone(), None);
            GatedMlp { gate_proj: l(1)?, up_proj: l(2)?, down_proj: l(3)?, act: Activation::Silu }.forward(&t[0])
        },
        1e-6,
        "GatedMlp grad",
    );
    let m = GatedMlp::new(b, dim, hidden, false, Activation::Silu, dt, 3).unwrap();
    assert_eq!(m.num_parameters(), 3 * dim * hidden);
    let m = Mlp::new(b, dim, hidden, true, Activation::Gelu, dt, 3).unwrap();
    assert_eq!(m.num_parameters(), 2 * dim * hidden + dim + hidden);
}

/// Dropout drops (seeded, scaled) in training and is the identity in evaluation.
pub fn dropout_layer<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = values(400, 17, 0.5, 1.5);
    let t = tensor(b, &x, [4, 100], dt);
    let d = Dropout::new(0.25);
    let train = d.forward(&t, 9, true).unwrap().to_vec_f64().unwrap();
    let e: Vec<f64> = (0..400)
        .map(|i| if redco_core::ops::random::uniform_at(9, i as u64) >= 0.25 { x[i] / 0.75 } else { 0.0 })
        .collect();
    assert_close(&train, &e, tol(dt), "Dropout train");
    assert_eq!(d.forward(&t, 9, false).unwrap().to_vec_f64().unwrap(), x, "Dropout eval");
    grad_check(b, &[(x[..10].to_vec(), Shape::new([10]))], |t| d.forward(&t[0], 9, false), 1e-6, "Dropout eval grad");
    assert!(Dropout::new(1.0).forward(&t, 0, true).is_err());
}

/// scaled_dot_product_attention with `[batch, kv_len]` padding masks of any dtype,
/// causal masks and grouped-query heads, default scale 1/sqrt(d); values and gradients.
pub fn sdpa<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (bs, hq, hk, tq, tk, d) = (2, 4, 2, 3, 5, 4);
    let pad: Vec<u8> = [[1u8, 1, 1, 1, 1], [0, 0, 1, 1, 1]].concat();
    let (q, k, v) = (
        values(bs * hq * tq * d, 18, -1.0, 1.0),
        values(bs * hk * tk * d, 19, -1.0, 1.0),
        values(bs * hk * tk * d, 20, -1.0, 1.0),
    );
    let (qs, ks) = (Shape::new([bs, hq, tq, d]), Shape::new([bs, hk, tk, d]));
    let masks: Vec<Tensor<B>> = vec![
        ids(b, &pad.iter().map(|&p| p as i64).collect::<Vec<_>>(), [bs, tk]),
        tensor(b, &pad.iter().map(|&p| p as f64).collect::<Vec<_>>(), [bs, tk], dt),
        Tensor::from_vec(b, pad.clone(), [bs, tk]).unwrap(),
    ];
    for causal in [false, true] {
        let e = r::attention(
            &q,
            &k,
            &v,
            (bs, hq, hk, tq, tk, d),
            Some(&pad),
            causal,
            0.5,
            redco_core::ops::attention::mask_fill(dt),
        );
        for m in &masks {
            let y = nn::scaled_dot_product_attention(
                &tensor(b, &q, qs.clone(), dt),
                &tensor(b, &k, ks.clone(), dt),
                &tensor(b, &v, ks.clone(), dt),
                Some(m),
                causal,
                None,
            )
            .unwrap();
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("sdpa causal {causal} mask {:?}", m.dtype()));
        }
        let e = r::attention(
            &q,
            &k,
            &v,
            (bs, hq, hk, tq, tk, d),
            None,
            causal,
            0.3,
            redco_core::ops::attention::mask_fill(dt),
        );
        let y = nn::scaled_dot_product_attention(
            &tensor(b, &q, qs.clone(), dt),
            &tensor(b, &k, ks.clone(), dt),
            &tensor(b, &v, ks.clone(), dt),
            None,
            causal,
            Some(0.3),
        )
        .unwrap();
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("sdpa causal {causal} no mask"));
    }
    let m = &masks[0];
    grad_check(
        b,
        &[(q, qs), (k, ks.clone()), (v, ks)],
        |t| nn::scaled_dot_product_attention(&t[0], &t[1], &t[2], Some(m), true, None),
        1e-6,
        "sdpa grad",
    );
    let keep = nn::padding_mask(m).unwrap();
    assert_eq!((keep.dims(), keep.dtype()), (&[bs, 1, 1, tk][..], DType::U8));
    assert_eq!(keep.to_vec_i64().unwrap(), pad.iter().map(|&p| p as i64).collect::<Vec<_>>());
    assert!(nn::padding_mask(&ids(b, &[1; 5], [5])).is_err(), "mask of rank 1");
}

/// nn::cross_entropy is the mean over targets that are not IGNORE_INDEX (-100).
pub fn cross_entropy_loss<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    assert_eq!(nn::IGNORE_INDEX, -100);
    let x = values(2 * 3 * 6, 21, -3.0, 3.0);
    let tg = [5i64, -100, 0, 2, -100, 2];
    let loss = nn::cross_entropy(&tensor(b, &x, [2, 3, 6], dt), &ids(b, &tg, [2, 3])).unwrap();
    let per = r::cross_entropy(&x, 6, &tg, -100);
    assert_close(&[loss.to_scalar().unwrap()], &[per.iter().sum::<f64>() / 4.0], tol(dt), "nn::cross_entropy");
    let t = ids(b, &tg, [2, 3]);
    grad_check(b, &[(x, Shape::new([2, 3, 6]))], |l| nn::cross_entropy(&l[0], &t), 1e-6, "nn::cross_entropy grad");
}

// ----- the Module API on a small composite model -----

/// A decoder block: a norm, a gated MLP and a learned scalar gate (a bare parameter).
struct Block<B: Backend> {
    input_layernorm: RmsNorm<B>,
    mlp: GatedMlp<B>,
    gate: Tensor<B>,
}

/// `model.{embed_tokens, layers.N, norm}` and an optional untied `lm_head`.
struct Decoder<B: Backend> {
    embed_tokens: Embedding<B>,
    layers: Vec<Block<B>>,
    norm: LayerNorm<B>,
}

struct CausalLm<B: Backend> {
    model: Decoder<B>,
    lm_head: Option<Linear<B>>,
}

impl<B: Backend> Module<B> for Block<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.input_layernorm.visit(&join(p, "input_layernorm"), f);
        self.mlp.visit(&join(p, "mlp"), f);
        self.gate.visit(&join(p, "gate"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.input_layernorm.visit_mut(&join(p, "input_layernorm"), f);
        self.mlp.visit_mut(&join(p, "mlp"), f);
        self.gate.visit_mut(&join(p, "gate"), f);
    }
}

impl<B: Backend> Module<B> for Decoder<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.embed_tokens.visit(&join(p, "embed_tokens"), f);
        self.layers.visit(&join(p, "layers"), f);
        self.norm.visit(&join(p, "norm"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.embed_tokens.visit_mut(&join(p, "embed_tokens"), f);
        self.layers.visit_mut(&join(p, "layers"), f);
        self.norm.visit_mut(&join(p, "norm"), f);
    }
}

impl<B: Backend> Module<B> for CausalLm<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.model.visit(&join(p, "model"), f);
        self.lm_head.visit(&join(p, "lm_head"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.model.visit_mut(&join(p, "model"), f);
        self.lm_head.visit_mut(&join(p, "lm_head"), f);
    }
}

const VOCAB: usize = 11;
const DIM: usize = 4;
const HIDDEN: usize = 6;
const LAYERS: usize = 2;

impl<B: Backend> CausalLm<B> {
    fn new(b: &B, dt: DType, seed: u64, lm_head: bool) -> Result<Self> {
        let layers = (0..LAYERS as u64)
            .map(|i| {
                Ok(Block {
                    input_layernorm: RmsNorm {
                        weight: nn::Init::Uniform(1.0).var(b, [DIM], dt, seed + 10 * i)?,
                        eps: 1e-6,
                    },
                    mlp: GatedMlp::new(b, DIM, HIDDEN, false, Activation::Silu, dt, seed + 10 * i + 1)?,
                    gate: nn::Init::Uniform(1.0).var(b, [], dt, seed + 10 * i + 5)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CausalLm {
            model: Decoder {
                embed_tokens: Embedding::new(b, VOCAB, DIM, 1.0, dt, seed + 100)?,
                layers,
                norm: LayerNorm::new(b, DIM, true, true, 1e-5, dt)?,
            },
            lm_head: if lm_head { Some(Linear::new(b, DIM, VOCAB, false, dt, seed + 200)?) } else { None },
        })
    }

    /// Embeds, runs the gated residual blocks, normalises and projects to the vocabulary
    /// (through the embedding table when there is no lm_head).
    fn forward(&self, ids: &Tensor<B>) -> Result<Tensor<B>> {
        let mut h = self.model.embed_tokens.forward(ids)?;
        for l in &self.model.layers {
            h = h.add(&l.mlp.forward(&l.input_layernorm.forward(&h)?)?.mul(&l.gate)?)?;
        }
        let h = self.model.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => h.matmul_t(&self.model.embed_tokens.weight),
        }
    }
}

fn expected_names(lm_head: bool) -> Vec<String> {
    let mut n = vec!["model.embed_tokens.weight".to_string()];
    for i in 0..LAYERS {
        for p in
            ["input_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "gate"]
        {
            n.push(format!("model.layers.{i}.{p}"));
        }
    }
    n.extend(["model.norm.weight".to_string(), "model.norm.bias".to_string()]);
    if lm_head {
        n.push("lm_head.weight".into());
    }
    n
}

/// Dotted Hugging Face names in visiting order, the exact parameter count, and every
/// parameter receiving a gradient of its own shape.
pub fn module_names_and_counts<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for lm_head in [true, false] {
        let m = CausalLm::new(b, dt, 1, lm_head).unwrap();
        let named = m.named_parameters();
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names, expected_names(lm_head));
        let count =
            VOCAB * DIM + LAYERS * (DIM + 3 * DIM * HIDDEN + 1) + 2 * DIM + if lm_head { VOCAB * DIM } else { 0 };
        assert_eq!(m.num_parameters(), count);
        assert_eq!(m.state_dict().keys().cloned().collect::<Vec<_>>(), {
            let mut s = names.clone();
            s.sort();
            s
        });
        let sub: Vec<String> = m.model.layers[1].mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(sub, ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]);
        // every parameter takes part in the forward pass
        let logits = m.forward(&ids(b, &[1, 5, 10, 0, 3, 3], [2, 3])).unwrap();
        assert_eq!(logits.dims(), &[2, 3, VOCAB]);
        let grads = nn::cross_entropy(&logits, &ids(b, &[5, 10, -100, 3, 3, 7], [2, 3])).unwrap().backward().unwrap();
        for (n, p) in &named {
            let g = grads.get(p).unwrap_or_else(|| panic!("no gradient for {n}"));
            assert_eq!(g.shape(), p.shape(), "{n}");
            assert!(g.to_vec_f64().unwrap().iter().any(|v| *v != 0.0), "{n}: zero gradient");
        }
    }
}

/// state_dict -> load_state_dict copies every value into fresh variables (and casts to
/// the module's dtype); the loaded model computes the same outputs.
pub fn state_dict_round_trip<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let src = CausalLm::new(b, dt, 1, true).unwrap();
    let mut dst = CausalLm::new(b, dt, 2, true).unwrap();
    let sd = src.state_dict();
    assert_ne!(sd["lm_head.weight"].to_vec_f64().unwrap(), dst.state_dict()["lm_head.weight"].to_vec_f64().unwrap());
    dst.load_state_dict(&sd, true).unwrap();
    for (n, p) in dst.named_parameters() {
        assert_eq!(p.to_vec_f64().unwrap(), sd[&n].to_vec_f64().unwrap(), "{n}");
        assert!(p.is_var(), "{n} is a variable after loading");
        assert_ne!(p.id(), sd[&n].id(), "{n} is a fresh tensor");
        assert_eq!(p.dtype(), dt);
    }
    let x = ids(b, &[2, 4, 6], [1, 3]);
    assert_eq!(src.forward(&x).unwrap().to_vec_f64().unwrap(), dst.forward(&x).unwrap().to_vec_f64().unwrap());
    // an f32 map loads into the module's dtype
    if dt != DType::F32 {
        let f32_map: BTreeMap<String, Tensor<B>> =
            sd.iter().map(|(k, v)| (k.clone(), v.cast(DType::F32).unwrap())).collect();
        let mut m = CausalLm::new(b, dt, 3, true).unwrap();
        m.load_state_dict(&f32_map, true).unwrap();
        for (n, p) in m.named_parameters() {
            assert_eq!(p.dtype(), dt, "{n}");
            assert_close(&p.to_vec_f64().unwrap(), &sd[&n].to_vec_f64().unwrap(), 1e-6, &n);
        }
    }
}

/// Missing, unexpected (when strict) and mis-shaped entries are `Error::Parameter` naming
/// the parameter, and leave the module unchanged.
pub fn load_state_dict_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let good = CausalLm::new(b, dt, 1, true).unwrap().state_dict();
    let mut m = CausalLm::new(b, dt, 2, true).unwrap();
    let before: Vec<(String, Tensor<B>)> = m.named_parameters();
    let unchanged = |m: &CausalLm<B>, what: &str| {
        for ((n, p), (_, q)) in m.named_parameters().iter().zip(&before) {
            assert_eq!(p.id(), q.id(), "{what}: {n} was replaced");
        }
    };
    let expect = |r: Result<()>, name: &str, words: &[&str], what: &str| match r {
        Err(Error::Parameter { name: n, msg }) => {
            assert_eq!(n, name, "{what}: {msg}");
            for w in words {
                assert!(msg.contains(w), "{what}: message {msg:?} lacks {w:?}");
            }
        }
        other => panic!("{what}: expected a parameter error, got {other:?}"),
    };

    let mut missing = good.clone();
    missing.remove("model.layers.1.mlp.up_proj.weight");
    expect(m.load_state_dict(&missing, true), "model.layers.1.mlp.up_proj.weight", &["missing"], "missing");
    expect(
        m.load_state_dict(&missing, false),
        "model.layers.1.mlp.up_proj.weight",
        &["missing"],
        "missing, not strict",
    );
    unchanged(&m, "missing");

    let mut extra = good.clone();
    extra.insert("model.layers.2.gate".into(), Tensor::zeros(b, [], dt).unwrap());
    expect(m.load_state_dict(&extra, true), "model.layers.2.gate", &["unexpected"], "unexpected");
    unchanged(&m, "unexpected");

    let mut shaped = good.clone();
    shaped.insert("model.norm.weight".into(), Tensor::zeros(b, [DIM + 1], dt).unwrap());
    expect(m.load_state_dict(&shaped, true), "model.norm.weight", &["[5]", "[4]"], "mis-shaped");
    unchanged(&m, "mis-shaped");

    // several problems: every one is named in the message
    let mut many = shaped.clone();
    many.remove("lm_head.weight");
    many.insert("extra.weight".into(), Tensor::zeros(b, [1], dt).unwrap());
    match m.load_state_dict(&many, true) {
        Err(Error::Parameter { msg, .. }) => {
            for n in ["model.norm.weight", "lm_head.weight", "extra.weight"] {
                assert!(msg.contains(n), "message {msg:?} lacks {n}");
            }
        }
        other => panic!("expected a parameter error, got {other:?}"),
    }
    unchanged(&m, "several problems");

    // not strict: extra entries are ignored and the rest loads
    m.load_state_dict(&extra, false).unwrap();
    assert_eq!(m.state_dict()["lm_head.weight"].to_vec_f64().unwrap(), good["lm_head.weight"].to_vec_f64().unwrap());
}
