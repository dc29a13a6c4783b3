// Reduction along one dimension of x viewed as [outer, size, inner]; one invocation per
// output. Params: n_out, size, inner.
// $T: the element type; $OUT: the output type; $INIT, $STEP: the accumulator.

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read_write> y: array<$OUT>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = gid(wid, nwg, lid);
    if (o >= p[0]) {
        return;
    }
    let size = p[1];
    let inner = p[2];
    let base = (o / inner) * size * inner + o % inner;
    var acc: $T = $T(x[base]);
    var arg = 0u;
    for (var s = 1u; s < size; s = s + 1u) {
        let v = $T(x[base + s * inner]);
        $STEP
    }
    y[o] = $FINISH;
}
