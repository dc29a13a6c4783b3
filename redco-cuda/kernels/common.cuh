// Shared by every kernel family (prepended to each source before NVRTC compiles it): the
// element types without CUDA's headers, conversions through f32 (f64 stays f64), the
// broadcast index arithmetic, and block reductions.
typedef unsigned char u8;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;

struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };

#define MAX_RANK 8
#define NEG_INF (__int_as_float(0xff800000))
#define NAN_VALUE (__int_as_float(0x7fc00000))

// Dims of an output and the strides (in elements) of up to three operands over it; a
// stride of 0 broadcasts.
struct Dims {
    int rank;
    i64 out[MAX_RANK];
    i64 s0[MAX_RANK];
    i64 s1[MAX_RANK];
    i64 s2[MAX_RANK];
};

template <typename T> struct Acc { typedef float t; };
template <> struct Acc<double> { typedef double t; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(bf16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
__device__ __forceinline__ float to_acc(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}
__device__ __forceinline__ float to_acc(i64 v) { return (float)v; }
__device__ __forceinline__ float to_acc(i32 v) { return (float)v; }
__device__ __forceinline__ float to_acc(u8 v) { return (float)v; }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_acc<bf16>(float v) {
    unsigned u = __float_as_uint(v);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (unsigned short)((u >> 16) | 0x40);  // quiet NaN, sign kept
    } else {
        r.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest, ties to even
    }
    return r;
}
template <> __device__ __forceinline__ f16 from_acc<f16>(float v) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
    return r;
}
template <> __device__ __forceinline__ i64 from_acc<i64>(float v) { return (i64)v; }
template <> __device__ __forceinline__ i32 from_acc<i32>(float v) { return (i32)v; }
template <> __device__ __forceinline__ u8 from_acc<u8>(float v) { return (u8)v; }
template <typename T> __device__ __forceinline__ T from_acc(double v);
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }

// Offsets of the output's linear index `i` in the three operands.
__device__ __forceinline__ void offsets(const Dims& d, i64 i, i64& o0, i64& o1, i64& o2) {
    o0 = 0; o1 = 0; o2 = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
        i64 n = d.out[k];
        i64 c = i % n;
        i /= n;
        o0 += c * d.s0[k];
        o1 += c * d.s1[k];
        o2 += c * d.s2[k];
    }
}

// A grid-stride loop over n elements.
#define FOR_EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum and max (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result.
template <typename A> __device__ A block_sum(A v) {
    __shared__ A part[32];
    v = warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    A t = lane < (int)(blockDim.x >> 5) ? part[lane] : (A)0;
    return warp_sum(t);
}
template <typename A> __device__ A block_max(A v) {
    __shared__ A part[32];
    v = warp_max(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    A t = lane < (int)(blockDim.x >> 5) ? part[lane] : (A)NEG_INF;
    return warp_max(t);
}

// Conversion of a double to T as Rust's `as` does it: floats rounded, integers truncated
// toward zero and saturated, NaN to 0 (the CPU backend stores through f64 this way).
template <typename T> __device__ __forceinline__ T cast_to(double v);
template <> __device__ __forceinline__ float cast_to<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double cast_to<double>(double v) { return v; }
template <> __device__ __forceinline__ bf16 cast_to<bf16>(double v) { return from_acc<bf16>((float)v); }
template <> __device__ __forceinline__ f16 cast_to<f16>(double v) { return from_acc<f16>((float)v); }
template <typename I> __device__ __forceinline__ I sat_int(double v, double lo, double hi) {
    if (v != v) return (I)0;
    if (v <= lo) return (I)lo;
    if (v >= hi) return (I)hi;
    return (I)v;
}
template <> __device__ __forceinline__ i64 cast_to<i64>(double v) {
    if (v != v) return 0;
    if (v <= -9.2233720368547758e18) return (i64)0x8000000000000000ull;
    if (v >= 9.2233720368547758e18) return (i64)0x7fffffffffffffffull;
    return (i64)v;
}
template <> __device__ __forceinline__ i32 cast_to<i32>(double v) { return sat_int<i32>(v, -2147483648.0, 2147483647.0); }
template <> __device__ __forceinline__ u8 cast_to<u8>(double v) { return sat_int<u8>(v, 0.0, 255.0); }

#define FOR_FLOATS(M) M(f32, float) M(f64, double) M(bf16, bf16) M(f16, f16)
#define FOR_ALL(M) FOR_FLOATS(M) M(i64, i64) M(i32, i32) M(u8, u8)
// The (gradient, compute copy) pairs of the mixed-precision AdamW over f32 masters.
#define FOR_MASTER(M) M(f32, float, bf16, bf16) M(bf16, bf16, bf16, bf16) M(f32, float, f16, f16) M(f16, f16, f16, f16) \
    M(f32, float, f32, float)
