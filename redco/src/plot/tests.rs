use super::style::{self, BLUE, ORANGE};
use super::*;
use plotters::style::RGBColor;
use redco_pipeline::metrics::StepMetrics;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("redco-plot-test-{}-{name}", std::process::id()))
}

/// Decodes a PNG file and removes it.
fn decode(path: &Path) -> Rgb {
    let bytes = std::fs::read(path).unwrap();
    std::fs::remove_file(path).unwrap();
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    Rgb { width: info.width, height: info.height, pixels: buf }
}

/// The pixels of `img` in the box `x0..x1`, `y0..y1` that satisfy `f`.
fn count(img: &Rgb, (x0, x1): (u32, u32), (y0, y1): (u32, u32), f: impl Fn([u8; 3]) -> bool) -> usize {
    let mut n = 0;
    for y in y0..y1.min(img.height) {
        for x in x0..x1.min(img.width) {
            let i = (y * img.width + x) as usize * 3;
            n += usize::from(f([img.pixels[i], img.pixels[i + 1], img.pixels[i + 2]]));
        }
    }
    n
}

fn is(c: RGBColor) -> impl Fn([u8; 3]) -> bool {
    move |p| p == [c.0, c.1, c.2]
}

/// The learning rate's red, blended or not.
fn reddish(p: [u8; 3]) -> bool {
    p[0] > 180 && p[1] < 110 && p[2] < 110
}

fn dark(p: [u8; 3]) -> bool {
    p.iter().all(|v| *v < 128)
}

fn m(step: u64, loss: f64, lr: f64, eval: Option<f64>) -> StepMetrics {
    StepMetrics { step, loss, lr, grad_norm: 1.0, tokens_per_s: 1000.0, step_time_s: 0.1, eval, moe_dropped: None }
}

/// A deterministic noise in [-1, 1).
fn noise(i: u64) -> f64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Loss decaying 4.3 -> 0.95 with noise, cosine learning rate with warmup peaking at 3e-3,
/// eval every 100 steps (the curve the old renderer was compared on).
fn synthetic(n: u64) -> Vec<StepMetrics> {
    let warmup = n / 15;
    (1..=n)
        .map(|s| {
            let t = s as f64 / n as f64;
            let clean = 0.95 + 3.35 * ((-5.0 * t).exp() - (-5f64).exp()) / (1.0 - (-5f64).exp());
            let loss = clean + 0.06 * noise(s) * clean.sqrt() * (1.0 - t * 0.7);
            let lr = if s <= warmup {
                3e-3 * s as f64 / warmup as f64
            } else {
                let p = (s - warmup) as f64 / (n - warmup) as f64;
                3e-4 + (3e-3 - 3e-4) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            };
            m(s, loss, lr, (s % 100 == 0).then_some(clean + 0.06))
        })
        .collect()
}

#[test]
fn the_loss_plot_has_its_size_curves_legend_and_both_axes() {
    if let Some(dir) = std::env::var_os("REDCO_PLOT_DIR") {
        loss_plot(&synthetic(1000), &PathBuf::from(dir).join("new_loss.png")).unwrap();
    }
    let p = tmp("loss.png");
    loss_plot(&synthetic(1000), &p).unwrap();
    let img = decode(&p);
    assert_eq!((img.width, img.height), LOSS_PLOT_SIZE);
    let (w, h) = (img.width, img.height);
    let all = ((0, w), (0, h));
    assert!(count(&img, all.0, all.1, is(BLUE)) > 1500, "the smoothed loss is drawn");
    assert!(count(&img, all.0, all.1, is(ORANGE)) > 300, "the eval line and markers are drawn");
    assert!(count(&img, all.0, all.1, reddish) > 500, "the learning rate and its axis title are drawn");
    assert!(count(&img, (0, w), (0, 40), dark) > 300, "the title is written on top");
    // the left and right label areas: tick labels, and the axis titles
    assert!(count(&img, (0, 80), (40, h - 60), |p| p != [255; 3]) > 300, "the loss axis is labelled");
    assert!(count(&img, (w - 95, w), (40, h - 60), |p| p != [255; 3]) > 300, "the learning-rate axis is labelled");
    assert!(count(&img, (w - 40, w), (40, h - 60), reddish) > 40, "the learning-rate axis has its red title");
    assert!(count(&img, (100, w - 100), (h - 55, h), dark) > 100, "the step axis is labelled");
}

#[test]
fn odd_inputs_still_write_a_plot() {
    let nan = f64::NAN;
    let cases: Vec<(&str, Vec<StepMetrics>)> = vec![
        ("empty", vec![]),
        ("one", vec![m(1, 2.5, 1e-3, Some(2.6))]),
        ("nan", (1..=50).map(|s| m(s, nan, nan, Some(nan))).collect()),
        (
            "inf",
            (1..=50).map(|s| m(s, if s % 2 == 0 { f64::INFINITY } else { 1.0 }, f64::NEG_INFINITY, None)).collect(),
        ),
        ("flat", (1..=50).map(|s| m(s, 1.0, 3e-4, None)).collect()),
        ("zero", (1..=50).map(|s| m(s, 0.0, 0.0, None)).collect()),
        (
            "huge-steps",
            (0..200_000u64)
                .map(|i| m(1_000_000_000 + i * 5_000, 3.0 - i as f64 * 1e-5 + noise(i), 1e-4, None))
                .collect(),
        ),
        ("unsorted", vec![m(5, 1.0, 1e-3, None), m(1, 2.0, 0.0, None), m(3, nan, 1e-3, Some(1.5))]),
        ("huge-values", (1..=20).map(|s| m(s, 1e30 * s as f64, 1e9, None)).collect()),
    ];
    for (name, steps) in cases {
        let p = tmp(&format!("odd-{name}.png"));
        loss_plot(&steps, &p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decode(&p).width, LOSS_PLOT_SIZE.0, "{name}");
    }
}

#[test]
fn an_unwritable_path_is_an_error_naming_it() {
    let p = tmp("no-such-dir").join("x.png");
    let e = loss_plot(&synthetic(10), &p).unwrap_err().to_string();
    assert!(e.contains("plot") && e.contains("no-such-dir"), "{e}");
    assert!(!p.with_file_name(".x.png.part").exists());
}

#[test]
fn the_bar_chart_is_a_png_with_a_bar_per_value() {
    let groups = vec![
        ("train tok/s".to_string(), vec![("redco-cpu-1x1".to_string(), 12345.0), ("torch".to_string(), 23456.7)]),
        ("decode tok/s".to_string(), vec![("redco-cpu-1x1".to_string(), 456.0), ("torch".to_string(), f64::NAN)]),
        ("delta".to_string(), vec![("a".to_string(), -3.0), ("b".to_string(), 2.0)]),
        ("empty".to_string(), vec![]),
    ];
    let p = tmp("bars.png");
    bar_chart("throughput", &groups, "tok/s", &p).unwrap();
    let img = decode(&p);
    assert!(img.width >= 900 && img.height > 200, "{}x{}", img.width, img.height);
    let all = ((0, img.width), (0, img.height));
    assert!(count(&img, all.0, all.1, is(BLUE)) > 2 * 20 * 300, "two long blue bars");
    assert!(count(&img, all.0, all.1, is(ORANGE)) > 20 * 300, "the other label keeps its colour");
    assert!(count(&img, all.0, all.1, dark) > 1000, "labels are written");
    if let Some(dir) = std::env::var_os("REDCO_PLOT_DIR") {
        bar_chart("throughput", &groups[..3], "tok/s", &PathBuf::from(dir).join("new_bars.png")).unwrap();
    }
    let p = tmp("bars-empty.png");
    bar_chart("", &[], "", &p).unwrap();
    assert!(decode(&p).width > 0);
}

#[test]
fn numbers_are_compact() {
    let cases = [
        (0.0, "0"),
        (0.25, "0.25"),
        (3.5, "3.5"),
        (12345.0, "12.3k"),
        (4_500_000.0, "4.5M"),
        (3e-4, "3e-4"),
        (1.2e9, "1.2e9"),
        (f64::NAN, "NaN"),
        (-3.0, "-3"),
    ];
    for (v, s) in cases {
        assert_eq!(style::compact(v), s, "{v}");
    }
    assert_eq!(style::exp(0.0025), "2.5e-3");
    assert_eq!(style::exp(0.0030000000000000005), "3e-3");
    assert_eq!(style::step(1000.0), "1000");
    assert_eq!(style::loss(0.93901), "0.9390");
}
