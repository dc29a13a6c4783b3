// Broadcasting binary op and comparison: y[i] = $STORE(op($T(a[ia]), $T(b[ib]))).
// Params: n, rank, dims[rank], a_strides[rank], b_strides[rank]; rank 0 means that both
// operands are contiguous with the output's shape.

@group(0) @binding(0) var<storage, read> a: array<$IN>;
@group(0) @binding(1) var<storage, read> b: array<$IN>;
@group(0) @binding(2) var<storage, read_write> y: array<$OUT>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

fn op(x: $T, z: $T) -> $RT {
    $OP
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let rank = p[1];
    var ia = 0u;
    var ib = 0u;
    if (rank == 0u) {
        ia = i;
        ib = i;
    } else {
        var r = i;
        for (var d = rank; d > 0u; d = d - 1u) {
            let size = p[1u + d];
            let c = r % size;
            r = r / size;
            ia = ia + c * p[1u + rank + d];
            ib = ib + c * p[1u + 2u * rank + d];
        }
    }
    y[i] = $STORE(op($T(a[ia]), $T(b[ib])));
}
