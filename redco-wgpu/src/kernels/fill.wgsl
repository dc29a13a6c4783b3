// y[i] = bits. Params: n, bits.

@group(0) @binding(0) var<storage, read_write> y: array<u32>;
@group(0) @binding(1) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    y[i] = p[1];
}
