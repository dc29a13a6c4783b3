// scatter_add without atomics: every output element (x viewed as [outer, size, inner])
// scans the index column at its (outer, inner) position and adds the sources that point at
// it. Params: n, inner, size, n_idx (the index's extent along the dim).

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read> src: array<$XT>;
@group(0) @binding(3) var<storage, read_write> y: array<$XT>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let e = gid(wid, nwg, lid);
    if (e >= p[0]) {
        return;
    }
    let inner = p[1];
    let size = p[2];
    let k = p[3];
    let ii = e % inner;
    let t = e / inner;
    let j = i32(t % size);
    let oo = t / size;
    var acc = $T(x[e]);
    for (var q = 0u; q < k; q = q + 1u) {
        let pos = (oo * k + q) * inner + ii;
        if (idx[pos] == j) {
            acc = acc + $T(src[pos]);
        }
    }
    y[e] = $STORE(acc);
}
