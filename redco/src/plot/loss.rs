//! The training-curve plot: loss (and eval) on the left axis, learning rate on the right.

use super::style::{self, BLUE, FAMILY, GRID, MUTED, ORANGE, RED, TEXT};
use super::{draw_err, Rgb};
use plotters::chart::SeriesLabelPosition;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use redco_core::Result;
use redco_pipeline::metrics::StepMetrics;
use std::path::Path;

/// Width and height of [`loss_plot`]'s image.
pub const LOSS_PLOT_SIZE: (u32, u32) = (1000, 500);
/// At most this many eval points get a marker; more are drawn as a line only.
const MAX_MARKERS: usize = 60;
/// The plotting area's approximate width in pixels (for thinning dense curves).
const PLOT_W: usize = 800;

/// Writes the training curves of `steps` to a PNG ([`LOSS_PLOT_SIZE`]): the loss in blue
/// (faint raw values under a centred moving average when they are noisy), the eval metric
/// in orange with markers, both on the left axis, and the learning rate as a red dashed
/// line on the right axis; the x axis is the optimizer step, the title gives the final loss
/// and eval, and a legend sits in the corner the curves leave most free. Steps may come in
/// any order; non-finite values are skipped.
pub fn loss_plot(steps: &[StepMetrics], path: &Path) -> Result<()> {
    render_loss(steps)?.save_png(path)
}

/// The image of [`loss_plot`].
pub fn render_loss(steps: &[StepMetrics]) -> Result<Rgb> {
    style::font()?;
    let (w, h) = LOSS_PLOT_SIZE;
    let mut img = Rgb::white(w, h);
    {
        let root = BitMapBackend::with_buffer(&mut img.pixels, (w, h)).into_drawing_area();
        draw(&root, &Curves::new(steps)).map_err(draw_err)?;
        root.present().map_err(draw_err)?;
    }
    Ok(img)
}

/// The finite points of each curve, sorted by step, and the title.
struct Curves {
    loss: Vec<(f64, f64)>,
    eval: Vec<(f64, f64)>,
    lr: Vec<(f64, f64)>,
    steps: (f64, f64),
    title: String,
    empty: &'static str,
}

impl Curves {
    fn new(steps: &[StepMetrics]) -> Self {
        let mut ms: Vec<&StepMetrics> = steps.iter().collect();
        ms.sort_by_key(|m| m.step);
        let finite = |f: fn(&StepMetrics) -> Option<f64>| -> Vec<(f64, f64)> {
            ms.iter().filter_map(|m| f(m).filter(|v| v.is_finite()).map(|v| (m.step as f64, v))).collect()
        };
        let mut title = match ms.last() {
            Some(m) => format!("final loss {} at step {}", style::loss(m.loss), m.step),
            None => "no steps logged".to_string(),
        };
        if let Some((s, v)) = ms.iter().rev().find_map(|m| m.eval.map(|v| (m.step, v))) {
            title.push_str(&format!("     final eval {} at step {s}", style::loss(v)));
        }
        let (lo, hi) = range(ms.iter().map(|m| m.step as f64));
        let steps = if hi > lo {
            (lo, hi)
        } else if lo.is_finite() {
            ((lo - 1.0).max(0.0), hi + 1.0)
        } else {
            (0.0, 1.0)
        };
        Curves {
            loss: finite(|m| Some(m.loss)),
            eval: finite(|m| m.eval),
            lr: finite(|m| Some(m.lr)),
            steps,
            title,
            empty: if ms.is_empty() { "no data" } else { "no finite loss values" },
        }
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Curves,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let (xlo, xhi) = c.steps;
    let (ylo, yhi) = padded(range(c.loss.iter().chain(&c.eval).map(|p| p.1)), 0.04);
    let has_lr = !c.lr.is_empty();
    let (lrlo, lrhi) = range(c.lr.iter().map(|p| p.1));
    let (lrlo, lrhi) = if has_lr { padded((lrlo.min(0.0), lrhi), 0.03) } else { (0.0, 1.0) };
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, 23.0, &TEXT))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(76)
        .right_y_label_area_size(if has_lr { 92 } else { 0 })
        .build_cartesian_2d(xlo..xhi, ylo..yhi)?
        .set_secondary_coord(xlo..xhi, lrlo..lrhi);
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .axis_desc_style((FAMILY, 19.0, &TEXT))
        .label_style((FAMILY, 17.0, &MUTED))
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .x_labels(9)
        .y_labels(9)
        .x_label_formatter(&|v| style::step(*v))
        .y_label_formatter(&|v| style::compact(*v))
        .draw()?;
    if has_lr {
        chart
            .configure_secondary_axes()
            .y_desc("learning rate")
            .axis_desc_style((FAMILY, 19.0, &RED))
            .label_style((FAMILY, 17.0, &MUTED))
            .y_labels(9)
            .y_label_formatter(&|v| style::exp(*v))
            .draw()?;
        let lr = thin(&c.lr);
        chart
            .draw_secondary_series(DashedLineSeries::new(lr, 8, 5, RED.mix(0.9).stroke_width(2)))?
            .label("learning rate")
            .legend(|(x, y)| DashedPathElement::new(vec![(x, y), (x + 26, y)], 7, 4, RED.stroke_width(2)));
    }
    if !c.loss.is_empty() {
        let smooth = smoothed(&c.loss);
        let noisy = smooth.as_ref().is_some_and(|s| {
            let dev = c.loss.iter().zip(s).map(|(a, b)| (a.1 - b.1).abs()).sum::<f64>() / c.loss.len() as f64;
            dev > 0.004 * (yhi - ylo)
        });
        let raw = if noisy { BLUE.mix(0.4).stroke_width(1) } else { BLUE.stroke_width(2) };
        chart
            .draw_series(LineSeries::new(envelope(&c.loss), raw))?
            .label("loss")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 26, y)], raw));
        if c.loss.len() == 1 {
            chart.draw_series(c.loss.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))?;
        }
        if let (true, Some(s)) = (noisy, smooth) {
            chart
                .draw_series(LineSeries::new(thin(&s), BLUE.stroke_width(2)))?
                .label("loss, smoothed")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 26, y)], BLUE.stroke_width(2)));
        }
    }
    if !c.eval.is_empty() {
        let pts = thin(&c.eval);
        let markers = pts.len() <= MAX_MARKERS;
        chart.draw_series(LineSeries::new(pts.clone(), ORANGE.stroke_width(2)))?.label("eval").legend(move |(x, y)| {
            let marker = if markers { 4 } else { 0 };
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (26, 0)], ORANGE.stroke_width(2))
                + Circle::new((13, 0), marker, ORANGE.filled())
        });
        if markers {
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 5, WHITE.filled())))?;
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, ORANGE.filled())))?;
        }
    }
    if c.loss.is_empty() && c.eval.is_empty() {
        let centre = ((xlo + xhi) / 2.0, (ylo + yhi) / 2.0);
        let style = TextStyle::from((FAMILY, 18.0).into_font()).color(&MUTED).pos(text_anchor_centre());
        chart.plotting_area().draw(&Text::new(c.empty, centre, style))?;
    }
    if !c.loss.is_empty() || !c.eval.is_empty() || has_lr {
        chart
            .configure_series_labels()
            .position(legend_corner(c, (xlo, xhi), (ylo, yhi), (lrlo, lrhi)))
            .margin(14)
            .legend_area_size(34)
            .label_font((FAMILY, 17.0, &TEXT))
            .background_style(WHITE.mix(0.92))
            .border_style(RGBColor(200, 200, 200))
            .draw()?;
    }
    Ok(())
}

fn text_anchor_centre() -> plotters::style::text_anchor::Pos {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    Pos::new(HPos::Center, VPos::Center)
}

/// The corner whose quarter of the plot holds the fewest points of the curves.
fn legend_corner(c: &Curves, x: (f64, f64), y: (f64, f64), lr: (f64, f64)) -> SeriesLabelPosition {
    let norm = |v: f64, (lo, hi): (f64, f64)| (v - lo) / (hi - lo).max(f64::MIN_POSITIVE);
    let in_corner = |right: bool, upper: bool, (px, py): (f64, f64)| {
        (if right { px >= 0.62 } else { px <= 0.38 }) && (if upper { py >= 0.55 } else { py <= 0.45 })
    };
    let corners = [
        (true, true, SeriesLabelPosition::UpperRight),
        (false, true, SeriesLabelPosition::UpperLeft),
        (true, false, SeriesLabelPosition::LowerRight),
        (false, false, SeriesLabelPosition::LowerLeft),
    ];
    let points = || {
        let left = c.loss.iter().chain(&c.eval).map(move |p| (norm(p.0, x), norm(p.1, y)));
        left.chain(c.lr.iter().map(move |p| (norm(p.0, x), norm(p.1, lr))))
    };
    corners
        .into_iter()
        .min_by_key(|(r, u, _)| points().filter(|p| in_corner(*r, *u, *p)).count())
        .map_or(SeriesLabelPosition::UpperRight, |c| c.2)
}

/// The min and max of the finite values (infinities when there are none).
fn range(vs: impl Iterator<Item = f64>) -> (f64, f64) {
    vs.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// `(lo, hi)` widened by `frac` of its span on each side; a point or nothing gets a span.
fn padded((lo, hi): (f64, f64), frac: f64) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi <= lo {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return (lo - d, hi + d);
    }
    let pad = (hi - lo) * frac;
    (lo - pad, hi + pad)
}

/// A centred moving average over about 1/25 of the points (at least 5), its window
/// narrowing towards the ends so that it stays centred (no lag); `None` under 30 points.
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
    let mean = |i: usize| {
        let h = half.min(i).min(n - 1 - i);
        (prefix[i + h + 1] - prefix[i - h]) / (2 * h + 1) as f64
    };
    Some((0..n).map(|i| (pts[i].0, mean(i))).collect())
}

/// At most about `2 * PLOT_W` points: the mean of each of `PLOT_W` equal runs when there
/// are more (for smooth curves).
fn thin(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if pts.len() <= 2 * PLOT_W {
        return pts.to_vec();
    }
    let per = pts.len().div_ceil(PLOT_W);
    let mean = |ch: &[(f64, f64)]| {
        let (x, y) = ch.iter().fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
        (x / ch.len() as f64, y / ch.len() as f64)
    };
    pts.chunks(per).map(mean).collect()
}

/// At most about `2 * PLOT_W` points: each of `PLOT_W` equal runs as its min and max (in
/// step order) when there are more, so that a noisy raw curve keeps its band.
fn envelope(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if pts.len() <= 2 * PLOT_W {
        return pts.to_vec();
    }
    let per = pts.len().div_ceil(PLOT_W);
    let mut out = Vec::with_capacity(2 * PLOT_W + 2);
    for ch in pts.chunks(per) {
        let lo = ch.iter().copied().fold((0.0, f64::INFINITY), |a, p| if p.1 < a.1 { p } else { a });
        let hi = ch.iter().copied().fold((0.0, f64::NEG_INFINITY), |a, p| if p.1 > a.1 { p } else { a });
        if lo.0 <= hi.0 {
            out.extend([lo, hi]);
        } else {
            out.extend([hi, lo]);
        }
    }
    out
}
