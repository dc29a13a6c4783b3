// LayerNorm and RMSNorm over the last dimension: one block per row; the statistics in the
// accumulation type; optional weight and bias (null pointers when absent).

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
}
FOR_FLOATS(NORM)
