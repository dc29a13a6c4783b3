// Softmax and log-softmax over the last dimension: one block per row, the row's maximum
// and the sum of exponentials reduced across the block.

#define SOFTMAX(name, T) \
extern "C" __global__ void __launch_bounds__(1024) softmax_##name(const T* x, T* y, i64 rows, i64 n, int log_out) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        const T* xr = x + r * n; \
        T* yr = y + r * n; \
        A m = (A)NEG_INF; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = fmax(m, to_acc(xr[j])); \
        m = block_max(m); \
        A s = 0; \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += exp(to_acc(xr[j]) - m); \
        s = block_sum(s); \
        A ls = log(s); \
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { \
            A v = to_acc(xr[j]) - m; \
            yr[j] = from_acc<T>(log_out ? v - ls : exp(v) / s); \
        } \
        __syncthreads(); \
    } \
}
FOR_FLOATS(SOFTMAX)
