//! Choosing the next token from one row of logits, on the host, as transformers does:
//! temperature, then top-k, then top-p (nucleus), then a draw; or the arg-max.

use redco_core::ops::random::uniform_at;
use redco_core::{Error, Result};

/// How the next token is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// The most likely token (the first one on ties).
    Greedy,
    /// A draw from the processed distribution.
    Sample {
        /// Logits are divided by this (> 0).
        temperature: f64,
        /// Keep only the `k` most likely tokens (ties with the k-th kept).
        top_k: Option<usize>,
        /// Keep the smallest set of most likely tokens whose probability reaches `p` (0 < p <= 1).
        top_p: Option<f64>,
        /// The random stream; the same seed gives the same tokens on every rank and backend.
        seed: u64,
    },
}

impl Sampling {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        if let Sampling::Sample { temperature, top_k, top_p, .. } = self {
            if !(*temperature > 0.0 && temperature.is_finite()) {
                return Err(Error::invalid("generate", format!("temperature must be > 0, got {temperature}")));
            }
            if *top_k == Some(0) {
                return Err(Error::invalid("generate", "top_k must be at least 1"));
            }
            if let Some(p) = top_p {
                if !(*p > 0.0 && *p <= 1.0) {
                    return Err(Error::invalid("generate", format!("top_p must be in (0, 1], got {p}")));
                }
            }
        }
        Ok(())
    }

    /// The token for `logits` (one row over the vocabulary); `draw` numbers the draw in the
    /// seed's stream.
    pub fn choose(&self, logits: &[f32], draw: u64) -> Result<usize> {
        if logits.iter().any(|x| x.is_nan()) {
            return Err(Error::invalid("generate", "the model produced NaN logits"));
        }
        match self {
            Sampling::Greedy => Ok(argmax(logits)),
            Sampling::Sample { temperature, top_k, top_p, seed } => {
                let mut s: Vec<f64> = logits.iter().map(|&x| x as f64 / temperature).collect();
                if let Some(k) = top_k {
                    keep_top_k(&mut s, *k);
                }
                if let Some(p) = top_p {
                    keep_top_p(&mut s, *p);
                }
                let probs = softmax(&s);
                let u = uniform_at(*seed, draw);
                let mut acc = 0.0;
                let mut last = 0;
                for (i, p) in probs.iter().enumerate() {
                    if *p > 0.0 {
                        acc += p;
                        last = i;
                        if u < acc {
                            return Ok(i);
                        }
                    }
                }
                Ok(last)
            }
        }
    }
}

/// The index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

fn keep_top_k(s: &mut [f64], k: usize) {
    if k >= s.len() {
        return;
    }
    let mut sorted = s.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[k - 1];
    for v in s.iter_mut() {
        if *v < kth {
            *v = f64::NEG_INFINITY;
        }
    }
}

fn keep_top_p(s: &mut [f64], p: f64) {
    let probs = softmax(s);
    let mut order: Vec<usize> = (0..s.len()).collect();
    // ascending, as transformers: drop the tokens whose cumulative mass stays <= 1 - p
    order.sort_by(|&a, &b| probs[a].total_cmp(&probs[b]));
    let mut acc = 0.0;
    for (n, &i) in order.iter().enumerate() {
        acc += probs[i];
        if acc <= 1.0 - p && n + 1 < order.len() {
            s[i] = f64::NEG_INFINITY;
        } else {
            break;
        }
    }
}

fn softmax(s: &[f64]) -> Vec<f64> {
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_and_top_p_keep_what_transformers_keeps() {
        let mut s = vec![1.0, 3.0, 2.0, 3.0, 0.0];
        keep_top_k(&mut s, 2);
        assert_eq!(s.iter().filter(|x| x.is_finite()).count(), 2);
        assert!(s[1].is_finite() && s[3].is_finite());
        // probabilities .5 .3 .2: p = .6 keeps the top two, p = .5 the top one
        let l = [0.5f64.ln(), 0.3f64.ln(), 0.2f64.ln()];
        let mut s = l.to_vec();
        keep_top_p(&mut s, 0.6);
        assert_eq!(s.iter().map(|x| x.is_finite()).collect::<Vec<_>>(), [true, true, false]);
        let mut s = l.to_vec();
        keep_top_p(&mut s, 0.5);
        assert_eq!(s.iter().map(|x| x.is_finite()).collect::<Vec<_>>(), [true, false, false]);
    }

    #[test]
    fn draws_follow_the_distribution() {
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let s = Sampling::Sample { temperature: 1.0, top_k: None, top_p: None, seed: 7 };
        let mut counts = [0usize; 3];
        for d in 0..20000 {
            counts[s.choose(&logits, d).unwrap()] += 1;
        }
        for (c, p) in counts.iter().zip([0.6, 0.3, 0.1]) {
            assert!((*c as f64 / 20000.0 - p).abs() < 0.015, "{counts:?}");
        }
        let k1 = Sampling::Sample { temperature: 0.5, top_k: Some(1), top_p: None, seed: 7 };
        assert!((0..100).all(|d| k1.choose(&logits, d).unwrap() == 0));
        assert!(Sampling::Greedy.choose(&[0.0, f32::NAN], 0).is_err());
    }
}
