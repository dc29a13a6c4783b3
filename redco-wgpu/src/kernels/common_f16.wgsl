// Stores of packed f16 (devices with SHADER_F16): rounded to nearest even in f32 first
// (overflow to infinity, as on the host), then converted exactly.
fn st_f16(x: f32) -> f16 {
    return f16(round_f16(x));
}
