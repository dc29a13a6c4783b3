//! Every op family on split inputs equals the op on whole inputs (values and gradients):
//! the propagation rules, the redistributions and their conjugates in backward.

use redco_core::runtime::{Mesh, SpmdOptions};
use redco_core::{DType, HostData, MeshAxis, Placement, Placements, Result, RotaryMode, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_tests::check::{assert_close, values};

type Op = fn(&[Tensor<Cpu>]) -> Result<Tensor<Cpu>>;

struct Input {
    shape: Vec<usize>,
    /// integer ids in 0..n instead of floats
    ids: Option<i64>,
    /// the first id is -100 (an ignored target)
    ignore_first: bool,
    dp: Placement,
    mp: Placement,
}

fn f(shape: &[usize], dp: Placement, mp: Placement) -> Input {
    Input { shape: shape.to_vec(), ids: None, ignore_first: false, dp, mp }
}
fn ids(shape: &[usize], n: i64, dp: Placement) -> Input {
    Input { shape: shape.to_vec(), ids: Some(n), ignore_first: false, dp, mp: Placement::Replicate }
}
fn targets(shape: &[usize], n: i64, dp: Placement) -> Input {
    Input { ignore_first: true, ..ids(shape, n, dp) }
}

const R: Placement = Placement::Replicate;
const S0: Placement = Placement::Shard(0);
const S1: Placement = Placement::Shard(1);
const S2: Placement = Placement::Shard(2);

fn make(b: &Cpu, inp: &Input, k: u64) -> Result<Tensor<Cpu>> {
    let n: usize = inp.shape.iter().product();
    match inp.ids {
        Some(v) => {
            let mut d: Vec<i64> = (0..n as u64).map(|i| ((i * 7 + k) % v as u64) as i64).collect();
            if inp.ignore_first {
                d[0] = -100;
            }
            Tensor::from_host(b, &HostData::I64(d), inp.shape.clone())
        }
        None => Tensor::from_host(b, &HostData::from_f64(&values(n, k, -1.5, 1.5), DType::F64), inp.shape.clone()),
    }
}

/// (value, gradients of the float inputs) of `op`, with every input laid out as given.
fn run(b: &Cpu, inputs: &[Input], op: Op, split: bool) -> Result<(Vec<f64>, Vec<Vec<f64>>)> {
    let mut ts = Vec::new();
    for (i, inp) in inputs.iter().enumerate() {
        let mut t = make(b, inp, 10 + i as u64)?;
        if split {
            t = t.redistribute(Placements([inp.dp, inp.mp]))?;
        }
        ts.push(if inp.ids.is_none() { t.into_var() } else { t });
    }
    let out = op(&ts)?;
    let w = Tensor::from_host(
        b,
        &HostData::from_f64(&values(out.elem_count(), 3, 0.5, 1.5), out.dtype()),
        out.shape().clone(),
    )?;
    let loss = out.mul(&w)?.sum_all()?;
    let g = loss.backward()?;
    let mut grads = Vec::new();
    for (t, inp) in ts.iter().zip(inputs) {
        if inp.ids.is_none() {
            grads.push(match g.get(t) {
                Some(x) => x.replicate()?.to_vec_f64()?,
                None => vec![0.0; t.elem_count()],
            });
        }
    }
    Ok((out.replicate()?.to_vec_f64()?, grads))
}

fn check(name: &str, inputs: Vec<Input>, op: Op) {
    let whole = run(&Cpu::new(1), &inputs, op, false).unwrap_or_else(|e| panic!("{name}: {e}"));
    let split = spmd_cpu(Mesh::new(2, 2).unwrap(), &SpmdOptions::default(), |rk| run(&rk.backend, &inputs, op, true))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (r, (v, g)) in split.iter().enumerate() {
        assert_close(v, &whole.0, 1e-9, &format!("{name}: value on rank {r}"));
        for (i, (a, e)) in g.iter().zip(&whole.1).enumerate() {
            assert_close(a, e, 1e-9, &format!("{name}: gradient of input {i} on rank {r}"));
        }
    }
}

#[test]
fn elementwise_with_broadcasting() {
    check("add col-split + row", vec![f(&[4, 6], R, S1), f(&[6], R, R)], |t| t[0].add(&t[1]));
    check("mul batch-split x col-split", vec![f(&[4, 6], S0, S1), f(&[4, 1], S0, R)], |t| t[0].mul(&t[1])?.exp());
    check("div by a split divisor", vec![f(&[4, 6], R, R), f(&[4, 6], R, S1)], |t| {
        t[0].div(&t[1].abs()?.add_scalar(1.0)?)
    });
    check("max of differently split", vec![f(&[4, 6], S0, R), f(&[4, 6], R, S1)], |t| t[0].maximum(&t[1]));
    check("gelu and where", vec![f(&[4, 6], S0, S1)], |t| {
        let m = t[0].compare_scalar(0.0, redco_core::CmpOp::Gt)?;
        m.where_cond(&t[0].gelu()?, &t[0].square()?)
    });
}

#[test]
fn matmul_column_row_batch_and_rows() {
    check("column", vec![f(&[2, 3, 8], S0, R), f(&[6, 8], R, S0)], |t| t[0].matmul_t(&t[1]));
    check("row (partial)", vec![f(&[2, 3, 8], S0, S2), f(&[6, 8], R, S1)], |t| t[0].matmul_t(&t[1]));
    check("row then relu", vec![f(&[4, 8], R, S1), f(&[6, 8], R, S1)], |t| t[0].matmul_t(&t[1])?.relu());
    check("per head", vec![f(&[2, 4, 3, 5], S0, S1), f(&[2, 4, 3, 5], S0, S1)], |t| t[0].matmul_t(&t[1]));
    check("k split on one side only", vec![f(&[4, 8], R, S1), f(&[8, 6], R, R)], |t| t[0].matmul(&t[1]));
}

#[test]
fn reductions_and_layout() {
    check("sum over the split dim", vec![f(&[4, 6], S0, S1)], |t| t[0].sum(1, false));
    check("mean over another dim", vec![f(&[4, 6], S0, S1)], |t| t[0].mean(0, true));
    check("max over the split dim", vec![f(&[4, 6], R, S1)], |t| t[0].max(1, false));
    check("sum_all", vec![f(&[4, 6], S0, S1)], |t| t[0].sum_all());
    check("reshape carries heads", vec![f(&[2, 3, 8], S0, S2)], |t| t[0].reshape([2, 3, 4, 2])?.transpose(1, 2));
    check("reshape that cannot carry", vec![f(&[2, 4, 6], R, S1)], |t| t[0].reshape([8, 6]));
    check("narrow and cat", vec![f(&[4, 6], S0, R), f(&[4, 2], S0, R)], |t| {
        redco_core::Tensor::cat(&[&t[0].narrow(1, 1, 3)?, &t[1]], 1)
    });
    check("expand", vec![f(&[4, 1, 6], S0, S2)], |t| t[0].expand([4, 3, 6]));
}

#[test]
fn fused_ops() {
    check("softmax over another dim", vec![f(&[4, 6], R, S0)], |t| t[0].softmax(-1));
    check("log_softmax over the split dim", vec![f(&[4, 6], S0, S1)], |t| t[0].log_softmax(-1));
    check("layer_norm", vec![f(&[4, 6], S0, R), f(&[6], R, R), f(&[6], R, R)], |t| {
        t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)
    });
    check("rms_norm of a split row", vec![f(&[4, 6], R, S1), f(&[6], R, R)], |t| t[0].rms_norm(Some(&t[1]), 1e-5));
    check("rotary per head", vec![f(&[2, 4, 3, 6], S0, S1)], |t| {
        let pos = Tensor::arange(t[0].backend(), 3)?;
        redco_core::nn::RotaryEmbedding::new(4, 500.0, RotaryMode::HalfSplit)?.forward(&t[0], &pos)
    });
    check(
        "attention per head with padding",
        vec![f(&[2, 4, 3, 4], S0, S1), f(&[2, 2, 3, 4], S0, S1), f(&[2, 2, 3, 4], S0, S1)],
        |t| {
            let mask = Tensor::from_vec(t[0].backend(), vec![0i64, 1, 1, 1, 1, 1], [2, 3])?;
            redco_core::nn::scaled_dot_product_attention(&t[0], &t[1], &t[2], Some(&mask), true, None)
        },
    );
    check("dropout draws the same mask", vec![f(&[4, 8], S0, S1)], |t| t[0].dropout(0.3, 7));
}

#[test]
fn vocab_parallel_lookup_and_cross_entropy() {
    check("lookup", vec![f(&[12, 4], R, S0), ids(&[2, 3], 12, S0)], |t| t[0].index_select(&t[1], 0));
    check("cross-entropy", vec![f(&[6, 12], S0, S1), targets(&[6], 12, S0)], |t| t[0].cross_entropy(&t[1], -100));
    check("gather (replicated fallback)", vec![f(&[4, 6], S0, S1), ids(&[4, 2], 6, S0)], |t| t[0].gather(&t[1], 1));
    // the fused attention kernel (no gradient) on split heads and batch
    let b = Cpu::new(1);
    let mk = |s: &[usize], k| {
        Tensor::from_host(&b, &HostData::from_f64(&values(s.iter().product(), k, -1.0, 1.0), DType::F64), s.to_vec())
            .unwrap()
    };
    let (q, kk, v) = (mk(&[2, 4, 3, 4], 1), mk(&[2, 2, 5, 4], 2), mk(&[2, 2, 5, 4], 3));
    let want = redco_core::no_grad(|| q.attention(&kk, &v, None, true, 0.5)).unwrap().to_vec_f64().unwrap();
    let got = spmd_cpu(Mesh::new(2, 2).unwrap(), &SpmdOptions::default(), |_| {
        let p = Placements::REPLICATED.with(MeshAxis::Dp, S0).with(MeshAxis::Mp, S1);
        let (q, kk, v) = (q.redistribute(p)?, kk.redistribute(p)?, v.redistribute(p)?);
        q.attention(&kk, &v, None, true, 0.5)?.replicate()?.to_vec_f64()
    })
    .unwrap();
    for g in got {
        assert_close(&g, &want, 1e-9, "fused attention on split heads");
    }
}
