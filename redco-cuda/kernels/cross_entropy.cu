// Fused cross-entropy over the vocabulary: one block per row of logits [rows, vocab],
// integer targets (i64 or i32); a row whose target equals `ignore` gives 0 loss and 0
// gradient. A target outside 0..vocab (and not `ignore`) sets *bad.

#define XENT(name, T, iname, I) \
extern "C" __global__ void __launch_bounds__(1024) xent_##name##_##iname(const T* x, const I* tgt, T* loss, i64 rows, i64 vocab, i64 ignore, int* bad) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        i64 t = (i64)tgt[r]; \
        if (t == ignore) { if (threadIdx.x == 0) loss[r] = from_acc<T>((A)0); continue; } \
        if (t < 0 || t >= vocab) { if (threadIdx.x == 0) { *bad = 1; loss[r] = from_acc<T>((A)0); } continue; } \
        const T* xr = x + r * vocab; \
        A m = (A)NEG_INF; \
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) m = fmax(m, to_acc(xr[j])); \
        m = block_max(m); \
        A s = 0; \
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) s += exp(to_acc(xr[j]) - m); \
        s = block_sum(s); \
        if (threadIdx.x == 0) loss[r] = from_acc<T>(m + log(s) - to_acc(xr[t])); \
        __syncthreads(); \
    } \
} \
extern "C" __global__ void __launch_bounds__(1024) xent_grad_##name##_##iname(const T* x, const I* tgt, const T* grad, T* dx, i64 rows, i64 vocab, i64 ignore, int* bad) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        i64 t = (i64)tgt[r]; \
        const T* xr = x + r * vocab; \
        T* dr = dx + r * vocab; \
        bool skip = t == ignore || t < 0 || t >= vocab; \
        if (skip) { \
            if (t != ignore && threadIdx.x == 0) *bad = 1; \
            for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) dr[j] = from_acc<T>((A)0); \
            continue; \
        } \
        A m = (A)NEG_INF; \
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) m = fmax(m, to_acc(xr[j])); \
        m = block_max(m); \
        A s = 0; \
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) s += exp(to_acc(xr[j]) - m); \
        s = block_sum(s); \
        A g = to_acc(grad[r]); \
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) { \
            A p = exp(to_acc(xr[j]) - m) / s; \
            dr[j] = from_acc<T>((p - (j == t ? (A)1 : (A)0)) * g); \
        } \
        __syncthreads(); \
    } \
}
#define XENTS(name, T) XENT(name, T, i64, i64) XENT(name, T, i32, i32)
FOR_FLOATS(XENTS)
