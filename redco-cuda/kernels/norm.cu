// LayerNorm and RMSNorm over the last dimension, and their input gradient: one block per
// row; the statistics in the accumulation type; optional weight and bias (null pointers
// when absent).

#define NORM(name, T) \
extern "C" __global__ void __launch_bounds__(1024) layer_norm_##name(const T* x, const T* w, const T* b, T* y, i64 rows, i64 n, double eps) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        const T* xr = x + r * n; \
        A s = 0; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += to_acc(xr[j]); \
        A mean = block_sum(s) / (A)n; \
        A q = 0; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { A d = to_acc(xr[j]) - mean; q += d * d; } \
        A inv = rsqrt(block_sum(q) / (A)n + (A)eps); \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { \
            A v = (to_acc(xr[j]) - mean) * inv; \
            if (w) v *= to_acc(w[j]); \
            if (b) v += to_acc(b[j]); \
            y[r * n + j] = from_acc<T>(v); \
        } \
        __syncthreads(); \
    } \
} \
extern "C" __global__ void __launch_bounds__(1024) rms_norm_##name(const T* x, const T* w, T* y, i64 rows, i64 n, double eps) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        const T* xr = x + r * n; \
        A q = 0; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { A v = to_acc(xr[j]); q += v * v; } \
        A inv = rsqrt(block_sum(q) / (A)n + (A)eps); \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { \
            A v = to_acc(xr[j]) * inv; \
            if (w) v *= to_acc(w[j]); \
            y[r * n + j] = from_acc<T>(v); \
        } \
        __syncthreads(); \
    } \
} \
/* the input gradient for dy = g: rstd (gx - mean(gx) [LayerNorm: center] - xhat mean(gx xhat)), */ \
/* gx = g w */ \
extern "C" __global__ void __launch_bounds__(1024) norm_bwd_##name(const T* x, const T* w, const T* g, T* dx, i64 rows, i64 n, double eps, int center) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        const T* xr = x + r * n; \
        const T* gr = g + r * n; \
        A mean = 0; \
        if (center) { \
            A s = 0; \
            for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += to_acc(xr[j]); \
            mean = block_sum(s) / (A)n; \
        } \
        A q = 0; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { A d = to_acc(xr[j]) - mean; q += d * d; } \
        A rstd = rsqrt(block_sum(q) / (A)n + (A)eps); \
        A s1 = 0, s2 = 0; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { \
            A gj = to_acc(gr[j]); \
            if (w) gj *= to_acc(w[j]); \
            s1 += gj; \
            s2 += gj * (to_acc(xr[j]) - mean) * rstd; \
        } \
        s1 = block_sum(s1); \
        s2 = block_sum(s2); \
        A m1 = center ? s1 / (A)n : (A)0, m2 = s2 / (A)n; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { \
            A gj = to_acc(gr[j]); \
            if (w) gj *= to_acc(w[j]); \
            dx[r * n + j] = from_acc<T>(rstd * (gj - m1 - (to_acc(xr[j]) - mean) * rstd * m2)); \
        } \
        __syncthreads(); \
    } \
}
FOR_FLOATS(NORM)
