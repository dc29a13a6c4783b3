//! CPU LayerNorm and RMSNorm over the last dim and their input gradients, rows in parallel,
//! statistics in f64.

use super::half_rows::{by_blocks, HalfIn};
use super::real::Real;
use super::strided::{filled, run_rows};
use super::{floats, Floats, Store};
use redco_core::{Error, HostData, Result, Shape};

fn norm_t<T: Real>(x: &[T], d: usize, w: Option<&[T]>, b: Option<&[T]>, eps: f64, center: bool) -> Vec<T> {
    let n = x.len();
    if n == 0 || d == 0 {
        return vec![T::zero(); n];
    }
    filled(n, |o| {
        run_rows(
            o,
            d,
            n,
            #[inline(always)]
            |r, out| {
                let row = &x[r * d..(r + 1) * d];
                let mean = if center { T::moments(row, 0.0).0 / d as f64 } else { 0.0 };
                let var = T::moments(row, mean).1 / d as f64;
                let rstd = T::of(1.0 / (var + eps).sqrt());
                let mean = T::of(mean);
                let it = out.iter_mut().zip(row);
                match (w, b) {
                    (Some(w), Some(b)) => it.zip(w.iter().zip(b)).for_each(|((o, &v), (&w, &b))| {
                        o.write((v - mean) * rstd * w + b);
                    }),
                    (Some(w), None) => it.zip(w).for_each(|((o, &v), &w)| {
                        o.write((v - mean) * rstd * w);
                    }),
                    (None, Some(b)) => it.zip(b).for_each(|((o, &v), &b)| {
                        o.write((v - mean) * rstd + b);
                    }),
                    (None, None) => it.for_each(|(o, &v)| {
                        o.write((v - mean) * rstd);
                    }),
                }
            },
        )
    })
}

/// True when every given weight or bias computes in f32 (as a 16-bit input does; others
/// are the dtype error of the general path).
fn f32_params(ps: &[Option<&HostData>]) -> bool {
    ps.iter().flatten().all(|p| p.dtype().compute_type() == redco_core::DType::F32)
}

/// LayerNorm (`center`) or RMSNorm over the last dim of `x`.
pub(crate) fn norm(
    x: &HostData,
    shape: &Shape,
    w: Option<&HostData>,
    b: Option<&HostData>,
    eps: f64,
    center: bool,
) -> Result<HostData> {
    let d = *shape.dims().last().unwrap_or(&1);
    let dt = x.dtype();
    for (what, t) in [("weight", w), ("bias", b)] {
        if let Some(t) = t.filter(|t| t.len() != d) {
            return Err(Error::invalid("norm", format!("{what} of {} elements for rows of {d}", t.len())));
        }
    }
    if let Some(xh) = HalfIn::of(x, d).filter(|_| f32_params(&[w, b])) {
        // a row's worth each, widened once per call
        let (w, b) = (w.map(HostData::to_f32_vec), b.map(HostData::to_f32_vec));
        let (w, b) = (w.as_deref(), b.as_deref());
        let rows = x.len().checked_div(d).unwrap_or(0);
        return by_blocks("norm", [xh], rows, d, |_, [xs]| norm_t(xs, d, w, b, eps, center));
    }
    let (fw, fb) = (w.map(floats), b.map(floats));
    Ok(match floats(x) {
        Floats::F32(v) => {
            let w = match &fw {
                Some(Floats::F32(w)) => Some(&w[..]),
                None => None,
                _ => return Err(Error::invalid("norm", "weight dtype differs")),
            };
            let b = match &fb {
                Some(Floats::F32(b)) => Some(&b[..]),
                None => None,
                _ => return Err(Error::invalid("norm", "bias dtype differs")),
            };
            f32::store(norm_t(&v, d, w, b, eps, center), dt)
        }
        Floats::F64(v) => {
            let w = match &fw {
                Some(Floats::F64(w)) => Some(&w[..]),
                None => None,
                _ => return Err(Error::invalid("norm", "weight dtype differs")),
            };
            let b = match &fb {
                Some(Floats::F64(b)) => Some(&b[..]),
                None => None,
                _ => return Err(Error::invalid("norm", "bias dtype differs")),
            };
            f64::store(norm_t(&v, d, w, b, eps, center), dt)
        }
    })
}

/// The input gradient of LayerNorm (`center`) or RMSNorm for the output gradient `g`, row
/// by row in f64: `rstd (gx - mean(gx) [LayerNorm only] - xhat mean(gx xhat))`.
fn norm_grad_t<T: Real>(x: &[T], g: &[T], d: usize, w: Option<&[T]>, eps: f64, center: bool) -> Vec<T> {
    let n = x.len();
    if n == 0 || d == 0 {
        return vec![T::zero(); n];
    }
    filled(n, |o| {
        run_rows(
            o,
            d,
            n,
            #[inline(always)]
            |r, out| {
                let (row, gr) = (&x[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
                let mean = if center { T::moments(row, 0.0).0 / d as f64 } else { 0.0 };
                let rstd = 1.0 / (T::moments(row, mean).1 / d as f64 + eps).sqrt();
                let gx = |j: usize| w.map_or(gr[j].to64(), |w| gr[j].to64() * w[j].to64());
                let (mut s1, mut s2) = (0.0, 0.0);
                for (j, &v) in row.iter().enumerate() {
                    let gj = gx(j);
                    s1 += gj;
                    s2 += gj * (v.to64() - mean) * rstd;
                }
                let (m1, m2) = (if center { s1 / d as f64 } else { 0.0 }, s2 / d as f64);
                for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
                    o.write(T::of(rstd * (gx(j) - m1 - (v.to64() - mean) * rstd * m2)));
                }
            },
        )
    })
}

/// The input gradient of LayerNorm (`center`) or RMSNorm over the last dim of `x` for the
/// output gradient `g` (`Backend::norm_backward`).
pub(crate) fn norm_grad(
    x: &HostData,
    shape: &Shape,
    w: Option<&HostData>,
    g: &HostData,
    eps: f64,
    center: bool,
) -> Result<HostData> {
    let d = *shape.dims().last().unwrap_or(&1);
    let dt = x.dtype();
    if g.len() != x.len() || g.dtype() != dt {
        return Err(Error::invalid("norm_backward", format!("a gradient of {} elements for {}", g.len(), x.len())));
    }
    if let Some(w) = w.filter(|w| w.len() != d) {
        return Err(Error::invalid("norm_backward", format!("weight of {} elements for rows of {d}", w.len())));
    }
    if let (Some(xh), Some(gh), true) = (HalfIn::of(x, d), HalfIn::of(g, d), f32_params(&[w])) {
        let w = w.map(HostData::to_f32_vec);
        let w = w.as_deref();
        let rows = x.len().checked_div(d).unwrap_or(0);
        return by_blocks("norm_backward", [xh, gh], rows, d, |_, [xs, gs]| norm_grad_t(xs, gs, d, w, eps, center));
    }
    let fw = w.map(floats);
    Ok(match (floats(x), floats(g)) {
        (Floats::F32(v), Floats::F32(gv)) => {
            let w = match &fw {
                Some(Floats::F32(w)) => Some(&w[..]),
                None => None,
                _ => return Err(Error::invalid("norm_backward", "weight dtype differs")),
            };
            f32::store(norm_grad_t(&v, &gv, d, w, eps, center), dt)
        }
        (Floats::F64(v), Floats::F64(gv)) => {
            let w = match &fw {
                Some(Floats::F64(w)) => Some(&w[..]),
                None => None,
                _ => return Err(Error::invalid("norm_backward", "weight dtype differs")),
            };
            f64::store(norm_grad_t(&v, &gv, d, w, eps, center), dt)
        }
        _ => return Err(Error::invalid("norm_backward", "gradient dtype differs")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_or_bias_of_the_wrong_length_is_an_error() {
        let x = HostData::F32(vec![1.0; 6]);
        let shape = Shape::new([2, 3]);
        let short = HostData::F32(vec![1.0; 2]);
        let ok = HostData::F32(vec![1.0; 3]);
        assert!(norm(&x, &shape, Some(&short), None, 1e-5, false).is_err());
        assert!(norm(&x, &shape, Some(&ok), Some(&short), 1e-5, true).is_err());
        assert!(norm(&x, &shape, Some(&ok), Some(&ok), 1e-5, true).is_ok());
    }
}
