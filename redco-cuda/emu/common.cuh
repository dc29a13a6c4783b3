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
