//! Grouped horizontal bar charts (benchmark results: one group per metric, one bar per system).

use super::canvas::{colors, Canvas, Rgb};
use super::ticks::fmt_value;
use super::SCALE;
use crate::Result;
use std::path::Path;

const PAD: i64 = 16;
const BAR: i64 = 20;
const ROW: i64 = 28;
const MIN_W: i64 = 900;
const BAR_SPAN: i64 = 520;
const TITLE_SCALE: usize = 3;

/// Draws a grouped horizontal bar chart to a PNG: `title` on top, then for each group (a
/// metric, e.g. "train tok/s") its name and one bar per `(label, value)` (a system, e.g.
/// "redco-cpu-1x1"), with the value written at the end of the bar. Each group has its own
/// scale from zero (groups are different metrics); a label keeps its colour across groups.
/// `unit` (may be empty) is added to a group's name unless the name already has it.
/// Non-finite values get no bar and the label "n/a".
pub fn bar_chart(title: &str, groups: &[(String, Vec<(String, f64)>)], unit: &str, path: &Path) -> Result<()> {
    render(title, groups, unit).save_png(path)
}

/// The chart of [`bar_chart`], on a canvas.
fn render(title: &str, groups: &[(String, Vec<(String, f64)>)], unit: &str) -> Canvas {
    let th = Canvas::text_height(SCALE) as i64;
    let tw = |s: &str| Canvas::text_width(s, SCALE) as i64;
    // a colour per distinct label, in order of appearance
    let mut labels: Vec<&str> = Vec::new();
    for (_, bars) in groups {
        for (l, _) in bars {
            if !labels.contains(&l.as_str()) {
                labels.push(l);
            }
        }
    }
    let colour = |l: &str| -> Rgb {
        let i = labels.iter().position(|x| *x == l).unwrap_or(0);
        colors::SERIES[i % colors::SERIES.len()]
    };
    let label_w = labels.iter().map(|l| tw(l)).max().unwrap_or(0);
    let values: Vec<String> = groups.iter().flat_map(|(_, b)| b.iter().map(|(_, v)| value_label(*v))).collect();
    let value_w = values.iter().map(|v| tw(v)).max().unwrap_or(0);
    let headers: Vec<String> = groups
        .iter()
        .map(|(g, _)| if unit.is_empty() || g.contains(unit) { g.clone() } else { format!("{g} ({unit})") })
        .collect();
    let header_w = headers.iter().map(|h| tw(h)).max().unwrap_or(0);

    let bar_x = PAD + label_w + 12;
    let w = (bar_x + BAR_SPAN + 10 + value_w + PAD)
        .max(PAD + Canvas::text_width(title, TITLE_SCALE) as i64 + PAD)
        .max(PAD + header_w + PAD)
        .max(MIN_W);
    let span = w - PAD - value_w - 10 - bar_x;
    let body: i64 = groups.iter().map(|(_, b)| th + 14 + ROW * b.len().max(1) as i64 + 18).sum();
    let title_h = Canvas::text_height(TITLE_SCALE) as i64;
    let h = PAD + title_h + 22 + body.max(th) + PAD - 8;
    let mut c = Canvas::new(w as usize, h.max(1) as usize);

    c.text_bold(PAD, PAD, title, colors::TEXT, TITLE_SCALE);
    let mut y = PAD + title_h + 22;
    for ((_, bars), header) in groups.iter().zip(&headers) {
        c.text_bold(PAD, y, header, colors::TEXT, SCALE);
        c.fill_rect(PAD, y + th + 6, w - 2 * PAD, 1, colors::GRID);
        y += th + 14;
        if bars.is_empty() {
            c.text(bar_x, y + (ROW - th) / 2, "no data", colors::MUTED, SCALE);
            y += ROW + 18;
            continue;
        }
        // this group's scale: zero and the finite values, the largest magnitude filling the span
        let fin = bars.iter().map(|b| b.1).filter(|v| v.is_finite());
        let (lo, hi) = fin.fold((0f64, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let extent = if hi > lo { hi - lo } else { 1.0 };
        let px = |v: f64| bar_x + ((v - lo) / extent * span as f64).round() as i64;
        let zero = px(0.0);
        for (label, v) in bars {
            let ty = y + (ROW - th) / 2;
            c.text(bar_x - 12 - tw(label), ty, label, colors::TEXT, SCALE);
            let by = y + (ROW - BAR) / 2;
            let mut end = zero;
            if v.is_finite() {
                let x = px(*v);
                let (a, b) = (zero.min(x), zero.max(x));
                let col = colour(label);
                c.fill_rect(a, by, (b - a).max(1), BAR, col);
                end = b;
            }
            c.text(end + 8, ty, &value_label(*v), colors::MUTED, SCALE);
            y += ROW;
        }
        c.fill_rect(zero, y - ROW * bars.len() as i64 + 2, 1, ROW * bars.len() as i64 - 4, colors::AXIS);
        y += 18;
    }
    c
}

/// A bar's value label.
fn value_label(v: f64) -> String {
    if v.is_finite() {
        fmt_value(v)
    } else {
        "n/a".into()
    }
}
