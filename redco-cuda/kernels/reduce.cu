// Reductions along one dimension of a tensor viewed as [outer, size, inner]: one block
// per output row when inner == 1 (the last dimension, contiguous), else one thread per
// output element walking the strided dimension. Op codes: 0 sum, 1 max, 2 min, 3 argmax.

template <typename A> __device__ __forceinline__ A red_init(int op) {
    return op == 0 ? (A)0 : (op == 2 ? -(A)NEG_INF : (A)NEG_INF);
}
// As the CPU backend: a sum propagates NaN, max and min skip it (IEEE maxNum / minNum).
template <typename A> __device__ __forceinline__ A red_step(int op, A acc, A v) {
    switch (op) {
    case 0: return acc + v;
    case 1: return fmax(acc, v);
    case 2: return fmin(acc, v);
    }
    return acc;
}

#define REDUCE(name, T) \
extern "C" __global__ void __launch_bounds__(1024) reduce_rows_##name(const T* x, T* y, i64 rows, i64 size, int op) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        const T* row = x + r * size; \
        A acc = red_init<A>(op); \
        for (i64 j = threadIdx.x; j < size; j += blockDim.x) acc = red_step(op, acc, to_acc(row[j])); \
        if (op == 0) acc = block_sum(acc); \
        else if (op == 1) acc = block_max(acc); \
        else acc = -block_max(-acc); \
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
        /* as the CPU backend: the first element, then any strictly greater one (NaN never is) */ \
        A best = size > 0 ? (A)to_acc(p[0]) : (A)NEG_INF; \
        i64 at = 0; \
        for (i64 j = 1; j < size; ++j) { \
            A v = to_acc(p[j * inner]); \
            if (v > best) { best = v; at = j; } \
        } \
        y[t] = at; \
    } \
}
FOR_FLOATS(REDUCE)

// Integer reductions as the CPU backend does them: in f64, stored back saturating.
#define INT_REDUCE(name, T) \
extern "C" __global__ void reduce_strided_##name(const T* x, T* y, i64 outer, i64 size, i64 inner, int op) { \
    FOR_EACH(t, outer * inner) { \
        i64 o = t / inner, i = t % inner; \
        const T* p = x + o * size * inner + i; \
        double acc = red_init<double>(op); \
        for (i64 j = 0; j < size; ++j) acc = red_step(op, acc, (double)p[j * inner]); \
        y[t] = cast_to<T>(acc); \
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
