//! Parsers that validate numeric flags when they are read: a bad value is an error naming
//! the flag (clap adds `--flag`) and what it accepts, never a run with a negative learning
//! rate, a NaN clip norm or a silent fallback.

/// Threads per core that `--threads` may ask for at most.
pub const THREADS_PER_CORE: usize = 16;

fn float(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_nan() {
        return Err("NaN is not a value".into());
    }
    Ok(v)
}

fn whole(s: &str) -> Result<u64, String> {
    s.trim().parse().map_err(|_| format!("`{s}` is not a whole number of at least 0"))
}

/// A finite number above 0.
pub fn positive(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v > 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{v} must be above 0 and finite"))
    }
}

/// A finite number of at least 0.
pub fn non_negative(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v >= 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{v} must be at least 0 and finite"))
    }
}

/// A number above 0, `inf` allowed (a limit that is off).
pub fn positive_or_inf(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err(format!("{v} must be above 0 (inf turns the limit off)"))
    }
}

/// A probability mass in (0, 1].
pub fn fraction(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} must be above 0 and at most 1"))
    }
}

/// A whole number of at least 1.
pub fn count(s: &str) -> Result<usize, String> {
    let v = whole(s)?;
    match usize::try_from(v) {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("{v} must be at least 1")),
    }
}

/// A whole number of at least 1, as u64.
pub fn count_u64(s: &str) -> Result<u64, String> {
    count(s).map(|v| v as u64)
}

/// A thread count: at least 1 and at most [`THREADS_PER_CORE`] per core of this machine.
pub fn threads(s: &str) -> Result<usize, String> {
    let v = count(s)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = cores * THREADS_PER_CORE;
    if v > most {
        return Err(format!("{v} threads on {cores} cores: at most {most} ({THREADS_PER_CORE} per core)"));
    }
    Ok(v)
}

/// Beams of beam search: at least 1, at most 1024 (each beam holds its own KV cache).
pub fn beams(s: &str) -> Result<usize, String> {
    let v = count(s)?;
    if v > 1024 {
        return Err(format!("{v} beams: at most 1024 (each beam holds a KV cache of its own)"));
    }
    Ok(v)
}

/// A token id: a whole number of at least 0 (no token has a negative id; the model's
/// vocabulary bounds it from above once the model is read).
pub fn token_id(s: &str) -> Result<i64, String> {
    let v = whole(s).map_err(|_| format!("`{s}` is not a token id (a whole number of at least 0)"))?;
    i64::try_from(v).map_err(|_| format!("{v} is beyond any token id"))
}

/// Parses `DPxMP`.
pub fn mesh(s: &str) -> Result<redco_core::runtime::Mesh, String> {
    s.parse().map_err(|e: redco_core::Error| e.to_string())
}

/// Parses a parameter dtype.
pub fn dtype(s: &str) -> Result<redco_core::DType, String> {
    match s {
        "f32" => Ok(redco_core::DType::F32),
        "bf16" => Ok(redco_core::DType::BF16),
        "f16" => Ok(redco_core::DType::F16),
        d => Err(format!("unknown dtype `{d}` (use f32, bf16 or f16)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused_and_good_ones_kept() {
        for bad in ["-1", "0", "nan", "NaN", "inf", "x", ""] {
            assert!(positive(bad).is_err(), "{bad}");
        }
        assert_eq!(positive("3e-4"), Ok(3e-4));
        assert!(non_negative("-0.5").is_err() && non_negative("inf").is_err());
        assert_eq!(non_negative("0"), Ok(0.0));
        assert!(positive_or_inf("nan").is_err() && positive_or_inf("0").is_err());
        assert_eq!(positive_or_inf("inf"), Ok(f64::INFINITY));
        assert!(fraction("1.5").is_err() && fraction("0").is_err());
        assert_eq!(fraction("1"), Ok(1.0));
        assert!(count("0").is_err() && count("-3").is_err() && count("1.5").is_err());
        assert_eq!(count("7"), Ok(7));
        assert!(threads("100000").unwrap_err().contains("at most"));
        assert_eq!(threads("1"), Ok(1));
        assert!(beams("0").is_err() && beams("1000000").is_err());
        assert!(token_id("-1").is_err() && token_id("1.5").is_err() && token_id("x").is_err());
        assert_eq!(token_id("0"), Ok(0));
    }
}

/// `--recompute`: which activations a training step recomputes in its backward pass
/// instead of keeping them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Recompute {
    /// Keep every activation (the fastest step).
    None,
    /// Recompute each transformer layer from its input (one hidden state kept per layer;
    /// one more forward per layer).
    Block,
    /// Keep each layer's matmul, attention and all-reduce outputs; recompute its norms,
    /// rotary embeddings, SiLU and product (no matmul or communication runs twice).
    Selective,
}

impl Recompute {
    /// The core's mode for the flag.
    pub fn mode(self) -> redco_core::Recompute {
        match self {
            Recompute::None => redco_core::Recompute::None,
            Recompute::Block => redco_core::Recompute::Block,
            Recompute::Selective => redco_core::Recompute::Selective,
        }
    }

    /// Whether anything is recomputed.
    pub fn on(self) -> bool {
        self.mode().on()
    }

    /// The flag's value.
    pub fn name(self) -> &'static str {
        self.mode().name()
    }
}

/// A memory size as `--device-memory` takes it (`80GB`, `24GiB`, `1500MB`, plain bytes).
pub fn bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("--device-memory {s}: not a size such as 80GB or 24GiB"))?;
    let mul = match unit.trim() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("--device-memory {s}: unknown unit (use B, kB, MB, GB, TB, KiB, MiB, GiB)")),
    };
    let bytes = n * mul;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("--device-memory {s}: must be at least one byte and below 2^64"));
    }
    Ok(bytes as u64)
}

/// `train --strategy`: who picks the memory tools the flags leave open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StrategyMode {
    /// The planner: among the ZeRO stages and recompute that fit the memory per rank, the one
    /// that moves and recomputes the fewest bytes.
    Auto,
    /// Nobody: ZeRO-0 and every activation kept, unless `--zero` or `--recompute` say otherwise.
    None,
}
