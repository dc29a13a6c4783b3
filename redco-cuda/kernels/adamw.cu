// AdamW over flat buffers: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// x = x (1 - lr wd) - lr (m / bias1) / (sqrt(v / bias2) + eps), computed in T's
// accumulation type; the moments are stored in T, as the composite does (the Trainer keeps
// f32 master weights, so its updates run in f32).
//
// adamw_*: one tensor, in place on x, m and v (the host hands in buffers it owns).
// adamw_many_*: every parameter of a step in one launch. `table` holds six i64 per tensor
// (x in, x out, g, m, v as device addresses, then n); `chunks` two per chunk (the tensor,
// the chunk's first element); a block takes one chunk of `chunk` elements at a time.

struct AdamStep { double lr, beta1, beta2, eps, wd, bias1, bias2; };

template <typename T>
__device__ __forceinline__ void adam_one(const T* x, T* y, const T* g, T* m, T* v, i64 i, const AdamStep& h) {
    typedef typename Acc<T>::t A;
    A lr = (A)h.lr, b1 = (A)h.beta1, b2 = (A)h.beta2, eps = (A)h.eps;
    A decay = (A)1 - (A)(h.lr * h.wd), c1 = (A)(1.0 / h.bias1), c2 = (A)(1.0 / h.bias2);
    A gi = to_acc(g[i]);
    A mi = b1 * to_acc(m[i]) + ((A)1 - b1) * gi;
    A vi = b2 * to_acc(v[i]) + ((A)1 - b2) * gi * gi;
    m[i] = from_acc<T>(mi);
    v[i] = from_acc<T>(vi);
    y[i] = from_acc<T>(to_acc(x[i]) * decay - lr * (mi * c1) / (sqrt(vi * c2) + eps));
}

#define ADAMW(name, T) \
extern "C" __global__ void adamw_##name(T* x, const T* g, T* m, T* v, i64 n, AdamStep h) { \
    FOR_EACH(i, n) adam_one<T>(x, x, g, m, v, i, h); \
} \
extern "C" __global__ void adamw_many_##name(const i64* table, const i64* chunks, i64 nchunks, i64 chunk, \
                                              AdamStep h) { \
    for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) { \
        const i64* e = table + 6 * chunks[2 * c]; \
        i64 start = chunks[2 * c + 1], end = min(e[5], start + chunk); \
        const T* x = (const T*)e[0]; \
        T* y = (T*)e[1]; \
        const T* g = (const T*)e[2]; \
        T* m = (T*)e[3]; \
        T* v = (T*)e[4]; \
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) adam_one<T>(x, y, g, m, v, i, h); \
    } \
}
FOR_FLOATS(ADAMW)

// adamw_master_<G>_<C>: the mixed-precision step of every parameter in one launch: f32
// masters read from one buffer and written to another (the same one where the host owns
// it alone), gradients of type G multiplied by `gscale` as they are read
// (the loss scale's inverse and the clipping factor folded in), f32 moments, and the
// parameter's compute copy written as C. Per element it reads G, the master and both
// moments and writes the master, the moments and the copy: for bf16 gradients and copies,
// 2 + 4 * 3 bytes in and 4 * 3 + 2 out. `table` holds seven i64 per tensor (master in,
// master out, copy, g, m, v as device addresses, then n); `chunks` as adamw_many's.
template <typename G, typename C>
__device__ __forceinline__ void adam_master_one(const float* x, float* nx, C* y, const G* g, float* m, float* v,
                                                i64 i, const AdamStep& h, float gscale) {
    float lr = (float)h.lr, b1 = (float)h.beta1, b2 = (float)h.beta2, eps = (float)h.eps;
    float decay = 1.0f - (float)(h.lr * h.wd), c1 = (float)(1.0 / h.bias1), c2 = (float)(1.0 / h.bias2);
    float gi = to_acc(g[i]) * gscale;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    float xi = x[i] * decay - lr * (mi * c1) / (sqrt(vi * c2) + eps);
    m[i] = mi;
    v[i] = vi;
    nx[i] = xi;
    y[i] = from_acc<C>(xi);
}

#define ADAMW_MASTER(gname, G, cname, C) \
extern "C" __global__ void adamw_master_##gname##_##cname(const i64* table, const i64* chunks, i64 nchunks, \
                                                          i64 chunk, AdamStep h, double gscale) { \
    float s = (float)gscale; \
    for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) { \
        const i64* e = table + 7 * chunks[2 * c]; \
        i64 start = chunks[2 * c + 1], end = min(e[6], start + chunk); \
        const float* x = (const float*)e[0]; \
        float* nx = (float*)e[1]; \
        C* y = (C*)e[2]; \
        const G* g = (const G*)e[3]; \
        float* m = (float*)e[4]; \
        float* v = (float*)e[5]; \
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) adam_master_one<G, C>(x, nx, y, g, m, v, i, h, s); \
    } \
}
FOR_MASTER(ADAMW_MASTER)
