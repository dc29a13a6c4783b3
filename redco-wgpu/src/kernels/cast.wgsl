// Elementwise conversion: y[i] = conv(x[i]). Params: n.

@group(0) @binding(0) var<storage, read> x: array<$IN>;
@group(0) @binding(1) var<storage, read_write> y: array<$OUT>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

fn conv(v: $CT) -> $OUT {
    $CONV
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    y[i] = conv($CT(x[i]));
}
