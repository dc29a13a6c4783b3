// Fused scaled-dot-product attention, forward and backward, tiled in the manner of flash
// attention: no [batch, heads, q, kv] tensor is ever formed.
//
// A block of W warps takes W consecutive rows of one (batch, head): query rows for the
// forward and dq passes, key rows of a kv head for the dk/dv pass. The other side is
// streamed through shared memory in tiles of `tile` rows (at most 32, chosen on the host
// so the block's shared memory fits), each loaded once for the W rows. Within a tile a lane
// takes one row of the other side (its score is a dot product over shared memory, no
// shuffle per key); the online-softmax update and the weighted sums broadcast each lane's
// value with one shuffle. Each lane holds head_dim / 32 features of its row's accumulators
// (head_dim <= 256). Tiles past the block's causal limit (key j > i + kv_len - q_len) are
// never loaded; grouped-query heads read their shared kv head (h / (q_heads / kv_heads));
// the u8 keep-mask is read through broadcast strides. A row with no key to attend attends
// every key uniformly, as the composite does (its masked scores are all the same
// most-negative value).

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

// One past the last key that query row i may attend.
__device__ __forceinline__ i64 key_limit(const AttnArgs& a, i64 i) {
    return a.causal ? max((i64)0, min(a.kv_len, i + a.kv_len - a.q_len + 1)) : a.kv_len;
}

// Rows of `d` features in shared memory are `d + 1` apart, so that 32 lanes reading the
// same feature of 32 rows hit 32 banks.
template <typename A>
__device__ __forceinline__ A* smem_rows() {
    extern __shared__ double smem_raw[];
    return (A*)smem_raw;
}

// Copies `n` rows of `d` features starting at `src` into `dst` (row pitch d + 1), zeros
// for rows past `valid`; every thread of the block takes part.
template <typename T, typename A>
__device__ __forceinline__ void load_tile(A* dst, const T* src, i64 n, i64 valid, i64 d) {
    i64 p = d + 1;
    for (i64 e = threadIdx.x; e < n * d; e += blockDim.x) {
        i64 r = e / d, f = e - r * d;
        dst[r * p + f] = r < valid ? (A)to_acc(src[r * d + f]) : (A)0;
    }
}

// The dot product of two shared rows of `d` features.
template <typename A>
__device__ __forceinline__ A dot_shared(const A* x, const A* y, i64 d) {
    A s = 0;
    for (i64 f = 0; f < d; ++f) s += x[f] * y[f];
    return s;
}

// acc[c] += sum over the tile's rows t of w_t * rows[t][lane + 32 c], w_t held by lane t.
template <typename A>
__device__ __forceinline__ void add_weighted(A* acc, A w, const A* rows, i64 n, i64 d, int lane) {
    i64 p = d + 1;
    for (i64 t = 0; t < n; ++t) {
        A wt = __shfl_sync(0xffffffffu, w, (int)t);
        if (wt == (A)0) continue;
        for (int c = 0; c < MAX_PER_LANE; ++c) {
            i64 f = lane + 32 * c;
            if (f < d) acc[c] += wt * rows[t * p + f];
        }
    }
}

// The online softmax of query row i (its features in shared `qs`) over the keys of one
// (batch, kv head): the running maximum `m` and sum `l`, the unnormalised output in `acc`.
// `ks`, `vs` are the block's tile buffers; every warp of the block calls this with the same
// `block_limit` (the furthest key any of its rows may attend), so the tile loads and
// barriers line up. Returns false when row i attends no key (then `acc` is the sum of
// every v and l = kv_len).
template <typename T, typename A>
__device__ bool row_softmax(const AttnArgs& a, const T* kb, const T* vb, const u8* mask, i64 b, i64 h, i64 i,
                            bool live, i64 block_limit, int tile, const A* qs, A* ks, A* vs, A& m, A& l, A* acc,
                            int lane) {
    i64 d = a.head_dim, p = d + 1;
    m = (A)NEG_INF;
    l = 0;
    for (int c = 0; c < MAX_PER_LANE; ++c) acc[c] = 0;
    for (i64 k0 = 0; k0 < block_limit; k0 += tile) {
        i64 n = min((i64)tile, a.kv_len - k0);
        __syncthreads();
        load_tile(ks, kb + k0 * d, tile, n, d);
        load_tile(vs, vb + k0 * d, tile, n, d);
        __syncthreads();
        if (!live) continue;
        i64 j = k0 + lane;
        bool ok = lane < n && allowed(a, mask, b, h, i, j);
        A s = ok ? dot_shared(qs, ks + lane * p, d) * (A)a.scale : (A)NEG_INF;
        A tmax = warp_max(s);
        if (tmax == (A)NEG_INF) continue;
        A mn = fmax(m, tmax);
        A corr = exp(m - mn), pj = ok ? exp(s - mn) : (A)0;
        l = l * corr + warp_sum(pj);
        for (int c = 0; c < MAX_PER_LANE; ++c) acc[c] *= corr;
        add_weighted(acc, pj, vs, n, d, lane);
        m = mn;
    }
    if (!live || m != (A)NEG_INF) return true;
    // no key allowed: the mean of v (read from global memory; a rare row)
    for (i64 j = 0; j < a.kv_len; ++j)
        for (int c = 0; c < MAX_PER_LANE; ++c) {
            i64 f = lane + 32 * c;
            if (f < d) acc[c] += (A)to_acc(vb[j * d + f]);
        }
    l = (A)a.kv_len;
    return false;
}

// The block's rows: `rows_per` rows of each of `groups` (batch, head) pairs, block
// blockIdx.x taking rows [r0, r0 + W) of pair `pair`; warp w has row r0 + w.
struct BlockRows { i64 pair, r0, row; int lane, warps; };
__device__ __forceinline__ BlockRows block_rows(i64 rows_per) {
    BlockRows r;
    r.warps = blockDim.x >> 5;
    i64 tiles = (rows_per + r.warps - 1) / r.warps;
    r.pair = blockIdx.x / tiles;
    r.r0 = (blockIdx.x % tiles) * r.warps;
    r.row = r.r0 + (threadIdx.x >> 5);
    r.lane = threadIdx.x & 31;
    return r;
}

// Shared layout of the forward and dq passes: ks, vs (tile rows each), then one query row
// and one output-gradient row per warp.
#define ATTN(name, T) \
extern "C" __global__ void attn_fwd_##name(const T* q, const T* k, const T* v, const u8* mask, T* out, AttnArgs a, \
                                           int tile) { \
    typedef Acc<T>::t A; \
    BlockRows br = block_rows(a.q_len); \
    i64 d = a.head_dim, p = d + 1; \
    i64 h = br.pair % a.q_heads, b = br.pair / a.q_heads, g = h / (a.q_heads / a.kv_heads); \
    i64 i = br.row; \
    bool live = i < a.q_len; \
    A* ks = smem_rows<A>(); \
    A* vs = ks + tile * p; \
    A* qs = vs + tile * p + (threadIdx.x >> 5) * p; \
    i64 qrow = (br.pair * a.q_len + i) * d; \
    for (i64 f = br.lane; f < d; f += 32) qs[f] = live ? (A)to_acc(q[qrow + f]) : (A)0; \
    __syncwarp(); \
    i64 last = min(a.q_len, br.r0 + br.warps) - 1; \
    i64 limit = key_limit(a, last); \
    const T* kb = k + (b * a.kv_heads + g) * a.kv_len * d; \
    const T* vb = v + (b * a.kv_heads + g) * a.kv_len * d; \
    A acc[MAX_PER_LANE], m, l; \
    row_softmax<T, A>(a, kb, vb, mask, b, h, i, live, limit, tile, qs, ks, vs, m, l, acc, br.lane); \
    if (!live) return; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = br.lane + 32 * c; \
        if (f < d) out[qrow + f] = from_acc<T>(acc[c] / l); \
    } \
} \
/* backward, pass 1 (query rows): lse_i (+inf for a row with no allowed key), */ \
/* D_i = dO_i . O_i, and dq_i = scale sum_j p_ij (dO_i . v_j - D_i) k_j */ \
extern "C" __global__ void attn_bwd_q_##name(const T* q, const T* k, const T* v, const u8* mask, const T* dout, \
                                              T* dq, Acc<T>::t* lse, Acc<T>::t* dd, AttnArgs a, int tile) { \
    typedef Acc<T>::t A; \
    BlockRows br = block_rows(a.q_len); \
    i64 d = a.head_dim, p = d + 1; \
    i64 h = br.pair % a.q_heads, b = br.pair / a.q_heads, g = h / (a.q_heads / a.kv_heads); \
    i64 i = br.row; \
    bool live = i < a.q_len; \
    int w = threadIdx.x >> 5; \
    A* ks = smem_rows<A>(); \
    A* vs = ks + tile * p; \
    A* qs = vs + tile * p + w * p; \
    A* os = vs + tile * p + (br.warps + w) * p; \
    i64 qrow = br.pair * a.q_len + i; \
    for (i64 f = br.lane; f < d; f += 32) { \
        qs[f] = live ? (A)to_acc(q[qrow * d + f]) : (A)0; \
        os[f] = live ? (A)to_acc(dout[qrow * d + f]) : (A)0; \
    } \
    __syncwarp(); \
    i64 last = min(a.q_len, br.r0 + br.warps) - 1; \
    i64 limit = key_limit(a, last); \
    const T* kb = k + (b * a.kv_heads + g) * a.kv_len * d; \
    const T* vb = v + (b * a.kv_heads + g) * a.kv_len * d; \
    A acc[MAX_PER_LANE], gq[MAX_PER_LANE], m, l; \
    bool any = row_softmax<T, A>(a, kb, vb, mask, b, h, i, live, limit, tile, qs, ks, vs, m, l, acc, br.lane); \
    A part = 0; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = br.lane + 32 * c; \
        if (f < d) part += os[f] * (acc[c] / l); \
        gq[c] = 0; \
    } \
    A di = warp_sum(part); \
    A ls = any ? m + log(l) : -(A)NEG_INF; \
    if (live && br.lane == 0) { lse[qrow] = ls; dd[qrow] = di; } \
    /* a row with no allowed key spreads over every key: the block then walks them all */ \
    bool none = live && !any; \
    i64 walk = __syncthreads_or(none) ? a.kv_len : limit; \
    for (i64 k0 = 0; k0 < walk; k0 += tile) { \
        i64 n = min((i64)tile, a.kv_len - k0); \
        __syncthreads(); \
        load_tile(ks, kb + k0 * d, tile, n, d); \
        load_tile(vs, vb + k0 * d, tile, n, d); \
        __syncthreads(); \
        if (!live) continue; \
        i64 j = k0 + br.lane; \
        A pj = 0; \
        if (br.lane < n) { \
            if (any) { \
                if (allowed(a, mask, b, h, i, j)) pj = exp(dot_shared(qs, ks + br.lane * p, d) * (A)a.scale - ls); \
            } else { \
                pj = (A)1 / (A)a.kv_len; \
            } \
        } \
        A ds = pj == (A)0 ? (A)0 : pj * (dot_shared(os, vs + br.lane * p, d) - di) * (A)a.scale; \
        add_weighted(gq, ds, ks, n, d, br.lane); \
    } \
    if (!live) return; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = br.lane + 32 * c; \
        if (f < d) dq[qrow * d + f] = from_acc<T>(gq[c]); \
    } \
} \
/* backward, pass 2 (key rows of a kv head): dk_j and dv_j over the query rows of every */ \
/* query head sharing the kv head, from pass 1's lse and D. Shared: the query tile, the */ \
/* output-gradient tile, their lse and D, then each warp's key and value rows. */ \
extern "C" __global__ void attn_bwd_kv_##name(const T* q, const T* k, const T* v, const u8* mask, const T* dout, \
                                               const Acc<T>::t* lse, const Acc<T>::t* dd, T* dk, T* dv, AttnArgs a, \
                                               int tile) { \
    typedef Acc<T>::t A; \
    BlockRows br = block_rows(a.kv_len); \
    i64 d = a.head_dim, p = d + 1, rep = a.q_heads / a.kv_heads; \
    i64 g = br.pair % a.kv_heads, b = br.pair / a.kv_heads; \
    i64 j = br.row; \
    bool live = j < a.kv_len; \
    int w = threadIdx.x >> 5; \
    A* qs = smem_rows<A>(); \
    A* os = qs + tile * p; \
    A* ls = os + tile * p; \
    A* ds_ = ls + tile; \
    A* kr = ds_ + tile + w * p; \
    A* vr = ds_ + tile + (br.warps + w) * p; \
    i64 krow = br.pair * a.kv_len + j; \
    for (i64 f = br.lane; f < d; f += 32) { \
        kr[f] = live ? (A)to_acc(k[krow * d + f]) : (A)0; \
        vr[f] = live ? (A)to_acc(v[krow * d + f]) : (A)0; \
    } \
    __syncwarp(); \
    A gk[MAX_PER_LANE], gv[MAX_PER_LANE]; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { gk[c] = 0; gv[c] = 0; } \
    /* query rows before the block's first key's causal start attend none of its keys, */ \
    /* unless some row attends no key at all (a mask, or more queries than keys) */ \
    i64 start = (a.causal && !a.has_mask && a.kv_len >= a.q_len) ? max((i64)0, br.r0 - (a.kv_len - a.q_len)) : 0; \
    start = (start / tile) * tile; \
    for (i64 h = g * rep; h < (g + 1) * rep; ++h) { \
        i64 base = (b * a.q_heads + h) * a.q_len; \
        for (i64 i0 = start; i0 < a.q_len; i0 += tile) { \
            i64 n = min((i64)tile, a.q_len - i0); \
            __syncthreads(); \
            load_tile(qs, q + (base + i0) * d, tile, n, d); \
            load_tile(os, dout + (base + i0) * d, tile, n, d); \
            for (i64 t = threadIdx.x; t < tile; t += blockDim.x) { \
                ls[t] = t < n ? lse[base + i0 + t] : (A)0; \
                ds_[t] = t < n ? dd[base + i0 + t] : (A)0; \
            } \
            __syncthreads(); \
            if (!live) continue; \
            i64 i = i0 + br.lane; \
            A pi = 0, gi = 0; \
            if (br.lane < n) { \
                A li = ls[br.lane]; \
                bool none = li == -(A)NEG_INF; \
                if (none || allowed(a, mask, b, h, i, j)) { \
                    pi = none ? (A)1 / (A)a.kv_len : exp(dot_shared(kr, qs + br.lane * p, d) * (A)a.scale - li); \
                    gi = pi * (dot_shared(vr, os + br.lane * p, d) - ds_[br.lane]) * (A)a.scale; \
                } \
            } \
            add_weighted(gk, gi, qs, n, d, br.lane); \
            add_weighted(gv, pi, os, n, d, br.lane); \
        } \
    } \
    if (!live) return; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = br.lane + 32 * c; \
        if (f < d) { dk[krow * d + f] = from_acc<T>(gk[c]); dv[krow * d + f] = from_acc<T>(gv[c]); } \
    } \
}
FOR_FLOATS(ATTN)

// Paged attention of a ragged batch (redco_core::ops::paged_attention): the queries of
// several sequences in one batch, each sequence's keys and values in rows of a shared pool
// listed by its slot table. One warp per (token, query head): each lane holds head_dim /
// 32 features of its query and accumulator, a key's score is the lanes' partial dot
// products summed by shuffles, and an online softmax runs over the key rows the slot
// table lists, read in place from the pool ([rows, kv_heads, head_dim]). Causal: query i
// of a segment sees its first kv_len - q_len + i + 1 keys (always at least one).
//
// `tab` (i32): the segment of each token, then at `segs_at` four words per segment
// (q_start, q_len, kv_len, slots_at: where its slots begin in `tab`), then the slots.

struct PagedArgs {
    i64 q_heads, kv_heads, tokens, head_dim, segs_at;
    double scale;
};

#define PAGED(name, T) \
extern "C" __global__ void paged_attn_##name(const T* q, const T* k, const T* v, T* out, const i32* tab, \
                                             PagedArgs a) { \
    typedef typename Acc<T>::t A; \
    i64 t = blockIdx.x, h = blockIdx.y; \
    int lane = threadIdx.x; \
    const i32* sg = tab + a.segs_at + 4 * (i64)tab[t]; \
    i64 q_start = sg[0], q_len = sg[1], kv_len = sg[2]; \
    const i32* slots = tab + sg[3]; \
    i64 lim = kv_len - q_len + (t - q_start) + 1; \
    i64 kvh = h / (a.q_heads / a.kv_heads); \
    i64 d = a.head_dim; \
    i64 row = (h * a.tokens + t) * d; \
    A qv[MAX_PER_LANE], acc[MAX_PER_LANE]; \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = lane + 32 * c; \
        qv[c] = f < d ? (A)to_acc(q[row + f]) : (A)0; \
        acc[c] = 0; \
    } \
    A mx = (A)NEG_INF, l = 0; \
    for (i64 j = 0; j < lim; ++j) { \
        i64 kr = ((i64)slots[j] * a.kv_heads + kvh) * d; \
        A s = 0; \
        for (int c = 0; c < MAX_PER_LANE; ++c) { \
            i64 f = lane + 32 * c; \
            if (f < d) s += qv[c] * (A)to_acc(k[kr + f]); \
        } \
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o); \
        s *= (A)a.scale; \
        A mn = s > mx ? s : mx; \
        A corr = exp(mx - mn), p = exp(s - mn); \
        l = l * corr + p; \
        for (int c = 0; c < MAX_PER_LANE; ++c) { \
            i64 f = lane + 32 * c; \
            if (f < d) acc[c] = acc[c] * corr + p * (A)to_acc(v[kr + f]); \
        } \
        mx = mn; \
    } \
    for (int c = 0; c < MAX_PER_LANE; ++c) { \
        i64 f = lane + 32 * c; \
        if (f < d) out[row + f] = from_acc<T>(acc[c] / l); \
    } \
}
FOR_FLOATS(PAGED)
