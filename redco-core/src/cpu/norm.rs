//! CPU LayerNorm and RMSNorm over the last dim, rows in parallel, statistics in f64.

use super::real::Real;
use super::strided::{filled, run_rows};
use super::{floats, Floats, Store};
use crate::{Error, HostData, Result, Shape};

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
