//! CPU LayerNorm and RMSNorm over the last dim, rows in parallel, statistics in f64.

use super::real::Real;
use super::strided::run_rows;
use super::{floats, Floats, Store};
use crate::{Error, HostData, Result, Shape};

fn norm_t<T: Real>(x: &[T], d: usize, w: Option<&[T]>, b: Option<&[T]>, eps: f64, center: bool) -> Vec<T> {
    let n = x.len();
    let mut o = vec![T::zero(); n];
    if n == 0 || d == 0 {
        return o;
    }
    run_rows(&mut o, d, n, |r, out| {
        let row = &x[r * d..(r + 1) * d];
        let mean = if center { row.iter().map(|v| v.to64()).sum::<f64>() / d as f64 } else { 0.0 };
        let var = row.iter().map(|v| (v.to64() - mean).powi(2)).sum::<f64>() / d as f64;
        let rstd = T::of(1.0 / (var + eps).sqrt());
        let mean = T::of(mean);
        for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
            let mut y = (v - mean) * rstd;
            if let Some(w) = w {
                y = y * w[j];
            }
            if let Some(b) = b {
                y = y + b[j];
            }
            *o = y;
        }
    });
    o
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
