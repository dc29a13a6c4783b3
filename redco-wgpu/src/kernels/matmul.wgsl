// Batched matmul C[z] = op(A[z]) * op(B[z]), register-blocked: each invocation computes a
// 4x4 block of C, a workgroup of 8x8 invocations a 32x32 tile; workgroup z is the batch
// entry. Params: m, n, k, a_batch_stride, b_batch_stride.
// $AIDX and $BIDX index the operands in their stored layout (transposed or not).

@group(0) @binding(0) var<storage, read> a: array<$XT>;
@group(0) @binding(1) var<storage, read> b: array<$XT>;
@group(0) @binding(2) var<storage, read_write> c: array<$XT>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

fn la(i: u32, q: u32, base: u32, m: u32, k: u32) -> f32 {
    return f32(a[base + $AIDX]);
}

fn lb(q: u32, j: u32, base: u32, n: u32, k: u32) -> f32 {
    return f32(b[base + $BIDX]);
}

@compute @workgroup_size(8, 8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = p[0];
    let n = p[1];
    let k = p[2];
    let ab = wid.z * p[3];
    let bb = wid.z * p[4];
    let row0 = (wid.y * 8u + lid.y) * 4u;
    let col0 = (wid.x * 8u + lid.x) * 4u;
    if (row0 >= m || col0 >= n) {
        return;
    }
    // clamp reads to the matrix; rows and columns past the edge are never written
    let r = min(vec4<u32>(row0, row0 + 1u, row0 + 2u, row0 + 3u), vec4<u32>(m - 1u));
    let s = min(vec4<u32>(col0, col0 + 1u, col0 + 2u, col0 + 3u), vec4<u32>(n - 1u));
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var q = 0u; q < k; q = q + 1u) {
        let av = vec4<f32>(la(r.x, q, ab, m, k), la(r.y, q, ab, m, k), la(r.z, q, ab, m, k), la(r.w, q, ab, m, k));
        let bv = vec4<f32>(lb(q, s.x, bb, n, k), lb(q, s.y, bb, n, k), lb(q, s.z, bb, n, k), lb(q, s.w, bb, n, k));
        acc0 = acc0 + av.x * bv;
        acc1 = acc1 + av.y * bv;
        acc2 = acc2 + av.z * bv;
        acc3 = acc3 + av.w * bv;
    }
    let rows = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let row = row0 + i;
        if (row < m) {
            let base = (wid.z * m + row) * n;
            for (var j = 0u; j < 4u; j = j + 1u) {
                if (col0 + j < n) {
                    c[base + col0 + j] = $STORE(rows[i][j]);
                }
            }
        }
    }
}
