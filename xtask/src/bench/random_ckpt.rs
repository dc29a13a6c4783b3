//! A random LLaMA checkpoint in bf16 written tensor by tensor (`model.safetensors` and
//! `config.json`), for the real-size rows of `bench load`: a 7B-config model is 13.5 GB,
//! more than building it in memory first would leave room for on a 24 GiB machine.
//! Weights are uniform in ±0.035 (about the spread of an initialised LLaMA's), norms 1.

use redco_core::Shape;
use std::io::{BufWriter, Write};
use std::path::Path;

/// A xorshift generator: enough to make weights that are not all alike.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `x` in bf16 (its f32 bits truncated to the upper half), little-endian.
fn bf16_bits(x: f32) -> [u8; 2] {
    ((x.to_bits() >> 16) as u16).to_le_bytes()
}

/// Writes `shapes` as random bf16 tensors into `dir/model.safetensors`, and `config` (a
/// config.json's text) beside it.
pub fn write(dir: &Path, config: &str, shapes: &[(String, Shape)]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in shapes {
        let bytes = shape.elem_count() as u64 * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape.dims(), "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut text = serde_json::Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let path = dir.join("model.safetensors");
    let tmp = dir.join("model.safetensors.partial");
    let file = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut out = BufWriter::with_capacity(1 << 22, file);
    let io = |e: std::io::Error| format!("writing {}: {e}", tmp.display());
    out.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(text.as_bytes()).map_err(io)?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let one = bf16_bits(1.0);
    let mut chunk = Vec::with_capacity(1 << 20);
    for (name, shape) in shapes {
        let norm = name.ends_with("norm.weight");
        let mut left = shape.elem_count();
        while left > 0 {
            let n = left.min(1 << 19);
            chunk.clear();
            for _ in 0..n {
                let bits = if norm {
                    one
                } else {
                    // uniform in [-0.035, 0.035)
                    let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
                    bf16_bits((u * 2.0 - 1.0) * 0.035)
                };
                chunk.extend_from_slice(&bits);
            }
            out.write_all(&chunk).map_err(io)?;
            left -= n;
        }
    }
    out.flush().map_err(io)?;
    drop(out);
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(dir.join("config.json"), config).map_err(|e| format!("config.json: {e}"))
}

/// The best of five passes summing `bytes` of memory on `threads` threads: this machine's
/// read bandwidth in bytes per second.
pub fn read_bandwidth(bytes: usize, threads: usize) -> f64 {
    let words: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let per = words.len().div_ceil(threads.max(1));
    let mut best = f64::MAX;
    let mut sink = 0u64;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> =
                words.chunks(per).map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        sink = sink.wrapping_add(sums.iter().fold(0, |a, &x| a.wrapping_add(x)));
    }
    std::hint::black_box(sink);
    (words.len() * 8) as f64 / best
}
