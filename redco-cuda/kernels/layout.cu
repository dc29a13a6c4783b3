// Layout copies (permute, expand, narrow, cat) as one strided copy: element i of the
// iteration space `d.out` is read at src[src_base + i . d.s1] and written at
// dst[dst_base + i . d.s0]. Elements are moved as raw bytes of their width.

#define COPY(name, T) \
extern "C" __global__ void copy_##name(const T* src, T* dst, i64 n, Dims d, i64 src_base, i64 dst_base) { \
    FOR_EACH(i, n) { \
        i64 od, os, o2; \
        offsets(d, i, od, os, o2); \
        dst[dst_base + od] = src[src_base + os]; \
    } \
}
COPY(b1, u8) COPY(b2, unsigned short) COPY(b4, unsigned) COPY(b8, u64)
