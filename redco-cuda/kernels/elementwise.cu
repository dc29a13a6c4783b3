// Elementwise kernels: unary ops, broadcast binary ops, comparisons, where, fill, cast.
// Op codes follow the order of redco_core's UnaryOp / BinaryOp / CmpOp (see unary.rs).

template <typename A> __device__ __forceinline__ A erf_a(A x) { return erf(x); }

template <typename A> __device__ A unary_op(int op, A x, A p0, A p1) {
    const A half = (A)0.5, one = (A)1;
    const A k = (A)0.7978845608028654;  // sqrt(2 / pi)
    const A c = (A)0.044715;
    switch (op) {
    case 0: return -x;
    case 1: return exp(x);
    case 2: return log(x);
    case 3: return sqrt(x);
    case 4: return rsqrt(x);
    case 5: return one / x;
    case 6: return fabs(x);
    case 7: return tanh(x);
    case 8: return one / (one + exp(-x));
    case 9: return x > (A)0 ? x : (A)0;
    case 10: return x / (one + exp(-x));
    case 11: return half * x * (one + erf_a(x * (A)0.7071067811865476));
    case 12: return half * x * (one + tanh(k * (x + c * x * x * x)));
    case 13: return erf_a(x);
    case 14: return sin(x);
    case 15: return cos(x);
    case 16: return x * x;
    case 17: return x > (A)0 ? one : (A)0;
    case 18: {
        A s = one / (one + exp(-x));
        return s * (one + x * (one - s));
    }
    case 19: {
        A cdf = half * (one + erf_a(x * (A)0.7071067811865476));
        A pdf = exp(-half * x * x) * (A)0.3989422804014327;
        return cdf + x * pdf;
    }
    case 20: {
        A u = k * (x + c * x * x * x);
        A t = tanh(u);
        return half * (one + t) + half * x * (one - t * t) * k * (one + (A)3 * c * x * x);
    }
    case 21: return x * p0 + p1;
    case 22: return pow(x, p0);
    case 23: return x > p0 ? x : (x != x ? x : p0);
    }
    return x;
}

#define UNARY(name, T) \
extern "C" __global__ void unary_##name(const T* x, T* y, i64 n, int op, double p0, double p1) { \
    typedef Acc<T>::t A; \
    FOR_EACH(i, n) y[i] = from_acc<T>(unary_op<A>(op, to_acc(x[i]), (A)p0, (A)p1)); \
}
FOR_FLOATS(UNARY)

template <typename A> __device__ __forceinline__ A binary_op(int op, A a, A b) {
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return a >= b ? a : b;  // as the CPU backend: max(NaN, 1) = 1, max(1, NaN) = NaN
    case 5: return a <= b ? a : b;
    }
    return a;
}

#define BINARY(name, T) \
extern "C" __global__ void binary_##name(const T* a, const T* b, T* y, i64 n, Dims d, int op) { \
    typedef Acc<T>::t A; \
    FOR_EACH(i, n) { \
        i64 oa, ob, o2; \
        offsets(d, i, oa, ob, o2); \
        y[i] = from_acc<T>(binary_op<A>(op, to_acc(a[oa]), to_acc(b[ob]))); \
    } \
}
FOR_FLOATS(BINARY)

// Integer binary ops as the CPU backend does them: in f64, stored back saturating (so
// U8 1 - 2 is 0, a / 0 saturates, 0 / 0 is 0).
template <typename T> __device__ __forceinline__ T int_op(int op, T a, T b) {
    return cast_to<T>(binary_op<double>(op, (double)a, (double)b));
}
#define INT_BINARY(name, T) \
extern "C" __global__ void binary_##name(const T* a, const T* b, T* y, i64 n, Dims d, int op) { \
    FOR_EACH(i, n) { \
        i64 oa, ob, o2; \
        offsets(d, i, oa, ob, o2); \
        y[i] = int_op<T>(op, a[oa], b[ob]); \
    } \
}
INT_BINARY(i64, i64) INT_BINARY(i32, i32) INT_BINARY(u8, u8)

template <typename T> __device__ __forceinline__ bool cmp_op(int op, T a, T b) {
    switch (op) {
    case 0: return a == b;
    case 1: return a != b;
    case 2: return a < b;
    case 3: return a <= b;
    case 4: return a > b;
    case 5: return a >= b;
    }
    return false;
}
// Floats compare in their accumulation type, integers as they are.
template <typename T> __device__ __forceinline__ typename Acc<T>::t cmp_val(T v) { return to_acc(v); }
__device__ __forceinline__ i64 cmp_val(i64 v) { return v; }
__device__ __forceinline__ i64 cmp_val(i32 v) { return v; }
__device__ __forceinline__ i64 cmp_val(u8 v) { return v; }

#define COMPARE(name, T) \
extern "C" __global__ void compare_##name(const T* a, const T* b, u8* y, i64 n, Dims d, int op) { \
    FOR_EACH(i, n) { \
        i64 oa, ob, o2; \
        offsets(d, i, oa, ob, o2); \
        y[i] = cmp_op(op, cmp_val(a[oa]), cmp_val(b[ob])) ? 1 : 0; \
    } \
}
FOR_ALL(COMPARE)

#define WHERE(name, T) \
extern "C" __global__ void where_##name(const u8* c, const T* a, const T* b, T* y, i64 n, Dims d) { \
    FOR_EACH(i, n) { \
        i64 oc, oa, ob; \
        offsets(d, i, oc, oa, ob); \
        y[i] = c[oc] ? a[oa] : b[ob]; \
    } \
}
FOR_ALL(WHERE)

#define FILL(name, T) \
extern "C" __global__ void fill_##name(T* y, i64 n, double v) { \
    T t = from_acc<T>((Acc<T>::t)v); \
    FOR_EACH(i, n) y[i] = t; \
}
FOR_FLOATS(FILL)
#define INT_FILL(name, T) \
extern "C" __global__ void fill_##name(T* y, i64 n, double v) { \
    T t = (T)v; \
    FOR_EACH(i, n) y[i] = t; \
}
INT_FILL(i64, i64) INT_FILL(i32, i32) INT_FILL(u8, u8)

// cast_<from>_<to>: floats through their accumulation type (f64 <-> f64 exact), floats to
// integers truncated toward zero as Rust's `as` (NaN to 0, saturating), integers exact.
template <typename T> __device__ __forceinline__ double as_f64(T v) { return (double)to_acc(v); }
__device__ __forceinline__ double as_f64(double v) { return v; }
__device__ __forceinline__ double as_f64(i64 v) { return (double)v; }
// Integer sources go through i64 so that large values stay exact: between I64 and I32 they
// wrap, to U8 they saturate, as the CPU backend's casts do.
template <typename D> __device__ __forceinline__ D int_to(i64 v) { return cast_to<D>((double)v); }
template <> __device__ __forceinline__ i64 int_to<i64>(i64 v) { return v; }
template <> __device__ __forceinline__ i32 int_to<i32>(i64 v) { return (i32)v; }
template <> __device__ __forceinline__ u8 int_to<u8>(i64 v) { return v < 0 ? (u8)0 : (v > 255 ? (u8)255 : (u8)v); }
template <typename S, typename D> struct Conv {
    static __device__ __forceinline__ D go(S v) { return cast_to<D>(as_f64(v)); }
};
template <typename D> struct Conv<i64, D> { static __device__ __forceinline__ D go(i64 v) { return int_to<D>(v); } };
template <typename D> struct Conv<i32, D> { static __device__ __forceinline__ D go(i32 v) { return int_to<D>((i64)v); } };
template <typename D> struct Conv<u8, D> { static __device__ __forceinline__ D go(u8 v) { return int_to<D>((i64)v); } };

#define CAST(sn, S, dn, D) \
extern "C" __global__ void cast_##sn##_##dn(const S* x, D* y, i64 n) { FOR_EACH(i, n) y[i] = Conv<S, D>::go(x[i]); }
#define CAST_FROM(sn, S) CAST(sn, S, f32, float) CAST(sn, S, f64, double) CAST(sn, S, bf16, bf16) \
    CAST(sn, S, f16, f16) CAST(sn, S, i64, i64) CAST(sn, S, i32, i32) CAST(sn, S, u8, u8)
FOR_ALL(CAST_FROM)
