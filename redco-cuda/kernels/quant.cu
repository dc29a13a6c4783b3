// Products with llama.cpp's block-quantized weights read in place (`Backend::quant_matmul`):
// W [n, k] is n rows of `row_bytes` bytes, each k / block values blocks of format `fmt`
// (0 Q4_0, 1 Q4_1, 2 Q8_0, 3 Q4_K, 4 Q6_K; byte layouts as redco_core::quant documents).
// Every format is read 32 values at a time (`deq32`: value group s of a row, one block of
// the 32-value formats, a sub-block of the K formats), dequantized in registers.
//
// quant_gemv_T: y [m, n] = x [m, k] W^T for few rows (decode): one warp per weight row,
// its lanes taking 32-value groups in turn, each group met by up to QROWS rows of x at once
// (more rows: the weight row is read again per QROWS), the warp's sums reduced by shuffles.
// quant_dequant_T: W as T [n, k] (for many rows: then one cuBLAS GEMM).

#define QROWS 8

// f16 bits as f32, without CUDA's headers (the blocks' scales).
__device__ __forceinline__ float half_bits(unsigned h) {
    unsigned s = (h >> 15) & 1u, e = (h >> 10) & 31u, f = h & 1023u;
    float v;
    if (e == 0) v = (float)f * 5.9604644775390625e-8f;  // subnormal: f * 2^-24, exact
    else if (e == 31) v = __uint_as_float(0x7f800000u | (f << 13));
    else v = __uint_as_float(((e + 112u) << 23) | (f << 13));
    return s ? -v : v;
}

__device__ __forceinline__ float half_at(const u8* p) { return half_bits((unsigned)p[0] | ((unsigned)p[1] << 8)); }

// Q4_K's 6-bit scale and minimum of sub-block j from its 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* mn) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *mn = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Values 32 s .. 32 s + 32 of a row of format fmt, into v.
__device__ __forceinline__ void deq32(int fmt, const u8* row, i64 s, float* v) {
    if (fmt == 0) {
        const u8* b = row + s * 18;
        float d = half_at(b);
        for (int l = 0; l < 16; ++l) {
            v[l] = d * (float)((int)(b[2 + l] & 0xF) - 8);
            v[l + 16] = d * (float)((int)(b[2 + l] >> 4) - 8);
        }
    } else if (fmt == 1) {
        const u8* b = row + s * 20;
        float d = half_at(b), m = half_at(b + 2);
        for (int l = 0; l < 16; ++l) {
            v[l] = d * (float)(b[4 + l] & 0xF) + m;
            v[l + 16] = d * (float)(b[4 + l] >> 4) + m;
        }
    } else if (fmt == 2) {
        const u8* b = row + s * 34;
        float d = half_at(b);
        for (int l = 0; l < 32; ++l) v[l] = d * (float)(signed char)b[2 + l];
    } else if (fmt == 3) {
        const u8* b = row + (s / 8) * 144;
        int j = (int)(s % 8);
        float sc, mn;
        scale_min_k4(j, b + 4, &sc, &mn);
        float d = half_at(b) * sc, m = half_at(b + 2) * mn;
        const u8* q = b + 16 + 32 * (j / 2);
        int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l) v[l] = d * (float)((q[l] >> shift) & 0xF) - m;
    } else {
        const u8* b = row + (s / 8) * 210;
        int j = (int)(s % 8), h = j / 4, g = j % 4;
        float d = half_at(b + 208);
        const u8* ql = b + 64 * h + 32 * (g % 2);
        const u8* qh = b + 128 + 32 * h;
        const u8* sc = b + 192 + 8 * h + 2 * g;
        for (int l = 0; l < 32; ++l) {
            int low = (ql[l] >> (4 * (g / 2))) & 0xF;
            int high = (qh[l] >> (2 * g)) & 3;
            v[l] = d * (float)(signed char)sc[l / 16] * (float)((low | (high << 4)) - 32);
        }
    }
}

#define QUANT(name, T) \
extern "C" __global__ void quant_gemv_##name(const T* x, const u8* w, T* y, i64 m, i64 n, i64 k, i64 row_bytes, int fmt) { \
    typedef Acc<T>::t A; \
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5; \
    i64 groups = k / 32; \
    for (i64 j = (i64)blockIdx.x * warps + (threadIdx.x >> 5); j < n; j += (i64)gridDim.x * warps) { \
        const u8* row = w + j * row_bytes; \
        for (i64 i0 = 0; i0 < m; i0 += QROWS) { \
            A acc[QROWS]; \
            for (int r = 0; r < QROWS; ++r) acc[r] = (A)0; \
            for (i64 s = lane; s < groups; s += 32) { \
                float v[32]; \
                deq32(fmt, row, s, v); \
                for (int r = 0; r < QROWS; ++r) { \
                    if (i0 + r >= m) break; \
                    const T* xs = x + (i0 + r) * k + 32 * s; \
                    A t = (A)0; \
                    for (int l = 0; l < 32; ++l) t += (A)v[l] * to_acc(xs[l]); \
                    acc[r] += t; \
                } \
            } \
            for (int r = 0; r < QROWS; ++r) { \
                A t = warp_sum(acc[r]); \
                if (lane == 0 && i0 + r < m) y[(i0 + r) * n + j] = from_acc<T>(t); \
            } \
        } \
    } \
} \
extern "C" __global__ void quant_dequant_##name(const u8* w, T* out, i64 n, i64 k, i64 row_bytes, int fmt) { \
    typedef Acc<T>::t A; \
    i64 groups = k / 32; \
    FOR_EACH(t, n * groups) { \
        i64 j = t / groups, s = t % groups; \
        float v[32]; \
        deq32(fmt, w + j * row_bytes, s, v); \
        for (int l = 0; l < 32; ++l) out[j * k + 32 * s + l] = from_acc<T>((A)v[l]); \
    } \
}
FOR_FLOATS(QUANT)
