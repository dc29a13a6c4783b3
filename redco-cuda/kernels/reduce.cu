// Reductions along one dimension of a tensor viewed as [outer, size, inner]: one block
// per output row when inner == 1 (the last dimension, contiguous), else one thread per
// output element walking the strided dimension. Op codes: 0 sum, 1 max, 2 min, 3 argmax.

template <typename A> __device__ __forceinline__ A red_init(int op) {
    return op == 0 ? (A)0 : (op == 2 ? -(A)NEG_INF : (A)NEG_INF);
}
template <typename A> __device__ __forceinline__ A red_step(int op, A acc, A v) {
    if (v != v) return v;  // NaN propagates
    if (acc != acc) return acc;
    switch (op) {
    case 0: return acc + v;
    case 1: return fmax(acc, v);
    case 2: return fmin(acc, v);
    }
    return acc;
}

#define REDUCE(name, T) \
extern "C" __global__ void reduce_rows_##name(const T* x, T* y, i64 rows, i64 size, int op) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        const T* row = x + r * size; \
        A acc = red_init<A>(op); \
        for (i64 j = threadIdx.x; j < size; j += blockDim.x) acc = red_step(op, acc, to_acc(row[j])); \
        bool nan = acc != acc; \
        if (op == 0) acc = block_sum(acc); \
        else if (op == 1) acc = block_max(acc); \
        else acc = -block_max(-acc); \
        if (__syncthreads_or(nan)) acc = (A)NAN_VALUE; \
        if (threadIdx.x == 0) y[r] = from_acc<T>(acc); \
        __syncthreads(); \
    } \
} \
extern "C" __global__ void reduce_strided_##name(const T* x, T* y, i64 outer, i64 size, i64 inner, int op) { \
    typedef Acc<T>::t A; \
    FOR_EACH(t, outer * inner) { \
        i64 o = t / inner, i = t % inner; \
        const T* p = x + o * size * inner + i; \
        A acc = red_init<A>(op); \
        for (i64 j = 0; j < size; ++j) acc = red_step(op, acc, to_acc(p[j * inner])); \
        y[t] = from_acc<T>(acc); \
    } \
} \
extern "C" __global__ void argmax_##name(const T* x, i64* y, i64 outer, i64 size, i64 inner) { \
    typedef Acc<T>::t A; \
    FOR_EACH(t, outer * inner) { \
        i64 o = t / inner, i = t % inner; \
        const T* p = x + o * size * inner + i; \
        A best = (A)NEG_INF; \
        i64 at = 0; \
        for (i64 j = 0; j < size; ++j) { \
            A v = to_acc(p[j * inner]); \
            if (v != v) { at = j; break; } \
            if (v > best) { best = v; at = j; } \
        } \
        y[t] = at; \
    } \
}
FOR_FLOATS(REDUCE)

// Integer sums and extrema stay exact.
#define INT_REDUCE(name, T) \
extern "C" __global__ void reduce_strided_##name(const T* x, T* y, i64 outer, i64 size, i64 inner, int op) { \
    FOR_EACH(t, outer * inner) { \
        i64 o = t / inner, i = t % inner; \
        const T* p = x + o * size * inner + i; \
        T acc = size > 0 ? p[0] : (T)0; \
        if (op == 0) acc = 0; \
        for (i64 j = (op == 0 ? 0 : 1); j < size; ++j) { \
            T v = p[j * inner]; \
            acc = op == 0 ? (T)(acc + v) : (op == 2 ? (v < acc ? v : acc) : (v > acc ? v : acc)); \
        } \
        y[t] = acc; \
    } \
} \
extern "C" __global__ void argmax_##name(const T* x, i64* y, i64 outer, i64 size, i64 inner) { \
    FOR_EACH(t, outer * inner) { \
        i64 o = t / inner, i = t % inner; \
        const T* p = x + o * size * inner + i; \
        i64 at = 0; \
        for (i64 j = 1; j < size; ++j) if (p[j * inner] > p[at * inner]) at = j; \
        y[t] = at; \
    } \
}
INT_REDUCE(i64, i64) INT_REDUCE(i32, i32) INT_REDUCE(u8, u8)
