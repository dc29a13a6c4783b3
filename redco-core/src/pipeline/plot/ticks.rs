//! "Nice" axis ticks (steps of 1, 2 or 5 times a power of ten) and compact number labels.

/// The ticks of one axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Ticks {
    /// The low end of the axis.
    pub lo: f64,
    /// The high end of the axis.
    pub hi: f64,
    /// The distance between two ticks: 1, 2 or 5 times a power of ten.
    pub step: f64,
    /// The tick values, ascending, all within `lo..=hi`.
    pub values: Vec<f64>,
}

/// The smallest step of the form {1, 2, 5} x 10^k that is at least `raw` (`raw` > 0).
fn nice_step_at_least(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw * (1.0 - 1e-9)).unwrap_or(10.0 * mag)
}

/// The 1-2-5 step after `step`.
fn next_step(step: f64) -> f64 {
    nice_step_at_least(step * 1.5)
}

/// A finite range with `hi > lo`: non-finite ends become 0..1, an empty range is widened
/// around its value.
fn sane_range(lo: f64, hi: f64) -> (f64, f64) {
    let (lo, hi) = match (lo.is_finite(), hi.is_finite()) {
        (true, true) => (lo.min(hi), lo.max(hi)),
        (true, false) => (lo, lo),
        (false, true) => (hi, hi),
        (false, false) => (0.0, 1.0),
    };
    if hi > lo {
        return (lo, hi);
    }
    let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.5 };
    let (lo2, hi2) = (lo - pad, hi + pad);
    // keep a positive quantity positive (an all-equal learning rate stays above zero)
    if lo >= 0.0 && lo2 < 0.0 {
        (0.0, hi2)
    } else {
        (lo2, hi2)
    }
}

/// Ticks for the data range `lo..=hi` with at most `max_intervals` (at least 2) steps between
/// them; the axis is widened to the ticks just outside the data, so both ends carry a tick.
/// A degenerate range (one value, or non-finite ends) is widened to something drawable.
pub fn nice_ticks(lo: f64, hi: f64, max_intervals: usize) -> Ticks {
    let (lo, hi) = sane_range(lo, hi);
    let n = max_intervals.max(2) as f64;
    let mut step = nice_step_at_least((hi - lo) / n);
    // two intervals of at least the range always fit, so this ends within a few steps
    for _ in 0..64 {
        let (k0, k1) = (floor(lo / step), ceil(hi / step));
        if k1 - k0 <= n {
            return from_multiples(k0, k1.max(k0 + 1.0), step);
        }
        step = next_step(step);
    }
    Ticks { lo, hi, step: hi - lo, values: vec![lo, hi] }
}

/// `q.floor()`, or `q.round()` when `q` is within rounding error of an integer.
fn floor(q: f64) -> f64 {
    if (q - q.round()).abs() < 1e-9 {
        q.round()
    } else {
        q.floor()
    }
}

/// `q.ceil()`, or `q.round()` when `q` is within rounding error of an integer.
fn ceil(q: f64) -> f64 {
    if (q - q.round()).abs() < 1e-9 {
        q.round()
    } else {
        q.ceil()
    }
}

/// Ticks for the axis `lo..=hi` kept as it is: the multiples of a 1-2-5 step inside it, at
/// most `max_intervals + 1` of them; with `integer`, the step is at least 1 (optimizer steps).
pub fn inner_ticks(lo: f64, hi: f64, max_intervals: usize, integer: bool) -> Ticks {
    let (lo, hi) = sane_range(lo, hi);
    let n = max_intervals.max(1) as f64;
    let mut step = nice_step_at_least((hi - lo) / n);
    if integer {
        step = step.max(1.0);
    }
    for _ in 0..64 {
        let (k0, k1) = (ceil(lo / step), floor(hi / step));
        if k1 - k0 <= n {
            let mut t = from_multiples(k0, k1, step);
            (t.lo, t.hi) = (lo, hi);
            return t;
        }
        step = next_step(step);
    }
    Ticks { lo, hi, step: hi - lo, values: vec![lo, hi] }
}

/// Ticks for the data range `lo..=hi` with exactly `intervals` steps, to share grid lines
/// with another axis of that many intervals (a twin axis). The step is the smallest 1-2-5
/// step whose ticks cover the data (when there is none, as for one interval across zero, the
/// ticks of [`nice_ticks`]).
pub fn aligned_ticks(lo: f64, hi: f64, intervals: usize) -> Ticks {
    let (lo, hi) = sane_range(lo, hi);
    let n = intervals.max(1) as f64;
    let mut step = nice_step_at_least((hi - lo) / n);
    for _ in 0..64 {
        let k0 = floor(lo / step);
        if ceil(hi / step) <= k0 + n {
            return from_multiples(k0, k0 + n, step);
        }
        step = next_step(step);
    }
    // one interval cannot span a range across zero
    nice_ticks(lo, hi, intervals)
}

/// Ticks `k0 * step ..= k1 * step`.
fn from_multiples(k0: f64, k1: f64, step: f64) -> Ticks {
    let count = if k1 >= k0 { (k1 - k0) as usize + 1 } else { 0 };
    let values: Vec<f64> =
        (0..count).map(|i| (k0 + i as f64) * step).map(|v| if v.abs() < step * 1e-9 { 0.0 } else { v }).collect();
    Ticks { lo: k0 * step, hi: k1 * step, step, values }
}

/// Labels for `ticks`: fixed-point with as many decimals as the step needs (`0.5 1.0 1.5`),
/// or, for small (below 0.01) or large values or a step below 1e-4, the shortest exponent
/// form (`5e-4 1e-3 1.5e-3`).
pub fn tick_labels(ticks: &Ticks) -> Vec<String> {
    let max = ticks.values.iter().fold(0f64, |m, v| m.max(v.abs()));
    let step = ticks.step.abs();
    if max == 0.0 || step == 0.0 || !step.is_finite() {
        return ticks.values.iter().map(|v| fmt_value(*v)).collect();
    }
    let step_exp = step.log10().floor();
    if (1e-2..1e5).contains(&max) && step >= 1e-4 {
        let decimals = (-step_exp).max(0.0) as usize;
        ticks.values.iter().map(|v| format!("{v:.decimals$}")).collect()
    } else {
        ticks.values.iter().map(|v| exp_label(*v, step_exp)).collect()
    }
}

/// `v` in exponent form with the digits a tick step of `10^step_exp` needs: `1.5e-3`, `2e5`.
fn exp_label(v: f64, step_exp: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let p = (v.abs().log10().floor() - step_exp).clamp(0.0, 15.0) as usize;
    strip_mantissa(&format!("{v:.p$e}"))
}

/// `1.50e-3` -> `1.5e-3`, `3.0e-3` -> `3e-3`.
fn strip_mantissa(s: &str) -> String {
    match s.split_once('e') {
        Some((m, e)) if m.contains('.') => format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.')),
        _ => s.to_string(),
    }
}

/// Labels for optimizer-step ticks: plain integers, or on an axis reaching ten thousand,
/// with a `k` / `M` / `B` suffix for each tick from a thousand on (`500k 1M 1.5M`).
pub fn step_labels(ticks: &Ticks) -> Vec<String> {
    let max = ticks.values.iter().fold(0f64, |m, v| m.max(v.abs()));
    ticks
        .values
        .iter()
        .map(|v| {
            let (div, suffix) = match v.abs() {
                _ if max < 1e4 => (1.0, ""),
                a if a >= 1e9 => (1e9, "B"),
                a if a >= 1e6 => (1e6, "M"),
                a if a >= 1e3 => (1e3, "k"),
                _ => (1.0, ""),
            };
            let step = (ticks.step / div).abs();
            let decimals =
                if step > 0.0 && step.is_finite() { (-step.log10().floor()).clamp(0.0, 15.0) as usize } else { 0 };
            let s = format!("{:.decimals$}", v / div);
            let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
            format!("{s}{suffix}")
        })
        .collect()
}

/// A value with about three significant digits, compactly: `0`, `0.0123`, `4.31`, `45.7`,
/// `1234`, `12.3k`, `1.5M`, `1.5e-4`; `NaN`, `inf` and `-inf` as such.
pub fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let a = v.abs();
    if a == 0.0 {
        return "0".into();
    }
    let trim = |s: String| if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if a >= 1e4 {
        for (div, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
            if a >= div * 0.9995 || div == 1e3 {
                let m = v / div;
                if m.abs() >= 999.5 && div == 1e12 {
                    return strip_mantissa(&format!("{v:.2e}"));
                }
                let d = if m.abs() >= 99.95 {
                    0
                } else if m.abs() >= 9.995 {
                    1
                } else {
                    2
                };
                return format!("{}{suffix}", trim(format!("{m:.d$}")));
            }
        }
    }
    if a >= 100.0 {
        return format!("{v:.0}");
    }
    if a >= 1e-3 {
        let d = (2.0 - a.log10().floor()).max(0.0) as usize;
        return trim(format!("{v:.d$}"));
    }
    strip_mantissa(&format!("{v:.2e}"))
}
