// Rotary embedding of x viewed as rows [rows, d] (row r at sequence position r % seq) on
// its first 2 * half features; cos / sin are [seq, half], or [batch, seq, half] when
// `per_batch` rows (heads x seq) share one batch entry's table. mode 0: interleaved pairs
// (2i, 2i + 1) (GPT-J); mode 1: halves (i, i + half) (LLaMA). Features past 2 * half are
// copied.

#define ROTARY(name, T) \
extern "C" __global__ void rotary_##name(const T* x, const T* cs, const T* sn, T* y, i64 rows, i64 d, i64 half, i64 seq, i64 per_batch, int mode) { \
    typedef Acc<T>::t A; \
    FOR_EACH(t, rows * d) { \
        i64 r = t / d, j = t % d; \
        if (j >= 2 * half) { y[t] = x[t]; continue; } \
        i64 crow = per_batch ? (r / per_batch) * seq + r % seq : r % seq; \
        i64 p = mode == 0 ? j / 2 : (j < half ? j : j - half); \
        bool first = mode == 0 ? (j % 2 == 0) : (j < half); \
        i64 mate = mode == 0 ? (first ? j + 1 : j - 1) : (first ? j + half : j - half); \
        A c = to_acc(cs[crow * half + p]), s = to_acc(sn[crow * half + p]); \
        A a = to_acc(x[r * d + j]), b = to_acc(x[r * d + mate]); \
        y[t] = from_acc<T>(first ? a * c - b * s : a * c + b * s); \
    } \
}
FOR_FLOATS(ROTARY)
