//! The training-curve plot: loss (and eval) on the left scale, learning rate on the right.

use super::canvas::{colors, Canvas, Rgb};
use super::ticks::{aligned_ticks, inner_ticks, nice_ticks, step_labels, tick_labels, Ticks};
use super::{draw_legend, legend_size, Swatch, SCALE};
use crate::pipeline::metrics::StepMetrics;
use crate::Result;
use std::path::Path;

const W: usize = 1000;
const H: usize = 500;
const LOSS: Rgb = colors::BLUE;
const EVAL: Rgb = colors::ORANGE;
const LR: Rgb = colors::RED;
/// At most this many eval points get a marker; more are drawn as a line only.
const MAX_MARKERS: usize = 60;

/// Writes the training curves of `steps` to a PNG file (1000 x 500): the loss in blue
/// (faint raw values under a centred moving average when they are noisy), the eval metric
/// in orange with markers, both on the left scale, and the learning rate as a red dashed
/// line on the right scale; the x axis is the optimizer step. Non-finite values are skipped;
/// the title gives the final loss and eval.
pub fn plot_png(steps: &[StepMetrics], path: &Path) -> Result<()> {
    render(steps).save_png(path)
}

/// The plot of [`plot_png`], on a canvas.
fn render(steps: &[StepMetrics]) -> Canvas {
    let mut ms: Vec<&StepMetrics> = steps.iter().collect();
    ms.sort_by_key(|m| m.step);
    let finite = |f: fn(&StepMetrics) -> Option<f64>| -> Vec<(f64, f64)> {
        ms.iter().filter_map(|m| f(m).filter(|v| v.is_finite()).map(|v| (m.step as f64, v))).collect()
    };
    let loss = finite(|m| Some(m.loss));
    let eval = finite(|m| m.eval);
    let lr = finite(|m| Some(m.lr));

    let mut c = Canvas::new(W, H);
    let th = Canvas::text_height(SCALE) as i64;
    let col_w = (super::font::ROWS * SCALE) as i64; // a rotated line of text

    // title
    let mut title = match ms.last() {
        Some(m) => format!("final loss {} at step {}", fmt_loss(m.loss), m.step),
        None => "no steps logged".to_string(),
    };
    if let Some((s, v)) = ms.iter().rev().find_map(|m| m.eval.map(|v| (m.step, v))) {
        title.push_str(&format!("      final eval {} at step {s}", fmt_loss(v)));
    }

    // vertical layout, then the left scale (its tick count depends on the height)
    let top = 16 + th + 18;
    let bottom = H as i64 - (12 + th + 12 + th + 14);
    let ph = (bottom - top) as f64;
    // a little room around the data, so that no point sits on the frame
    let (ylo, yhi) = range(loss.iter().chain(&eval).map(|p| p.1));
    let pad = (yhi - ylo) * 0.03;
    let (ylo, yhi) = (ylo - pad, yhi + pad);
    let yt = nice_ticks(ylo, yhi, ((ph / 45.0) as usize).clamp(2, 10));
    let ylabels = tick_labels(&yt);
    let intervals = yt.values.len().saturating_sub(1).max(1);
    let (lrlo, lrhi) = range(lr.iter().map(|p| p.1));
    let lrlo = lrlo.min(0.0);
    let lrhi = lrhi + (lrhi - lrlo) * 0.03;
    let rt = (!lr.is_empty()).then(|| aligned_ticks(lrlo, lrhi, intervals));
    let rlabels = rt.as_ref().map(tick_labels).unwrap_or_default();

    // horizontal layout
    let widest = |ls: &[String]| ls.iter().map(|l| Canvas::text_width(l, SCALE)).max().unwrap_or(0) as i64;
    let left = 12 + col_w + 10 + widest(&ylabels) + 12;
    let right = W as i64 - if rt.is_some() { 12 + col_w + 10 + widest(&rlabels) + 12 } else { 24 };
    let pw = (right - left) as f64;
    let (xlo, xhi) = range(ms.iter().map(|m| m.step as f64));
    let (xlo, xhi) = if xhi > xlo { (xlo, xhi) } else { ((xlo - 1.0).max(0.0), xhi + 1.0) };
    let xt = inner_ticks(xlo, xhi, ((pw / 110.0) as usize).clamp(2, 10), true);
    let xlabels = step_labels(&xt);

    let sx = |x: f64| left as f64 + (x - xlo) / (xhi - xlo) * pw;
    let sy = |t: &Ticks, v: f64| bottom as f64 - (v - t.lo) / (t.hi - t.lo) * ph;

    // grid, ticks and labels
    for (v, l) in xt.values.iter().zip(&xlabels) {
        let x = sx(*v).floor() as i64;
        c.fill_rect(x, top, 1, bottom - top, colors::GRID);
        c.fill_rect(x, bottom, 1, 6, colors::AXIS);
        c.text(x - Canvas::text_width(l, SCALE) as i64 / 2, bottom + 12, l, colors::MUTED, SCALE);
    }
    for (v, l) in yt.values.iter().zip(&ylabels) {
        let y = sy(&yt, *v).floor() as i64;
        c.fill_rect(left, y, right - left, 1, colors::GRID);
        c.fill_rect(left - 6, y, 6, 1, colors::AXIS);
        c.text(left - 12 - Canvas::text_width(l, SCALE) as i64, y - th / 2, l, colors::MUTED, SCALE);
    }
    if let Some(rt) = &rt {
        for (v, l) in rt.values.iter().zip(&rlabels) {
            let y = sy(rt, *v).floor() as i64;
            c.fill_rect(right, y, 6, 1, colors::AXIS);
            c.text(right + 12, y - th / 2, l, colors::MUTED, SCALE);
        }
        let t = "learning rate";
        let tw = Canvas::text_width(t, SCALE) as i64;
        c.text_up(W as i64 - 12 - col_w, (top + bottom - tw) / 2, t, LR, SCALE);
    }
    let tw = Canvas::text_width("loss", SCALE) as i64;
    c.text_up(12, (top + bottom - tw) / 2, "loss", LOSS, SCALE);
    let tw = Canvas::text_width("step", SCALE) as i64;
    c.text((left + right - tw) / 2, bottom + 12 + th + 12, "step", colors::TEXT, SCALE);
    c.text_bold(left, 16, &title, colors::TEXT, SCALE);

    // curves: learning rate under the loss, eval on top
    let mut legend = Vec::new();
    if let Some(rt) = &rt {
        let pts: Vec<(f64, f64)> = decimate(&lr, pw).iter().map(|&(x, v)| (sx(x), sy(rt, v))).collect();
        c.polyline(&pts, LR, 2.0, 0.9, Some((7.0, 4.0)));
        if pts.len() == 1 {
            c.disc(pts[0], 3.0, LR);
        }
    }
    if !loss.is_empty() {
        let smooth = smoothed(&loss);
        let noisy = smooth.as_ref().is_some_and(|s| {
            let dev = loss.iter().zip(s).map(|(a, b)| (a.1 - b.1).abs()).sum::<f64>() / loss.len() as f64;
            dev > 0.004 * (yt.hi - yt.lo)
        });
        let raw_alpha = if noisy { 0.45 } else { 1.0 };
        if loss.len() as f64 > 2.0 * pw {
            // more points than pixels: the raw values as a band per pixel column
            for (x, lo, hi) in envelope(&loss, xlo, xhi, pw) {
                let (y0, y1) = (sy(&yt, hi), sy(&yt, lo));
                let xx = (left as f64 + x).floor() as i64;
                for y in y0.floor() as i64..=y1.ceil() as i64 {
                    c.blend(xx, y, LOSS, raw_alpha);
                }
            }
        } else {
            let pts: Vec<(f64, f64)> = loss.iter().map(|&(x, v)| (sx(x), sy(&yt, v))).collect();
            c.polyline(&pts, LOSS, if noisy { 1.2 } else { 2.0 }, raw_alpha, None);
            if pts.len() == 1 {
                c.disc(pts[0], 3.5, LOSS);
            }
        }
        match (noisy, smooth) {
            (true, Some(s)) => {
                let pts: Vec<(f64, f64)> = decimate(&s, pw).iter().map(|&(x, v)| (sx(x), sy(&yt, v))).collect();
                c.polyline(&pts, LOSS, 2.2, 1.0, None);
                legend.push(("loss".to_string(), Swatch::Line(LOSS, 1.2, 0.45, None)));
                legend.push(("loss, smoothed".to_string(), Swatch::Line(LOSS, 2.2, 1.0, None)));
            }
            _ => legend.push(("loss".to_string(), Swatch::Line(LOSS, 2.0, 1.0, None))),
        }
    }
    if !eval.is_empty() {
        let pts: Vec<(f64, f64)> = decimate(&eval, pw).iter().map(|&(x, v)| (sx(x), sy(&yt, v))).collect();
        c.polyline(&pts, EVAL, 1.8, 1.0, None);
        if pts.len() <= MAX_MARKERS {
            for p in &pts {
                c.disc(*p, 5.0, colors::WHITE);
                c.disc(*p, 3.5, EVAL);
            }
        }
        legend.push(("eval".to_string(), Swatch::Marker(EVAL)));
    }
    if rt.is_some() {
        legend.push(("learning rate".to_string(), Swatch::Line(LR, 2.0, 0.9, Some((7.0, 4.0)))));
    }
    if loss.is_empty() && eval.is_empty() {
        let msg = if ms.is_empty() { "no data" } else { "no finite loss values" };
        let tw = Canvas::text_width(msg, SCALE) as i64;
        c.text((left + right - tw) / 2, (top + bottom - th) / 2, msg, colors::MUTED, SCALE);
    }

    // the frame over the curves' edges, then the legend where the curves leave room
    c.rect(left - 1, top - 1, right - left + 2, bottom - top + 2, colors::AXIS);
    if !legend.is_empty() {
        let (lw, lh) = legend_size(&legend);
        let inset = 10;
        let spots = [
            (right - inset - lw, top + inset),
            (left + inset, top + inset),
            (right - inset - lw, bottom - inset - lh),
            (left + inset, bottom - inset - lh),
        ];
        let ink = |c: &Canvas, (x, y): (i64, i64)| {
            let mut n = 0usize;
            for yy in y..y + lh {
                for xx in x..x + lw {
                    if c.get(xx, yy).is_some_and(|p| p != colors::WHITE && p != colors::GRID) {
                        n += 1;
                    }
                }
            }
            n
        };
        let best = spots.iter().copied().min_by_key(|s| ink(&c, *s)).unwrap_or(spots[0]);
        draw_legend(&mut c, best.0, best.1, &legend);
    }
    c
}

/// `{:.4}` for an ordinary loss, the compact form otherwise (`NaN`, `1.2e9`).
fn fmt_loss(v: f64) -> String {
    if v.is_finite() && v.abs() < 1e4 && (v == 0.0 || v.abs() >= 1e-3) {
        format!("{v:.4}")
    } else {
        super::ticks::fmt_value(v)
    }
}

/// The min and max of the finite values (infinities when there are none).
fn range(vs: impl Iterator<Item = f64>) -> (f64, f64) {
    vs.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// A centred moving average over about 1/25 of the points (at least 5), its window narrowing
/// towards the ends so that it stays centred (no lag); `None` for fewer than 30 points.
fn smoothed(pts: &[(f64, f64)]) -> Option<Vec<(f64, f64)>> {
    let n = pts.len();
    if n < 30 {
        return None;
    }
    let half = (n / 50).max(2);
    let mut prefix = vec![0.0; n + 1];
    for (i, p) in pts.iter().enumerate() {
        prefix[i + 1] = prefix[i] + p.1;
    }
    Some(
        (0..n)
            .map(|i| {
                let h = half.min(i).min(n - 1 - i);
                let (a, b) = (i - h, i + h + 1);
                (pts[i].0, (prefix[b] - prefix[a]) / (b - a) as f64)
            })
            .collect(),
    )
}

/// At most about `2 * pw` points: the mean of each of `pw` equal runs of `pts` when there are
/// more.
fn decimate(pts: &[(f64, f64)], pw: f64) -> Vec<(f64, f64)> {
    let buckets = pw.max(1.0) as usize;
    if pts.len() <= 2 * buckets {
        return pts.to_vec();
    }
    let per = pts.len().div_ceil(buckets);
    pts.chunks(per)
        .map(|ch| {
            let (sx, sy) = ch.iter().fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
            (sx / ch.len() as f64, sy / ch.len() as f64)
        })
        .collect()
}

/// Per pixel column of a `pw`-wide plot over `xlo..=xhi`: the column's offset and the min and
/// max of the values in it.
fn envelope(pts: &[(f64, f64)], xlo: f64, xhi: f64, pw: f64) -> Vec<(f64, f64, f64)> {
    let cols = pw.max(1.0) as usize;
    let mut out: Vec<(f64, f64, f64)> = (0..cols).map(|i| (i as f64, f64::INFINITY, f64::NEG_INFINITY)).collect();
    for &(x, v) in pts {
        let i = (((x - xlo) / (xhi - xlo).max(1e-12)) * cols as f64).floor().clamp(0.0, (cols - 1) as f64) as usize;
        out[i].1 = out[i].1.min(v);
        out[i].2 = out[i].2.max(v);
    }
    out.retain(|o| o.1 <= o.2);
    out
}
