// Paged attention of a ragged batch (redco_core::ops::paged_attention): the queries of
// several sequences in one batch, each sequence's keys and values in rows of a shared pool
// listed by its slot table. One workgroup per (block of BQ rows of one segment, kv head):
// a segment's rows are its q_len queries of each of the `rep` query heads sharing the kv
// head, as in attention.wgsl; the workgroup stages a tile of BK keys, read through the
// slot table from wherever they sit in the pool, in workgroup memory, and each invocation
// runs an online softmax for its row. Causal: query i of a segment sees its first
// kv_len - q_len + i + 1 keys (always at least one).
//
// BK <= 32: the kept keys of a tile are the bits of one u32.
//
// Params: q_heads, kv_heads, tokens, scale (f32 bits), blocks_at, three unused words;
// from word 8 four per segment (q_start, q_len, kv_len, slots_at: where its slots begin
// in the params); from blocks_at two per workgroup block (segment, first row); then the
// slots (pool rows).

const D: u32 = $Du;
const BQ: u32 = $BQu;
const BK: u32 = $BKu;
const LOWEST: f32 = -3.40282347e38;

@group(0) @binding(0) var<storage, read> q: array<$XT>;
@group(0) @binding(1) var<storage, read> k: array<$XT>;
@group(0) @binding(2) var<storage, read> v: array<$XT>;
@group(0) @binding(3) var<storage, read_write> y: array<$XT>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

var<workgroup> kt: array<f32, BK * D>;
var<workgroup> vt: array<f32, BK * D>;

@compute @workgroup_size(BQ)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let q_heads = p[0];
    let kv_heads = p[1];
    let tokens = p[2];
    let scale = bitcast<f32>(p[3]);
    let blk = p[4] + 2u * wid.x;
    let sg = 8u + 4u * p[blk];
    let r0 = p[blk + 1u];
    let q_start = p[sg];
    let q_len = p[sg + 1u];
    let kv_len = p[sg + 2u];
    let slots_at = p[sg + 3u];
    let rep = q_heads / kv_heads;
    let n_rows = rep * q_len;
    let kvh = wid.y;
    let r = r0 + lid.x;
    let live = r < n_rows;
    let head = kvh * rep + r / q_len;
    let qi = r % q_len;
    let off = kv_len - q_len;
    // the keys this workgroup visits (uniform: its last row's limit)
    let r1 = min(r0 + BQ, n_rows) - 1u;
    var max_qi = r1 % q_len;
    if (r0 / q_len != r1 / q_len) {
        max_qi = q_len - 1u;
    }
    let kv_end = max_qi + off + 1u;
    let row = (head * tokens + q_start + qi) * D;
    let last = qi + off;
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
        let nk = min(BK, kv_end - t0);
        for (var e = lid.x; e < nk * D; e = e + BQ) {
            let at = (p[slots_at + t0 + e / D] * kv_heads + kvh) * D + e % D;
            kt[e] = f32(k[at]);
            vt[e] = f32(v[at]);
        }
        workgroupBarrier();
        if (live) {
            var keep = 0u;
            for (var j = 0u; j < nk; j = j + 1u) {
                if (t0 + j <= last) {
                    keep = keep | (1u << j);
                }
            }
            online_tile(nk, keep, scale, &qr, &acc, &mx, &l, &seen);
        }
        workgroupBarrier();
    }
    if (live) {
        let inv = 1.0 / l;
        for (var e = 0u; e < D; e = e + 1u) {
            y[row + e] = $STORE(acc[e] * inv);
        }
    }
}
