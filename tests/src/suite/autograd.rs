//! Autograd: gradient accumulation over shared inputs and across calls, no_grad, detach,
//! and deep graphs.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use redco_core::{no_grad, Backend, Error, GradStore, Shape};

/// A diamond graph (x feeds two branches that meet again) sums both branches' gradients.
pub fn diamond_accumulates<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let xv = values(6, 1, -1.0, 1.0);
    let x = tensor(b, &xv, [2, 3], dt).into_var();
    // f = sin(x) * cos(x) + x * x: d/dx = cos^2 - sin^2 + 2x
    let f = x.sin().unwrap().mul(&x.cos().unwrap()).unwrap().add(&x.mul(&x).unwrap()).unwrap();
    let g = f.sum_all().unwrap().backward().unwrap();
    let e: Vec<f64> = xv.iter().map(|v| v.cos().powi(2) - v.sin().powi(2) + 2.0 * v).collect();
    assert_close(&g.get(&x).unwrap().to_vec_f64().unwrap(), &e, tol(dt), "diamond");
    grad_check(
        b,
        &[(xv.clone(), Shape::new([2, 3])), (values(3, 2, -1.0, 1.0), Shape::new([3]))],
        |t| {
            let a = t[0].mul(&t[1])?;
            let c = a.exp()?.add(&a.square()?)?;
            c.mul(&t[0])?.sub(&t[1])
        },
        1e-6,
        "shared intermediates",
    );
}

/// `backward_into` called twice on the same graph holds twice one call's gradients, and
/// a fresh store per call does not accumulate.
pub fn backward_into_accumulates<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &values(5, 3, -1.0, 1.0), [5], dt).into_var();
    let w = tensor(b, &values(5, 4, -1.0, 1.0), [5], dt).into_var();
    let loss = x.mul(&w).unwrap().tanh().unwrap().sum_all().unwrap();
    let once = loss.backward().unwrap();
    let mut store = GradStore::new();
    loss.backward_into(&mut store).unwrap();
    loss.backward_into(&mut store).unwrap();
    assert_eq!(store.len(), 2);
    for t in [&x, &w] {
        let one = once.get(t).unwrap().to_vec_f64().unwrap();
        let two: Vec<f64> = one.iter().map(|v| 2.0 * v).collect();
        assert_close(&store.get(t).unwrap().to_vec_f64().unwrap(), &two, tol(dt), "two calls");
    }
    // a second micro-batch with other values adds its own gradient
    let loss2 = x.square().unwrap().sum_all().unwrap();
    let mut s = GradStore::new();
    loss.backward_into(&mut s).unwrap();
    loss2.backward_into(&mut s).unwrap();
    let e: Vec<f64> = once
        .get(&x)
        .unwrap()
        .to_vec_f64()
        .unwrap()
        .iter()
        .zip(x.to_vec_f64().unwrap())
        .map(|(g, v)| g + 2.0 * v)
        .collect();
    assert_close(&s.get(&x).unwrap().to_vec_f64().unwrap(), &e, tol(dt), "two micro-batches");
}

/// Under `no_grad` nothing is recorded and backward is an error; the mode is restored on
/// exit; a tensor that depends on no variable cannot be differentiated.
pub fn no_grad_and_non_grad_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &values(4, 5, -1.0, 1.0), [4], dt).into_var();
    let y = no_grad(|| {
        assert!(!redco_core::is_grad_enabled());
        x.mul(&x).unwrap().exp().unwrap().sum_all().unwrap()
    });
    assert!(redco_core::is_grad_enabled(), "mode restored after no_grad");
    assert!(!y.requires_grad() && y.op_name().is_none());
    assert!(matches!(y.backward(), Err(Error::Invalid { op: "backward", .. })));
    let c = tensor(b, &values(4, 6, -1.0, 1.0), [4], dt);
    let z = c.exp().unwrap().sum_all().unwrap();
    assert!(!z.requires_grad());
    assert!(matches!(z.backward(), Err(Error::Invalid { op: "backward", .. })), "no variable");
    // a constant mixed with a variable gets no gradient
    let g = x.mul(&c).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(g.get(&c).is_none());
    assert_eq!(g.get(&x).unwrap().to_vec_f64().unwrap(), c.to_vec_f64().unwrap());
    // nested scopes restore the outer mode
    no_grad(|| {
        no_grad(|| {});
        assert!(!redco_core::is_grad_enabled());
    });
    assert!(redco_core::is_grad_enabled());
}

/// `detach` cuts the graph: gradients flow only through the attached uses.
pub fn detach_stops_gradients<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let xv = values(5, 7, -1.0, 1.0);
    let x = tensor(b, &xv, [5], dt).into_var();
    let d = x.detach();
    assert!(!d.requires_grad() && !d.is_var());
    assert_eq!(d.to_vec_f64().unwrap(), xv);
    // d/dx sum(detach(x) * x) = x, not 2x
    let g = d.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec_f64().unwrap(), xv);
    assert!(g.get(&d).is_none());
    let h = x.exp().unwrap().detach().mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    let e: Vec<f64> = xv.iter().map(|v| v.exp()).collect();
    assert_close(&h.get(&x).unwrap().to_vec_f64().unwrap(), &e, tol(dt), "exp(x).detach() * x");
    assert!(x.detach().sum_all().unwrap().backward().is_err());
}

/// A chain of thousands of ops differentiates and drops without overflowing the stack,
/// even on a thread with a small stack (where a recursive walk or drop of the graph would).
pub fn deep_chain<B: Backend>(b: &B) {
    let b = b.clone();
    let run = move || {
        let dt = check_dtype(&b);
        let n = 6000;
        let x = tensor(&b, &[0.5, -0.25], [2], dt).into_var();
        let mut y = x.clone();
        for i in 0..n {
            y = if i % 2 == 0 { y.affine(1.0, 0.001).unwrap() } else { y.mul(&x).unwrap().div(&x).unwrap() };
        }
        let loss = y.sum_all().unwrap();
        let g = loss.backward().unwrap();
        // y = x + n/2 * 0.001 up to rounding, so dy/dx = 1
        assert_close(&g.get(&x).unwrap().to_vec_f64().unwrap(), &[1.0, 1.0], 1e-9_f64.max(tol(dt)), "deep chain");
        drop((loss, y, g));
    };
    let t = std::thread::Builder::new().stack_size(256 << 10).spawn(run).unwrap();
    if let Err(e) = t.join() {
        std::panic::resume_unwind(e);
    }
}

/// A recomputed block (`Tensor::recompute`) gives the gradients the recorded block gives,
/// for its input and the weights it reads, without recording its inside in the forward;
/// a second-order graph through it and a weight it reads but does not list are refused.
pub fn recompute_matches_recorded<B: Backend>(b: &B) {
    use redco_core::Tensor;
    let dt = check_dtype(b);
    let x = tensor(b, &values(12, 7, -1.0, 1.0), [3, 4], dt).into_var();
    let w1 = tensor(b, &values(20, 8, -0.5, 0.5), [4, 5], dt).into_var();
    let w2 = tensor(b, &values(20, 9, -0.5, 0.5), [5, 4], dt).into_var();
    let mask = tensor(b, &values(4, 10, 0.0, 1.0), [4], dt);
    // a residual MLP block: x + silu(x W1) W2 * mask
    let block = |w1: Tensor<B>, w2: Tensor<B>| {
        move |xs: &[Tensor<B>]| -> redco_core::Result<Tensor<B>> {
            let h = xs[0].matmul(&w1)?.silu()?.matmul(&w2)?;
            xs[0].add(&h.mul(&xs[1])?)
        }
    };
    let loss_of = |y: Tensor<B>| y.square().unwrap().sum_all().unwrap();
    // two blocks in a row, the second fed by the first
    let f = block(w1.clone(), w2.clone());
    let recorded = f(&[f(&[x.clone(), mask.clone()]).unwrap(), mask.clone()]).unwrap();
    let want = loss_of(recorded).backward().unwrap();
    let r1 = Tensor::recompute(&[&x, &mask], &[&w1, &w2], block(w1.clone(), w2.clone())).unwrap();
    let r2 = Tensor::recompute(&[&r1, &mask], &[&w1, &w2], block(w1.clone(), w2.clone())).unwrap();
    // the block's inside is not recorded: the output's node is the recompute itself
    assert_eq!(r2.op_name(), Some("recompute"));
    let got = loss_of(r2.clone()).backward().unwrap();
    for (t, name) in [(&x, "x"), (&w1, "w1"), (&w2, "w2")] {
        let e = want.get(t).unwrap().to_vec_f64().unwrap();
        assert_close(&got.get(t).unwrap().to_vec_f64().unwrap(), &e, tol(dt), name);
    }
    assert!(got.get(&mask).is_none(), "the mask needs no gradient");
    // without gradients it is the block
    let plain = no_grad(|| Tensor::recompute(&[&x, &mask], &[&w1, &w2], block(w1.clone(), w2.clone()))).unwrap();
    assert!(!plain.requires_grad());
    // second order: refused, naming recompute
    let Err(e) = loss_of(r2).backward_graph() else { panic!("second order through recompute was accepted") };
    assert!(matches!(e, Error::Unsupported { op: "recompute", .. }), "{e}");
    // a weight read but not listed would lose its gradient: refused
    let r = Tensor::recompute(&[&x, &mask], &[&w1], block(w1.clone(), w2.clone())).unwrap();
    let Err(e) = loss_of(r).backward() else { panic!("an unlisted weight was accepted") };
    assert!(e.to_string().contains("not listed in its params"), "{e}");
}

/// A selectively recomputed block (`Tensor::recompute_selective`) gives the recorded
/// block's gradients, keeps its matmuls' outputs (its recomputation takes them instead of
/// running them), and a block that runs other ops when recomputed is refused.
pub fn recompute_selective_matches_recorded<B: Backend>(b: &B) {
    use redco_core::Tensor;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let dt = check_dtype(b);
    let x = tensor(b, &values(12, 7, -1.0, 1.0), [3, 4], dt).into_var();
    let w1 = tensor(b, &values(20, 8, -0.5, 0.5), [4, 5], dt).into_var();
    let w2 = tensor(b, &values(20, 9, -0.5, 0.5), [5, 4], dt).into_var();
    let mask = tensor(b, &values(4, 10, 0.0, 1.0), [4], dt);
    // a residual gated block: x + (silu(x W1) * (x W1)) W2 * mask
    let block = |w1: Tensor<B>, w2: Tensor<B>| {
        move |xs: &[Tensor<B>]| -> redco_core::Result<Tensor<B>> {
            let g = xs[0].matmul(&w1)?;
            let h = g.silu()?.mul(&g)?.matmul(&w2)?;
            xs[0].add(&h.mul(&xs[1])?)
        }
    };
    let loss_of = |y: Tensor<B>| y.square().unwrap().sum_all().unwrap();
    let f = block(w1.clone(), w2.clone());
    let recorded = f(&[f(&[x.clone(), mask.clone()]).unwrap(), mask.clone()]).unwrap();
    let want = loss_of(recorded).backward().unwrap();
    let r1 = Tensor::recompute_selective(&[&x, &mask], &[&w1, &w2], block(w1.clone(), w2.clone())).unwrap();
    let r2 = Tensor::recompute_selective(&[&r1, &mask], &[&w1, &w2], block(w1.clone(), w2.clone())).unwrap();
    assert_eq!(r2.op_name(), Some("recompute_selective"));
    let got = loss_of(r2.clone()).backward().unwrap();
    for (t, name) in [(&x, "x"), (&w1, "w1"), (&w2, "w2")] {
        let e = want.get(t).unwrap().to_vec_f64().unwrap();
        assert_close(&got.get(t).unwrap().to_vec_f64().unwrap(), &e, tol(dt), name);
    }
    assert!(got.get(&mask).is_none(), "the mask needs no gradient");
    // the recomputation follows the kept outputs in order: one that runs a matmul the
    // forward did not is refused, not given a wrong output
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = {
        let (w1, w2, calls) = (w1.clone(), w2.clone(), calls.clone());
        move |xs: &[Tensor<B>]| -> redco_core::Result<Tensor<B>> {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let g = xs[0].matmul(&w1)?;
            // on the recomputation, an extra matmul the forward did not run
            let g = if n > 0 { g.matmul(&w1.transpose(0, 1)?)?.matmul(&w1)? } else { g };
            g.matmul(&w2)
        }
    };
    let r = Tensor::recompute_selective(&[&x], &[&w1, &w2], counted).unwrap();
    let Err(e) = loss_of(r).backward() else { panic!("a recomputation running other ops was accepted") };
    assert!(e.to_string().contains("must run the same ops again"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the forward and one recomputation");
    // without gradients it is the block
    let plain =
        no_grad(|| Tensor::recompute_selective(&[&x, &mask], &[&w1, &w2], block(w1.clone(), w2.clone()))).unwrap();
    assert!(!plain.requires_grad());
    // second order: refused, naming recompute
    let Err(e) = loss_of(r1).backward_graph() else { panic!("second order through recompute was accepted") };
    assert!(matches!(e, Error::Unsupported { op: "recompute", .. }), "{e}");
}
