use super::*;
use crate::pipeline::metrics::StepMetrics;
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("redco-plot-test-{}-{name}", std::process::id()))
}

/// Decodes a PNG and removes it: its width, height and RGB bytes.
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::remove_file(path).unwrap();
    let dec = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn m(step: u64, loss: f64, lr: f64, eval: Option<f64>) -> StepMetrics {
    StepMetrics { step, loss, lr, grad_norm: 1.0, tokens_per_s: 1000.0, step_time_s: 0.1, eval }
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
/// eval every 100 steps.
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
            let eval = (s % 100 == 0).then_some(clean + 0.06);
            m(s, loss, lr, eval)
        })
        .collect()
}

fn dark(c: Rgb) -> bool {
    c.iter().all(|v| *v < 128)
}

#[test]
fn the_digit_one_has_its_column_pattern() {
    let mut c = Canvas::new(20, 20);
    let w = c.text(2, 3, "1", [0, 0, 0], 1);
    assert_eq!(w, 5);
    // ..#.. / .##.. / ..#.. x4 / .###.
    let col = |x: i64| -> Vec<bool> { (0..7).map(|r| dark(c.get(2 + x, 3 + r).unwrap())).collect() };
    assert_eq!(col(0), [false; 7]);
    assert_eq!(col(1), [false, true, false, false, false, false, true]);
    assert_eq!(col(2), [true; 7]);
    assert_eq!(col(3), [false, false, false, false, false, false, true]);
    assert_eq!(col(4), [false; 7]);
    // nothing outside the glyph's cell
    for y in 0..20 {
        for x in 0..20 {
            if !(2..7).contains(&x) || !(3..10).contains(&y) {
                assert_eq!(c.get(x, y), Some(colors::WHITE), "ink at ({x}, {y})");
            }
        }
    }
}

#[test]
fn scaled_and_rotated_text_fill_their_boxes() {
    let s = "Loss 1.5e-3 (eval) x2%: q/p";
    for scale in [1, 2, 3] {
        let tw = Canvas::text_width(s, scale) as i64;
        let rows = (font::ROWS * scale) as i64;
        let mut c = Canvas::new(tw as usize + 20, rows as usize + 20);
        assert_eq!(c.text(10, 10, s, [0, 0, 0], scale) as i64, tw);
        let inked: Vec<(i64, i64)> = (0..c.height() as i64)
            .flat_map(|y| (0..c.width() as i64).map(move |x| (x, y)))
            .filter(|&(x, y)| c.get(x, y) != Some(colors::WHITE))
            .collect();
        assert!(!inked.is_empty());
        assert!(inked.iter().all(|&(x, y)| (10..10 + tw).contains(&x) && (10..10 + rows).contains(&y)));
        // the first and last columns of the box have ink (no trailing gap), and descenders reach below the caps
        assert!(inked.iter().any(|p| p.0 == 10) && inked.iter().any(|p| p.0 == 10 + tw - 1));
        assert!(inked.iter().any(|p| p.1 >= 10 + Canvas::text_height(scale) as i64));

        let mut r = Canvas::new(rows as usize + 20, tw as usize + 20);
        r.text_up(10, 10, s, [0, 0, 0], scale);
        let n = (0..r.height() as i64)
            .flat_map(|y| (0..r.width() as i64).map(move |x| (x, y)))
            .filter(|&(x, y)| r.get(x, y) != Some(colors::WHITE))
            .inspect(|&(x, y)| assert!((10..10 + rows).contains(&x) && (10..10 + tw).contains(&y)))
            .count();
        assert_eq!(n, inked.len(), "rotation keeps the pixels");
    }
}

#[test]
fn every_printable_character_has_a_glyph() {
    for ch in ' '..='~' {
        let (rows, _, w) = font::glyph(ch);
        assert!((1..=font::COLS).contains(&w), "{ch:?}");
        assert_eq!(ch == ' ', rows.iter().all(|r| *r == 0), "{ch:?}");
        assert!(rows.iter().all(|r| *r < 32), "{ch:?} is 5 columns wide");
    }
    // distinct letters and digits
    let mut seen = std::collections::HashMap::new();
    for ch in ('0'..='9').chain('A'..='Z').chain('a'..='z') {
        if let Some(other) = seen.insert(font::glyph(ch).0, ch) {
            assert!(matches!((other, ch), ('0', 'O')), "{other:?} and {ch:?} look the same");
        }
    }
    // outside ASCII: a box, not a panic
    assert_eq!(Canvas::text_width("\u{e9}", 1), 5);
}

#[test]
fn lines_are_dashed_clipped_and_safe_far_off_the_canvas() {
    let mut c = Canvas::new(100, 20);
    c.polyline(&[(-1e12, 10.5), (1e12, 10.5)], [0, 0, 0], 1.0, 1.0, Some((6.0, 4.0)));
    // row 10 alternates: runs of ink and of white, period 10
    let row: Vec<bool> = (0..100).map(|x| dark(c.get(x, 10).unwrap())).collect();
    let runs = row.windows(2).filter(|w| w[0] != w[1]).count();
    assert!((18..=21).contains(&runs), "{runs} changes in {row:?}");
    assert!((0..100).all(|x| c.get(x, 5) == Some(colors::WHITE)), "one pixel thick");
    c.line((f64::NAN, 0.0), (5.0, 5.0), [0, 0, 0], 2.0);
    c.disc((50.0, 10.0), 1e12, [0, 0, 0]);
    assert!((0..100).all(|x| dark(c.get(x, 0).unwrap())));
    c.fill_rect(i64::MAX - 1, i64::MAX - 1, i64::MAX, i64::MAX, [0, 0, 0]);
    c.rect(i64::MIN, i64::MIN, i64::MAX, i64::MAX, [0, 0, 0]);
    c.text(i64::MAX - 3, 0, "overflow", [0, 0, 0], 3);
    c.text_up(0, i64::MAX - 3, "overflow", [0, 0, 0], 3);
    assert!(Canvas::new(0, 0).save_png(&tmp("empty.png")).is_err() || std::fs::remove_file(tmp("empty.png")).is_ok());
}

#[test]
fn ticks_are_nice_and_cover_the_range() {
    let t = nice_ticks(0.93, 4.31, 8);
    assert!(t.step == 0.5 || t.step == 1.0, "{t:?}");
    assert!(t.lo <= 0.93 && t.hi >= 4.31 && t.values.len() <= 9);
    assert_eq!(t.values.first(), Some(&t.lo));
    assert_eq!(t.values.last(), Some(&t.hi));
    assert_eq!(tick_labels(&t), ["0.5", "1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0", "4.5"]);
    let t = nice_ticks(0.93, 4.31, 5);
    assert_eq!((t.step, t.lo, t.hi), (1.0, 0.0, 5.0));

    for (lo, hi) in [(0.0, 1.0), (-3.2, 7.9), (1e-9, 3e-9), (123.0, 98765.0), (2.5, 2.5), (0.0, 0.0), (f64::NAN, 1.0)] {
        for n in 1..12 {
            let t = nice_ticks(lo, hi, n);
            let m = t.step / 10f64.powf(t.step.log10().floor());
            assert!([1.0, 2.0, 5.0].iter().any(|x| (m - x).abs() < 1e-9), "{lo} {hi} {n}: {t:?}");
            assert!(t.values.len() >= 2 && t.values.len() <= n.max(2) + 1, "{lo} {hi} {n}: {t:?}");
            if lo.is_finite() {
                assert!(t.lo <= lo && t.hi >= hi, "{lo} {hi} {n}: {t:?}");
            }
        }
    }

    let t = aligned_ticks(0.0, 3e-3, 8);
    assert_eq!(t.values.len(), 9);
    assert!((t.step - 5e-4).abs() < 1e-15 && t.hi >= 3e-3);
    assert_eq!(tick_labels(&t), ["0", "5e-4", "1e-3", "1.5e-3", "2e-3", "2.5e-3", "3e-3", "3.5e-3", "4e-3"]);

    let t = inner_ticks(1.0, 300.0, 8, true);
    assert_eq!(t.values, [50.0, 100.0, 150.0, 200.0, 250.0, 300.0]);
    assert_eq!((t.lo, t.hi), (1.0, 300.0));
    assert_eq!(inner_ticks(1.0, 3.0, 10, true).step, 1.0);
    let t = inner_ticks(0.0, 2_000_000.0, 8, true);
    assert_eq!(step_labels(&t), ["0", "500k", "1M", "1.5M", "2M"]);
    assert_eq!(
        step_labels(&inner_ticks(10_000.0, 13_000.0, 6, true)),
        ["10k", "10.5k", "11k", "11.5k", "12k", "12.5k", "13k"]
    );
}

#[test]
fn values_are_compact() {
    let cases = [
        (0.0, "0"),
        (4.3125, "4.31"),
        (45.67, "45.7"),
        (0.012345, "0.0123"),
        (1234.4, "1234"),
        (12345.0, "12.3k"),
        (999_999.0, "1M"),
        (1.5e6, "1.5M"),
        (-2.5e9, "-2.5G"),
        (1.5e-4, "1.5e-4"),
        (3e-3, "0.003"),
        (f64::NAN, "NaN"),
        (f64::NEG_INFINITY, "-inf"),
    ];
    for (v, s) in cases {
        assert_eq!(fmt_value(v), s, "{v}");
    }
}

#[test]
fn the_training_plot_is_a_png_of_the_expected_size() {
    let p = tmp("curves.png");
    plot_png(&synthetic(300), &p).unwrap();
    let (w, h, px) = decode(&p);
    assert_eq!((w, h), (1000, 500));
    let count = |c: Rgb| px.chunks(3).filter(|p| *p == c).count();
    assert!(count(colors::BLUE) > 300, "the loss is drawn");
    assert!(count(colors::ORANGE) > 20, "the eval markers are drawn");
    assert!(px.chunks(3).filter(|p| dark([p[0], p[1], p[2]])).count() > 2000, "there is text");
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
        plot_png(&steps, &p).unwrap();
        assert_eq!(decode(&p).0, 1000, "{name}");
    }
}

#[test]
fn an_unwritable_path_is_an_error_naming_it() {
    let p = tmp("no-such-dir").join("x.png");
    let e = plot_png(&synthetic(10), &p).unwrap_err().to_string();
    assert!(e.contains("plot") && e.contains("no-such-dir"), "{e}");
}

#[test]
fn the_bar_chart_is_a_png() {
    let groups = vec![
        ("train tok/s".to_string(), vec![("redco-cpu-1x1".to_string(), 12345.0), ("torch".to_string(), 23456.7)]),
        ("decode tok/s".to_string(), vec![("redco-cpu-1x1".to_string(), 456.0), ("torch".to_string(), f64::NAN)]),
        ("delta".to_string(), vec![("a".to_string(), -3.0), ("b".to_string(), 2.0)]),
        ("empty".to_string(), vec![]),
    ];
    let p = tmp("bars.png");
    bar_chart("throughput", &groups, "tok/s", &p).unwrap();
    let (w, h, px) = decode(&p);
    assert!(w >= 900 && h > 200, "{w}x{h}");
    assert!(px.chunks(3).filter(|p| *p == colors::BLUE).count() > 1000, "bars are drawn");
    let p = tmp("bars-empty.png");
    bar_chart("", &[], "", &p).unwrap();
    assert!(decode(&p).0 > 0);
}
