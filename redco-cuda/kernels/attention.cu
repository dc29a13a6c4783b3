// Fused scaled-dot-product attention, forward and backward, with no [batch, heads, q, kv]
// tensor: one warp per query row (forward, dq) or per key row (dk, dv); each lane holds
// head_dim / 32 features (head_dim <= 256). Online softmax; keys past the causal limit
// (key j > i + kv_len - q_len) are never visited; grouped-query heads read their shared
// kv head (h / (q_heads / kv_heads)); the u8 keep-mask is read through broadcast strides.
// A row with no key to attend attends every key uniformly, as the composite does (its
// masked scores are all the same most-negative value).

#define MAX_PER_LANE 8

struct AttnArgs {
    i64 batch, q_heads, kv_heads, q_len, kv_len, head_dim;
    i64 ms0, ms1, ms2, ms3;  // mask strides over [batch, q_heads, q_len, kv_len]
    int causal, has_mask;
    double scale;
};

__device__ __forceinline__ bool allowed(const AttnArgs& a, const u8* mask, i64 b, i64 h, i64 i, i64 j) {
    if (a.causal && j > i + a.kv_len - a.q_len) return false;
    if (a.has_mask && !mask[b * a.ms0 + h * a.ms1 + i * a.ms2 + j * a.ms3]) return false;
    return true;
}

template <typename T, typename A>
__device__ __forceinline__ void load_row(const T* p, A* r, i64 d, int lane) {
    for (int c = 0; c < MAX_PER_LANE; ++c) {
        i64 f = lane + 32 * c;
        r[c] = f < d ? (A)to_acc(p[f]) : (A)0;
    }
}
template <typename T, typename A>
__device__ __forceinline__ A dot_row(const A* r, const T* p, i64 d, int lane) {
    A s = 0;
    for (int c = 0; c < MAX_PER_LANE; ++c) {
        i64 f = lane + 32 * c;
        if (f < d) s += r[c] * (A)to_acc(p[f]);
    }
    return warp_sum(s);
}

// The softmax statistics of query row (b, h, i): its running maximum and sum (`m`, `l`),
// and the unnormalised output in `acc`; returns false when no key is allowed (then the
// row's output is the mean of v, in `acc` with l = kv_len).
template <typename T, typename A>
__device__ bool row_stats(const AttnArgs& a, const T* k, const T* v, const u8* mask, i64 b, i64 h, i64 i,
                          const A* qv, A& m, A& l, A* acc, int lane) {
    i64 d = a.head_dim, g = h / (a.q_heads / a.kv_heads);
    const T* kb = k + (b * a.kv_heads + g) * a.kv_len * d;
    const T* vb = v + (b * a.kv_heads + g) * a.kv_len * d;
    i64 limit = a.causal ? min(a.kv_len, i + a.kv_len - a.q_len + 1) : a.kv_len;
    m = (A)NEG_INF;
    l = 0;
    for (int c = 0; c < MAX_PER_LANE; ++c) acc[c] = 0;
    bool any = false;
    for (i64 j = 0; j < limit; ++j) {
        if (!allowed(a, mask, b, h, i, j)) continue;
        A s = dot_row(qv, kb + j * d, d, lane) * (A)a.scale;
        A mn = fmax(m, s);
        A corr = exp(m - mn), p = exp(s - mn);
        l = l * corr + p;
        for (int c = 0; c < MAX_PER_LANE; ++c) {
            i64 f = lane + 32 * c;
            acc[c] = acc[c] * corr + (f < d ? p * (A)to_acc(vb[j * d + f]) : (A)0);
        }
        m = mn;
        any = true;
    }
    if (!any) {
        for (i64 j = 0; j < a.kv_len; ++j)
            for (int c = 0; c < MAX_PER_LANE; ++c) {
                i64 f = lane + 32 * c;
                if (f < d) acc[c] += (A)to_acc(vb[j * d + f]);
            }
        l = (A)a.kv_len;
        m = (A)NEG_INF;
    }
    return any;
}

#define ATTN(name, T) \
extern "C" __global__ void attn_fwd_##name(const T* q, const T* k, const T* v, const u8* mask, T* out, AttnArgs a) { \
    typedef Acc<T>::t A; \
    int lane = threadIdx.x & 31; \
    i64 rows = a.batch * a.q_heads * a.q_len, d = a.head_dim; \
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); \
    if (row >= rows) return; \
    i64 i = row % a.q_len, h = (row / a.q_len) % a.q_heads, b = row / (a.q_len * a.q_heads); \
    A qv[MAX_PER_LANE], acc[MAX_PER_LANE], m, l; \
    load_row(q + row * d, qv, d, lane); \
    row_stats<T, A>(a, k, v, mask, b, h, i, qv, m, l, acc, lane); \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = lane + 32 * c; \
        if (f < d) out[row * d + f] = from_acc<T>(acc[c] / l); \
    } \
} \
/* backward, pass 1 (a warp per query row): lse_i (+inf for a row with no allowed key), */ \
/* D_i = dO_i . O_i, and dq_i = scale sum_j p_ij (dO_i . v_j - D_i) k_j */ \
extern "C" __global__ void attn_bwd_q_##name(const T* q, const T* k, const T* v, const u8* mask, const T* dout, \
                                              T* dq, Acc<T>::t* lse, Acc<T>::t* dd, AttnArgs a) { \
    typedef Acc<T>::t A; \
    int lane = threadIdx.x & 31; \
    i64 rows = a.batch * a.q_heads * a.q_len, d = a.head_dim; \
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); \
    if (row >= rows) return; \
    i64 i = row % a.q_len, h = (row / a.q_len) % a.q_heads, b = row / (a.q_len * a.q_heads); \
    i64 g = h / (a.q_heads / a.kv_heads); \
    const T* kb = k + (b * a.kv_heads + g) * a.kv_len * d; \
    const T* vb = v + (b * a.kv_heads + g) * a.kv_len * d; \
    A qv[MAX_PER_LANE], acc[MAX_PER_LANE], go[MAX_PER_LANE], gq[MAX_PER_LANE], m, l; \
    load_row(q + row * d, qv, d, lane); \
    load_row(dout + row * d, go, d, lane); \
    bool any = row_stats<T, A>(a, k, v, mask, b, h, i, qv, m, l, acc, lane); \
    A part = 0; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { part += go[c] * (acc[c] / l); gq[c] = 0; } \
    A di = warp_sum(part); \
    A ls = any ? m + log(l) : -(A)NEG_INF; \
    if (lane == 0) { lse[row] = ls; dd[row] = di; } \
    i64 limit = (a.causal && any) ? min(a.kv_len, i + a.kv_len - a.q_len + 1) : a.kv_len; \
    for (i64 j = 0; j < limit; ++j) { \
        A p; \
        if (any) { \
            if (!allowed(a, mask, b, h, i, j)) continue; \
            p = exp(dot_row(qv, kb + j * d, d, lane) * (A)a.scale - ls); \
        } else { \
            p = (A)1 / (A)a.kv_len; \
        } \
        A ds = p * (dot_row(go, vb + j * d, d, lane) - di) * (A)a.scale; \
        for (int c = 0; c < MAX_PER_LANE; ++c) { \
            i64 f = lane + 32 * c; \
            if (f < d) gq[c] += ds * (A)to_acc(kb[j * d + f]); \
        } \
    } \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = lane + 32 * c; \
        if (f < d) dq[row * d + f] = from_acc<T>(gq[c]); \
    } \
} \
/* backward, pass 2 (a warp per key row of a kv head): dk_j and dv_j over the query rows */ \
/* of every query head sharing the kv head, from pass 1's lse and D */ \
extern "C" __global__ void attn_bwd_kv_##name(const T* q, const T* k, const T* v, const u8* mask, const T* dout, \
                                               const Acc<T>::t* lse, const Acc<T>::t* dd, T* dk, T* dv, AttnArgs a) { \
    typedef Acc<T>::t A; \
    int lane = threadIdx.x & 31; \
    i64 rows = a.batch * a.kv_heads * a.kv_len, d = a.head_dim, rep = a.q_heads / a.kv_heads; \
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); \
    if (row >= rows) return; \
    i64 j = row % a.kv_len, g = (row / a.kv_len) % a.kv_heads, b = row / (a.kv_len * a.kv_heads); \
    A kv[MAX_PER_LANE], vv[MAX_PER_LANE], gk[MAX_PER_LANE], gv[MAX_PER_LANE]; \
    load_row(k + row * d, kv, d, lane); \
    load_row(v + row * d, vv, d, lane); \
    for (int c = 0; c < MAX_PER_LANE; ++c) { gk[c] = 0; gv[c] = 0; } \
    for (i64 h = g * rep; h < (g + 1) * rep; ++h) { \
        for (i64 i = 0; i < a.q_len; ++i) { \
            i64 qrow = (b * a.q_heads + h) * a.q_len + i; \
            A ls = lse[qrow]; \
            bool none = ls == -(A)NEG_INF; \
            if (!none && !allowed(a, mask, b, h, i, j)) continue; \
            const T* qi = q + qrow * d; \
            const T* oi = dout + qrow * d; \
            A p = none ? (A)1 / (A)a.kv_len : exp(dot_row(kv, qi, d, lane) * (A)a.scale - ls); \
            A ds = p * (dot_row(vv, oi, d, lane) - dd[qrow]) * (A)a.scale; \
            for (int c = 0; c < MAX_PER_LANE; ++c) { \
                i64 f = lane + 32 * c; \
                if (f < d) { \
                    gk[c] += ds * (A)to_acc(qi[f]); \
                    gv[c] += p * (A)to_acc(oi[f]); \
                } \
            } \
        } \
    } \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = lane + 32 * c; \
        if (f < d) { dk[row * d + f] = from_acc<T>(gk[c]); dv[row * d + f] = from_acc<T>(gv[c]); } \
    } \
}
FOR_FLOATS(ATTN)
