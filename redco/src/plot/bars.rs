//! Grouped horizontal bar charts (benchmark results: one group per metric, one bar per
//! system).

use super::style::{self, FAMILY, GRID, MUTED, SERIES, TEXT};
use super::{draw_err, Rgb};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use redco_core::{Error, Result};
use std::path::Path;

const PAD: i32 = 16;
const BAR: i32 = 20;
const ROW: i32 = 28;
const MIN_W: i32 = 900;
const BAR_SPAN: i32 = 520;
const TITLE: f64 = 26.0;
const HEADER: f64 = 19.0;
const LABEL: f64 = 17.0;

/// Draws a grouped horizontal bar chart to a PNG: `title` on top, then for each group (a
/// metric, e.g. "train tok/s") its name and one bar per `(label, value)` (a system, e.g.
/// "redco-cpu-1x1"), with the value written at the end of the bar. Each group has its own
/// scale from zero (groups are different metrics); a label keeps its colour across groups.
/// `unit` (may be empty) is added to a group's name unless the name already has it.
/// Non-finite values get no bar and the label "n/a".
pub fn bar_chart(title: &str, groups: &[(String, Vec<(String, f64)>)], unit: &str, path: &Path) -> Result<()> {
    render(title, groups, unit)?.save_png(path)
}

/// Text's width in pixels at `size`.
fn width(text: &str, size: f64) -> Result<i32> {
    let (w, _) = (FAMILY, size)
        .into_font()
        .box_size(text)
        .map_err(|e| Error::invalid("plot", format!("cannot measure text: {e}")))?;
    Ok(w as i32)
}

/// The widest of `texts` at `size`.
fn widest<'a>(texts: impl IntoIterator<Item = &'a str>, size: f64) -> Result<i32> {
    texts.into_iter().try_fold(0, |m, t| Ok(m.max(width(t, size)?)))
}

/// The chart of [`bar_chart`].
fn render(title: &str, groups: &[(String, Vec<(String, f64)>)], unit: &str) -> Result<Rgb> {
    style::font()?;
    // a colour per distinct label, in order of appearance
    let mut labels: Vec<&str> = Vec::new();
    for (_, bars) in groups {
        for (l, _) in bars {
            if !labels.contains(&l.as_str()) {
                labels.push(l);
            }
        }
    }
    let values: Vec<String> = groups.iter().flat_map(|(_, b)| b.iter().map(|(_, v)| value_label(*v))).collect();
    let headers: Vec<String> = groups
        .iter()
        .map(|(g, _)| if unit.is_empty() || g.contains(unit) { g.clone() } else { format!("{g} ({unit})") })
        .collect();
    let label_w = widest(labels.iter().copied(), LABEL)?;
    let value_w = widest(values.iter().map(String::as_str), LABEL)?;
    let bar_x = PAD + label_w + 12;
    let w = (bar_x + BAR_SPAN + 10 + value_w + PAD)
        .max(PAD + width(title, TITLE)? + PAD)
        .max(PAD + widest(headers.iter().map(String::as_str), HEADER)? + PAD)
        .max(MIN_W);
    let body: i32 = groups.iter().map(|(_, b)| 24 + ROW * b.len().max(1) as i32 + 16).sum();
    let h = PAD + 34 + 12 + body.max(ROW) + PAD;
    let layout = Layout { labels, headers, bar_x, span: w - PAD - value_w - 10 - bar_x, w };
    let mut img = Rgb::white(w as u32, h as u32);
    {
        let root = BitMapBackend::with_buffer(&mut img.pixels, (w as u32, h as u32)).into_drawing_area();
        draw(&root, title, groups, &layout).map_err(draw_err)?;
        root.present().map_err(draw_err)?;
    }
    Ok(img)
}

/// Where things go.
struct Layout<'a> {
    labels: Vec<&'a str>,
    headers: Vec<String>,
    bar_x: i32,
    span: i32,
    w: i32,
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    groups: &[(String, Vec<(String, f64)>)],
    l: &Layout<'_>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let text = |size: f64, colour: &'static RGBColor, h: HPos| {
        TextStyle::from((FAMILY, size).into_font()).color(colour).pos(Pos::new(h, VPos::Center))
    };
    root.draw(&Text::new(title, (PAD, PAD + 17), text(TITLE, &TEXT, HPos::Left)))?;
    let mut y = PAD + 34 + 12;
    for ((_, bars), header) in groups.iter().zip(&l.headers) {
        root.draw(&Text::new(header.as_str(), (PAD, y + 9), text(HEADER, &TEXT, HPos::Left)))?;
        root.draw(&Rectangle::new([(PAD, y + 20), (l.w - PAD, y + 21)], GRID.filled()))?;
        y += 24;
        if bars.is_empty() {
            root.draw(&Text::new("no data", (l.bar_x, y + ROW / 2), text(LABEL, &MUTED, HPos::Left)))?;
            y += ROW + 16;
            continue;
        }
        // this group's scale: zero and the finite values, the largest magnitude filling the span
        let fin = bars.iter().map(|b| b.1).filter(|v| v.is_finite());
        let (lo, hi) = fin.fold((0f64, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let extent = if hi > lo { hi - lo } else { 1.0 };
        let px = |v: f64| l.bar_x + ((v - lo) / extent * l.span as f64).round() as i32;
        let zero = px(0.0);
        let top = y;
        for (label, v) in bars {
            let mid = y + ROW / 2;
            root.draw(&Text::new(label.as_str(), (l.bar_x - 12, mid), text(LABEL, &TEXT, HPos::Right)))?;
            let mut end = zero;
            if v.is_finite() {
                let x = px(*v);
                let (a, b) = (zero.min(x), zero.max(x).max(zero.min(x) + 1));
                let i = l.labels.iter().position(|x| x == label).unwrap_or(0);
                root.draw(&Rectangle::new(
                    [(a, mid - BAR / 2), (b, mid + BAR / 2)],
                    SERIES[i % SERIES.len()].filled(),
                ))?;
                end = b;
            }
            root.draw(&Text::new(value_label(*v), (end + 8, mid), text(LABEL, &MUTED, HPos::Left)))?;
            y += ROW;
        }
        root.draw(&Rectangle::new([(zero, top + 2), (zero + 1, y - 2)], RGBColor(120, 120, 120).filled()))?;
        y += 16;
    }
    Ok(())
}

/// A bar's value label.
fn value_label(v: f64) -> String {
    if v.is_finite() {
        style::compact(v)
    } else {
        "n/a".into()
    }
}
