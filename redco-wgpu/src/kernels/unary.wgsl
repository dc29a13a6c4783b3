// Elementwise unary map on f32: y = $STORE(op(x)). Params: n, a, b (f32 bits).

@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read_write> y: array<$XT>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

const INV_SQRT2: f32 = 0.70710678118654752;
const INV_SQRT_2PI: f32 = 0.39894228040143268;
const SQRT_2_PI: f32 = 0.79788456080286536;
const GELU_C: f32 = 0.044715;

fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn erf_(x: f32) -> f32 {
    let a = abs(x);
    if (a < 0.5) {
        let x2 = x * x;
        return 1.1283791670955126 * x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 + x2 / 216.0))));
    }
    // Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7)
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let r = 1.0 - poly * exp(-a * a);
    return select(r, -r, x < 0.0);
}

fn tanh_(x: f32) -> f32 {
    let t = exp(-2.0 * abs(x));
    let r = (1.0 - t) / (1.0 + t);
    return select(r, -r, x < 0.0);
}

fn sig(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn powf_(v: f32, e: f32) -> f32 {
    if (e == 0.0) {
        return 1.0;
    }
    if (e == 1.0) {
        return v;
    }
    if (e == 2.0) {
        return v * v;
    }
    var r: f32;
    if (v == 0.0) {
        r = select(0.0, bitcast<f32>(0x7f800000u), e < 0.0);
    } else {
        r = exp2(e * log2(abs(v)));
    }
    if (v < 0.0) {
        if (fract(e) != 0.0) {
            return nan();
        }
        if (fract(e * 0.5) != 0.0) {
            return -r;
        }
    }
    return r;
}

fn op(v: f32, a: f32, b: f32) -> f32 {
    $OP
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = gid(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    y[i] = $STORE(op(f32(x[i]), bitcast<f32>(p[1]), bitcast<f32>(p[2])));
}
