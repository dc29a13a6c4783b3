//! `redco serve --kv-dtype`: a KV cache held in another float dtype than the weights.

use crate::cli_serve::{alive, http, post, start};
use crate::common::{fixture_named, redco, s};
use serde_json::{json, Value};

/// `--kv-dtype bf16` under f32 weights: the same `--kv-memory` holds twice the blocks, and
/// the served greedy text and log-probabilities are those of the f32 cache within bf16's
/// rounding of the keys and values (the attention reads the rounded pool in f32).
#[test]
fn serve_with_a_bf16_cache_under_f32_weights_holds_twice_the_blocks() {
    let model = fixture_named("llama-tiny");
    let f32_kv = start(&model, &[]);
    let bf16_kv = start(&model, &["--kv-dtype", "bf16"]);
    let total = |addr: &str| -> u64 {
        let (st, m) = http(addr, "GET", "/metrics", b"");
        assert_eq!(st, 200);
        m.lines()
            .find_map(|l| l.strip_prefix("redco_kv_blocks_total "))
            .and_then(|x| x.trim().parse().ok())
            .unwrap_or_else(|| panic!("no redco_kv_blocks_total in {m}"))
    };
    alive(&f32_kv.addr);
    alive(&bf16_kv.addr);
    // (each count is the budget over a block's bytes, rounded down)
    let (half, full) = (total(&bf16_kv.addr), total(&f32_kv.addr));
    assert!(half == 2 * full || half == 2 * full + 1, "a bf16 cache holds twice the blocks: {half} against {full}");
    for prompt in ["Hello world", "the cat sat on the mat and"] {
        let ask = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 1});
        let (st, a) = post(&f32_kv.addr, "/v1/completions", &ask);
        assert_eq!(st, 200, "{a}");
        let (st, b) = post(&bf16_kv.addr, "/v1/completions", &ask);
        assert_eq!(st, 200, "{b}");
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{prompt:?}: the greedy text");
        let lp = |r: &Value| -> Vec<f64> {
            r["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let (x, y) = (lp(&a), lp(&b));
        assert_eq!(x.len(), 10);
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!((p - q).abs() <= 2e-2 * (1.0 + p.abs()), "{prompt:?} token {i}: {p} (f32 cache) against {q}");
        }
        assert!(x.iter().zip(&y).any(|(p, q)| p != q), "the bf16 cache rounds: {x:?}");
    }
    // a cache of integers is refused before serving
    let (code, _, err) = redco(&["serve", "--model", s(&model), "--kv-dtype", "i8", "--port", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--kv-dtype"), "{err}");
}
