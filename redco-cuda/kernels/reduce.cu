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

// The block-wide fold of `op` (every thread gets the result).
template <typename A> __device__ __forceinline__ A block_fold(int op, A acc) {
    if (op == 0) return block_sum(acc);
    if (op == 1) return block_max(acc);
    return -block_max(-acc);
}

// Few long rows (a whole tensor's sum is one row): each row is split into `parts`
// contiguous spans, one block each, so the reduction runs on every SM instead of one.
// reduce_split_*: block b folds span b % parts of row b / parts into partial[b] (in the
// accumulation type); reduce_parts_*: one block per row folds its parts in order.
#define REDUCE_SPLIT(name, T) \
extern "C" __global__ void __launch_bounds__(1024) reduce_split_##name(const T* x, Acc<T>::t* partial, i64 rows, \
                                                                      i64 size, i64 parts, int op) { \
    typedef Acc<T>::t A; \
    i64 span = (size + parts - 1) / parts; \
    for (i64 b = blockIdx.x; b < rows * parts; b += gridDim.x) { \
        const T* row = x + (b / parts) * size; \
        i64 lo = (b % parts) * span, hi = min(size, lo + span); \
        A acc = red_init<A>(op); \
        for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) acc = red_step(op, acc, to_acc(row[j])); \
        acc = block_fold(op, acc); \
        if (threadIdx.x == 0) partial[b] = acc; \
        __syncthreads(); \
    } \
} \
extern "C" __global__ void __launch_bounds__(1024) reduce_parts_##name(const Acc<T>::t* partial, T* y, i64 rows, \
                                                                      i64 parts, int op) { \
    typedef Acc<T>::t A; \
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) { \
        A acc = red_init<A>(op); \
        for (i64 j = threadIdx.x; j < parts; j += blockDim.x) acc = red_step(op, acc, partial[r * parts + j]); \
        acc = block_fold(op, acc); \
        if (threadIdx.x == 0) y[r] = from_acc<T>(acc); \
        __syncthreads(); \
    } \
}
FOR_FLOATS(REDUCE_SPLIT)

// The sum of squares of many tensors in f64 (a global gradient norm), read in their own
// dtype: `table` holds two i64 per tensor (its device address, its length), `chunks` two
// per chunk (the tensor, the chunk's first element). Block b folds the chunks b, b +
// gridDim.x, ... into partial[b]; sum_partials adds the blocks' partials in order (one
// block), so the result does not depend on scheduling.
#define SUM_SQUARES(name, T) \
extern "C" __global__ void __launch_bounds__(1024) sum_squares_many_##name(const i64* table, const i64* chunks, \
                                                                          i64 nchunks, i64 chunk, double* partial) { \
    double acc = 0; \
    for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) { \
        const i64* e = table + 2 * chunks[2 * c]; \
        const T* x = (const T*)e[0]; \
        i64 start = chunks[2 * c + 1], end = min(e[1], start + chunk); \
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) { \
            double v = (double)to_acc(x[i]); \
            acc += v * v; \
        } \
    } \
    acc = block_sum(acc); \
    if (threadIdx.x == 0) partial[blockIdx.x] = acc; \
}
FOR_FLOATS(SUM_SQUARES)
extern "C" __global__ void __launch_bounds__(1024) sum_partials(const double* partial, i64 n, double* y) {
    double acc = 0;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) acc += partial[j];
    acc = block_sum(acc);
    if (threadIdx.x == 0) y[0] = acc;
}

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
