// Shared part of the row kernels (softmax, norms, cross-entropy), prepended to each.
//
// A workgroup of WG invocations holds RPW = WG / TPR rows: row `wg * RPW + lid / TPR` is
// handled by the TPR invocations of its segment (TPR a power of two; a long row takes the
// whole workgroup). Each invocation walks its row with stride TPR, then the segment
// combines the partial results with a tree in workgroup memory.

const TPR: u32 = $TPRu;
const RPW: u32 = WG / TPR;
// The lowest finite f32: the identity of max (kept finite, no infinities in flight).
const LOWEST: f32 = -3.40282347e38;

var<workgroup> red: array<f32, 256>;

// The row this invocation works on (may be past the last row) and its lane in the row.
fn row_of(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> vec2<u32> {
    return vec2<u32>((wid.y * nwg.x + wid.x) * RPW + lid.x / TPR, lid.x % TPR);
}

// The sum of `v` over the segment of invocation `l`; every invocation must call it.
fn seg_sum(l: u32, v: f32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var w = TPR / 2u; w > 0u; w = w / 2u) {
        if (l % TPR < w) {
            red[l] = red[l] + red[l + w];
        }
        workgroupBarrier();
    }
    let r = red[l - l % TPR];
    workgroupBarrier();
    return r;
}

// The maximum of `v` over the segment of invocation `l`; every invocation must call it.
fn seg_max(l: u32, v: f32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var w = TPR / 2u; w > 0u; w = w / 2u) {
        if (l % TPR < w) {
            red[l] = max(red[l], red[l + w]);
        }
        workgroupBarrier();
    }
    let r = red[l - l % TPR];
    workgroupBarrier();
    return r;
}
