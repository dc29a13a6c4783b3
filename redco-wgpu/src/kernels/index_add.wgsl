// index_add without atomics: every output element (x viewed as [outer, size, inner]) adds
// the source rows whose id equals its row, found through a CSR inverse of the ids (offs:
// size + 1 offsets into order, which lists source rows by target).
// Params: n, inner, size, n_ids.

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> src: array<$XT>;
@group(0) @binding(2) var<storage, read> offs: array<u32>;
@group(0) @binding(3) var<storage, read> order: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<$XT>;
@group(0) @binding(5) var<storage, read> p: array<u32>;

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
    let j = t % size;
    let oo = t / size;
    var acc = $T(x[e]);
    for (var q = offs[j]; q < offs[j + 1u]; q = q + 1u) {
        acc = acc + $T(src[(oo * k + order[q]) * inner + ii]);
    }
    y[e] = $STORE(acc);
}
