//! Second-order autograd ([`Tensor::backward_graph`]): Hessian-vector products against
//! finite differences of first-order gradients, for every op family and the `nn` layers.
//!
//! For a scalar `f(theta)` and a direction `u`, `H u` is the gradient of
//! `sum(grad f . u)` (the gradients recorded as a graph), and must equal
//! `(grad f(theta + h u) - grad f(theta - h u)) / 2h`.

use crate::check::{assert_close, check_dtype, tensor, values};
use redco_core::nn::Linear;
use redco_core::{Backend, DType, Result, Shape, Tensor};

/// Checks `H u` of the scalar `sum(f(inputs) * w)` (fixed random weights `w`) against
/// central differences of its gradient along `u`, for every input.
pub fn hvp_check<B: Backend>(
    b: &B,
    inputs: &[(Vec<f64>, Shape)],
    f: impl Fn(&[Tensor<B>]) -> Result<Tensor<B>>,
    what: &str,
) {
    let dt = check_dtype(b);
    let (h, tol) = if dt == DType::F64 { (1e-5, 1e-6) } else { (1e-2, 3e-2) };
    let dirs: Vec<Vec<f64>> =
        inputs.iter().enumerate().map(|(k, (v, _))| values(v.len(), 300 + k as u64, -1.0, 1.0)).collect();
    let scalar = |xs: &[Tensor<B>]| -> Result<Tensor<B>> {
        let out = f(xs)?;
        let w = tensor(b, &values(out.elem_count(), 77, -1.0, 1.0), out.shape().clone(), out.dtype());
        out.mul(&w)?.sum_all()
    };
    // H u from the graph of the gradients
    let vars: Vec<Tensor<B>> = inputs.iter().map(|(v, s)| tensor(b, v, s.clone(), dt).into_var()).collect();
    let grads =
        scalar(&vars).and_then(|l| l.backward_graph()).unwrap_or_else(|e| panic!("{what}: backward_graph failed: {e}"));
    let mut dot: Option<Tensor<B>> = None;
    for (k, x) in vars.iter().enumerate() {
        let Some(g) = grads.get(x) else { continue };
        let u = tensor(b, &dirs[k], x.shape().clone(), dt);
        let term = g.mul(&u).and_then(|t| t.sum_all()).unwrap_or_else(|e| panic!("{what}: {e}"));
        dot = Some(match dot {
            Some(d) => d.add(&term).unwrap(),
            None => term,
        });
    }
    let dot = dot.unwrap_or_else(|| panic!("{what}: no input received a gradient"));
    // a gradient that does not depend on the inputs (a linear f) has a zero Hessian
    let hv = if dot.requires_grad() {
        Some(dot.backward().unwrap_or_else(|e| panic!("{what}: the second backward failed: {e}")))
    } else {
        None
    };
    // central differences of the first-order gradient along u
    let grad_at = |sign: f64| -> Vec<Vec<f64>> {
        let xs: Vec<Tensor<B>> = inputs
            .iter()
            .zip(&dirs)
            .map(|((v, s), u)| {
                let moved: Vec<f64> = v.iter().zip(u).map(|(a, d)| a + sign * h * d).collect();
                tensor(b, &moved, s.clone(), dt).into_var()
            })
            .collect();
        let g = scalar(&xs).unwrap().backward().unwrap();
        xs.iter()
            .zip(inputs)
            .map(|(x, (v, _))| g.get(x).map_or(vec![0.0; v.len()], |t| t.to_vec_f64().unwrap()))
            .collect()
    };
    let (plus, minus) = (grad_at(1.0), grad_at(-1.0));
    for (k, x) in vars.iter().enumerate() {
        let numeric: Vec<f64> = plus[k].iter().zip(&minus[k]).map(|(p, m)| (p - m) / (2.0 * h)).collect();
        let analytic = hv.as_ref().and_then(|g| g.get(x)).map_or(vec![0.0; numeric.len()], |t| t.to_vec_f64().unwrap());
        assert_close(&analytic, &numeric, tol, &format!("{what}: H u of input {k}"));
    }
}

fn input(n: usize, seed: u64, lo: f64, hi: f64, shape: &[usize]) -> (Vec<f64>, Shape) {
    (values(n, seed, lo, hi), Shape::new(shape.to_vec()))
}

/// Every unary map, through products so that its second derivative matters.
pub fn hvp_unary<B: Backend>(b: &B) {
    type F<B> = fn(&Tensor<B>) -> Result<Tensor<B>>;
    let ops: [(&str, F<B>, f64, f64); 18] = [
        ("exp", |x| x.exp(), -1.0, 1.0),
        ("log", |x| x.log(), 0.5, 2.0),
        ("sqrt", |x| x.sqrt(), 0.5, 2.0),
        ("rsqrt", |x| x.rsqrt(), 0.5, 2.0),
        ("recip", |x| x.recip(), 0.5, 2.0),
        ("tanh", |x| x.tanh(), -1.5, 1.5),
        ("sigmoid", |x| x.sigmoid(), -2.0, 2.0),
        ("silu", |x| x.silu(), -2.0, 2.0),
        ("gelu", |x| x.gelu(), -2.0, 2.0),
        ("gelu_tanh", |x| x.gelu_tanh(), -2.0, 2.0),
        ("erf", |x| x.erf(), -1.5, 1.5),
        ("sin", |x| x.sin(), -2.0, 2.0),
        ("cos", |x| x.cos(), -2.0, 2.0),
        ("square", |x| x.square(), -2.0, 2.0),
        ("powf", |x| x.powf(2.5), 0.5, 2.0),
        ("affine", |x| x.affine(-1.5, 0.25)?.square(), -1.0, 1.0),
        ("relu", |x| x.relu()?.square(), 0.1, 1.0),
        ("abs", |x| x.abs()?.powf(1.5), 0.2, 1.0),
    ];
    for (name, op, lo, hi) in ops {
        hvp_check(
            b,
            &[input(6, 11, lo, hi, &[2, 3]), input(6, 12, -1.0, 1.0, &[2, 3])],
            |t| op(&t[0])?.mul(&t[1])?.mul(&t[0]),
            name,
        );
    }
    hvp_check(b, &[input(6, 13, 0.2, 1.0, &[6])], |t| t[0].clamp_min(0.5)?.square(), "clamp_min");
}

/// Broadcast binary ops and matmul (products of inputs: cross second derivatives).
pub fn hvp_binary_and_matmul<B: Backend>(b: &B) {
    let ins = [input(6, 21, 0.5, 1.5, &[2, 3]), input(3, 22, 0.5, 1.5, &[3])];
    hvp_check(b, &ins, |t| t[0].mul(&t[1])?.add(&t[0].square()?), "mul + add (broadcast)");
    hvp_check(b, &ins, |t| t[0].div(&t[1])?.sub(&t[1].mul(&t[0])?), "div - mul");
    hvp_check(b, &ins, |t| t[0].maximum(&t[1].mul(&t[1])?)?.square(), "maximum");
    let mm = [input(12, 23, -1.0, 1.0, &[3, 4]), input(8, 24, -1.0, 1.0, &[4, 2])];
    hvp_check(b, &mm, |t| t[0].matmul(&t[1])?.tanh(), "matmul");
    let bm = [input(24, 25, -1.0, 1.0, &[2, 3, 4]), input(8, 26, -1.0, 1.0, &[2, 4])];
    hvp_check(b, &bm, |t| t[0].matmul_t(&t[1])?.square(), "batched matmul against a transposed weight");
}

/// Reductions and layout ops between nonlinear maps.
pub fn hvp_reduce_and_layout<B: Backend>(b: &B) {
    let x = [input(24, 31, -1.0, 1.0, &[2, 3, 4])];
    hvp_check(b, &x, |t| t[0].sum(1, true)?.square()?.mul(&t[0]), "sum");
    hvp_check(b, &x, |t| t[0].mean(-1, false)?.exp(), "mean");
    hvp_check(b, &x, |t| t[0].max(-1, false)?.square(), "max");
    hvp_check(
        b,
        &x,
        |t| t[0].transpose(0, 2)?.reshape([4, 6])?.tanh()?.narrow(1, 1, 3)?.square(),
        "permute, reshape, narrow",
    );
    hvp_check(
        b,
        &x,
        |t| Tensor::cat(&[&t[0].sin()?, &t[0].square()?], 1)?.expand([3, 2, 6, 4])?.square(),
        "cat, expand",
    );
}

/// Softmax, log-softmax and the fused cross-entropy (with an ignored row).
pub fn hvp_softmax_and_cross_entropy<B: Backend>(b: &B) {
    let x = [input(15, 41, -2.0, 2.0, &[3, 5])];
    hvp_check(b, &x, |t| t[0].softmax(-1)?.square(), "softmax");
    hvp_check(b, &x, |t| t[0].log_softmax(-1)?.square(), "log_softmax");
    let targets = Tensor::from_vec(b, vec![4i64, -100, 1], [3]).unwrap();
    hvp_check(b, &x, |t| t[0].cross_entropy(&targets, -100), "cross_entropy");
    hvp_check(
        b,
        &x,
        |t| t[0].cross_entropy_per_token(&targets, -100)?.mul(&t[0].sum(-1, false)?),
        "cross_entropy per token",
    );
}

/// LayerNorm and RMSNorm with their weights, and rotary embedding.
pub fn hvp_norm_and_rotary<B: Backend>(b: &B) {
    let ins = [input(12, 51, -1.0, 1.0, &[3, 4]), input(4, 52, 0.5, 1.5, &[4]), input(4, 53, -0.5, 0.5, &[4])];
    hvp_check(b, &ins, |t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)?.square(), "layer_norm");
    hvp_check(b, &ins[..2], |t| t[0].rms_norm(Some(&t[1]), 1e-5)?.square(), "rms_norm");
    let angles: Vec<f64> = (0..6).map(|i| 0.3 * i as f64).collect();
    let dt = check_dtype(b);
    let cos = tensor(b, &angles.iter().map(|a| a.cos()).collect::<Vec<_>>(), [3, 2], dt);
    let sin = tensor(b, &angles.iter().map(|a| a.sin()).collect::<Vec<_>>(), [3, 2], dt);
    let x = [input(24, 54, -1.0, 1.0, &[2, 3, 4])];
    for mode in [redco_core::backend::RotaryMode::HalfSplit, redco_core::backend::RotaryMode::Interleaved] {
        hvp_check(b, &x, |t| t[0].rotary(&cos, &sin, mode)?.square()?.mul(&t[0]), "rotary");
    }
}

/// Fused attention (grouped-query heads, causal), and the embedding lookup.
pub fn hvp_attention_and_index<B: Backend>(b: &B) {
    let ins = [
        input(24, 61, -1.0, 1.0, &[1, 2, 3, 4]),
        input(12, 62, -1.0, 1.0, &[1, 1, 3, 4]),
        input(12, 63, -1.0, 1.0, &[1, 1, 3, 4]),
    ];
    hvp_check(b, &ins, |t| t[0].attention(&t[1], &t[2], None, true, 0.5), "attention");
    let ids = Tensor::from_vec(b, vec![2i64, 0, 2, 1], [4]).unwrap();
    let table = [input(12, 64, -1.0, 1.0, &[3, 4])];
    hvp_check(b, &table, |t| t[0].index_select(&ids, 0)?.tanh()?.mul(&t[0].index_select(&ids, 0)?), "index_select");
}

/// An MLP of `nn::Linear` layers with tanh, trained by second-order MAML: the HVP of its
/// loss with respect to the weights, and the gradient of the loss after one inner step
/// (through the inner step's gradient) against finite differences.
pub fn hvp_mlp_and_maml_step<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (h, tol) = if dt == DType::F64 { (1e-5, 1e-6) } else { (1e-2, 3e-2) };
    let xs = tensor(b, &values(8, 71, -1.0, 1.0), [8, 1], dt);
    let ys = tensor(b, &values(8, 72, -1.0, 1.0), [8, 1], dt);
    let theta0: Vec<Vec<f64>> =
        vec![values(8, 73, -1.0, 1.0), values(8, 74, -0.5, 0.5), values(8, 75, -1.0, 1.0), values(1, 76, -0.5, 0.5)];
    let shapes = [Shape::new([8, 1]), Shape::new([8]), Shape::new([1, 8]), Shape::new([1])];
    let layer = |w: &Tensor<B>, c: &Tensor<B>| Linear::from_tensors(w.clone(), Some(c.clone()));
    let mse = |p: &[Tensor<B>]| -> Result<Tensor<B>> {
        let h1 = layer(&p[0], &p[1])?.forward(&xs)?.tanh()?;
        let out = layer(&p[2], &p[3])?.forward(&h1)?;
        out.sub(&ys)?.square()?.mean_all()
    };
    hvp_check(
        b,
        &theta0.iter().cloned().zip(shapes.iter().cloned()).collect::<Vec<_>>(),
        |t| mse(t),
        "two Linear layers with tanh",
    );
    // MAML's outer loss: L(theta - a grad L(theta)), differentiated through the inner step
    let alpha = 0.1;
    let outer = |p: &[Tensor<B>], graph: bool| -> Result<Tensor<B>> {
        let inner = mse(p)?;
        let g = if graph { inner.backward_graph()? } else { inner.backward()? };
        let adapted: Vec<Tensor<B>> = p
            .iter()
            .map(|t| t.sub(&g.get(t).expect("every weight has a gradient").scale(alpha)?))
            .collect::<Result<_>>()?;
        mse(&adapted)
    };
    let vars: Vec<Tensor<B>> =
        theta0.iter().zip(&shapes).map(|(v, s)| tensor(b, v, s.clone(), dt).into_var()).collect();
    let g = outer(&vars, true).unwrap().backward().unwrap();
    for (k, (v, s)) in theta0.iter().zip(&shapes).enumerate() {
        let analytic = g.get(&vars[k]).unwrap().to_vec_f64().unwrap();
        let numeric: Vec<f64> = (0..v.len())
            .map(|i| {
                let at = |d: f64| -> f64 {
                    let p: Vec<Tensor<B>> = theta0
                        .iter()
                        .zip(&shapes)
                        .enumerate()
                        .map(|(j, (w, sh))| {
                            let mut w = w.clone();
                            if j == k {
                                w[i] += d;
                            }
                            tensor(b, &w, sh.clone(), dt).into_var()
                        })
                        .collect();
                    outer(&p, false).unwrap().to_scalar().unwrap()
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect();
        let _ = s;
        assert_close(&analytic, &numeric, tol, &format!("MAML outer gradient of weight {k}"));
    }
}
