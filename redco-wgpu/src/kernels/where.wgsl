// Broadcasting select on elements ($E: u32 words, or packed f16): y[i] = c[ic] != 0 ? a[ia] : b[ib].
// Params: n, rank, dims[rank], c_strides[rank], a_strides[rank], b_strides[rank].

@group(0) @binding(0) var<storage, read> c: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<$E>;
@group(0) @binding(2) var<storage, read> b: array<$E>;
@group(0) @binding(3) var<storage, read_write> y: array<$E>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let rank = p[1];
    var ic = 0u;
    var ia = 0u;
    var ib = 0u;
    var r = i;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = p[1u + d];
        let k = r % size;
        r = r / size;
        ic = ic + k * p[1u + rank + d];
        ia = ia + k * p[1u + 2u * rank + d];
        ib = ib + k * p[1u + 3u * rank + d];
    }
    y[i] = select(b[ib], a[ia], c[ic] != 0u);
}
