// Shared helpers, prepended to every kernel.

const WG: u32 = 256u;

// Flat invocation index of a one-dimensional launch folded into (x, y) workgroups.
fn gid(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid.x;
}

// Stores of f32 values in their logical dtype: f32 as is, f16/bf16 rounded to nearest even.
fn keep(x: f32) -> f32 {
    return x;
}

fn round_bf16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return x;
    }
    let r = b + 0x7fffu + ((b >> 16u) & 1u);
    return bitcast<f32>(r & 0xffff0000u);
}

fn round_f16(x: f32) -> f32 {
    if (abs(x) >= 65520.0) {
        return x * bitcast<f32>(0x7f800000u);
    }
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// Integer stores: U8 saturates like the CPU backend's `as u8`.
fn keep_i(x: i32) -> i32 {
    return x;
}

fn sat_u8(x: i32) -> i32 {
    return clamp(x, 0, 255);
}
