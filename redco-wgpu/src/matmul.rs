//! Batched matmul with transpose flags (`kernels/matmul.wgsl`): each invocation computes a
//! 4x4 block of C, each workgroup a 32x32 tile, one workgroup layer per batch entry.

use crate::device::err;
use crate::{store_fn, tpl, u32p, Wgpu, WgpuStorage};
use redco_core::backend::MatmulSpec;
use redco_core::{DType, Error, Result};

/// Rows (and columns) of C computed by one workgroup.
const TILE: usize = 32;

/// `C[b] = op(A[b]) * op(B[b])`.
pub(crate) fn matmul(w: &Wgpu, a: &WgpuStorage, b: &WgpuStorage, spec: &MatmulSpec, dt: DType) -> Result<WgpuStorage> {
    let MatmulSpec { batch, m, n, k, trans_a, trans_b, a_batched, b_batched } = *spec;
    let need_a = if a_batched { batch } else { 1 } * m * k;
    let need_b = if b_batched { batch } else { 1 } * k * n;
    if a.len < need_a || b.len < need_b {
        return Err(Error::invalid(
            "matmul",
            format!("operands of {} and {} elements are too small for {spec:?}", a.len, b.len),
        ));
    }
    let out = w.alloc(batch * m * n, dt)?;
    if batch * m * n == 0 {
        return Ok(out);
    }
    if k == 0 {
        return crate::elementwise::full(w, batch * m * n, 0.0, dt);
    }
    if let Some(lp) = vec4_loop(trans_a, trans_b, m, n, k) {
        let store = store_fn(dt);
        let key = format!("matmul_vec4/{trans_a}/{trans_b}/{store}");
        let src = || tpl(include_str!("kernels/matmul_vec4.wgsl"), &[("$LOOP", lp), ("$STORE", store)]);
        return launch(w, a, b, out, spec, &key, src);
    }
    let aidx = if trans_a { "q * m + i" } else { "i * k + q" };
    let bidx = if trans_b { "j * k + q" } else { "q * n + j" };
    let store = store_fn(dt);
    let key = format!("matmul/{trans_a}/{trans_b}/{store}");
    let src = || tpl(include_str!("kernels/matmul.wgsl"), &[("$AIDX", aidx), ("$BIDX", bidx), ("$STORE", store)]);
    launch(w, a, b, out, spec, &key, src)
}

fn launch(
    w: &Wgpu,
    a: &WgpuStorage,
    b: &WgpuStorage,
    out: WgpuStorage,
    spec: &MatmulSpec,
    key: &str,
    src: impl FnOnce() -> String,
) -> Result<WgpuStorage> {
    let MatmulSpec { batch, m, n, k, a_batched, b_batched, .. } = *spec;
    let max = w.ctx.limits.max_compute_workgroups_per_dimension as usize;
    if batch > max {
        return Err(err(format!("matmul: a batch of {batch} exceeds the device's {max} workgroups per dimension")));
    }
    let params = [
        u32p(m, "m")?,
        u32p(n, "n")?,
        u32p(k, "k")?,
        u32p(if a_batched { m * k } else { 0 }, "a batch stride")?,
        u32p(if b_batched { k * n } else { 0 }, "b batch stride")?,
    ];
    let groups = (n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, batch as u32);
    // trusted: every read is clamped into the operands (whose lengths were checked above)
    // and every write is guarded
    w.launch_with(key, true, src, &[a, b], &out, &params, groups)?;
    Ok(out)
}

/// The k loop of the vec4 kernel for a layout, when the stored rows it loads as vec4 are
/// multiples of 4 floats (else the scalar kernel runs).
fn vec4_loop(trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize) -> Option<&'static str> {
    match (trans_a, trans_b) {
        // A rows and B rows as vec4 along k and n: 4 k-steps per iteration
        (false, false) if k.is_multiple_of(4) && n.is_multiple_of(4) => Some(
            "let k4 = k / 4u; let n4 = n / 4u; let c4 = col0 / 4u;
    for (var q = 0u; q < k4; q = q + 1u) {
        let b0 = b[bb + (4u * q) * n4 + c4];
        let b1 = b[bb + (4u * q + 1u) * n4 + c4];
        let b2 = b[bb + (4u * q + 2u) * n4 + c4];
        let b3 = b[bb + (4u * q + 3u) * n4 + c4];
        let a0 = a[ab + r.x * k4 + q];
        let a1 = a[ab + r.y * k4 + q];
        let a2 = a[ab + r.z * k4 + q];
        let a3 = a[ab + r.w * k4 + q];
        acc0 = acc0 + a0.x * b0 + a0.y * b1 + a0.z * b2 + a0.w * b3;
        acc1 = acc1 + a1.x * b0 + a1.y * b1 + a1.z * b2 + a1.w * b3;
        acc2 = acc2 + a2.x * b0 + a2.y * b1 + a2.z * b2 + a2.w * b3;
        acc3 = acc3 + a3.x * b0 + a3.y * b1 + a3.z * b2 + a3.w * b3;
    }",
        ),
        // A rows and B^T rows both along k: dot products of vec4s
        (false, true) if k.is_multiple_of(4) => Some(
            "let k4 = k / 4u;
    for (var q = 0u; q < k4; q = q + 1u) {
        let b0 = b[bb + s.x * k4 + q];
        let b1 = b[bb + s.y * k4 + q];
        let b2 = b[bb + s.z * k4 + q];
        let b3 = b[bb + s.w * k4 + q];
        let a0 = a[ab + r.x * k4 + q];
        let a1 = a[ab + r.y * k4 + q];
        let a2 = a[ab + r.z * k4 + q];
        let a3 = a[ab + r.w * k4 + q];
        acc0 = acc0 + vec4<f32>(dot(a0, b0), dot(a0, b1), dot(a0, b2), dot(a0, b3));
        acc1 = acc1 + vec4<f32>(dot(a1, b0), dot(a1, b1), dot(a1, b2), dot(a1, b3));
        acc2 = acc2 + vec4<f32>(dot(a2, b0), dot(a2, b1), dot(a2, b2), dot(a2, b3));
        acc3 = acc3 + vec4<f32>(dot(a3, b0), dot(a3, b1), dot(a3, b2), dot(a3, b3));
    }",
        ),
        // A^T rows along m and B rows along n: outer products
        (true, false) if m.is_multiple_of(4) && n.is_multiple_of(4) => Some(
            "let m4 = m / 4u; let n4 = n / 4u; let c4 = col0 / 4u; let r4 = row0 / 4u;
    for (var q = 0u; q < k; q = q + 1u) {
        let av = a[ab + q * m4 + r4];
        let bv = b[bb + q * n4 + c4];
        acc0 = acc0 + av.x * bv;
        acc1 = acc1 + av.y * bv;
        acc2 = acc2 + av.z * bv;
        acc3 = acc3 + av.w * bv;
    }",
        ),
        _ => None,
    }
}
