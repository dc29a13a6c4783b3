//! An RGB raster with anti-aliased lines, rectangles, discs and bitmap text, saved as PNG.

use super::font;
use crate::{Error, Result};
use std::path::Path;

/// An RGB colour.
pub type Rgb = [u8; 3];

/// Colours shared by the plots (a tableau-like palette that survives greyscale printing).
pub mod colors {
    use super::Rgb;

    /// The background.
    pub const WHITE: Rgb = [255, 255, 255];
    /// Text.
    pub const TEXT: Rgb = [40, 40, 40];
    /// Secondary text: tick labels, value labels.
    pub const MUTED: Rgb = [90, 90, 90];
    /// Axis frame and tick marks.
    pub const AXIS: Rgb = [110, 110, 110];
    /// Grid lines.
    pub const GRID: Rgb = [228, 228, 228];
    /// Blue (the training loss).
    pub const BLUE: Rgb = [31, 119, 180];
    /// Orange (the eval metric).
    pub const ORANGE: Rgb = [255, 127, 14];
    /// Red (the learning rate).
    pub const RED: Rgb = [214, 39, 40];
    /// Green.
    pub const GREEN: Rgb = [44, 160, 44];
    /// Purple.
    pub const PURPLE: Rgb = [148, 103, 189];
    /// Brown.
    pub const BROWN: Rgb = [140, 86, 75];
    /// Pink.
    pub const PINK: Rgb = [227, 119, 194];
    /// Grey.
    pub const GREY: Rgb = [127, 127, 127];
    /// Olive.
    pub const OLIVE: Rgb = [188, 189, 34];
    /// Cyan.
    pub const CYAN: Rgb = [23, 190, 207];
    /// The series colours, in order.
    pub const SERIES: [Rgb; 10] = [BLUE, ORANGE, GREEN, RED, PURPLE, BROWN, PINK, GREY, OLIVE, CYAN];

    /// `c` mixed with white: `t` = 0 gives `c`, 1 gives white.
    pub fn tint(c: Rgb, t: f64) -> Rgb {
        let t = t.clamp(0.0, 1.0);
        c.map(|v| (v as f64 + (255.0 - v as f64) * t).round() as u8)
    }
}

/// An RGB raster, white when new. Coordinates are pixels from the top-left corner; a pixel
/// `(x, y)` covers `[x, x + 1) x [y, y + 1)`, so a line along `y = 10.5` lights row 10 only.
/// Whatever falls outside the raster is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    /// A white `w` x `h` canvas.
    pub fn new(w: usize, h: usize) -> Self {
        Canvas { w, h, px: vec![255; w * h * 3] }
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.w
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.h
    }

    /// The pixels, row-major RGB.
    pub fn pixels(&self) -> &[u8] {
        &self.px
    }

    /// The colour at `(x, y)`, or `None` outside the canvas.
    pub fn get(&self, x: i64, y: i64) -> Option<Rgb> {
        let i = self.index(x, y)?;
        Some([self.px[i], self.px[i + 1], self.px[i + 2]])
    }

    fn index(&self, x: i64, y: i64) -> Option<usize> {
        (x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h)
            .then(|| (y as usize * self.w + x as usize) * 3)
    }

    /// Paints the pixel `(x, y)`.
    pub fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if let Some(i) = self.index(x, y) {
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    /// Mixes `c` into the pixel `(x, y)` with opacity `alpha` in `[0, 1]`.
    pub fn blend(&mut self, x: i64, y: i64, c: Rgb, alpha: f64) {
        let a = alpha.clamp(0.0, 1.0);
        if a <= 0.0 {
            return;
        }
        if let Some(i) = self.index(x, y) {
            for (p, new) in self.px[i..i + 3].iter_mut().zip(c) {
                *p = (*p as f64 + (new as f64 - *p as f64) * a).round() as u8;
            }
        }
    }

    /// Fills the rectangle with top-left `(x, y)`, `w` wide and `h` high.
    pub fn fill_rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: Rgb) {
        let (x0, y0) = (x.max(0), y.max(0));
        let (x1, y1) = (x.saturating_add(w).min(self.w as i64), y.saturating_add(h).min(self.h as i64));
        for yy in y0..y1 {
            for xx in x0..x1 {
                self.set(xx, yy, c);
            }
        }
    }

    /// Outlines the rectangle with top-left `(x, y)`, `w` wide and `h` high, one pixel thick
    /// and inside the rectangle.
    pub fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: Rgb) {
        if w <= 0 || h <= 0 {
            return;
        }
        self.fill_rect(x, y, w, 1, c);
        self.fill_rect(x, y.saturating_add(h - 1), w, 1, c);
        self.fill_rect(x, y, 1, h, c);
        self.fill_rect(x.saturating_add(w - 1), y, 1, h, c);
    }

    /// An anti-aliased line from `(x0, y0)` to `(x1, y1)`, `width` pixels thick, with round caps.
    pub fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), c: Rgb, width: f64) {
        self.polyline(&[(x0, y0), (x1, y1)], c, width, 1.0, None);
    }

    /// An anti-aliased polyline through `pts`, `width` pixels thick, at opacity `alpha`;
    /// dashed when `dash` = `Some((on, off))` (lengths in pixels). Joints are not painted
    /// twice, so translucent lines stay even. Points that are not finite are skipped.
    pub fn polyline(&mut self, pts: &[(f64, f64)], c: Rgb, width: f64, alpha: f64, dash: Option<(f64, f64)>) {
        let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        if pts.is_empty() || width.is_nan() || width <= 0.0 {
            return;
        }
        let segs = match dash {
            Some((on, off)) if on > 0.0 && off > 0.0 && on + off >= 1.0 => {
                let pad = width + 2.0;
                dashes(&pts, on, off, (-pad, -pad, self.w as f64 + pad, self.h as f64 + pad))
            }
            _ if pts.len() == 1 => vec![(pts[0], pts[0])],
            _ => pts.windows(2).map(|w| (w[0], w[1])).collect(),
        };
        let r = width / 2.0;
        let pad = r + 1.0;
        let fold = |f: fn(f64, f64) -> f64, init: f64, sel: fn(&(f64, f64)) -> f64| pts.iter().map(sel).fold(init, f);
        let bx0 = (fold(f64::min, f64::INFINITY, |p| p.0) - pad).floor().max(0.0);
        let by0 = (fold(f64::min, f64::INFINITY, |p| p.1) - pad).floor().max(0.0);
        let bx1 = (fold(f64::max, f64::NEG_INFINITY, |p| p.0) + pad).ceil().min(self.w as f64);
        let by1 = (fold(f64::max, f64::NEG_INFINITY, |p| p.1) + pad).ceil().min(self.h as f64);
        if bx1 <= bx0 || by1 <= by0 {
            return;
        }
        let (ox, oy) = (bx0 as i64, by0 as i64);
        let (cw, ch) = ((bx1 - bx0) as usize, (by1 - by0) as usize);
        // coverage of each pixel in the bounding box: the max over the segments
        let mut cov = vec![0f32; cw * ch];
        for (a, b) in segs {
            let sx0 = ((a.0.min(b.0) - pad).floor() as i64).max(ox);
            let sy0 = ((a.1.min(b.1) - pad).floor() as i64).max(oy);
            let sx1 = ((a.0.max(b.0) + pad).ceil() as i64).min(ox + cw as i64);
            let sy1 = ((a.1.max(b.1) + pad).ceil() as i64).min(oy + ch as i64);
            for y in sy0..sy1 {
                for x in sx0..sx1 {
                    let d = dist_to_segment((x as f64 + 0.5, y as f64 + 0.5), a, b);
                    let v = (r + 0.5 - d).clamp(0.0, 1.0) as f32;
                    let i = (y - oy) as usize * cw + (x - ox) as usize;
                    if v > cov[i] {
                        cov[i] = v;
                    }
                }
            }
        }
        for (i, v) in cov.iter().enumerate() {
            if *v > 0.0 {
                self.blend(ox + (i % cw) as i64, oy + (i / cw) as i64, c, *v as f64 * alpha);
            }
        }
    }

    /// A filled anti-aliased disc of radius `r` centred on `(cx, cy)`.
    pub fn disc(&mut self, (cx, cy): (f64, f64), r: f64, c: Rgb) {
        if !cx.is_finite() || !cy.is_finite() || r.is_nan() || r <= 0.0 {
            return;
        }
        let (x0, x1) = (((cx - r - 1.0).floor() as i64).max(0), ((cx + r + 1.0).ceil() as i64).min(self.w as i64));
        let (y0, y1) = (((cy - r - 1.0).floor() as i64).max(0), ((cy + r + 1.0).ceil() as i64).min(self.h as i64));
        for y in y0..=y1 {
            for x in x0..=x1 {
                let d = ((x as f64 + 0.5 - cx).powi(2) + (y as f64 + 0.5 - cy).powi(2)).sqrt();
                self.blend(x, y, c, r + 0.5 - d);
            }
        }
    }

    /// Width in pixels of `s` drawn at `scale`.
    pub fn text_width(s: &str, scale: usize) -> usize {
        font::width(s) * scale
    }

    /// Height in pixels of a capital letter drawn at `scale` (the text's ascent).
    pub fn text_height(scale: usize) -> usize {
        font::CAP * scale
    }

    /// Draws `s` with its top-left corner (the top of the capitals) at `(x, y)`, each font
    /// pixel a `scale` x `scale` square; descenders reach `2 * scale` below the baseline.
    /// Returns the width drawn.
    pub fn text(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: usize) -> usize {
        self.glyphs(s, scale, |cv, col, row| {
            cv.fill_rect(x.saturating_add(col), y.saturating_add(row), scale as i64, scale as i64, c)
        })
    }

    /// Draws `s` as [`text`](Self::text) does, in bold (each stroke a pixel wider); returns the
    /// width drawn.
    pub fn text_bold(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: usize) -> usize {
        self.text(x.saturating_add(1), y, s, c, scale);
        self.text(x, y, s, c, scale) + 1
    }

    /// Draws `s` turned a quarter turn anticlockwise (reading upwards), with the top-left
    /// corner of its bounding box at `(x, y)`: the box is `text_height(scale)` wide (plus the
    /// descenders, on the right) and `text_width(s, scale)` high. Returns the length drawn.
    pub fn text_up(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: usize) -> usize {
        let len = Self::text_width(s, scale) as i64;
        let sc = scale as i64;
        self.glyphs(s, scale, |cv, col, row| {
            cv.fill_rect(x.saturating_add(row), y.saturating_add(len - col - sc), sc, sc, c)
        })
    }

    /// Calls `put(self, dx, dy)` for each lit font pixel of `s`, at offsets from the text's
    /// top-left corner; returns the width.
    fn glyphs(&mut self, s: &str, scale: usize, mut put: impl FnMut(&mut Self, i64, i64)) -> usize {
        let mut pen = 0usize;
        for (k, ch) in s.chars().enumerate() {
            if k > 0 {
                pen += font::GAP;
            }
            let (rows, first, w) = font::glyph(ch);
            for row in 0..font::ROWS {
                for col in 0..w {
                    if font::ink(rows, first + col, row) {
                        put(self, ((pen + col) * scale) as i64, (row * scale) as i64);
                    }
                }
            }
            pen += w;
        }
        pen * scale
    }

    /// Writes the canvas as an 8-bit RGB PNG.
    pub fn save_png(&self, path: &Path) -> Result<()> {
        let err = |e: &dyn std::fmt::Display| Error::invalid("plot", format!("{}: {e}", path.display()));
        let f = std::fs::File::create(path).map_err(|e| err(&e))?;
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), self.w as u32, self.h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| err(&e))?;
        w.write_image_data(&self.px).map_err(|e| err(&e))?;
        w.finish().map_err(|e| err(&e))
    }
}

/// Distance from `p` to the segment `a`-`b`.
fn dist_to_segment(p: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let t = if len2 > 0.0 { (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0) } else { 0.0 };
    let (qx, qy) = (a.0 + t * dx, a.1 + t * dy);
    ((p.0 - qx).powi(2) + (p.1 - qy).powi(2)).sqrt()
}

/// The "on" pieces of a dashed polyline, within the box `(x0, y0, x1, y1)`; the pattern runs
/// on across joints (and across the parts outside the box, which cost nothing).
fn dashes(pts: &[(f64, f64)], on: f64, off: f64, bbox: (f64, f64, f64, f64)) -> Vec<((f64, f64), (f64, f64))> {
    let period = on + off;
    let mut out = Vec::new();
    let mut dist = 0.0; // along the path, at the start of the segment
    for w in pts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        if len > 0.0 {
            if let Some((t0, t1)) = clip(a, b, bbox) {
                let at = |d: f64| {
                    let t = (d - dist) / len;
                    (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t)
                };
                let (d0, d1) = (dist + t0 * len, dist + t1 * len);
                let mut k = (d0 / period).floor();
                while k * period < d1 {
                    let (s, e) = ((k * period).max(d0), (k * period + on).min(d1));
                    if e > s {
                        out.push((at(s), at(e)));
                    }
                    k += 1.0;
                }
            }
        }
        dist += len;
    }
    out
}

/// The part `t0..=t1` (fractions of the way from `a` to `b`) of the segment inside the box
/// `(x0, y0, x1, y1)`, if any (Liang-Barsky).
fn clip(a: (f64, f64), b: (f64, f64), (x0, y0, x1, y1): (f64, f64, f64, f64)) -> Option<(f64, f64)> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0f64, 1f64);
    for (p, q) in [(-dx, a.0 - x0), (dx, x1 - a.0), (-dy, a.1 - y0), (dy, y1 - a.1)] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let r = q / p;
            if p < 0.0 {
                t0 = t0.max(r);
            } else {
                t1 = t1.min(r);
            }
        }
    }
    (t0 <= t1).then_some((t0, t1))
}
