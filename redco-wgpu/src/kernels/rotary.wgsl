// Rotary embedding, one invocation per output element of x [rows, d]: features below
// 2 * half rotate with their partner ($PAIR sets k, the pair's table column, `first`, and
// the pair (a, b)), the rest are copied. The table row of x's row r is r % seq, or
// (r / per_batch) * seq + r % seq for per-row tables ([batch, seq, half], per_batch =
// heads * seq). Params: n, d, seq, half, per_batch (0 for shared tables).

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> cs: array<$XT>;
@group(0) @binding(2) var<storage, read> sn: array<$XT>;
@group(0) @binding(3) var<storage, read_write> y: array<$XT>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let d = p[1];
    let half = p[3];
    let j = i % d;
    if (j >= 2u * half) {
        y[i] = x[i];
        return;
    }
    let r = i / d;
    let seq = p[2];
    let per_batch = p[4];
    var t = r % seq;
    if (per_batch != 0u) {
        t = (r / per_batch) * seq + r % seq;
    }
    let rd = r * d;
    $PAIR
    let c = f32(cs[t * half + k]);
    let s = f32(sn[t * half + k]);
    y[i] = $STORE(select(b * c + a * s, a * c - b * s, first));
}
