//! PNG charts drawn without a plotting library: the training curves ([`plot_png`]: loss and
//! eval on the left scale, learning rate on the right), grouped bar charts ([`bar_chart`]),
//! and the [`Canvas`] they are drawn on (lines, rectangles, discs and a built-in bitmap font)
//! for other charts.

mod bars;
mod canvas;
mod curves;
mod font;
mod ticks;

pub use bars::bar_chart;
pub use canvas::{colors, Canvas, Rgb};
pub use curves::plot_png;
pub use ticks::{aligned_ticks, fmt_value, inner_ticks, nice_ticks, step_labels, tick_labels, Ticks};

/// The text scale of the charts: each font pixel a 2 x 2 square.
const SCALE: usize = 2;

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy)]
enum Swatch {
    /// A line: colour, width, opacity, dash pattern.
    Line(Rgb, f64, f64, Option<(f64, f64)>),
    /// A line with a marker in the middle.
    Marker(Rgb),
}

/// Draws a legend box with `entries`, its top-left corner at `(x, y)`; [`legend_size`] gives
/// its size.
fn draw_legend(c: &mut Canvas, x: i64, y: i64, entries: &[(String, Swatch)]) {
    let (w, h) = legend_size(entries);
    c.fill_rect(x, y, w, h, colors::WHITE);
    c.rect(x, y, w, h, [200, 200, 200]);
    let th = Canvas::text_height(SCALE) as i64;
    for (i, (label, sw)) in entries.iter().enumerate() {
        let ry = y + LEGEND_PAD + i as i64 * LEGEND_ROW;
        let mid = ry as f64 + th as f64 / 2.0;
        let (sx0, sx1) = ((x + LEGEND_PAD) as f64, (x + LEGEND_PAD + LEGEND_SWATCH) as f64);
        match *sw {
            Swatch::Line(col, width, alpha, dash) => c.polyline(&[(sx0, mid), (sx1, mid)], col, width, alpha, dash),
            Swatch::Marker(col) => {
                c.line((sx0, mid), (sx1, mid), col, 1.5);
                c.disc(((sx0 + sx1) / 2.0, mid), 5.0, colors::WHITE);
                c.disc(((sx0 + sx1) / 2.0, mid), 3.5, col);
            }
        }
        c.text(x + LEGEND_PAD * 2 + LEGEND_SWATCH, ry, label, colors::TEXT, SCALE);
    }
}

const LEGEND_PAD: i64 = 9;
const LEGEND_ROW: i64 = 22;
const LEGEND_SWATCH: i64 = 30;

/// Width and height of the legend for `entries`.
fn legend_size(entries: &[(String, Swatch)]) -> (i64, i64) {
    let tw = entries.iter().map(|(l, _)| Canvas::text_width(l, SCALE)).max().unwrap_or(0) as i64;
    let w = LEGEND_PAD * 3 + LEGEND_SWATCH + tw;
    let h = LEGEND_PAD * 2 + LEGEND_ROW * entries.len() as i64 - (LEGEND_ROW - Canvas::text_height(SCALE) as i64);
    (w, h)
}

#[cfg(test)]
mod tests;
