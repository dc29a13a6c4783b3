// Per-row cross-entropy of logits [rows, d] against i32 targets [rows] (see rows.wgsl and row_lse.wgsl):
// max(x) + log(sum exp(x - max)) - x[target], 0 for an ignored row. The host checked that
// every target other than the ignore index lies in 0..d, so a target outside it is the
// ignore index (possibly saturated to i32). Params: rows, d, ignore index (i32 bits).

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> t: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<$XT>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let rl = row_of(wid, nwg, lid);
    let d = p[1];
    let live = rl.x < p[0];
    let base = rl.x * d;
    let ms = row_max_sumexp(lid.x, live, base, rl.y, d);
    let mx = ms.x;
    let s = ms.y;
    if (live && rl.y == 0u) {
        let tg = t[rl.x];
        if (tg == bitcast<i32>(p[2]) || tg < 0 || u32(tg) >= d) {
            y[rl.x] = 0.0;
        } else {
            y[rl.x] = $STORE((log(s) + mx) - f32(x[base + u32(tg)]));
        }
    }
}
