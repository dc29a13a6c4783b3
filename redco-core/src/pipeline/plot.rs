//! A PNG plot of the loss and learning-rate curves, drawn without a plotting library:
//! loss in blue on the left scale, learning rate in red on the right scale.

use super::metrics::StepMetrics;
use crate::{Error, Result};
use std::path::Path;

const W: usize = 800;
const H: usize = 400;
const PAD: usize = 40;

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Self {
        Canvas { px: vec![255; W * H * 3] }
    }
    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }
    /// A line from (x0, y0) to (x1, y1), two pixels thick.
    fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), c: [u8; 3]) {
        let n = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as usize).max(1);
        for i in 0..=n {
            let t = i as f64 / n as f64;
            let (x, y) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
            for (dx, dy) in [(0, 0), (1, 0), (0, 1)] {
                self.set(x.round() as i64 + dx, y.round() as i64 + dy, c);
            }
        }
    }
}

/// Maps values to the plot's vertical range.
fn scale(v: &[f64]) -> impl Fn(f64) -> f64 {
    let lo = v.iter().cloned().filter(|x| x.is_finite()).fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().filter(|x| x.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (lo.min(0.0), lo.max(0.0) + 1.0) };
    move |x| (H - PAD) as f64 - (x - lo) / (hi - lo) * (H - 2 * PAD) as f64
}

/// Writes the loss and learning-rate curves of `steps` to a PNG file.
pub fn plot_png(steps: &[StepMetrics], path: &Path) -> Result<()> {
    let mut c = Canvas::new();
    // axes
    c.line((PAD as f64, PAD as f64), (PAD as f64, (H - PAD) as f64), [0, 0, 0]);
    c.line((PAD as f64, (H - PAD) as f64), ((W - PAD) as f64, (H - PAD) as f64), [0, 0, 0]);
    c.line(((W - PAD) as f64, PAD as f64), ((W - PAD) as f64, (H - PAD) as f64), [0, 0, 0]);
    if steps.len() > 1 {
        let (s0, s1) = (steps[0].step as f64, steps[steps.len() - 1].step as f64);
        let sx = |s: f64| PAD as f64 + (s - s0) / (s1 - s0).max(1.0) * (W - 2 * PAD) as f64;
        let loss: Vec<f64> = steps.iter().map(|m| m.loss).collect();
        let lr: Vec<f64> = steps.iter().map(|m| m.lr).collect();
        let (ly, ry) = (scale(&loss), scale(&lr));
        for w in steps.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            if a.loss.is_finite() && b.loss.is_finite() {
                c.line((sx(a.step as f64), ly(a.loss)), (sx(b.step as f64), ly(b.loss)), [30, 90, 200]);
            }
            c.line((sx(a.step as f64), ry(a.lr)), (sx(b.step as f64), ry(b.lr)), [210, 40, 40]);
        }
    }
    let f = std::fs::File::create(path).map_err(|e| Error::invalid("plot", format!("{}: {e}", path.display())))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), W as u32, H as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| Error::invalid("plot", e.to_string()))?;
    w.write_image_data(&c.px).map_err(|e| Error::invalid("plot", e.to_string()))?;
    Ok(())
}
