//! Reading `config.json` fields by type, and the limits a model's sizes must respect.
//!
//! A field that is present with the wrong type (`"hidden_size": "32"`, `"rms_norm_eps":
//! "x"`) is an error naming the field and the type expected, never "missing" or a silent
//! default; sizes beyond any real model's (a billion layers) are refused before anything is
//! sized from them; configuration features the models do not implement (`rope_scaling`)
//! are refused rather than ignored.

use redco_core::{Error, Result};
use serde_json::Value;

fn bad(key: &str, x: &Value, want: &str) -> Error {
    Error::config("config", format!("`{key}` is {x}: expected {want}"))
}

/// The first of `keys` present (and not null) as a whole number.
pub(crate) fn uint(v: &Value, keys: &[&str]) -> Result<Option<u64>> {
    for k in keys {
        match v.get(*k) {
            None | Some(Value::Null) => continue,
            Some(x) => return x.as_u64().map(Some).ok_or_else(|| bad(k, x, "a whole number of at least 0")),
        }
    }
    Ok(None)
}

/// The first of `keys` present (and not null) as a finite number.
pub(crate) fn float(v: &Value, keys: &[&str]) -> Result<Option<f64>> {
    for k in keys {
        match v.get(*k) {
            None | Some(Value::Null) => continue,
            Some(x) => {
                return x.as_f64().filter(|f| f.is_finite()).map(Some).ok_or_else(|| bad(k, x, "a finite number"))
            }
        }
    }
    Ok(None)
}

/// `key` as a boolean, when present and not null.
pub(crate) fn boolean(v: &Value, key: &str) -> Result<Option<bool>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_bool().map(Some).ok_or_else(|| bad(key, x, "true or false")),
    }
}

/// The first of `keys` present (and not null) as a string.
pub(crate) fn string<'a>(v: &'a Value, keys: &[&str]) -> Result<Option<&'a str>> {
    for k in keys {
        match v.get(*k) {
            None | Some(Value::Null) => continue,
            Some(x) => return x.as_str().map(Some).ok_or_else(|| bad(k, x, "a string")),
        }
    }
    Ok(None)
}

/// The largest value each size may take: well beyond every published model, far below
/// what would overflow the arithmetic that sizes buffers from them.
pub(crate) const LIMITS: &[(&str, u64)] = &[
    ("layers", 10_000),
    ("hidden size", 1 << 17),
    ("attention heads", 1 << 12),
    ("intermediate size", 1 << 20),
    ("vocabulary", 1 << 24),
    ("head dim", 1 << 13),
    ("max positions", 1 << 24),
    ("experts", 1 << 14),
    ("experts' intermediate size", 1 << 20),
];

/// The most parameters a config may describe (100 trillion).
pub(crate) const MAX_PARAMS: u128 = 100_000_000_000_000;

/// Ok when `value` (of the size called `what`, read from `key`) is within its limit.
pub(crate) fn within(what: &str, key: &str, value: usize) -> Result<()> {
    let limit = LIMITS.iter().find(|(w, _)| *w == what).map_or(u64::MAX, |(_, l)| *l);
    if value as u64 > limit {
        return Err(Error::config(
            "config",
            format!("`{key}` = {value} is beyond any model redco can hold (the {what} may be at most {limit})"),
        ));
    }
    Ok(())
}

/// Refuses RoPE variants the models do not implement: `rope_scaling` (or transformers 5's
/// `rope_parameters`) of any type but the default.
pub(crate) fn plain_rope(v: &Value) -> Result<()> {
    for key in ["rope_scaling", "rope_parameters"] {
        let Some(r) = v.get(key).filter(|r| !r.is_null()) else { continue };
        let kind = r.get("rope_type").or_else(|| r.get("type")).and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(Error::unsupported(
                "config",
                format!("`{key}` of type `{kind}` is not supported: redco's models use plain RoPE, which would give other outputs"),
            ));
        }
    }
    Ok(())
}

/// Checks T5's relative-position buckets (`relative_attention_num_buckets`, default 32, and
/// `relative_attention_max_distance`, default 128): the bucket function takes logarithms
/// of the distance over the last exact bucket (a quarter of the buckets in the encoder,
/// half in the decoder), so there must be at least 4 buckets and the largest distance must
/// lie past half of them; anything else gives NaN or infinite bucket positions.
pub(crate) fn t5_buckets(v: &Value) -> Result<()> {
    let nb = uint(v, &["relative_attention_num_buckets"])?.unwrap_or(32);
    let md = uint(v, &["relative_attention_max_distance"])?.unwrap_or(128);
    if !(4..=1 << 16).contains(&nb) {
        return Err(Error::config(
            "config",
            format!("`relative_attention_num_buckets` = {nb}: expected 4 to 65536 buckets (T5 uses 32)"),
        ));
    }
    if md <= nb / 2 || md > 1 << 24 {
        return Err(Error::config(
            "config",
            format!(
                "`relative_attention_max_distance` = {md}: expected more than half of \
                 `relative_attention_num_buckets` ({nb}) and at most {} (T5 uses 128)",
                1 << 24
            ),
        ));
    }
    Ok(())
}
