// Reduction of contiguous rows ([rows, size], inner = 1): one workgroup per row, a strided
// pass per invocation then a tree in workgroup memory. Params: rows, size.

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read_write> y: array<$OUT>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

var<workgroup> vals: array<$T, 256>;
var<workgroup> args: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * nwg.x + wid.x;
    let t = lid.x;
    let size = p[1];
    let live = row < p[0];
    let base = row * size;
    var acc: $T = $INIT;
    var arg = 0u;
    var started = false;
    if (live) {
        for (var s = t; s < size; s = s + WG) {
            let v = $T(x[base + s]);
            if (!started) {
                acc = v;
                arg = s;
                started = true;
            } else {
                $STEP
            }
        }
    }
    vals[t] = acc;
    args[t] = select(0xffffffffu, arg, started);
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            let a0 = vals[t];
            let a1 = vals[t + w];
            let i0 = args[t];
            let i1 = args[t + w];
            $MERGE
        }
        workgroupBarrier();
    }
    if (live && t == 0u) {
        let acc = vals[0];
        let arg = args[0];
        y[row] = $FINISH;
    }
}
