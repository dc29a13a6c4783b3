// One AdamW step over flat buffers, in place on x, m and v (the host hands in buffers it
// owns): m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// x = x (1 - lr wd) - lr (m / bias1) / (sqrt(v / bias2) + eps), computed in T's
// accumulation type; the moments are stored in T, as the composite does (the Trainer keeps
// f32 master weights, so its updates run in f32).

struct AdamStep { double lr, beta1, beta2, eps, wd, bias1, bias2; };

#define ADAMW(name, T) \
extern "C" __global__ void adamw_##name(T* x, const T* g, T* m, T* v, i64 n, AdamStep h) { \
    typedef Acc<T>::t A; \
    A lr = (A)h.lr, b1 = (A)h.beta1, b2 = (A)h.beta2, eps = (A)h.eps; \
    A decay = (A)1 - (A)(h.lr * h.wd), c1 = (A)(1.0 / h.bias1), c2 = (A)(1.0 / h.bias2); \
    FOR_EACH(i, n) { \
        A gi = to_acc(g[i]); \
        A mi = b1 * to_acc(m[i]) + ((A)1 - b1) * gi; \
        A vi = b2 * to_acc(v[i]) + ((A)1 - b2) * gi * gi; \
        m[i] = from_acc<T>(mi); \
        v[i] = from_acc<T>(vi); \
        x[i] = from_acc<T>(to_acc(x[i]) * decay - lr * (mi * c1) / (sqrt(vi * c2) + eps)); \
    } \
}
FOR_FLOATS(ADAMW)
