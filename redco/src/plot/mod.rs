//! PNG charts drawn with [plotters](https://docs.rs/plotters): the training curves
//! ([`loss_plot`]: loss, its smoothed trend and the eval metric on the left axis, the
//! learning rate on the right) and grouped bar charts ([`bar_chart`], as the benchmarks
//! draw them).
//!
//! The text is set in DejaVu Sans, bundled with the crate (`assets/fonts/`, with its
//! license), so a chart looks the same on every machine and needs no system font. plotters
//! draws into an RGB buffer, which the `png` crate encodes; the file is written
//! atomically (a temporary sibling, then a rename), so a reader never sees half a chart.

mod bars;
mod loss;
mod style;
#[cfg(test)]
mod tests;

pub use bars::bar_chart;
pub use loss::{loss_plot, render_loss, LOSS_PLOT_SIZE};

use redco_core::{Error, Result};
use std::io::Write;
use std::path::Path;

/// An RGB image: width, height, and 3 bytes per pixel, row by row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub pixels: Vec<u8>,
}

impl Rgb {
    /// A white image.
    fn white(width: u32, height: u32) -> Self {
        Rgb { width, height, pixels: vec![255; width as usize * height as usize * 3] }
    }

    /// The image as PNG bytes.
    pub fn png(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, self.width, self.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let err = |e: png::EncodingError| Error::invalid("plot", format!("cannot encode the PNG: {e}"));
        let mut w = enc.write_header().map_err(err)?;
        w.write_image_data(&self.pixels).map_err(err)?;
        w.finish().map_err(err)?;
        Ok(out)
    }

    /// Writes the image to `path` as a PNG, atomically.
    pub fn save_png(&self, path: &Path) -> Result<()> {
        write_atomic(path, &self.png()?)
    }
}

/// Writes `bytes` to a temporary sibling of `path`, then renames it over `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().map_or_else(|| "plot".into(), |f| f.to_string_lossy().to_string());
    let tmp = path.with_file_name(format!(".{name}.{}.part", std::process::id()));
    let written =
        std::fs::File::create(&tmp).and_then(|mut f| f.write_all(bytes)).and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::invalid("plot", format!("cannot write {}: {e}", path.display()))
    })
}

/// A plotters drawing error, as the crate's error.
fn draw_err<E: std::error::Error + Send + Sync>(e: plotters::drawing::DrawingAreaErrorKind<E>) -> Error {
    Error::invalid("plot", format!("cannot draw: {e}"))
}
