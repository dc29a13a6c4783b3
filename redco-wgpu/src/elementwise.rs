//! Elementwise kernels: fill, unary maps, broadcasting binary ops and comparisons,
//! `where`, casts (`kernels/{fill,unary,binary,where,cast}.wgsl`).

use crate::device::{err, groups_1d};
use crate::layout::collapse;
use crate::{tpl, u32p, Dev, Wgpu, WgpuStorage};
use redco_core::backend::{BinaryOp, CmpOp, UnaryOp};
use redco_core::{DType, Result, Shape};

/// `n` copies of `value` in `dtype`.
pub(crate) fn full(w: &Wgpu, n: usize, value: f64, dtype: DType) -> Result<WgpuStorage> {
    let bits = match dtype {
        DType::F32 | DType::F64 => (value as f32).to_bits(),
        DType::F16 => half::f16::from_f64(value).to_f32().to_bits(),
        DType::BF16 => half::bf16::from_f64(value).to_f32().to_bits(),
        DType::I64 => {
            let v = value as i64;
            i32::try_from(v).map_err(|_| err(format!("full: {v} does not fit the device's 32-bit integers")))? as u32
        }
        DType::I32 => (value as i32) as u32,
        DType::U8 => (value as u8) as u32,
    };
    // allocate first: a size beyond the device's buffer limit is reported as such
    let out = w.alloc(n, dtype)?;
    // packed f16: fill the words with two copies of the value
    let (words, bits) = if w.packed(dtype) {
        let h = half::f16::from_f64(value).to_bits() as u32;
        (n.div_ceil(2), h | (h << 16))
    } else {
        (n, bits)
    };
    let n32 = u32p(words, "elements")?;
    w.launch("fill", || include_str!("kernels/fill.wgsl").into(), &[], &out, &[n32, bits], groups_1d(words))?;
    Ok(out)
}

/// The WGSL body of a unary op and its two scalar parameters.
fn unary_body(op: UnaryOp) -> (&'static str, &'static str, f64, f64) {
    match op {
        UnaryOp::Neg => ("neg", "return -v;", 0.0, 0.0),
        UnaryOp::Exp => ("exp", "return exp(v);", 0.0, 0.0),
        UnaryOp::Log => ("log", "return log(v);", 0.0, 0.0),
        UnaryOp::Sqrt => ("sqrt", "return sqrt(v);", 0.0, 0.0),
        UnaryOp::Rsqrt => ("rsqrt", "return 1.0 / sqrt(v);", 0.0, 0.0),
        UnaryOp::Recip => ("recip", "return 1.0 / v;", 0.0, 0.0),
        UnaryOp::Abs => ("abs", "return abs(v);", 0.0, 0.0),
        UnaryOp::Tanh => ("tanh", "return tanh_(v);", 0.0, 0.0),
        UnaryOp::Sigmoid => ("sigmoid", "return sig(v);", 0.0, 0.0),
        UnaryOp::Relu => ("relu", "return select(0.0, v, v > 0.0);", 0.0, 0.0),
        UnaryOp::Silu => ("silu", "return v * sig(v);", 0.0, 0.0),
        UnaryOp::GeluErf => ("gelu_erf", "return 0.5 * v * (1.0 + erf_(v * INV_SQRT2));", 0.0, 0.0),
        UnaryOp::GeluTanh => {
            ("gelu_tanh", "return 0.5 * v * (1.0 + tanh_(SQRT_2_PI * (v + GELU_C * v * v * v)));", 0.0, 0.0)
        }
        UnaryOp::Erf => ("erf", "return erf_(v);", 0.0, 0.0),
        UnaryOp::Sin => ("sin", "return sin(v);", 0.0, 0.0),
        UnaryOp::Cos => ("cos", "return cos(v);", 0.0, 0.0),
        UnaryOp::Square => ("square", "return v * v;", 0.0, 0.0),
        UnaryOp::Step => ("step", "return select(0.0, 1.0, v > 0.0);", 0.0, 0.0),
        UnaryOp::SiluDeriv => ("silu_deriv", "let s = sig(v); return s * (1.0 + v * (1.0 - s));", 0.0, 0.0),
        UnaryOp::GeluErfDeriv => (
            "gelu_erf_deriv",
            "return 0.5 * (1.0 + erf_(v * INV_SQRT2)) + v * INV_SQRT_2PI * exp(-0.5 * v * v);",
            0.0,
            0.0,
        ),
        UnaryOp::GeluTanhDeriv => (
            "gelu_tanh_deriv",
            "let t = tanh_(SQRT_2_PI * (v + GELU_C * v * v * v)); \
             let du = SQRT_2_PI * (1.0 + 3.0 * GELU_C * v * v); \
             return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du;",
            0.0,
            0.0,
        ),
        UnaryOp::Affine { mul, add } => ("affine", "return v * a + b;", mul, add),
        UnaryOp::Powf(e) => ("powf", "return powf_(v, a);", e, 0.0),
        UnaryOp::ClampMin(c) => ("clamp_min", "return select(v, a, v < a);", c, 0.0),
    }
}

/// A unary op on the first `n` elements of a float storage.
pub(crate) fn unary(w: &Wgpu, op: UnaryOp, x: &WgpuStorage, n: usize) -> Result<WgpuStorage> {
    let (name, body, a, b) = unary_body(op);
    let (store, xt) = (w.store(x.dtype), w.elem(x.dtype));
    let key = format!("unary/{name}/{xt}/{store}");
    let src = || tpl(include_str!("kernels/unary.wgsl"), &[("$OP", body), ("$STORE", store), ("$XT", xt)]);
    let params = [u32p(n, "elements")?, (a as f32).to_bits(), (b as f32).to_bits()];
    w.map_kernel(&key, src, &[x], n, x.dtype, &params)
}

/// The WGSL type binary kernels compute in for `dt` (U8 masks compute in i32 and saturate).
fn compute_ty(dt: DType) -> &'static str {
    match Dev::of(dt) {
        Dev::F32 => "f32",
        _ => "i32",
    }
}

/// Params `[n, rank, dims.., strides..]` of a broadcasting kernel over `out`, with rank 0
/// when every operand is already contiguous in `out`'s shape.
fn broadcast_params(ops: &[&Shape], out: &Shape) -> Result<Vec<u32>> {
    let n = u32p(out.elem_count(), "elements")?;
    if ops.iter().all(|s| s.dims() == out.dims()) {
        return Ok(vec![n, 0]);
    }
    let mut strides: Vec<Vec<usize>> = ops.iter().map(|s| s.broadcast_strides(out)).collect();
    let dims = collapse(out.dims(), &mut strides);
    let mut p = vec![n, dims.len() as u32];
    for d in &dims {
        p.push(u32p(*d, "dimension")?);
    }
    for s in &strides {
        for &x in s {
            p.push(u32p(x, "stride")?);
        }
    }
    Ok(p)
}

/// Broadcasting binary op.
pub(crate) fn binary(
    w: &Wgpu,
    op: BinaryOp,
    a: (&WgpuStorage, &Shape),
    b: (&WgpuStorage, &Shape),
    out: &Shape,
) -> Result<WgpuStorage> {
    let dt = a.0.dtype;
    let body = match op {
        BinaryOp::Add => "return x + z;",
        BinaryOp::Sub => "return x - z;",
        BinaryOp::Mul => "return x * z;",
        BinaryOp::Div => "return x / z;",
        BinaryOp::Max => "return max(x, z);",
        BinaryOp::Min => "return min(x, z);",
    };
    let (ty, store, et) = (compute_ty(dt), w.store(dt), w.elem_as(dt, compute_ty(dt)));
    let key = format!("binary/{op:?}/{ty}/{et}/{store}");
    let src = || {
        tpl(
            include_str!("kernels/binary.wgsl"),
            &[("$T", ty), ("$RT", ty), ("$IN", et), ("$OUT", et), ("$OP", body), ("$STORE", store)],
        )
    };
    let params = broadcast_params(&[a.1, b.1], out)?;
    w.map_kernel(&key, src, &[a.0, b.0], out.elem_count(), dt, &params)
}

/// Broadcasting comparison into a U8 mask.
pub(crate) fn compare(
    w: &Wgpu,
    op: CmpOp,
    a: (&WgpuStorage, &Shape),
    b: (&WgpuStorage, &Shape),
    out: &Shape,
) -> Result<WgpuStorage> {
    let cmp = match op {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    };
    let (ty, et) = (compute_ty(a.0.dtype), w.elem_as(a.0.dtype, compute_ty(a.0.dtype)));
    let body = format!("return select(0u, 1u, x {cmp} z);");
    let key = format!("compare/{op:?}/{ty}/{et}");
    let src = || {
        tpl(
            include_str!("kernels/binary.wgsl"),
            &[("$T", ty), ("$RT", "u32"), ("$IN", et), ("$OUT", "u32"), ("$OP", &body), ("$STORE", "")],
        )
    };
    let params = broadcast_params(&[a.1, b.1], out)?;
    w.map_kernel(&key, src, &[a.0, b.0], out.elem_count(), DType::U8, &params)
}

/// `cond ? a : b` with broadcasting (a bit copy, whatever the dtype).
pub(crate) fn where_cond(
    w: &Wgpu,
    c: (&WgpuStorage, &Shape),
    a: (&WgpuStorage, &Shape),
    b: (&WgpuStorage, &Shape),
    out: &Shape,
) -> Result<WgpuStorage> {
    let mut params = broadcast_params(&[c.1, a.1, b.1], out)?;
    if params[1] == 0 {
        // the kernel has no contiguous fast path: give it the full rank-1 description
        let n = params[0];
        params = vec![n, 1, n, 1, 1, 1];
    }
    let e = w.bits(a.0.dtype);
    let src = || tpl(include_str!("kernels/where.wgsl"), &[("$E", e)]);
    w.map_kernel(&format!("where/{e}"), src, &[c.0, a.0, b.0], out.elem_count(), a.0.dtype, &params)
}

/// Converts the first `n` elements of `x` to `dtype`.
pub(crate) fn cast(w: &Wgpu, x: &WgpuStorage, n: usize, dtype: DType) -> Result<WgpuStorage> {
    let (from, to) = (Dev::of(x.dtype), Dev::of(dtype));
    let store = w.store(dtype);
    let conv = match (from, to) {
        (Dev::F32, Dev::F32) | (Dev::I32, Dev::F32) | (Dev::U32, Dev::F32) => format!("return {store}(f32(v));"),
        (Dev::F32, Dev::I32) => "return select(i32(clamp(v, -2147483648.0, 2147483520.0)), 0, v != v);".to_string(),
        (Dev::F32, Dev::U32) => "return select(u32(clamp(v, 0.0, 255.0)), 0u, v != v);".to_string(),
        (Dev::I32, Dev::U32) => "return u32(clamp(v, 0, 255));".to_string(),
        (Dev::U32, Dev::I32) => "return i32(v);".to_string(),
        (Dev::I32, Dev::I32) | (Dev::U32, Dev::U32) => "return v;".to_string(),
    };
    let (xt, yt) = (w.elem(x.dtype), w.elem(dtype));
    let key = format!("cast/{from:?}/{to:?}/{xt}/{yt}/{store}");
    let src =
        || tpl(include_str!("kernels/cast.wgsl"), &[("$CT", from.wgsl()), ("$IN", xt), ("$OUT", yt), ("$CONV", &conv)]);
    let mut out = w.map_kernel(&key, src, &[x], n, dtype, &[u32p(n, "elements")?])?;
    if from == Dev::I32 && to == Dev::I32 && n == x.len {
        out.host_ids = x.host_ids.clone();
    }
    Ok(out)
}
