//! Naive f64 reference implementations, written for clarity, not speed.

/// Row-major multi-index of flat index `i` in `dims`.
pub fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        idx[d] = i % dims[d].max(1);
        i /= dims[d].max(1);
    }
    idx
}

/// Flat index of `idx` in `dims`.
pub fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// NumPy broadcast of two shapes (panics when incompatible).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let y = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            assert!(x == y || x == 1 || y == 1, "incompatible {a:?} {b:?}");
            x.max(y)
        })
        .collect()
}

/// The element of `x` (shape `dims`) that broadcasts to output index `out_idx`.
pub fn at_broadcast(x: &[f64], dims: &[usize], out_idx: &[usize]) -> f64 {
    let off = out_idx.len() - dims.len();
    let idx: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { out_idx[i + off] }).collect();
    x[ravel(&idx, dims)]
}

/// Broadcasting binary op.
pub fn binary(a: &[f64], ad: &[usize], b: &[f64], bd: &[usize], f: impl Fn(f64, f64) -> f64) -> (Vec<f64>, Vec<usize>) {
    let out = broadcast_shape(ad, bd);
    let n: usize = out.iter().product();
    let v = (0..n)
        .map(|i| {
            let idx = unravel(i, &out);
            f(at_broadcast(a, ad, &idx), at_broadcast(b, bd, &idx))
        })
        .collect();
    (v, out)
}

/// Batched matmul with broadcast batch dims and transpose flags.
pub fn matmul(a: &[f64], ad: &[usize], b: &[f64], bd: &[usize], ta: bool, tb: bool) -> (Vec<f64>, Vec<usize>) {
    let (ra, rb) = (ad.len(), bd.len());
    let (m, k) = if ta { (ad[ra - 1], ad[ra - 2]) } else { (ad[ra - 2], ad[ra - 1]) };
    let n = if tb { bd[rb - 2] } else { bd[rb - 1] };
    let batch = broadcast_shape(&ad[..ra - 2], &bd[..rb - 2]);
    let nb: usize = batch.iter().product();
    let mut out = Vec::with_capacity(nb * m * n);
    for bi in 0..nb {
        let bidx = unravel(bi, &batch);
        // offset of the matrix of this batch entry in an operand (size-1 dims broadcast)
        let base = |dims: &[usize], r: usize| -> usize {
            let off = bidx.len() - (r - 2);
            let mut idx: Vec<usize> = (0..r - 2).map(|d| if dims[d] == 1 { 0 } else { bidx[d + off] }).collect();
            idx.extend([0, 0]);
            ravel(&idx, dims)
        };
        let (oa, ob) = (base(ad, ra), base(bd, rb));
        // element (i, j) of the stored matrix is at i * cols + j
        let (ca, cb) = (ad[ra - 1], bd[rb - 1]);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let x = if ta { a[oa + p * ca + i] } else { a[oa + i * ca + p] };
                    let y = if tb { b[ob + j * cb + p] } else { b[ob + p * cb + j] };
                    s += x * y;
                }
                out.push(s);
            }
        }
    }
    let mut od = batch;
    od.extend([m, n]);
    (out, od)
}

/// Splits dims around `dim` into (outer, size, inner).
pub fn split(dims: &[usize], dim: usize) -> (usize, usize, usize) {
    (dims[..dim].iter().product(), dims[dim], dims[dim + 1..].iter().product())
}

/// Reduces along `dim` (kept with size 1) with `f` over the values of each fibre.
pub fn reduce(x: &[f64], dims: &[usize], dim: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let (o, s, i) = split(dims, dim);
    let mut out = Vec::with_capacity(o * i);
    for a in 0..o {
        for c in 0..i {
            let fib: Vec<f64> = (0..s).map(|b| x[(a * s + b) * i + c]).collect();
            out.push(f(&fib));
        }
    }
    out
}

/// Applies `f` to every last-dim row of `x` (row length `d`).
pub fn rows(x: &[f64], d: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    x.chunks(d).flat_map(f).collect()
}

/// Softmax of one row.
pub fn softmax(r: &[f64]) -> Vec<f64> {
    let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = r.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Log-softmax of one row.
pub fn log_softmax(r: &[f64]) -> Vec<f64> {
    softmax(r).iter().map(|v| v.ln()).collect()
}

/// LayerNorm of one row.
pub fn layer_norm(r: &[f64], w: Option<&[f64]>, b: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let n = r.len() as f64;
    let mu = r.iter().sum::<f64>() / n;
    let var = r.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n;
    r.iter()
        .enumerate()
        .map(|(j, v)| (v - mu) / (var + eps).sqrt() * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]))
        .collect()
}

/// RMSNorm of one row.
pub fn rms_norm(r: &[f64], w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let ms = r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64;
    r.iter().enumerate().map(|(j, v)| v / (ms + eps).sqrt() * w.map_or(1.0, |w| w[j])).collect()
}

/// Permutes dims.
pub fn permute(x: &[f64], dims: &[usize], perm: &[usize]) -> Vec<f64> {
    let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    (0..x.len())
        .map(|i| {
            let oi = unravel(i, &od);
            let mut ii = vec![0; dims.len()];
            for (k, &p) in perm.iter().enumerate() {
                ii[p] = oi[k];
            }
            x[ravel(&ii, dims)]
        })
        .collect()
}

/// Rotary embedding of `x` `[rows, seq, d]` at positions `pos[seq]`, on the first `rot`
/// features, `interleaved` (GPT-J) or half-split (LLaMA).
pub fn rotary(x: &[f64], seq: usize, d: usize, pos: &[i64], rot: usize, theta: f64, interleaved: bool) -> Vec<f64> {
    let mut out = x.to_vec();
    let half = rot / 2;
    for (ri, row) in x.chunks(d).enumerate() {
        let p = pos[ri % seq] as f64;
        for i in 0..half {
            let a = p * theta.powf(-(2.0 * i as f64) / rot as f64);
            let (c, s) = (a.cos(), a.sin());
            let (j1, j2) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
            out[ri * d + j1] = row[j1] * c - row[j2] * s;
            out[ri * d + j2] = row[j2] * c + row[j1] * s;
        }
    }
    out
}

/// Per-row cross-entropy with an ignore index.
pub fn cross_entropy(logits: &[f64], v: usize, targets: &[i64], ignore: i64) -> Vec<f64> {
    logits.chunks(v).zip(targets).map(|(r, &t)| if t == ignore { 0.0 } else { -log_softmax(r)[t as usize] }).collect()
}

/// Attention `q [b,hq,tq,d]`, `k`/`v` `[b,hk,tk,d]`, keep-mask `pad[b][tk]`, causal with the
/// queries at the last positions; masked scores take `fill`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: (usize, usize, usize, usize, usize, usize),
    pad: Option<&[u8]>,
    causal: bool,
    scale: f64,
    fill: f64,
) -> Vec<f64> {
    let (tq, tk) = (dims.3, dims.4);
    let keep = |bi: usize, _h: usize, i: usize, j: usize| {
        (!causal || j as i64 <= i as i64 + tk as i64 - tq as i64) && pad.is_none_or(|p| p[bi * tk + j] != 0)
    };
    attention_with(q, k, v, dims, keep, scale, fill)
}

/// Attention with a general keep predicate `keep(batch, q_head, query, key)`; masked scores
/// take `fill`.
pub fn attention_with(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (b, hq, hk, tq, tk, d): (usize, usize, usize, usize, usize, usize),
    keep: impl Fn(usize, usize, usize, usize) -> bool,
    scale: f64,
    fill: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; b * hq * tq * d];
    let rep = hq / hk;
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / rep;
            for i in 0..tq {
                let mut s: Vec<f64> = (0..tk)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|e| q[((bi * hq + h) * tq + i) * d + e] * k[((bi * hk + kh) * tk + j) * d + e])
                            .sum();
                        if keep(bi, h, i, j) {
                            dot * scale
                        } else {
                            fill
                        }
                    })
                    .collect();
                s = softmax(&s);
                for e in 0..d {
                    out[((bi * hq + h) * tq + i) * d + e] =
                        (0..tk).map(|j| s[j] * v[((bi * hk + kh) * tk + j) * d + e]).sum();
                }
            }
        }
    }
    out
}

/// The error function: the Maclaurin series for `|x| < 3`, the continued fraction of
/// erfc beyond (absolute error below 1e-13).
pub fn erf(x: f64) -> f64 {
    if x.abs() < 3.0 {
        let mut sum = x;
        let mut term = x;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs().max(1e-300) {
            n += 1.0;
            term *= -x * x / n;
            sum += term / (2.0 * n + 1.0);
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        // erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...))))
        let a = x.abs();
        let mut k = a;
        for n in (1..=80).rev() {
            k = a + (n as f64 / 2.0) / k;
        }
        x.signum() * (1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * k))
    }
}

/// GELU, exact erf form.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}

/// GELU, tanh approximation.
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// SiLU (swish).
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}
