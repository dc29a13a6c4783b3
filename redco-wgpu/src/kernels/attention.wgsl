// Fused scaled-dot-product attention. One workgroup per (block of BQ rows, kv head, batch
// entry); the rows of a (batch, kv head) pair are the q_len queries of each of the `rep`
// query heads that share it (grouped-query attention reads the shared head directly, and
// one key/value tile serves them all). Each invocation owns one row: its query and output
// accumulator live in registers, and an online softmax runs over key tiles of BK keys that
// the workgroup stages in workgroup memory.
//
// Masked keys (causal: key > query + kv_len - q_len; keep-mask entry 0) are skipped, which
// is exact when a row sees at least one key (their weight exp(fill - max) is 0); a fully
// masked row gets the uniform average of every value, as the softmax of equal fills gives.
// Causal workgroups stop at the last key any of their rows sees.
//
// BK <= 32: the kept keys of a tile are the bits of one u32.
//
// Params: q_heads, kv_heads, q_len, kv_len, scale (f32 bits), causal, has_mask, then the
// mask's element strides broadcast to [batch, q_heads, q_len, kv_len].

const D: u32 = $Du;
const BQ: u32 = $BQu;
const BK: u32 = $BKu;
const LOWEST: f32 = -3.40282347e38;

@group(0) @binding(0) var<storage, read> q: array<$XT>;
@group(0) @binding(1) var<storage, read> k: array<$XT>;
@group(0) @binding(2) var<storage, read> v: array<$XT>;
@group(0) @binding(3) var<storage, read> mask: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<$XT>;
@group(0) @binding(5) var<storage, read> p: array<u32>;

var<workgroup> kt: array<f32, BK * D>;
var<workgroup> vt: array<f32, BK * D>;

@compute @workgroup_size(BQ)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let q_heads = p[0];
    let kv_heads = p[1];
    let q_len = p[2];
    let kv_len = p[3];
    let scale = bitcast<f32>(p[4]);
    let causal = p[5] != 0u;
    let has_mask = p[6] != 0u;
    let rep = q_heads / kv_heads;
    let n_rows = rep * q_len;
    let kvh = wid.y;
    let bi = wid.z;
    let r0 = wid.x * BQ;
    let r = r0 + lid.x;
    let live = r < n_rows;
    let head = kvh * rep + r / q_len;
    let qi = r % q_len;
    let off = i32(kv_len) - i32(q_len);
    // the keys this workgroup visits (uniform: the last row's limit)
    var kv_end = kv_len;
    if (causal) {
        let r1 = min(r0 + BQ, n_rows) - 1u;
        var max_qi = r1 % q_len;
        if (r0 / q_len != r1 / q_len) {
            max_qi = q_len - 1u;
        }
        kv_end = u32(clamp(i32(max_qi) + off + 1, 0, i32(kv_len)));
    }
    let row = ((bi * q_heads + head) * q_len + qi) * D;
    let kv0 = (bi * kv_heads + kvh) * kv_len * D;
    let last = i32(qi) + off;
    let mrow = bi * p[7] + head * p[8] + qi * p[9];
    var qr: array<f32, D>;
    var acc: array<f32, D>;
    for (var e = 0u; e < D; e = e + 1u) {
        acc[e] = 0.0;
        qr[e] = 0.0;
        if (live) {
            qr[e] = f32(q[row + e]);
        }
    }
    var mx = LOWEST;
    var l = 0.0;
    var seen = false;
    for (var t0 = 0u; t0 < kv_end; t0 = t0 + BK) {
        let nk = min(BK, kv_len - t0);
        for (var e = lid.x; e < nk * D; e = e + BQ) {
            kt[e] = f32(k[kv0 + t0 * D + e]);
            vt[e] = f32(v[kv0 + t0 * D + e]);
        }
        workgroupBarrier();
        if (live) {
            var keep = 0u;
            for (var j = 0u; j < nk; j = j + 1u) {
                let key = t0 + j;
                var ok = !causal || i32(key) <= last;
                if (ok && has_mask) {
                    ok = mask[mrow + key * p[10]] != 0u;
                }
                if (ok) {
                    keep = keep | (1u << j);
                }
            }
            online_tile(nk, keep, scale, &qr, &acc, &mx, &l, &seen);
        }
        workgroupBarrier();
    }
    if (live) {
        if (seen) {
            let inv = 1.0 / l;
            for (var e = 0u; e < D; e = e + 1u) {
                y[row + e] = $STORE(acc[e] * inv);
            }
        } else {
            for (var e = 0u; e < D; e = e + 1u) {
                var s = 0.0;
                for (var j = 0u; j < kv_len; j = j + 1u) {
                    s = s + f32(v[kv0 + j * D + e]);
                }
                y[row + e] = $STORE(s / f32(kv_len));
            }
        }
    }
}
