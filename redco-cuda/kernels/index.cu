// Index ops over a tensor viewed as [outer, size, inner] along the indexed dimension.
// Ids are i64 or i32 (`_i64` / `_i32` suffix); an id outside 0..size sets *bad to 1 (the
// host reads it and reports the error) and reads or writes nothing.

template <typename I> __device__ __forceinline__ bool id_ok(I id, i64 size) { return id >= 0 && (i64)id < size; }

// out[o, j, i] = x[o, ids[j], i]
#define INDEX_SELECT(name, T, iname, I) \
extern "C" __global__ void index_select_##name##_##iname(const T* x, const I* ids, T* y, i64 outer, i64 size, i64 inner, i64 n_ids, int* bad) { \
    FOR_EACH(t, outer * n_ids * inner) { \
        i64 i = t % inner, j = (t / inner) % n_ids, o = t / (inner * n_ids); \
        I id = ids[j]; \
        if (!id_ok(id, size)) { *bad = 1; y[t] = T(); continue; } \
        y[t] = x[(o * size + id) * inner + i]; \
    } \
}

// out[o, j, i] = x[o, idx[o, j, i], i]; idx has `n_idx` entries along the dimension
#define GATHER(name, T, iname, I) \
extern "C" __global__ void gather_##name##_##iname(const T* x, const I* idx, T* y, i64 outer, i64 size, i64 inner, i64 n_idx, int* bad) { \
    FOR_EACH(t, outer * n_idx * inner) { \
        i64 i = t % inner, o = t / (inner * n_idx); \
        I id = idx[t]; \
        if (!id_ok(id, size)) { *bad = 1; y[t] = T(); continue; } \
        y[t] = x[(o * size + id) * inner + i]; \
    } \
}

// y (a copy of x, made by the host) += src rows at ids: y[o, ids[j], i] += src[o, j, i]
#define INDEX_ADD(name, T, iname, I) \
extern "C" __global__ void index_add_##name##_##iname(T* y, const I* ids, const T* src, i64 outer, i64 size, i64 inner, i64 n_ids, int* bad) { \
    FOR_EACH(t, outer * n_ids * inner) { \
        i64 i = t % inner, j = (t / inner) % n_ids, o = t / (inner * n_ids); \
        I id = ids[j]; \
        if (!id_ok(id, size)) { *bad = 1; continue; } \
        atomicAdd(&y[(o * size + id) * inner + i], src[t]); \
    } \
}

// y (a copy of x) += src at the gathered positions: y[o, idx[o, j, i], i] += src[o, j, i]
#define SCATTER_ADD(name, T, iname, I) \
extern "C" __global__ void scatter_add_##name##_##iname(T* y, const I* idx, const T* src, i64 outer, i64 size, i64 inner, i64 n_idx, int* bad) { \
    FOR_EACH(t, outer * n_idx * inner) { \
        i64 i = t % inner, o = t / (inner * n_idx); \
        I id = idx[t]; \
        if (!id_ok(id, size)) { *bad = 1; continue; } \
        atomicAdd(&y[(o * size + id) * inner + i], src[t]); \
    } \
}

// ids outside 0..size: *bad = 1
#define CHECK_IDS(iname, I) \
extern "C" __global__ void check_ids_##iname(const I* ids, i64 n, i64 size, int* bad) { \
    FOR_EACH(t, n) if (!id_ok(ids[t], size)) *bad = 1; \
}
CHECK_IDS(i64, i64) CHECK_IDS(i32, i32)

#define BY_ID(M, name, T) M(name, T, i64, i64) M(name, T, i32, i32)
#define SELECTS(name, T) BY_ID(INDEX_SELECT, name, T) BY_ID(GATHER, name, T)
FOR_ALL(SELECTS)
// the adds run on f32 and f64 (16-bit floats are widened by the host first)
BY_ID(INDEX_ADD, f32, float) BY_ID(INDEX_ADD, f64, double)
BY_ID(SCATTER_ADD, f32, float) BY_ID(SCATTER_ADD, f64, double)
