// One AdamW step, one invocation per element: reads x, g, m, v once and writes the new
// parameter and both moments. Params: n, then f32 bits of beta1, beta2, 1 - beta1,
// 1 - beta2, 1 / bias1, 1 / bias2, lr, eps, 1 - lr * weight_decay.

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> g: array<$XT>;
@group(0) @binding(2) var<storage, read> m: array<$XT>;
@group(0) @binding(3) var<storage, read> v: array<$XT>;
@group(0) @binding(4) var<storage, read_write> xo: array<$XT>;
@group(0) @binding(5) var<storage, read_write> mo: array<$XT>;
@group(0) @binding(6) var<storage, read_write> vo: array<$XT>;
@group(0) @binding(7) var<storage, read> p: array<u32>;

fn f(i: u32) -> f32 {
    return bitcast<f32>(p[i]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let gi = f32(g[i]);
    let mi = f(1u) * f32(m[i]) + f(3u) * gi;
    let vi = f(2u) * f32(v[i]) + f(4u) * (gi * gi);
    let denom = sqrt(vi * f(6u)) + f(8u);
    mo[i] = $STORE(mi);
    vo[i] = $STORE(vi);
    xo[i] = $STORE(f32(x[i]) * f(9u) - f(7u) * ((mi * f(5u)) / denom));
}
