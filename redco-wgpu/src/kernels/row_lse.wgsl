// The maximum of one row of `x` (elements base..base+d, this invocation's share starting at
// j0) and the sum of exp(x - max) over it, reduced over the row's invocations (see
// rows.wgsl); every invocation of the row gets both. Called in uniform control flow.
fn row_max_sumexp(lane: u32, live: bool, base: u32, j0: u32, d: u32) -> vec2<f32> {
    var mx = LOWEST;
    if (live) {
        for (var j = j0; j < d; j = j + TPR) {
            mx = max(mx, f32(x[base + j]));
        }
    }
    mx = seg_max(lane, mx);
    var s = 0.0;
    if (live) {
        for (var j = j0; j < d; j = j + TPR) {
            s = s + exp(f32(x[base + j]) - mx);
        }
    }
    s = seg_sum(lane, s);
    return vec2<f32>(mx, s);
}
