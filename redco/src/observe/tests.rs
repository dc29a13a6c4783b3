//! The TensorBoard files read back: by a decoder written here from the format's
//! description (TFRecord framing with its CRCs, the protobuf wire format), and by
//! TensorBoard's own reader where Python has it.

use super::{TensorBoard, TrainObserver, FILE_VERSION};
use redco_pipeline::metrics::StepMetrics;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-observe-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// CRC32C, bit by bit (Castagnoli polynomial, reflected), masked as TFRecord does.
fn masked(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    let crc = !crc;
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The records of a TFRecord file, every CRC checked.
fn records(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let (mut out, mut at) = (Vec::new(), 0);
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    while at < bytes.len() {
        let len_bytes = &bytes[at..at + 8];
        if u32_at(at + 8) != masked(len_bytes) {
            return Err(format!("the length CRC of the record at {at}"));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let data = &bytes[at + 12..at + 12 + len];
        if u32_at(at + 12 + len) != masked(data) {
            return Err(format!("the data CRC of the record at {at}"));
        }
        out.push(data.to_vec());
        at += 16 + len;
    }
    Ok(out)
}

/// A protobuf field's value.
#[derive(Debug, Clone)]
enum Field {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Vec<u8>),
    Fixed32([u8; 4]),
}

/// A message's fields by number, in order.
fn fields(mut b: &[u8]) -> Vec<(u32, Field)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                return v;
            }
        }
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let f = match key & 7 {
            0 => Field::Varint(varint(&mut b)),
            1 => {
                let (v, rest) = b.split_at(8);
                b = rest;
                Field::Fixed64(v.try_into().unwrap())
            }
            2 => {
                let n = varint(&mut b) as usize;
                let (v, rest) = b.split_at(n);
                b = rest;
                Field::Bytes(v.to_vec())
            }
            5 => {
                let (v, rest) = b.split_at(4);
                b = rest;
                Field::Fixed32(v.try_into().unwrap())
            }
            t => panic!("wire type {t}"),
        };
        out.push(((key >> 3) as u32, f));
    }
    out
}

/// One decoded event: wall time, step, file version, scalars.
#[derive(Debug, Default)]
struct Event {
    wall_time: f64,
    step: i64,
    file_version: Option<String>,
    scalars: Vec<(String, f32)>,
}

fn event(data: &[u8]) -> Event {
    let mut e = Event::default();
    for (n, f) in fields(data) {
        match (n, f) {
            (1, Field::Fixed64(v)) => e.wall_time = f64::from_le_bytes(v),
            (2, Field::Varint(v)) => e.step = v as i64,
            (3, Field::Bytes(v)) => e.file_version = Some(String::from_utf8(v).unwrap()),
            (5, Field::Bytes(summary)) => {
                for (n, value) in fields(&summary) {
                    let (1, Field::Bytes(value)) = (n, value) else { panic!("Summary field {n}") };
                    let (mut tag, mut v) = (String::new(), None);
                    for (n, f) in fields(&value) {
                        match (n, f) {
                            (1, Field::Bytes(t)) => tag = String::from_utf8(t).unwrap(),
                            (2, Field::Fixed32(x)) => v = Some(f32::from_le_bytes(x)),
                            other => panic!("Summary.Value field {other:?}"),
                        }
                    }
                    e.scalars.push((tag, v.expect("simple_value")));
                }
            }
            other => panic!("Event field {other:?}"),
        }
    }
    e
}

/// The events of every event file in `dir`, files in name order.
fn read_dir(dir: &Path) -> Vec<Event> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files.iter().flat_map(|f| records(&std::fs::read(f).unwrap()).unwrap()).map(|r| event(&r)).collect()
}

fn m(step: u64) -> StepMetrics {
    let s = step as f64;
    StepMetrics {
        step,
        loss: 4.0 / s + 0.123_456_789,
        lr: 3e-4 * s,
        grad_norm: if step == 2 { f64::NAN } else { 1.5 + s },
        tokens_per_s: 1000.0 + s,
        step_time_s: 0.1,
        eval: step.is_multiple_of(2).then_some(2.0 / s),
        moe_dropped: None,
    }
}

/// What a run of steps `from..=to` logs, per tag: (step, value as f32).
fn expected(steps: impl Iterator<Item = u64>) -> BTreeMap<String, Vec<(i64, f32)>> {
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for s in steps {
        let x = m(s);
        let vals =
            [("loss", x.loss), ("learning_rate", x.lr), ("grad_norm", x.grad_norm), ("tokens_per_s", x.tokens_per_s)];
        for (tag, v) in vals.into_iter().chain(x.eval.map(|e| ("eval", e))).filter(|(_, v)| v.is_finite()) {
            out.entry(tag.to_string()).or_default().push((s as i64, v as f32));
        }
    }
    out
}

/// Runs the observer over steps `first+1..=last` in `workdir`.
fn run(workdir: &Path, first: u64, last: u64) -> PathBuf {
    let mut tb = TensorBoard::new();
    tb.on_start(workdir, first, last).unwrap();
    for s in first + 1..=last {
        tb.on_step(&m(s)).unwrap();
    }
    let path = tb.path().unwrap().to_path_buf();
    tb.on_end(workdir, &[]).unwrap();
    path
}

#[test]
fn the_event_file_reads_back_with_its_crcs_steps_and_values() {
    let w = tmp("read-back");
    let path = run(&w, 0, 5);
    assert!(path.starts_with(w.join("tensorboard")));
    assert!(path.file_name().unwrap().to_string_lossy().starts_with("events.out.tfevents."));
    let events = read_dir(&w.join("tensorboard"));
    assert_eq!(events.len(), 6, "the version event, then one per step");
    assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let mut got: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for e in &events[1..] {
        assert!((now - e.wall_time).abs() < 600.0, "wall time {}", e.wall_time);
        assert!(e.file_version.is_none());
        for (tag, v) in &e.scalars {
            got.entry(tag.clone()).or_default().push((e.step, *v));
        }
    }
    assert_eq!(got, expected(1..=5));
    assert_eq!(got["eval"].iter().map(|p| p.0).collect::<Vec<_>>(), [2, 4], "eval on the steps that have it");
    assert_eq!(got["grad_norm"].len(), 4, "a non-finite value is left out");
    // a corrupted byte fails the CRC check
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 6] ^= 1;
    assert!(records(&bytes).unwrap_err().contains("data CRC"), "a flipped bit is caught");
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn a_resumed_run_adds_a_file_and_a_fresh_run_replaces_them() {
    let w = tmp("resume");
    let first = run(&w, 0, 3);
    std::thread::sleep(std::time::Duration::from_millis(1100)); // a later file name
    let second = run(&w, 2, 4);
    assert_ne!(first, second);
    assert!(first.exists() && second.exists());
    let steps: Vec<i64> = read_dir(&w.join("tensorboard")).iter().map(|e| e.step).collect();
    assert_eq!(steps, [0, 1, 2, 3, 0, 3, 4], "TensorBoard drops the repeated step 3 when it reads them");
    let third = run(&w, 0, 1);
    assert!(!first.exists() && !second.exists() && third.exists(), "a run from step 0 replaced the earlier ones");
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn a_file_that_cannot_be_created_is_an_error_naming_it() {
    let w = tmp("unwritable");
    std::fs::write(w.join("tensorboard"), b"a file where the directory goes").unwrap();
    let e = TensorBoard::new().on_start(&w, 0, 3).unwrap_err().to_string();
    assert!(e.contains("tensorboard") && e.contains(&w.display().to_string()), "{e}");
    let _ = std::fs::remove_dir_all(&w);
}

/// TensorBoard's own reader (`EventAccumulator`) agrees, where Python has the
/// `tensorboard` package (`REDCO_PYTHON`, else `python3`); skipped otherwise, saying why.
#[test]
fn tensorboards_own_reader_reads_the_same_scalars() {
    let w = tmp("python");
    run(&w, 0, 6);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/python/check_tensorboard.py");
    let python = std::env::var("REDCO_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = match std::process::Command::new(&python).arg(&script).arg(w.join("tensorboard")).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: cannot run {python} ({e}); set REDCO_PYTHON to a Python with tensorboard");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        eprintln!("SKIPPED: {python}: {}", stderr.trim());
        return;
    }
    assert!(out.status.success(), "{python} {}: {stderr}", script.display());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut got: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for (tag, points) in json.as_object().unwrap() {
        for p in points.as_array().unwrap() {
            let v = p[1].as_f64().unwrap_or(f64::NAN);
            got.entry(tag.clone()).or_default().push((p[0].as_i64().unwrap(), v as f32));
        }
    }
    assert_eq!(got, expected(1..=6), "TensorBoard reads what was logged, to f32 precision");
    eprintln!("TensorBoard's EventAccumulator read {} tags", got.len());
    let _ = std::fs::remove_dir_all(&w);
}
