//! CPU elementwise kernels: fill, unary maps, broadcasting binary ops, comparisons, where.

use super::float_kernel;
use super::real::Real;
use super::strided::{broadcast2, broadcast3, map1};
use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::{DType, HostData, Result, Shape};

/// `n` copies of `value` in `dtype`.
pub(crate) fn full(n: usize, value: f64, dtype: DType) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(vec![value as f32; n]),
        DType::F64 => HostData::F64(vec![value; n]),
        DType::F16 => HostData::F16(vec![half::f16::from_f64(value); n]),
        DType::BF16 => HostData::BF16(vec![half::bf16::from_f64(value); n]),
        DType::I64 => HostData::I64(vec![value as i64; n]),
        DType::I32 => HostData::I32(vec![value as i32; n]),
        DType::U8 => HostData::U8(vec![value as u8; n]),
    }
}

fn unary_t<T: Real>(op: UnaryOp, x: &[T]) -> Vec<T> {
    let half = T::of(0.5);
    let one = T::one();
    let sqrt_2_pi = T::of((2.0 / std::f64::consts::PI).sqrt());
    let c = T::of(0.044715);
    let inv_sqrt2 = T::of(std::f64::consts::FRAC_1_SQRT_2);
    let inv_sqrt_2pi = T::of(1.0 / (2.0 * std::f64::consts::PI).sqrt());
    let sig = move |v: T| one / (one + (-v).fexp());
    match op {
        UnaryOp::Neg => map1(x, |v| -v),
        UnaryOp::Exp => map1(x, |v| v.fexp()),
        UnaryOp::Log => map1(x, |v| v.ln()),
        UnaryOp::Sqrt => map1(x, |v| v.sqrt()),
        UnaryOp::Rsqrt => map1(x, |v| one / v.sqrt()),
        UnaryOp::Recip => map1(x, |v| one / v),
        UnaryOp::Abs => map1(x, |v| v.abs()),
        UnaryOp::Tanh => map1(x, |v| v.tanh()),
        UnaryOp::Sigmoid => map1(x, sig),
        UnaryOp::Relu => map1(x, |v| if v > T::zero() { v } else { T::zero() }),
        UnaryOp::Silu => map1(x, |v| v * sig(v)),
        UnaryOp::GeluErf => map1(x, |v| half * v * (one + (v * inv_sqrt2).erf())),
        UnaryOp::GeluTanh => map1(x, |v| half * v * (one + (sqrt_2_pi * (v + c * v * v * v)).tanh())),
        UnaryOp::Erf => map1(x, |v| v.erf()),
        UnaryOp::Sin => map1(x, |v| v.sin()),
        UnaryOp::Cos => map1(x, |v| v.cos()),
        UnaryOp::Square => map1(x, |v| v * v),
        UnaryOp::Step => map1(x, |v| if v > T::zero() { one } else { T::zero() }),
        UnaryOp::SiluDeriv => map1(x, |v| {
            let s = sig(v);
            s * (one + v * (one - s))
        }),
        UnaryOp::GeluErfDeriv => {
            map1(x, |v| half * (one + (v * inv_sqrt2).erf()) + v * inv_sqrt_2pi * (-half * v * v).exp())
        }
        UnaryOp::GeluTanhDeriv => map1(x, |v| {
            let u = sqrt_2_pi * (v + c * v * v * v);
            let t = u.tanh();
            let du = sqrt_2_pi * (one + T::of(3.0) * c * v * v);
            half * (one + t) + half * v * (one - t * t) * du
        }),
        UnaryOp::Affine { mul, add } => {
            let (m, a) = (T::of(mul), T::of(add));
            map1(x, |v| v * m + a)
        }
        UnaryOp::Powf(e) => {
            let e = T::of(e);
            map1(x, |v| v.powf(e))
        }
        UnaryOp::ClampMin(c) => {
            let c = T::of(c);
            map1(x, |v| if v < c { c } else { v })
        }
    }
}

/// A unary op on a float buffer.
pub(crate) fn unary(op: UnaryOp, x: &HostData, dt: DType) -> Result<HostData> {
    if !dt.is_float() {
        return Err(crate::Error::UnsupportedDType { op: "unary", dtype: dt });
    }
    Ok(float_kernel!(dt, [x => v], unary_t(op, v)))
}

fn binary_t<T: Real>(op: BinaryOp, a: &[T], ash: &Shape, b: &[T], bsh: &Shape, out: &Shape) -> Vec<T> {
    match op {
        BinaryOp::Add => broadcast2(a, ash, b, bsh, out, |x, y| x + y),
        BinaryOp::Sub => broadcast2(a, ash, b, bsh, out, |x, y| x - y),
        BinaryOp::Mul => broadcast2(a, ash, b, bsh, out, |x, y| x * y),
        BinaryOp::Div => broadcast2(a, ash, b, bsh, out, |x, y| x / y),
        BinaryOp::Max => broadcast2(a, ash, b, bsh, out, |x, y| if x >= y { x } else { y }),
        BinaryOp::Min => broadcast2(a, ash, b, bsh, out, |x, y| if x <= y { x } else { y }),
    }
}

/// A broadcasting binary op (integers are computed through f64).
pub(crate) fn binary(
    op: BinaryOp,
    a: (&HostData, &Shape),
    b: (&HostData, &Shape),
    out: &Shape,
    dt: DType,
) -> Result<HostData> {
    Ok(float_kernel!(dt, [a.0 => x, b.0 => y], binary_t(op, x, a.1, y, b.1, out)))
}

fn compare_t<T: PartialOrd + Copy + Sync>(
    op: CmpOp,
    a: &[T],
    ash: &Shape,
    b: &[T],
    bsh: &Shape,
    out: &Shape,
) -> Vec<u8> {
    match op {
        CmpOp::Eq => broadcast2(a, ash, b, bsh, out, |x, y| (x == y) as u8),
        CmpOp::Ne => broadcast2(a, ash, b, bsh, out, |x, y| (x != y) as u8),
        CmpOp::Lt => broadcast2(a, ash, b, bsh, out, |x, y| (x < y) as u8),
        CmpOp::Le => broadcast2(a, ash, b, bsh, out, |x, y| (x <= y) as u8),
        CmpOp::Gt => broadcast2(a, ash, b, bsh, out, |x, y| (x > y) as u8),
        CmpOp::Ge => broadcast2(a, ash, b, bsh, out, |x, y| (x >= y) as u8),
    }
}

/// A broadcasting comparison into a `U8` mask.
pub(crate) fn compare(op: CmpOp, a: (&HostData, &Shape), b: (&HostData, &Shape), out: &Shape) -> Result<HostData> {
    Ok(HostData::U8(match (a.0, b.0) {
        (HostData::F32(x), HostData::F32(y)) => compare_t(op, x, a.1, y, b.1, out),
        (HostData::F64(x), HostData::F64(y)) => compare_t(op, x, a.1, y, b.1, out),
        (HostData::I64(x), HostData::I64(y)) => compare_t(op, x, a.1, y, b.1, out),
        (HostData::I32(x), HostData::I32(y)) => compare_t(op, x, a.1, y, b.1, out),
        (HostData::U8(x), HostData::U8(y)) => compare_t(op, x, a.1, y, b.1, out),
        (x, y) => compare_t(op, &x.to_f32_vec(), a.1, &y.to_f32_vec(), b.1, out),
    }))
}

/// `cond ? a : b` with broadcasting, for any element type.
pub(crate) fn where_cond(c: (&[u8], &Shape), a: (&HostData, &Shape), b: (&HostData, &Shape), out: &Shape) -> HostData {
    let bd = b.0;
    macro_rules! pick {
        ($v:ident, $var:ident) => {{
            let HostData::$var(w) = bd else { unreachable!("dtypes checked by the caller") };
            broadcast3(c.0, c.1, $v, a.1, w, b.1, out, |k, x, y| if k != 0 { x } else { y })
        }};
    }
    match a.0 {
        HostData::F32(v) => HostData::F32(pick!(v, F32)),
        HostData::F64(v) => HostData::F64(pick!(v, F64)),
        HostData::F16(v) => HostData::F16(pick!(v, F16)),
        HostData::BF16(v) => HostData::BF16(pick!(v, BF16)),
        HostData::I64(v) => HostData::I64(pick!(v, I64)),
        HostData::I32(v) => HostData::I32(pick!(v, I32)),
        HostData::U8(v) => HostData::U8(pick!(v, U8)),
    }
}
