// Softmax / log-softmax of contiguous rows [rows, d] (see rows.wgsl and row_lse.wgsl): the row maximum, the
// sum of exp(x - max), then one write pass. Params: rows, d.

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read_write> y: array<$XT>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

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
    if (live) {
        let inv = 1.0 / s;
        let ls = log(s);
        for (var j = rl.y; j < d; j = j + TPR) {
            let v = f32(x[base + j]);
            y[base + j] = $STORE($OUT);
        }
    }
}
