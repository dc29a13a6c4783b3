//! CPU elementwise kernels: fill, unary maps, broadcasting binary ops, comparisons, where.
//!
//! bf16 and f16 maps and binary ops compute in f32 one element at a time inside their single
//! pass (read 16-bit, compute, write 16-bit), rather than widening whole inputs to f32
//! copies and narrowing a whole f32 result afterwards.

use super::float_kernel;
use super::real::Real;
use super::strided::{broadcast2, broadcast3, map1};
use half::f16;
use redco_core::backend::{BinaryOp, CmpOp, UnaryOp};
use redco_core::dtype::{bf16_to_f32, f32_to_bf16};
use redco_core::{DType, HostData, Result, Shape};

/// `n` copies of `value` in `dtype`, written (zeros too) in parallel chunks.
///
/// Zeros are written rather than left to `calloc`: a calloc'd buffer of fresh pages maps
/// the shared zero page, and the first write after a read (an accumulator, AdamW's moments
/// in the first step) then takes a copy-on-write fault per page, each flushing the TLB of
/// every core the process runs on. Measured with `perf` on the bench LLaMA (2 threads, 6
/// training steps), those faults' inter-processor interrupts were 11% of the samples.
pub(crate) fn full(n: usize, value: f64, dtype: DType) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(filled_with(n, value as f32)),
        DType::F64 => HostData::F64(filled_with(n, value)),
        DType::F16 => HostData::F16(filled_with(n, half::f16::from_f64(value))),
        DType::BF16 => HostData::BF16(filled_with(n, half::bf16::from_f64(value))),
        DType::I64 => HostData::I64(filled_with(n, value as i64)),
        DType::I32 => HostData::I32(filled_with(n, value as i32)),
        DType::U8 => HostData::U8(filled_with(n, value as u8)),
    }
}

/// `n` copies of `v`, written in parallel chunks for large `n`.
fn filled_with<T: Copy + Send + Sync>(n: usize, v: T) -> Vec<T> {
    use rayon::prelude::*;
    use std::mem::MaybeUninit;
    super::strided::filled(n, |o: &mut [MaybeUninit<T>]| {
        if n >= super::strided::PAR_MIN {
            o.par_chunks_mut(super::strided::PAR_MIN).for_each(|c| c.fill(MaybeUninit::new(v)));
        } else {
            o.fill(MaybeUninit::new(v));
        }
    })
}

/// Pins a closure's type to `T -> T` (for the maps' macro).
fn unary_fn<T, F: Fn(T) -> T + Sync>(f: F) -> F {
    f
}

/// `op` over `x`, each element read through `load` into the compute type `T` and written
/// through `store` (identities for f32 and f64; the 16-bit conversions otherwise).
fn unary_t<T: Real, S, O>(op: UnaryOp, x: &[S], load: impl Fn(S) -> T + Sync, store: impl Fn(T) -> O + Sync) -> Vec<O>
where
    S: Copy + Sync,
    O: Copy + Send + Default,
{
    let half = T::of(0.5);
    let one = T::one();
    let sqrt_2_pi = T::of((2.0 / std::f64::consts::PI).sqrt());
    let c = T::of(0.044715);
    let inv_sqrt2 = T::of(std::f64::consts::FRAC_1_SQRT_2);
    let inv_sqrt_2pi = T::of(1.0 / (2.0 * std::f64::consts::PI).sqrt());
    let sig = move |v: T| one / (one + (-v).fexp());
    // one pass: load, compute in T, store (a macro, so each op's closure is inlined)
    macro_rules! m {
        ($f:expr) => {{
            let f = unary_fn::<T, _>($f);
            map1(x, |v| store(f(load(v))))
        }};
    }
    match op {
        UnaryOp::Neg => m!(|v| -v),
        UnaryOp::Exp => m!(|v| v.fexp()),
        UnaryOp::Log => m!(|v| v.ln()),
        UnaryOp::Sqrt => m!(|v| v.sqrt()),
        UnaryOp::Rsqrt => m!(|v| one / v.sqrt()),
        UnaryOp::Recip => m!(|v| one / v),
        UnaryOp::Abs => m!(|v| v.abs()),
        UnaryOp::Tanh => m!(|v| v.tanh()),
        UnaryOp::Sigmoid => m!(sig),
        UnaryOp::Relu => m!(|v| if v > T::zero() { v } else { T::zero() }),
        UnaryOp::Silu => m!(|v| v * sig(v)),
        UnaryOp::GeluErf => m!(|v| half * v * (one + (v * inv_sqrt2).erf())),
        UnaryOp::GeluTanh => m!(|v| half * v * (one + (sqrt_2_pi * (v + c * v * v * v)).tanh())),
        UnaryOp::Erf => m!(|v| v.erf()),
        UnaryOp::Sin => m!(|v| v.sin()),
        UnaryOp::Cos => m!(|v| v.cos()),
        UnaryOp::Square => m!(|v| v * v),
        UnaryOp::Step => m!(|v| if v > T::zero() { one } else { T::zero() }),
        UnaryOp::SiluDeriv => m!(|v| {
            let s = sig(v);
            s * (one + v * (one - s))
        }),
        UnaryOp::GeluErfDeriv => {
            m!(|v| half * (one + (v * inv_sqrt2).erf()) + v * inv_sqrt_2pi * (-half * v * v).exp())
        }
        UnaryOp::GeluTanhDeriv => m!(|v| {
            let u = sqrt_2_pi * (v + c * v * v * v);
            let t = u.tanh();
            let du = sqrt_2_pi * (one + T::of(3.0) * c * v * v);
            half * (one + t) + half * v * (one - t * t) * du
        }),
        UnaryOp::Affine { mul, add } => {
            let (m, a) = (T::of(mul), T::of(add));
            m!(|v| v * m + a)
        }
        UnaryOp::Powf(e) => {
            let e = T::of(e);
            m!(|v| v.powf(e))
        }
        UnaryOp::ClampMin(c) => {
            let c = T::of(c);
            m!(|v| if v < c { c } else { v })
        }
    }
}

/// A unary op on a float buffer.
pub(crate) fn unary(op: UnaryOp, x: &HostData, dt: DType) -> Result<HostData> {
    if !dt.is_float() {
        return Err(redco_core::Error::UnsupportedDType { op: "unary", dtype: dt });
    }
    Ok(match x {
        HostData::BF16(v) if dt == DType::BF16 => HostData::BF16(unary_t(op, v, bf16_to_f32, f32_to_bf16)),
        HostData::F16(v) if dt == DType::F16 => HostData::F16(unary_t(op, v, f16::to_f32, f16::from_f32)),
        _ => float_kernel!(dt, [x => v], unary_t(op, v, |v| v, |v| v)),
    })
}

/// `op` over `a` and `b` broadcast to `out`, elements read through `load` into the compute
/// type `T` and written through `store` (as in [`unary_t`]).
#[allow(clippy::too_many_arguments)]
fn binary_t<T: Real, S, O>(
    op: BinaryOp,
    a: &[S],
    ash: &Shape,
    b: &[S],
    bsh: &Shape,
    out: &Shape,
    load: impl Fn(S) -> T + Sync + Copy,
    store: impl Fn(T) -> O + Sync,
) -> Vec<O>
where
    S: Copy + Sync,
    O: Copy + Send + Sync + Default,
{
    // one pass: load both, compute in T, store (a macro, so each op's closure is inlined)
    macro_rules! z {
        ($f:expr) => {{
            let f = $f;
            broadcast2(a, ash, b, bsh, out, |x, y| store(f(load(x), load(y))))
        }};
    }
    match op {
        BinaryOp::Add => z!(|x: T, y: T| x + y),
        BinaryOp::Sub => z!(|x: T, y: T| x - y),
        BinaryOp::Mul => z!(|x: T, y: T| x * y),
        BinaryOp::Div => z!(|x: T, y: T| x / y),
        BinaryOp::Max => z!(|x: T, y: T| if x >= y { x } else { y }),
        BinaryOp::Min => z!(|x: T, y: T| if x <= y { x } else { y }),
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
    Ok(match (a.0, b.0) {
        (HostData::BF16(x), HostData::BF16(y)) if dt == DType::BF16 => {
            HostData::BF16(binary_t(op, x, a.1, y, b.1, out, bf16_to_f32, f32_to_bf16))
        }
        (HostData::F16(x), HostData::F16(y)) if dt == DType::F16 => {
            HostData::F16(binary_t(op, x, a.1, y, b.1, out, f16::to_f32, f16::from_f32))
        }
        _ => float_kernel!(dt, [a.0 => x, b.0 => y], binary_t(op, x, a.1, y, b.1, out, |v| v, |v| v)),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-bit maps and binary ops (one pass, converting per element) give exactly what
    /// widening the inputs to f32, computing in f32 and narrowing the result gives, for
    /// every op, with NaNs, infinities and broadcasting.
    #[test]
    fn sixteen_bit_ops_equal_the_widened_f32_ops() {
        let vals: Vec<f32> = (0..2000)
            .map(|i| ((i * 7919) % 2000) as f32 / 250.0 - 4.0)
            .chain([f32::NAN, f32::INFINITY, -0.0, 1e-8])
            .collect();
        let n = vals.len();
        let unaries = [
            UnaryOp::Neg,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Rsqrt,
            UnaryOp::Recip,
            UnaryOp::Abs,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Silu,
            UnaryOp::GeluErf,
            UnaryOp::GeluTanh,
            UnaryOp::Erf,
            UnaryOp::Sin,
            UnaryOp::Cos,
            UnaryOp::Square,
            UnaryOp::Step,
            UnaryOp::SiluDeriv,
            UnaryOp::GeluErfDeriv,
            UnaryOp::GeluTanhDeriv,
            UnaryOp::Affine { mul: 1.5, add: -0.25 },
            UnaryOp::Powf(1.7),
            UnaryOp::ClampMin(0.3),
        ];
        // the bits, every NaN as one (a NaN's sign depends on the instruction order)
        let bits = |h: &HostData| -> Vec<u32> {
            h.to_f32_vec().iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect()
        };
        for dt in [DType::BF16, DType::F16] {
            let x = HostData::from_f32(vals.clone(), dt);
            let wide = HostData::F32(x.to_f32_vec());
            for op in unaries {
                let got = unary(op, &x, dt).unwrap();
                let want = HostData::from_f32(unary(op, &wide, DType::F32).unwrap().to_f32_vec(), dt);
                assert!(bits(&got) == bits(&want), "{dt:?} {op:?}");
            }
            // same shapes, a row broadcast against a matrix, a column against a row
            let cols = 4;
            let rows = n / cols;
            let cases = [
                (Shape::from([n]), Shape::from([n]), Shape::from([n])),
                (Shape::from([rows, cols]), Shape::from([1, cols]), Shape::from([rows, cols])),
                (Shape::from([rows, 1]), Shape::from([1, cols]), Shape::from([rows, cols])),
            ];
            for (ash, bsh, out) in cases {
                let a = HostData::from_f32(vals[..ash.elem_count()].to_vec(), dt);
                let b = HostData::from_f32(vals.iter().rev().take(bsh.elem_count()).copied().collect(), dt);
                let (aw, bw) = (HostData::F32(a.to_f32_vec()), HostData::F32(b.to_f32_vec()));
                for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min] {
                    let got = binary(op, (&a, &ash), (&b, &bsh), &out, dt).unwrap();
                    let want = binary(op, (&aw, &ash), (&bw, &bsh), &out, DType::F32).unwrap().to_f32_vec();
                    let want = HostData::from_f32(want, dt);
                    assert!(bits(&got) == bits(&want), "{dt:?} {op:?} {ash:?} {bsh:?}");
                }
            }
        }
    }
}
