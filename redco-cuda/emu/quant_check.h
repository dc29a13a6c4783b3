// The block-quantized products of kernels/quant.cu (`quant_gemv_T`, `quant_dequant_T`) on the
// emulated thread model, for every format, against an f64 product whose weights are
// dequantized value by value from the byte layouts (a reference written apart from the
// kernels' 32-value groups). Included by check.cpp after the kernels.
#include <random>

namespace quant_ref {
inline double half(const u8* p) { return (double)half_bits((unsigned)p[0] | ((unsigned)p[1] << 8)); }
const i64 VALUES[5] = {32, 32, 32, 256, 256};
const i64 BYTES[5] = {18, 20, 34, 144, 210};
const char* NAMES[5] = {"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"};
// Value t of a row of format f.
inline double value(int f, const u8* row, i64 t) {
    const u8* b = row + (t / VALUES[f]) * BYTES[f];
    i64 r = t % VALUES[f];
    if (f == 0 || f == 1) {
        int at = f == 0 ? 2 : 4;
        u8 byte = b[at + r % 16];
        int q = r < 16 ? byte & 15 : byte >> 4;
        return f == 0 ? half(b) * (q - 8) : half(b) * q + half(b + 2);
    }
    if (f == 2) return half(b) * (double)(signed char)b[2 + r];
    if (f == 3) {
        i64 chunk = r / 64, rr = r % 64, sub = 2 * chunk + (rr >= 32);
        u8 byte = b[16 + 32 * chunk + rr % 32];
        int q = rr < 32 ? byte & 15 : byte >> 4;
        const u8* s = b + 4;
        int sc = sub < 4 ? s[sub] & 63 : (s[sub + 4] & 15) | ((s[sub - 4] >> 6) << 4);
        int mn = sub < 4 ? s[sub + 4] & 63 : (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
        return half(b) * sc * q - half(b + 2) * mn;
    }
    i64 hf = r / 128, rr = r % 128, g = rr / 32, l = rr % 32;
    u8 low = b[64 * hf + l + 32 * (g % 2)];
    int lo = g < 2 ? low & 15 : low >> 4;
    int hi = (b[128 + 32 * hf + l] >> (2 * g)) & 3;
    return half(b + 208) * (double)(signed char)b[192 + 8 * hf + l / 16 + 2 * g] * ((lo | (hi << 4)) - 32);
}
// Random blocks: random codes, and scales (and Q4_1's offsets, Q4_K's minimums) that are
// random normal f16 values of either sign.
inline std::vector<u8> blocks(int f, i64 n, i64 k, std::mt19937& rng) {
    std::vector<u8> w(n * (k / VALUES[f]) * BYTES[f]);
    for (auto& x : w) x = (u8)rng();
    auto put = [&](u8* p) {
        unsigned h = 0x2000u + rng() % 0x1000u | (rng() % 2 ? 0x8000u : 0u);
        p[0] = (u8)h;
        p[1] = (u8)(h >> 8);
    };
    for (u8* b = w.data(); b < w.data() + w.size(); b += BYTES[f]) {
        if (f == 4) put(b + 208);
        else put(b);
        if (f == 1 || f == 3) put(b + 2);
    }
    return w;
}
}  // namespace quant_ref

template <typename T, typename G, typename D>
void quant_check(const char* what, G gemv, D dequant) {
    std::mt19937 rng(77);
    std::uniform_real_distribution<double> U(-1, 1);
    for (int f = 0; f < 5; ++f) {
        for (auto [m, n, k] : {std::tuple{1, 5, 512}, {3, 9, 256}, {9, 4, 1280}}) {
            auto w = quant_ref::blocks(f, n, k, rng);
            i64 row = k / quant_ref::VALUES[f] * quant_ref::BYTES[f];
            std::vector<T> x(m * k), y(m * n, (T)NAN), deq(n * k, (T)NAN);
            for (auto& e : x) e = (T)U(rng);
            std::vector<double> want(m * n, 0), wv(n * k);
            for (i64 j = 0; j < n; ++j) for (i64 t = 0; t < k; ++t) wv[j * k + t] = quant_ref::value(f, w.data() + j * row, t);
            for (i64 i = 0; i < m; ++i) for (i64 j = 0; j < n; ++j) for (i64 t = 0; t < k; ++t) want[i * n + j] += (double)x[i * k + t] * wv[j * k + t];
            // 2 warps a block over 2 blocks: weight rows past the grid loop back
            launch(2, 64, [&] { gemv(x.data(), w.data(), y.data(), (i64)m, (i64)n, (i64)k, row, f); });
            launch(3, 32, [&] { dequant(w.data(), deq.data(), (i64)n, (i64)k, row, f); });
            auto [ey, ay] = worst_error(y, want);
            auto [ed, ad] = worst_error(deq, wv);
            // f32: the products of k terms; the dequantized values are exact in f64 and
            // rounded once in f32
            double tol = sizeof(T) == 4 ? 1e-4 : 1e-12;
            bool ok = ey <= tol && ed <= (sizeof(T) == 4 ? 1e-6 : 1e-15);
            fails += !ok;
            printf("%s quant %s %s m=%d n=%d k=%d: product worst %.2e at %lld, dequantized worst %.2e at %lld\n",
                   ok ? "ok  " : "FAIL", what, quant_ref::NAMES[f], m, n, k, ey, ay, ed, ad);
        }
    }
}
