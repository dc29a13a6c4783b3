// The part of kernels/common.cuh that the emulated kernels use, for f32 and f64 on the
// host (the real header's f16 conversions are PTX). Keep in step with common.cuh.
typedef unsigned char u8;
typedef int i32;
typedef long long i64;
#define NEG_INF (-INFINITY)
template <typename T> struct Acc { typedef float t; };
template <> struct Acc<double> { typedef double t; };
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
template <typename T> T from_acc(float v);
template <> inline float from_acc<float>(float v) { return v; }
template <typename T> T from_acc(double v);
template <> inline double from_acc<double>(double v) { return v; }
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline i64 min(i64 a, i64 b) { return a < b ? a : b; }
inline i64 max(i64 a, i64 b) { return a > b ? a : b; }
#define FOR_EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
template <typename A> A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#define FOR_FLOATS(M) M(f32, float) M(f64, double)
// bf16 as common.cuh has it (the conversions written out on the host), for the
// mixed-precision kernels; f16's are PTX, so those pairs are left to the GPU.
struct bf16 { unsigned short x; };
inline float to_acc(bf16 v) {
    unsigned u = ((unsigned)v.x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
template <> inline bf16 from_acc<bf16>(float v) {
    unsigned u;
    std::memcpy(&u, &v, 4);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) r.x = (unsigned short)((u >> 16) | 0x40);
    else r.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}
#define FOR_MASTER(M) M(f32, float, bf16, bf16) M(bf16, bf16, bf16, bf16) M(f32, float, f32, float)
#define __launch_bounds__(n)
// Rust's `as` for the integer kernels (not checked here: their semantics are the GPU's)
template <typename T> T cast_to(double v) { return (T)v; }
inline float rsqrt(float v) { return 1.0f / std::sqrt(v); }
inline double rsqrt(double v) { return 1.0 / std::sqrt(v); }
// Block-wide sum and max as in common.cuh; `static` is the block's shared memory here (the
// blocks run one after another on one OS thread).
template <typename A> A block_sum(A v) {
    static A part[32];
    v = warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    A t = lane < (int)(blockDim.x >> 5) ? part[lane] : (A)0;
    return warp_sum(t);
}
template <typename A> A block_max(A v) {
    static A part[32];
    v = warp_max(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    A t = lane < (int)(blockDim.x >> 5) ? part[lane] : (A)NEG_INF;
    return warp_max(t);
}
