//! What the charts share: the bundled font, the colours and the number formats.

use plotters::style::{FontFamily, FontStyle, RGBColor};
use redco_core::{Error, Result};
use std::sync::OnceLock;

/// DejaVu Sans (see `assets/fonts/LICENSE-DejaVu.txt`).
static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// The family name the charts ask plotters for.
pub const FAMILY: &str = "redco-sans";

/// Registers the bundled font with plotters (once per process); every chart calls it first.
pub fn font() -> Result<FontFamily<'static>> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, DEJAVU_SANS).is_ok());
    if ok {
        Ok(FontFamily::Name(FAMILY))
    } else {
        Err(Error::invalid("plot", "the bundled DejaVu Sans font does not parse"))
    }
}

/// Text.
pub const TEXT: RGBColor = RGBColor(34, 34, 34);
/// Tick labels and secondary text.
pub const MUTED: RGBColor = RGBColor(90, 90, 90);
/// Grid lines.
pub const GRID: RGBColor = RGBColor(228, 228, 228);
/// The loss.
pub const BLUE: RGBColor = RGBColor(31, 119, 180);
/// The eval metric.
pub const ORANGE: RGBColor = RGBColor(255, 127, 14);
/// The learning rate.
pub const RED: RGBColor = RGBColor(214, 39, 40);
/// Bars, one colour per label, in order of appearance.
pub const SERIES: [RGBColor; 8] = [
    BLUE,
    ORANGE,
    RGBColor(44, 160, 44),
    RED,
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A compact number: `0`, `0.25`, `3.5`, `12.3k`, `4.5M`, `3e-4`, `1.2e9`, `NaN`.
pub fn compact(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".into();
    }
    if !(1e-3..1e7).contains(&a) {
        return exp(v);
    }
    if a >= 1e4 {
        let (d, s) = if a >= 1e6 { (1e6, "M") } else { (1e3, "k") };
        return format!("{}{s}", trim(format!("{:.1}", v / d)));
    }
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    trim(format!("{v:.decimals$}"))
}

/// A number with a step's precision: whole steps as integers (compact when huge).
pub fn step(v: f64) -> String {
    if v.abs() < 1e7 && v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        compact(v)
    }
}

/// `2.5e-3`: three significant digits at most, no trailing zeros.
pub fn exp(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let s = format!("{v:.2e}");
    match s.split_once('e') {
        Some((m, e)) => format!("{}e{e}", trim(m.to_string())),
        None => s,
    }
}

/// A loss for the title: `{:.4}` when ordinary, compact otherwise.
pub fn loss(v: f64) -> String {
    if v.is_finite() && v.abs() < 1e4 && (v == 0.0 || v.abs() >= 1e-3) {
        format!("{v:.4}")
    } else {
        compact(v)
    }
}

/// Drops a decimal tail of zeros (and the point).
fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}
