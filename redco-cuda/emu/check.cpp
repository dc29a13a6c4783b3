// Runs the block-quantized products, the attention kernels (forward, dq, dk/dv), paged attention, the multi-tensor AdamW (and its
// mixed-precision form over f32 masters), the split-row reductions, the multi-tensor sum of squares, LayerNorm and
// RMSNorm forward and backward, softmax, and the fused cross-entropy forward and backward
// of `kernels/` on the emulated thread model
// against f64 references, in f32 and f64. Attention:
// grouped heads, causal with more or fewer queries than keys, padding masks with a fully
// masked row, head sizes that are not a multiple of 32, and tiles of 32 and 7 rows.
// Built and run by `tests/emulated.rs`; prints one line per check and exits 1 on a failure.
#include "emu.h"
#include "common.cuh"
#include "attention.cu"
#include "adamw.cu"
#include "reduce.cu"
SUM_SQUARES(bf16, bf16)  // FOR_FLOATS is f32 and f64 here
#include "norm.cu"
#include "softmax.cu"
#include "cross_entropy.cu"
#include "quant.cu"
#include <algorithm>
#include <random>
#include <string>
#include <tuple>

struct Case { i64 b, hq, hk, tq, tk, d; int causal, mask; };

int fails = 0;

// The worst relative error |got - want| / (1 + |want|) and where it is; a NaN (an element
// never written: outputs start as NaN) counts as an infinite error.
template <typename T>
std::pair<double, i64> worst_error(const std::vector<T>& got, const std::vector<double>& want) {
    double worst = 0;
    i64 at = -1;
    for (size_t i = 0; i < want.size(); ++i) {
        double e = std::fabs((double)got[i] - want[i]) / (1 + std::fabs(want[i]));
        if (e != e) e = INFINITY;
        if (e > worst || at < 0) { worst = e; at = (i64)i; }
    }
    return {worst, at};
}
template <typename T>
void run(const Case& c, int tile, unsigned seed) {
    typedef typename Acc<T>::t A;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> U(-1, 1);
    i64 nq = c.b * c.hq * c.tq * c.d, nk = c.b * c.hk * c.tk * c.d;
    std::vector<double> q(nq), k(nk), v(nk), go(nq);
    for (auto* x : {&q, &k, &v, &go}) for (auto& e : *x) e = U(rng);
    // mask [b, 1, tq, tk]: random keeps, and one fully masked row per batch
    std::vector<u8> mask(c.b * c.tq * c.tk, 1);
    if (c.mask) {
        for (auto& m : mask) m = (rng() % 4) != 0;
        for (i64 bb = 0; bb < c.b; ++bb) for (i64 j = 0; j < c.tk; ++j) mask[(bb * c.tq + (c.tq / 2)) * c.tk + j] = 0;
    }
    double scale = 1.0 / std::sqrt((double)c.d);
    AttnArgs a{c.b, c.hq, c.hk, c.tq, c.tk, c.d, c.tq * c.tk, 0, c.tk, 1, c.causal, c.mask, scale};
    auto keep = [&](i64 bb, i64 i, i64 j) {
        if (c.causal && j > i + c.tk - c.tq) return false;
        return !c.mask || mask[(bb * c.tq + i) * c.tk + j] != 0;
    };
    // f64 reference
    std::vector<double> out(nq), dq(nq), dk(nk, 0), dv(nk, 0);
    i64 rep = c.hq / c.hk;
    for (i64 bb = 0; bb < c.b; ++bb) for (i64 h = 0; h < c.hq; ++h) for (i64 i = 0; i < c.tq; ++i) {
        i64 g = h / rep;
        const double* qi = &q[((bb * c.hq + h) * c.tq + i) * c.d];
        const double* oi = &go[((bb * c.hq + h) * c.tq + i) * c.d];
        auto kj = [&](i64 j) { return &k[((bb * c.hk + g) * c.tk + j) * c.d]; };
        auto vj = [&](i64 j) { return &v[((bb * c.hk + g) * c.tk + j) * c.d]; };
        std::vector<double> p(c.tk, 0);
        double mx = -INFINITY; bool any = false;
        for (i64 j = 0; j < c.tk; ++j) if (keep(bb, i, j)) {
            double s = 0; for (i64 f = 0; f < c.d; ++f) s += qi[f] * kj(j)[f];
            p[j] = s * scale; mx = std::max(mx, p[j]); any = true;
        }
        double sum = 0;
        for (i64 j = 0; j < c.tk; ++j) {
            if (!any) p[j] = 1.0 / c.tk;
            else if (keep(bb, i, j)) { p[j] = std::exp(p[j] - mx); sum += p[j]; }
            else p[j] = 0;
        }
        if (any) for (auto& e : p) e /= sum;
        double* o = &out[((bb * c.hq + h) * c.tq + i) * c.d];
        for (i64 f = 0; f < c.d; ++f) { o[f] = 0; for (i64 j = 0; j < c.tk; ++j) o[f] += p[j] * vj(j)[f]; }
        double D = 0; for (i64 f = 0; f < c.d; ++f) D += oi[f] * o[f];
        double* gq = &dq[((bb * c.hq + h) * c.tq + i) * c.d];
        for (i64 f = 0; f < c.d; ++f) gq[f] = 0;
        for (i64 j = 0; j < c.tk; ++j) {
            double dp = 0; for (i64 f = 0; f < c.d; ++f) dp += oi[f] * vj(j)[f];
            double ds = p[j] * (dp - D) * scale;
            for (i64 f = 0; f < c.d; ++f) {
                gq[f] += ds * kj(j)[f];
                dk[((bb * c.hk + g) * c.tk + j) * c.d + f] += ds * qi[f];
                dv[((bb * c.hk + g) * c.tk + j) * c.d + f] += p[j] * oi[f];
            }
        }
    }
    auto cvt = [](const std::vector<double>& x) { return std::vector<T>(x.begin(), x.end()); };
    auto tq = cvt(q), tk = cvt(k), tv = cvt(v), tg = cvt(go);
    std::vector<T> kout(nq, (T)NAN), kdq(nq, (T)NAN), kdk(nk, (T)NAN), kdv(nk, (T)NAN);
    std::vector<A> lse(c.b * c.hq * c.tq), dd(c.b * c.hq * c.tq);
    unsigned W = 4;
    auto blocks = [&](i64 rows, i64 pairs) { return (unsigned)(((rows + W - 1) / W) * pairs); };
    const u8* mp = c.mask ? mask.data() : nullptr;
    if (sizeof(T) == 4) {
        launch(blocks(c.tq, c.b * c.hq), 32 * W, [&] { attn_fwd_f32((const float*)tq.data(), (const float*)tk.data(), (const float*)tv.data(), mp, (float*)kout.data(), a, tile); });
        launch(blocks(c.tq, c.b * c.hq), 32 * W, [&] { attn_bwd_q_f32((const float*)tq.data(), (const float*)tk.data(), (const float*)tv.data(), mp, (const float*)tg.data(), (float*)kdq.data(), (float*)lse.data(), (float*)dd.data(), a, tile); });
        launch(blocks(c.tk, c.b * c.hk), 32 * W, [&] { attn_bwd_kv_f32((const float*)tq.data(), (const float*)tk.data(), (const float*)tv.data(), mp, (const float*)tg.data(), (const float*)lse.data(), (const float*)dd.data(), (float*)kdk.data(), (float*)kdv.data(), a, tile); });
    } else {
        launch(blocks(c.tq, c.b * c.hq), 32 * W, [&] { attn_fwd_f64((const double*)tq.data(), (const double*)tk.data(), (const double*)tv.data(), mp, (double*)kout.data(), a, tile); });
        launch(blocks(c.tq, c.b * c.hq), 32 * W, [&] { attn_bwd_q_f64((const double*)tq.data(), (const double*)tk.data(), (const double*)tv.data(), mp, (const double*)tg.data(), (double*)kdq.data(), (double*)lse.data(), (double*)dd.data(), a, tile); });
        launch(blocks(c.tk, c.b * c.hk), 32 * W, [&] { attn_bwd_kv_f64((const double*)tq.data(), (const double*)tk.data(), (const double*)tv.data(), mp, (const double*)tg.data(), (const double*)lse.data(), (const double*)dd.data(), (double*)kdk.data(), (double*)kdv.data(), a, tile); });
    }
    double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
    auto cmp = [&](const char* what, const std::vector<T>& got, const std::vector<double>& want) {
        auto [worst, at] = worst_error(got, want);
        bool ok = worst <= tol;
        if (!ok) { ++fails; }
        printf("%s %-4s b%lld hq%lld hk%lld tq%lld tk%lld d%lld causal%d mask%d tile%d: %s worst %.2e at %lld\n",
               ok ? "ok  " : "FAIL", what, c.b, c.hq, c.hk, c.tq, c.tk, c.d, c.causal, c.mask, tile,
               sizeof(T) == 4 ? "f32" : "f64", worst, at);
    };
    cmp("out", kout, out); cmp("dq", kdq, dq); cmp("dk", kdk, dk); cmp("dv", kdv, dv);
}

// adamw_many over tensors of 1, CHUNK - 1, CHUNK + 1 and 3 CHUNK elements (chunks of
// 64 here), from the table and chunk list the host builds, against the f64 update.
template <typename T>
void adamw_many_check() {
    const i64 chunk = 64;
    std::vector<i64> sizes = {1, chunk - 1, chunk + 1, 3 * chunk};
    AdamStep h{3e-3, 0.9, 0.95, 1e-8, 0.1, 0.19, 0.0975};
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> U(-1, 1);
    std::vector<std::vector<T>> x, y, g, m, v;
    std::vector<std::vector<double>> want_x, want_m, want_v;
    std::vector<i64> table, chunks;
    for (size_t t = 0; t < sizes.size(); ++t) {
        i64 n = sizes[t];
        x.emplace_back(n); y.emplace_back(n, (T)NAN); g.emplace_back(n); m.emplace_back(n); v.emplace_back(n);
        want_x.emplace_back(n); want_m.emplace_back(n); want_v.emplace_back(n);
        for (i64 i = 0; i < n; ++i) {
            x[t][i] = (T)U(rng); g[t][i] = (T)(0.5 * U(rng)); m[t][i] = (T)(0.1 * U(rng)); v[t][i] = (T)(0.005 * (1 + U(rng)));
            double mi = h.beta1 * m[t][i] + (1 - h.beta1) * g[t][i];
            double vi = h.beta2 * v[t][i] + (1 - h.beta2) * g[t][i] * g[t][i];
            want_m[t][i] = mi; want_v[t][i] = vi;
            want_x[t][i] = x[t][i] * (1 - h.lr * h.wd) - h.lr * (mi / h.bias1) / (std::sqrt(vi / h.bias2) + h.eps);
        }
        for (const void* p : {(const void*)x[t].data(), (const void*)y[t].data(), (const void*)g[t].data(), (const void*)m[t].data(), (const void*)v[t].data()})
            table.push_back((i64)p);
        table.push_back(n);
        for (i64 s = 0; s < n; s += chunk) { chunks.push_back((i64)t); chunks.push_back(s); }
    }
    i64 nc = (i64)chunks.size() / 2;
    auto x0 = x;
    // fewer blocks than chunks: each block loops
    launch(3, 256, [&] {
        if (sizeof(T) == 4) adamw_many_f32(table.data(), chunks.data(), nc, chunk, h);
        else adamw_many_f64(table.data(), chunks.data(), nc, chunk, h);
    });
    double tol = sizeof(T) == 4 ? 1e-5 : 1e-12, worst = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
        for (auto [got, want] : {std::pair{&y[t], &want_x[t]}, {&m[t], &want_m[t]}, {&v[t], &want_v[t]}})
            worst = std::max(worst, worst_error(*got, *want).first);
        for (i64 i = 0; i < sizes[t]; ++i)
            worst = std::max(worst, x[t][i] == x0[t][i] ? 0.0 : 1.0);  // the input parameter is left alone
    }
    bool ok = worst <= tol;
    fails += !ok;
    printf("%s adamw_many %s: worst %.2e\n", ok ? "ok  " : "FAIL", sizeof(T) == 4 ? "f32" : "f64", worst);
}

// LayerNorm / RMSNorm forward and input gradient, softmax and log-softmax: rows of n,
// launched with `threads` per block over `grid` blocks (fewer than the rows: blocks loop).
template <typename T>
void rows_check(i64 rows, i64 n, unsigned threads, unsigned grid) {
    std::mt19937 rng(11 + n);
    std::uniform_real_distribution<double> U(-2, 2);
    std::vector<double> x(rows * n), g(rows * n), w(n), bias(n);
    for (auto* v : {&x, &g, &w, &bias}) for (auto& e : *v) e = U(rng);
    auto cvt = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
    auto tx = cvt(x), tg = cvt(g), tw = cvt(w), tb = cvt(bias);
    double eps = 1e-5, tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
    const char* tn = sizeof(T) == 4 ? "f32" : "f64";
    auto report = [&](const char* what, const std::vector<T>& got, const std::vector<double>& want) {
        double worst = worst_error(got, want).first;
        bool ok = worst <= tol;
        fails += !ok;
        printf("%s %-18s rows %lld n %lld threads %u grid %u %s: worst %.2e\n", ok ? "ok  " : "FAIL", what, rows, n,
               threads, grid, tn, worst);
    };
    for (int center : {1, 0}) {
        for (int hw : {0, 1}) {
            std::vector<double> y(rows * n), dx(rows * n);
            for (i64 r = 0; r < rows; ++r) {
                const double* xr = &x[r * n]; const double* gr = &g[r * n];
                double mean = 0, var = 0, m1 = 0, m2 = 0;
                if (center) { for (i64 j = 0; j < n; ++j) mean += xr[j]; mean /= n; }
                for (i64 j = 0; j < n; ++j) var += (xr[j] - mean) * (xr[j] - mean);
                double rstd = 1 / std::sqrt(var / n + eps);
                for (i64 j = 0; j < n; ++j) {
                    double xh = (xr[j] - mean) * rstd, gx = hw ? gr[j] * w[j] : gr[j];
                    y[r * n + j] = xh * (hw ? w[j] : 1) + (center && hw ? bias[j] : 0);
                    m1 += gx; m2 += gx * xh;
                }
                for (i64 j = 0; j < n; ++j) {
                    double xh = (xr[j] - mean) * rstd, gx = hw ? gr[j] * w[j] : gr[j];
                    dx[r * n + j] = rstd * (gx - (center ? m1 / n : 0) - xh * m2 / n);
                }
            }
            std::vector<T> ky(rows * n, (T)NAN), kdx(rows * n, (T)NAN);
            const T* wp = hw ? tw.data() : nullptr;
            const T* bp = center && hw ? tb.data() : nullptr;
            launch(grid, threads, [&] {
                if constexpr (sizeof(T) == 4) {
                    if (center) layer_norm_f32(tx.data(), wp, bp, ky.data(), rows, n, eps);
                    else rms_norm_f32(tx.data(), wp, ky.data(), rows, n, eps);
                    norm_bwd_f32(tx.data(), wp, tg.data(), kdx.data(), rows, n, eps, center);
                } else {
                    if (center) layer_norm_f64(tx.data(), wp, bp, ky.data(), rows, n, eps);
                    else rms_norm_f64(tx.data(), wp, ky.data(), rows, n, eps);
                    norm_bwd_f64(tx.data(), wp, tg.data(), kdx.data(), rows, n, eps, center);
                }
            });
            std::string what = std::string(center ? "layer_norm" : "rms_norm") + (hw ? "+w" : "");
            report(what.c_str(), ky, y);
            report((what + " bwd").c_str(), kdx, dx);
        }
    }
    for (int log_out : {0, 1}) {
        std::vector<double> y(rows * n);
        for (i64 r = 0; r < rows; ++r) {
            double m = -INFINITY, s = 0;
            for (i64 j = 0; j < n; ++j) m = std::max(m, x[r * n + j]);
            for (i64 j = 0; j < n; ++j) s += std::exp(x[r * n + j] - m);
            for (i64 j = 0; j < n; ++j) y[r * n + j] = log_out ? x[r * n + j] - m - std::log(s) : std::exp(x[r * n + j] - m) / s;
        }
        std::vector<T> ky(rows * n, (T)NAN);
        launch(grid, threads, [&] {
            if constexpr (sizeof(T) == 4) softmax_f32(tx.data(), ky.data(), rows, n, log_out);
            else softmax_f64(tx.data(), ky.data(), rows, n, log_out);
        });
        report(log_out ? "log_softmax" : "softmax", ky, y);
    }
}

// The fused cross-entropy and its gradient over `vocab`, with an ignored row and, when
// `bad`, a target out of range (flagged, its row 0).
template <typename T>
void xent_check(i64 rows, i64 vocab, unsigned threads, unsigned grid, bool bad) {
    std::mt19937 rng(5 + vocab);
    std::uniform_real_distribution<double> U(-4, 4);
    std::vector<double> x(rows * vocab), g(rows);
    for (auto& e : x) e = U(rng);
    for (auto& e : g) e = U(rng);
    std::vector<i64> t(rows);
    for (i64 r = 0; r < rows; ++r) t[r] = (i64)(rng() % vocab);
    const i64 ignore = -100;
    t[1] = ignore;
    if (bad) t[rows - 1] = vocab + 3;
    std::vector<double> loss(rows, 0), dx(rows * vocab, 0);
    for (i64 r = 0; r < rows; ++r) {
        if (t[r] == ignore || t[r] < 0 || t[r] >= vocab) continue;
        double m = -INFINITY, s = 0;
        for (i64 j = 0; j < vocab; ++j) m = std::max(m, x[r * vocab + j]);
        for (i64 j = 0; j < vocab; ++j) s += std::exp(x[r * vocab + j] - m);
        loss[r] = m + std::log(s) - x[r * vocab + t[r]];
        for (i64 j = 0; j < vocab; ++j) dx[r * vocab + j] = (std::exp(x[r * vocab + j] - m) / s - (j == t[r])) * g[r];
    }
    std::vector<T> tx(x.begin(), x.end()), tg(g.begin(), g.end()), kl(rows, (T)NAN), kd(rows * vocab, (T)NAN);
    int flag_f = 0, flag_b = 0;
    launch(grid, threads, [&] {
        if constexpr (sizeof(T) == 4) {
            xent_f32_i64(tx.data(), t.data(), kl.data(), rows, vocab, ignore, &flag_f);
            xent_grad_f32_i64(tx.data(), t.data(), tg.data(), kd.data(), rows, vocab, ignore, &flag_b);
        } else {
            xent_f64_i64(tx.data(), t.data(), kl.data(), rows, vocab, ignore, &flag_f);
            xent_grad_f64_i64(tx.data(), t.data(), tg.data(), kd.data(), rows, vocab, ignore, &flag_b);
        }
    });
    double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
    double worst = std::max(worst_error(kl, loss).first, worst_error(kd, dx).first);
    bool ok = worst <= tol && flag_f == (int)bad && flag_b == (int)bad;
    fails += !ok;
    printf("%s cross_entropy      rows %lld vocab %lld threads %u grid %u bad %d %s: worst %.2e, flags %d %d\n",
           ok ? "ok  " : "FAIL", rows, vocab, threads, grid, (int)bad, sizeof(T) == 4 ? "f32" : "f64", worst, flag_f, flag_b);
}

// Paged attention of a ragged batch: a decode token over 65 keys, a 9-query chunk over 37,
// a 3-token prompt, and a 40-query chunk over 70 keys, each segment's keys at rows of a
// 160-row pool drawn at random (segments may share rows, as prefix-cached blocks do), the
// table built as `src/paged_attention.rs` builds it; against the f64 causal attention.
template <typename T>
void paged_check(i64 hq, i64 hk, i64 d, unsigned seed) {
    struct Seg { i64 q_len, kv_len; };
    const std::vector<Seg> segs = {{1, 65}, {9, 37}, {3, 3}, {40, 70}};
    const i64 rows = 160;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> U(-1, 1);
    i64 tokens = 0;
    for (auto& g : segs) tokens += g.q_len;
    std::vector<double> q(hq * tokens * d), k(rows * hk * d), v(rows * hk * d);
    for (auto* x : {&q, &k, &v}) for (auto& e : *x) e = U(rng);
    std::vector<std::vector<i32>> slots;
    for (auto& g : segs) {
        std::vector<i32> perm(rows);
        for (i64 r = 0; r < rows; ++r) perm[r] = (i32)r;
        std::shuffle(perm.begin(), perm.end(), rng);
        slots.emplace_back(perm.begin(), perm.begin() + g.kv_len);
    }
    // the table: each token's segment, four words per segment, then the slots
    std::vector<i32> tab;
    for (size_t n = 0; n < segs.size(); ++n) for (i64 i = 0; i < segs[n].q_len; ++i) tab.push_back((i32)n);
    i64 segs_at = (i64)tab.size(), slots_at = segs_at + 4 * (i64)segs.size(), q_start = 0;
    for (size_t n = 0; n < segs.size(); ++n) {
        for (i64 w : {q_start, segs[n].q_len, segs[n].kv_len, slots_at}) tab.push_back((i32)w);
        q_start += segs[n].q_len;
        slots_at += segs[n].kv_len;
    }
    for (auto& sl : slots) tab.insert(tab.end(), sl.begin(), sl.end());
    double scale = 1.0 / std::sqrt((double)d);
    std::vector<double> want(q.size());
    q_start = 0;
    for (size_t n = 0; n < segs.size(); ++n) {
        for (i64 i = 0; i < segs[n].q_len; ++i) for (i64 h = 0; h < hq; ++h) {
            i64 t = q_start + i, kvh = h / (hq / hk), lim = segs[n].kv_len - segs[n].q_len + i + 1;
            const double* qi = &q[(h * tokens + t) * d];
            std::vector<double> p(lim);
            double mx = -INFINITY, sum = 0;
            for (i64 j = 0; j < lim; ++j) {
                const double* kj = &k[((i64)slots[n][j] * hk + kvh) * d];
                double s = 0;
                for (i64 f = 0; f < d; ++f) s += qi[f] * kj[f];
                p[j] = s * scale;
                mx = std::max(mx, p[j]);
            }
            for (auto& e : p) { e = std::exp(e - mx); sum += e; }
            double* o = &want[(h * tokens + t) * d];
            for (i64 f = 0; f < d; ++f) {
                o[f] = 0;
                for (i64 j = 0; j < lim; ++j) o[f] += p[j] / sum * v[((i64)slots[n][j] * hk + kvh) * d + f];
            }
        }
        q_start += segs[n].q_len;
    }
    std::vector<T> tq(q.begin(), q.end()), tk(k.begin(), k.end()), tv(v.begin(), v.end()), out(q.size(), (T)NAN);
    PagedArgs a{hq, hk, tokens, d, segs_at, scale};
    launch((unsigned)tokens, 32, [&] {
        if constexpr (sizeof(T) == 4) paged_attn_f32(tq.data(), tk.data(), tv.data(), out.data(), tab.data(), a);
        else paged_attn_f64(tq.data(), tk.data(), tv.data(), out.data(), tab.data(), a);
    }, (unsigned)hq);
    auto [worst, at] = worst_error(out, want);
    bool ok = worst <= (sizeof(T) == 4 ? 2e-5 : 1e-12);
    fails += !ok;
    printf("%s paged_attention    hq %lld hk %lld d %lld tokens %lld %s: worst %.2e at %lld\n", ok ? "ok  " : "FAIL", hq,
           hk, d, tokens, sizeof(T) == 4 ? "f32" : "f64", worst, at);
}

// The multi-tensor mixed-precision AdamW over f32 masters (gradients G, compute copies C)
// against the f64 update of the same stored values, with the gradient multiplier folded
// in; every copy must be exactly the new master rounded to C.
template <typename G, typename C, typename K>
void adamw_master_check(const char* what, K kernel) {
    const i64 chunk = 64;
    std::vector<i64> sizes = {1, chunk - 1, chunk + 1, 3 * chunk};
    AdamStep h{3e-3, 0.9, 0.95, 1e-8, 0.1, 0.19, 0.0975};
    const double gscale = 0.37;
    std::mt19937 rng(9);
    std::uniform_real_distribution<double> U(-1, 1);
    std::vector<std::vector<float>> x, nx, m, v;
    std::vector<std::vector<G>> g;
    std::vector<std::vector<C>> y;
    std::vector<std::vector<double>> want_x, want_m, want_v;
    std::vector<i64> table, chunks;
    for (size_t t = 0; t < sizes.size(); ++t) {
        i64 n = sizes[t];
        x.emplace_back(n); nx.emplace_back(n, NAN); m.emplace_back(n); v.emplace_back(n); g.emplace_back(n);
        y.emplace_back(n, from_acc<C>(NAN));
        want_x.emplace_back(n); want_m.emplace_back(n); want_v.emplace_back(n);
        for (i64 i = 0; i < n; ++i) {
            x[t][i] = (float)U(rng); g[t][i] = from_acc<G>((float)(0.5 * U(rng)));
            m[t][i] = (float)(0.1 * U(rng)); v[t][i] = (float)(0.005 * (1 + U(rng)));
            double gi = (double)to_acc(g[t][i]) * gscale;
            double mi = h.beta1 * m[t][i] + (1 - h.beta1) * gi;
            double vi = h.beta2 * v[t][i] + (1 - h.beta2) * gi * gi;
            want_m[t][i] = mi; want_v[t][i] = vi;
            want_x[t][i] = x[t][i] * (1 - h.lr * h.wd) - h.lr * (mi / h.bias1) / (std::sqrt(vi / h.bias2) + h.eps);
        }
        // the last tensor's master is updated where it is (the same buffer in and out)
        float* out = t + 1 == sizes.size() ? x[t].data() : nx[t].data();
        for (const void* p : {(const void*)x[t].data(), (const void*)out, (const void*)y[t].data(),
                              (const void*)g[t].data(), (const void*)m[t].data(), (const void*)v[t].data()})
            table.push_back((i64)p);
        table.push_back(n);
        for (i64 s = 0; s < n; s += chunk) { chunks.push_back((i64)t); chunks.push_back(s); }
    }
    i64 nc = (i64)chunks.size() / 2;
    auto x0 = x;
    launch(3, 256, [&] { kernel(table.data(), chunks.data(), nc, chunk, h, gscale); });
    double worst = 0;
    i64 copies_off = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
        bool in_place = t + 1 == sizes.size();
        auto& got_x = in_place ? x[t] : nx[t];
        for (auto [got, want] : {std::pair{&got_x, &want_x[t]}, {&m[t], &want_m[t]}, {&v[t], &want_v[t]}})
            worst = std::max(worst, worst_error(*got, *want).first);
        for (i64 i = 0; i < sizes[t]; ++i) {
            C r = from_acc<C>(got_x[i]);
            copies_off += std::memcmp(&r, &y[t][i], sizeof(C)) != 0;
            if (!in_place) worst = std::max(worst, x[t][i] == x0[t][i] ? 0.0 : 1.0);  // the input master is left alone
        }
    }
    bool ok = worst <= 1e-5 && copies_off == 0;
    fails += !ok;
    printf("%s adamw_master %s: worst %.2e, %lld copies not the rounded master\n", ok ? "ok  " : "FAIL", what, worst,
           copies_off);
}

// A few long rows reduced in split spans (sum, max, min) against f64, with more spans
// than blocks (blocks loop) and spans that do not divide the row.
template <typename T>
void split_reduce_check(i64 rows, i64 size, i64 parts, unsigned threads, unsigned grid) {
    typedef typename Acc<T>::t A;
    std::mt19937 rng(13 + size);
    std::uniform_real_distribution<double> U(-2, 2);
    std::vector<T> x(rows * size);
    for (auto& e : x) e = (T)U(rng);
    for (int op : {0, 1, 2}) {
        std::vector<double> want(rows);
        for (i64 r = 0; r < rows; ++r) {
            double acc = op == 0 ? 0 : (op == 1 ? -INFINITY : INFINITY);
            for (i64 j = 0; j < size; ++j) {
                double e = x[r * size + j];
                acc = op == 0 ? acc + e : (op == 1 ? std::max(acc, e) : std::min(acc, e));
            }
            want[r] = acc;
        }
        std::vector<A> partial(rows * parts, (A)NAN);
        std::vector<T> y(rows, (T)NAN);
        launch(grid, threads, [&] {
            if constexpr (sizeof(T) == 4) reduce_split_f32(x.data(), partial.data(), rows, size, parts, op);
            else reduce_split_f64(x.data(), partial.data(), rows, size, parts, op);
        });
        launch(2, 64, [&] {
            if constexpr (sizeof(T) == 4) reduce_parts_f32(partial.data(), y.data(), rows, parts, op);
            else reduce_parts_f64(partial.data(), y.data(), rows, parts, op);
        });
        double worst = worst_error(y, want).first * (op == 0 ? 1.0 / std::sqrt((double)size) : 1.0);
        double tol = sizeof(T) == 4 ? 1e-5 : 1e-12;
        bool ok = worst <= tol;
        fails += !ok;
        printf("%s reduce_split op %d rows %lld size %lld parts %lld %s: worst %.2e\n", ok ? "ok  " : "FAIL", op, rows,
               size, parts, sizeof(T) == 4 ? "f32" : "f64", worst);
    }
}

// The sum of squares of several tensors (empty, one element, chunk edges) in T, folded in
// f64 by 3 blocks, then the partials added by one block.
template <typename T, typename K>
void sum_squares_check(const char* what, K kernel) {
    const i64 chunk = 64;
    std::vector<i64> sizes = {0, 1, chunk - 1, chunk + 1, 3 * chunk, 5};
    std::mt19937 rng(21);
    std::uniform_real_distribution<double> U(-3, 3);
    std::vector<std::vector<T>> xs;
    std::vector<i64> table, chunks;
    double want = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
        xs.emplace_back(sizes[t]);
        for (auto& e : xs.back()) {
            e = from_acc<T>((typename Acc<T>::t)U(rng));
            want += (double)to_acc(e) * (double)to_acc(e);
        }
        table.push_back((i64)xs.back().data());
        table.push_back(sizes[t]);
        for (i64 s = 0; s < sizes[t]; s += chunk) { chunks.push_back((i64)t); chunks.push_back(s); }
    }
    i64 nc = (i64)chunks.size() / 2;
    const unsigned grid = 3;
    std::vector<double> partial(grid, NAN), y(1, NAN);
    launch(grid, 128, [&] { kernel(table.data(), chunks.data(), nc, chunk, partial.data()); });
    launch(1, 64, [&] { sum_partials(partial.data(), (i64)grid, y.data()); });
    double worst = std::fabs(y[0] - want) / want;
    if (worst != worst) worst = INFINITY;
    bool ok = worst <= 1e-13;
    fails += !ok;
    printf("%s sum_squares_many %s: %.6f vs %.6f, worst %.2e\n", ok ? "ok  " : "FAIL", what, y[0], want, worst);
}

#include "quant_check.h"

int main() {
    quant_check<float>("f32", quant_gemv_f32, quant_dequant_f32);
    quant_check<double>("f64", quant_gemv_f64, quant_dequant_f64);
    unsigned pseed = 40;
    for (auto [hq, hk, d] : {std::tuple{4, 2, 40}, {2, 2, 128}, {3, 1, 256}, {2, 1, 8}}) {
        paged_check<float>(hq, hk, d, pseed);
        paged_check<double>(hq, hk, d, pseed++);
    }
    for (auto [rows, vocab, threads, grid, bad] : {std::tuple{6, 50, 64u, 6u, false}, {5, 1000, 1024u, 2u, true}, {4, 3000, 256u, 4u, true}}) {
        xent_check<float>(rows, vocab, threads, grid, bad);
        xent_check<double>(rows, vocab, threads, grid, bad);
    }
    for (auto [rows, n, threads, grid] : {std::tuple{5, 7, 32u, 5u}, {6, 300, 512u, 2u}, {3, 300, 64u, 3u}, {4, 1000, 1024u, 4u}}) {
        rows_check<float>(rows, n, threads, grid);
        rows_check<double>(rows, n, threads, grid);
    }
    adamw_many_check<float>();
    adamw_many_check<double>();
    adamw_master_check<float, bf16>("f32 -> bf16", adamw_master_f32_bf16);
    adamw_master_check<bf16, bf16>("bf16 -> bf16", adamw_master_bf16_bf16);
    adamw_master_check<float, float>("f32 -> f32", adamw_master_f32_f32);
    for (auto [rows, size, parts, threads, grid] : {std::tuple{1, 5000, 7, 256u, 3u}, {3, 1000, 4, 64u, 12u}, {2, 300, 5, 32u, 4u}}) {
        split_reduce_check<float>(rows, size, parts, threads, grid);
        split_reduce_check<double>(rows, size, parts, threads, grid);
    }
    sum_squares_check<float>("f32", sum_squares_many_f32);
    sum_squares_check<double>("f64", sum_squares_many_f64);
    sum_squares_check<bf16>("bf16", sum_squares_many_bf16);
    Case cases[] = {
        {1, 2, 2, 37, 37, 40, 1, 0},   // causal, square, d not a multiple of 32
        {2, 4, 2, 9, 70, 64, 1, 0},    // grouped heads, fewer queries than keys (a prefill on a cache)
        {1, 2, 1, 45, 13, 16, 1, 0},   // more queries than keys: early rows attend nothing
        {2, 2, 2, 33, 41, 8, 1, 1},    // causal and a padding mask with a fully masked row
        {1, 4, 4, 19, 50, 96, 0, 1},   // a mask alone
        {1, 1, 1, 5, 5, 256, 0, 0},    // the largest head
        {1, 2, 2, 1, 65, 32, 1, 0},    // one query (decode)
    };
    unsigned seed = 1;
    for (auto& c : cases) {
        for (int tile : {32, 7}) {
            run<float>(c, tile, seed);
            run<double>(c, tile, seed);
            ++seed;
        }
    }
    printf("%d failures\n", fails);
    return fails != 0;
}
