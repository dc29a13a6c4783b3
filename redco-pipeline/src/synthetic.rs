//! A synthetic, learnable corpus generated deterministically (no downloads): sequences from
//! a sparse first-order Markov chain whose entropy rate is known exactly, so a language
//! model's loss can be compared with the best achievable.

use redco_core::ops::random::{mix64, uniform_at};

/// A Markov chain over `vocab` tokens: each token has `probs.len()` successors (chosen by
/// the seed) with the probabilities `probs`.
#[derive(Debug, Clone)]
pub struct MarkovCorpus {
    /// Vocabulary size.
    pub vocab: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Successor probabilities of every token (sum to 1).
    pub probs: Vec<f64>,
    successors: Vec<Vec<usize>>,
    seed: u64,
}

impl MarkovCorpus {
    /// A chain with successor probabilities 0.6, 0.3, 0.1.
    pub fn new(vocab: usize, seq_len: usize, seed: u64) -> Self {
        let probs = vec![0.6, 0.3, 0.1];
        let successors = (0..vocab)
            .map(|t| {
                let mut s = Vec::new();
                let mut h = seed ^ (t as u64 + 1);
                while s.len() < probs.len() {
                    // a Weyl step keeps the stream moving (the finaliser maps 0 to 0)
                    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let h = mix64(h);
                    let c = (h % vocab as u64) as usize;
                    if !s.contains(&c) {
                        s.push(c);
                    }
                }
                s
            })
            .collect();
        MarkovCorpus { vocab, seq_len, probs, successors, seed }
    }

    /// The entropy rate in nats per predicted token (every token's successors have the
    /// same probabilities, so it does not depend on the stationary distribution).
    pub fn entropy(&self) -> f64 {
        -self.probs.iter().map(|p| p * p.ln()).sum::<f64>()
    }

    /// Sequence `i` (deterministic in the seed and `i`).
    pub fn sequence(&self, i: u64) -> Vec<i64> {
        let key = mix64(self.seed ^ 0xc0ffee ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut t = (uniform_at(key, 0) * self.vocab as f64) as usize;
        let mut out = vec![t as i64];
        for j in 1..self.seq_len {
            let u = uniform_at(key, j as u64);
            let mut acc = 0.0;
            let mut pick = self.successors[t][self.probs.len() - 1];
            for (k, p) in self.probs.iter().enumerate() {
                acc += p;
                if u < acc {
                    pick = self.successors[t][k];
                    break;
                }
            }
            t = pick;
            out.push(t as i64);
        }
        out
    }

    /// Sequences `start..start + n`.
    pub fn sequences(&self, start: u64, n: usize) -> Vec<Vec<i64>> {
        (start..start + n as u64).map(|i| self.sequence(i)).collect()
    }
}
