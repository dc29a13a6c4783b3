// LayerNorm (CENTER) / RMSNorm of contiguous rows [rows, d] (see rows.wgsl): the mean (for
// LayerNorm), the mean square of x - mean, then one write pass with the optional scale w and
// shift b (inputs bound in any case; $AFFINE reads the present ones). Params: rows, d, eps.

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> w: array<$XT>;
@group(0) @binding(2) var<storage, read> b: array<$XT>;
@group(0) @binding(3) var<storage, read_write> y: array<$XT>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

const CENTER: bool = $CENTER;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let rl = row_of(wid, nwg, lid);
    let d = p[1];
    let eps = bitcast<f32>(p[2]);
    let live = rl.x < p[0];
    let base = rl.x * d;
    var mean = 0.0;
    if (CENTER) {
        var s = 0.0;
        if (live) {
            for (var j = rl.y; j < d; j = j + TPR) {
                s = s + f32(x[base + j]);
            }
        }
        mean = seg_sum(lid.x, s) / f32(d);
    }
    var q = 0.0;
    if (live) {
        for (var j = rl.y; j < d; j = j + TPR) {
            let c = f32(x[base + j]) - mean;
            q = q + c * c;
        }
    }
    let rstd = 1.0 / sqrt(seg_sum(lid.x, q) / f32(d) + eps);
    if (live) {
        for (var j = rl.y; j < d; j = j + TPR) {
            let v = (f32(x[base + j]) - mean) * rstd;
            y[base + j] = $STORE($AFFINE);
        }
    }
}
