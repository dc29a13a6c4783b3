// Index ops on elements ($E: u32 words, or packed f16). $MODE selects the kernel body:
// - select (index_select): inputs x, ids; out [outer, n_ids, inner];
//   params: n_out, inner, size, n_ids.
// - gather: inputs x, idx; out shaped like idx = [outer, n_idx, inner];
//   params: n_out, inner, size, n_idx.

@group(0) @binding(0) var<storage, read> x: array<$E>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<$E>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = gid(wid, nwg, lid);
    if (o >= p[0]) {
        return;
    }
    let inner = p[1];
    let size = p[2];
    let k = p[3];
    let ii = o % inner;
    let t = o / inner;
    let j = t % k;
    let oo = t / k;
    $MODE
}
