// Strided copy of elements ($E: u32 words, or packed f16): for each multi-index c over dims,
// y[dst_off + c . dst_strides] = x[src_off + c . src_strides].
// Params: n, rank, src_off, dst_off, dims[rank], src_strides[rank], dst_strides[rank].
// Serves permute, expand, narrow and each part of cat.

@group(0) @binding(0) var<storage, read> x: array<$E>;
@group(0) @binding(1) var<storage, read_write> y: array<$E>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let rank = p[1];
    var src = p[2];
    var dst = p[3];
    var r = i;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = p[3u + d];
        let c = r % size;
        r = r / size;
        src = src + c * p[3u + rank + d];
        dst = dst + c * p[3u + 2u * rank + d];
    }
    y[dst] = x[src];
}
