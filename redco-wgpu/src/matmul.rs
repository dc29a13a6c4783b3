//! Batched matmul with transpose flags.
//!
//! Aligned shapes (rows of 4 floats along every dimension the kernel loads as `vec4`) run a
//! register-tiled kernel generated per layout and tile ([`tiled_source`]): each invocation
//! accumulates a block of `rows x 4*quads` outputs over k in steps of 4, a workgroup of
//! `lanes` invocations covers `rows` rows (the same for all its lanes) and
//! `lanes * 4 * quads` contiguous columns. Other shapes run `kernels/matmul.wgsl` (a 4x4
//! block per invocation with scalar loads).
//!
//! The tile depends on the device: on a CPU adapter (lavapipe / llvmpipe runs an invocation
//! per SIMD lane and turns every non-constant buffer load into a loop over the lanes) large
//! blocks of 32 rows x 16 columns per invocation in workgroups of 8 amortise those loads over
//! 128 FMAs each; on a GPU, blocks of 4x4 in workgroups of 64 keep registers free and the
//! loads of a workgroup coalesced.

use crate::device::err;
use crate::{tpl, u32p, Wgpu, WgpuStorage};
use redco_core::backend::MatmulSpec;
use redco_core::{DType, Error, Result};

/// Rows (and columns) of C computed by one workgroup of the scalar fallback kernel.
const TILE: usize = 32;

/// The register tiling of the aligned kernel: at most `rows` rows of C per workgroup and
/// `quads` column quads per invocation, `lanes` invocations per workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tiling {
    rows: usize,
    quads: usize,
    lanes: usize,
}

impl Tiling {
    /// For CPU adapters (lavapipe, llvmpipe): at 1024^3 on 2 cores, 4x the GFLOP/s of 4x4
    /// blocks in workgroups of 8x8 (18 against 4.4 on a busy machine, 36 when idle).
    pub(crate) const CPU: Tiling = Tiling { rows: 32, quads: 4, lanes: 8 };
    /// For GPUs.
    pub(crate) const GPU: Tiling = Tiling { rows: 4, quads: 1, lanes: 64 };

    /// The tiling for `w`'s adapter.
    fn of(w: &Wgpu) -> Tiling {
        if w.ctx.info.device_type == wgpu::DeviceType::Cpu {
            Tiling::CPU
        } else {
            Tiling::GPU
        }
    }

    /// This tiling narrowed to a problem of `m` rows and `n` columns, so that small
    /// problems do not compute (clamped, discarded) rows and columns far beyond their edge:
    /// the rows, a power of two, at least `m` unless capped (at least 4 when A is
    /// transposed, whose rows are loaded as vec4); the quads, a power of two, as few as
    /// cover `n` with the lanes.
    fn fit(self, m: usize, n: usize, trans_a: bool) -> Tiling {
        let min_rows = if trans_a { 4 } else { 1 };
        let rows = m.next_power_of_two().clamp(min_rows, self.rows.max(min_rows));
        let quads = (n / 4).div_ceil(self.lanes).next_power_of_two().clamp(1, self.quads);
        Tiling { rows, quads, lanes: self.lanes }
    }
}

/// `C[b] = op(A[b]) * op(B[b])`.
pub(crate) fn matmul(w: &Wgpu, a: &WgpuStorage, b: &WgpuStorage, spec: &MatmulSpec, dt: DType) -> Result<WgpuStorage> {
    matmul_tiled(w, a, b, spec, dt, Tiling::of(w))
}

/// [`matmul`] with the aligned kernel's tiling given.
pub(crate) fn matmul_tiled(
    w: &Wgpu,
    a: &WgpuStorage,
    b: &WgpuStorage,
    spec: &MatmulSpec,
    dt: DType,
    tiling: Tiling,
) -> Result<WgpuStorage> {
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
    let (store, xt) = (w.store(dt), w.elem(dt));
    // the aligned kernel loads rows of A (along k, or along m when transposed), rows of B
    // (along n, or along k when transposed) and stores rows of C as vec4
    if k.is_multiple_of(4) && n.is_multiple_of(4) && (!trans_a || m.is_multiple_of(4)) {
        let t = tiling.fit(m, n, trans_a);
        let key = format!("matmul_tiled/{trans_a}/{trans_b}/{}x{}x{}/{xt}/{store}", t.rows, t.quads, t.lanes);
        let groups = ((n / 4).div_ceil(t.lanes * t.quads), m.div_ceil(t.rows));
        return launch(w, a, b, out, spec, &key, || tiled_source(trans_a, trans_b, t, xt, store), groups);
    }
    let aidx = if trans_a { "q * m + i" } else { "i * k + q" };
    let bidx = if trans_b { "j * k + q" } else { "q * n + j" };
    let key = format!("matmul/{trans_a}/{trans_b}/{xt}/{store}");
    let src = || {
        tpl(include_str!("kernels/matmul.wgsl"), &[("$AIDX", aidx), ("$BIDX", bidx), ("$STORE", store), ("$XT", xt)])
    };
    launch(w, a, b, out, spec, &key, src, (n.div_ceil(TILE), m.div_ceil(TILE)))
}

#[allow(clippy::too_many_arguments)]
fn launch(
    w: &Wgpu,
    a: &WgpuStorage,
    b: &WgpuStorage,
    out: WgpuStorage,
    spec: &MatmulSpec,
    key: &str,
    src: impl FnOnce() -> String,
    groups: (usize, usize),
) -> Result<WgpuStorage> {
    let MatmulSpec { batch, m, n, k, a_batched, b_batched, .. } = *spec;
    let max = w.ctx.limits.max_compute_workgroups_per_dimension as usize;
    if batch > max || groups.0 > max || groups.1 > max {
        return Err(err(format!(
            "matmul: {batch} x {m} x {n} needs {groups:?} workgroups and a batch of {batch}, beyond the device's \
             {max} workgroups per dimension"
        )));
    }
    let params = [
        u32p(m, "m")?,
        u32p(n, "n")?,
        u32p(k, "k")?,
        u32p(if a_batched { m * k } else { 0 }, "a batch stride")?,
        u32p(if b_batched { k * n } else { 0 }, "b batch stride")?,
    ];
    // trusted: every read is clamped into the operands (whose lengths were checked above)
    // and every write is guarded
    w.launch_with(key, true, src, &[a, b], &out, &params, (groups.0 as u32, groups.1 as u32, batch as u32))?;
    Ok(out)
}

/// The WGSL of the aligned kernel for a layout and tiling (see the module doc).
///
/// Names: `a{i}` is row `i` of the block of op(A) at k = 4q..4q+4 (a vec4 along k);
/// `b{t}_{j}` is column quad `j` of op(B) at k = 4q+t (a vec4 along n); `acc{i}_{j}` the
/// outputs. Transposed operands are loaded along their stored rows and regrouped, which
/// costs nothing on SIMD-over-lanes devices (the components are separate registers).
/// Params: m, n, k, a_batch_stride, b_batch_stride (in floats). Reads are clamped into the
/// matrices, writes past the edges skipped.
fn tiled_source(ta: bool, tb: bool, t: Tiling, xt: &str, store: &str) -> String {
    let Tiling { rows, quads, lanes } = t;
    let mut s = String::new();
    let mut l = |line: String| {
        s.push_str(&line);
        s.push('\n');
    };
    l(format!("@group(0) @binding(0) var<storage, read> a: array<vec4<{xt}>>;"));
    l(format!("@group(0) @binding(1) var<storage, read> b: array<vec4<{xt}>>;"));
    l(format!("@group(0) @binding(2) var<storage, read_write> c: array<vec4<{xt}>>;"));
    l("@group(0) @binding(3) var<storage, read> p: array<u32>;".into());
    l(format!("@compute @workgroup_size({lanes})"));
    l("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {".into());
    l("    let m = p[0]; let n = p[1]; let k = p[2]; let k4 = k / 4u; let n4 = n / 4u; let m4 = m / 4u;".into());
    l("    let ab = wid.z * (p[3] / 4u); let bb = wid.z * (p[4] / 4u);".into());
    l(format!("    let row0 = wid.y * {rows}u;"));
    for j in 0..quads {
        l(format!("    let c{j} = wid.x * {}u + {}u + lid.x;", lanes * quads, j * lanes));
        l(format!("    let cc{j} = min(c{j}, n4 - 1u);"));
    }
    if ta {
        for g in 0..rows / 4 {
            l(format!("    let ar{g} = ab + min(row0 / 4u + {g}u, m4 - 1u);"));
        }
    } else {
        for i in 0..rows {
            l(format!("    let ar{i} = ab + min(row0 + {i}u, m - 1u) * k4;"));
        }
    }
    if tb {
        for j in 0..quads {
            for u in 0..4 {
                l(format!("    let br{j}_{u} = bb + min(cc{j} * 4u + {u}u, n - 1u) * k4;"));
            }
        }
    }
    for i in 0..rows {
        for j in 0..quads {
            l(format!("    var acc{i}_{j} = vec4<f32>(0.0);"));
        }
    }
    l("    for (var q = 0u; q < k4; q = q + 1u) {".into());
    if ta {
        for u in 0..4 {
            for g in 0..rows / 4 {
                l(format!("        let at{u}_{g} = vec4<f32>(a[ar{g} + (4u * q + {u}u) * m4]);"));
            }
        }
        for i in 0..rows {
            let (g, r) = (i / 4, i % 4);
            l(format!("        let a{i} = vec4<f32>(at0_{g}[{r}], at1_{g}[{r}], at2_{g}[{r}], at3_{g}[{r}]);"));
        }
    } else {
        for i in 0..rows {
            l(format!("        let a{i} = vec4<f32>(a[ar{i} + q]);"));
        }
    }
    for j in 0..quads {
        if tb {
            for u in 0..4 {
                l(format!("        let bt{u}_{j} = vec4<f32>(b[br{j}_{u} + q]);"));
            }
            for u in 0..4 {
                l(format!("        let b{u}_{j} = vec4<f32>(bt0_{j}[{u}], bt1_{j}[{u}], bt2_{j}[{u}], bt3_{j}[{u}]);"));
            }
        } else {
            for u in 0..4 {
                l(format!("        let b{u}_{j} = vec4<f32>(b[bb + (4u * q + {u}u) * n4 + cc{j}]);"));
            }
        }
    }
    for i in 0..rows {
        for j in 0..quads {
            l(format!(
                "        acc{i}_{j} = acc{i}_{j} + a{i}.x * b0_{j} + a{i}.y * b1_{j} + a{i}.z * b2_{j} + a{i}.w * b3_{j};"
            ));
        }
    }
    l("    }".into());
    for i in 0..rows {
        l(format!("    if (row0 + {i}u < m) {{"));
        for j in 0..quads {
            let v = format!("acc{i}_{j}");
            let val = if store == "keep" {
                v
            } else {
                format!("vec4<{xt}>({store}({v}.x), {store}({v}.y), {store}({v}.z), {store}({v}.w))")
            };
            l(format!("        if (c{j} < n4) {{ c[(wid.z * m + row0 + {i}u) * n4 + c{j}] = {val}; }}"));
        }
        l("    }".into());
    }
    l("}".into());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_core::{Backend, HostData};

    /// Every layout, aligned and not, batched or broadcast, with both tilings, against a
    /// host reference in f64.
    #[test]
    fn both_tilings_every_layout() {
        let Some(w) = crate::test_device() else { return };
        let shapes = [(1, 4, 8), (5, 12, 8), (33, 68, 20), (36, 132, 4), (7, 5, 3), (8, 8, 6)];
        for tiling in [Tiling::CPU, Tiling::GPU] {
            for &(m, n, k) in &shapes {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    for (batch, a_batched, b_batched) in [(1, true, true), (3, true, false), (2, false, true)] {
                        let spec = MatmulSpec { batch, m, n, k, trans_a: ta, trans_b: tb, a_batched, b_batched };
                        check(&w, &spec, tiling);
                    }
                }
            }
        }
    }

    fn check(w: &Wgpu, spec: &MatmulSpec, tiling: Tiling) {
        let MatmulSpec { batch, m, n, k, trans_a, trans_b, a_batched, b_batched } = *spec;
        let (na, nb) = (if a_batched { batch } else { 1 }, if b_batched { batch } else { 1 });
        let av: Vec<f32> = (0..na * m * k).map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5).collect();
        let bv: Vec<f32> = (0..nb * k * n).map(|i| ((i * 53) % 29) as f32 / 9.0 - 1.5).collect();
        let a = w.upload(&HostData::F32(av.clone())).unwrap();
        let b = w.upload(&HostData::F32(bv.clone())).unwrap();
        let c = matmul_tiled(w, &a, &b, spec, DType::F32, tiling).unwrap();
        let got = w.download(&c).unwrap().to_f32_vec();
        for z in 0..batch {
            let (ao, bo) = (if a_batched { z * m * k } else { 0 }, if b_batched { z * k * n } else { 0 });
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k)
                        .map(|q| {
                            let x = av[ao + if trans_a { q * m + i } else { i * k + q }];
                            let y = bv[bo + if trans_b { j * k + q } else { q * n + j }];
                            x as f64 * y as f64
                        })
                        .sum();
                    let g = got[(z * m + i) * n + j] as f64;
                    assert!((g - r).abs() <= 1e-4 * (1.0 + r.abs()), "{spec:?} {tiling:?} at {z},{i},{j}: {g} vs {r}");
                }
            }
        }
    }
}
