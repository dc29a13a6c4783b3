// One key tile of an online softmax, shared by attention.wgsl and paged_attention.wgsl
// (which define D, BK, LOWEST and the workgroup tiles kt, vt). The row's query `qr` is
// scored against the tile's kept keys (bit j of `keep`: key j of `kt`, scaled by `scale`);
// then the running max `mx`, the running sum `l` and the accumulator `acc` (a weighted sum
// of the rows of `vt`) are updated. `seen` says whether an earlier tile kept a key.
fn online_tile(
    nk: u32,
    keep: u32,
    scale: f32,
    qr: ptr<function, array<f32, D>>,
    acc: ptr<function, array<f32, D>>,
    mx: ptr<function, f32>,
    l: ptr<function, f32>,
    seen: ptr<function, bool>,
) {
    if (keep == 0u) {
        return;
    }
    var sc: array<f32, BK>;
    var tmax = LOWEST;
    for (var j = 0u; j < nk; j = j + 1u) {
        if ((keep & (1u << j)) != 0u) {
            var dot = 0.0;
            for (var e = 0u; e < D; e = e + 1u) {
                dot = dot + (*qr)[e] * kt[j * D + e];
            }
            sc[j] = dot * scale;
            tmax = max(tmax, sc[j]);
        }
    }
    let mn = max(*mx, tmax);
    let corr = select(0.0, exp(*mx - mn), *seen);
    *seen = true;
    *mx = mn;
    *l = *l * corr;
    for (var e = 0u; e < D; e = e + 1u) {
        (*acc)[e] = (*acc)[e] * corr;
    }
    for (var j = 0u; j < nk; j = j + 1u) {
        if ((keep & (1u << j)) != 0u) {
            let pj = exp(sc[j] - mn);
            *l = *l + pj;
            for (var e = 0u; e < D; e = e + 1u) {
                (*acc)[e] = (*acc)[e] + pj * vt[j * D + e];
            }
        }
    }
}
