//! A key/value cache of fixed capacity whose length lives on the device: every decode step
//! has the same shapes and reads nothing from the host, so a compiled backend (PJRT) can
//! record one step and replay it for every token.
//!
//! Per layer the keys and values are `[batch, kv_heads, capacity, head_dim]`; the number of
//! positions written so far is an `I64` tensor of shape `[1]`. New positions are written
//! with a select (no host offset), and attention sees only the written positions through a
//! keep mask built from that length. Writing past the capacity is not detected on the
//! device (the positions beyond it are dropped): size the cache for prompt + new tokens.

use redco_core::backend::CmpOp;
use redco_core::{Backend, DType, Error, Result, Tensor};

/// The keys and values of one layer.
pub type LayerKv<B> = (Tensor<B>, Tensor<B>);

/// Keys, values and the written length, of fixed shapes.
pub struct FixedKvCache<B: Backend> {
    layers: Vec<LayerKv<B>>,
    len: Tensor<B>,
    capacity: usize,
}

impl<B: Backend> FixedKvCache<B> {
    /// An empty cache: zeros for `layers` layers of `[batch, kv_heads, capacity, head_dim]`.
    pub fn zeros(b: &B, layers: usize, shape: [usize; 4], dtype: DType) -> Result<Self> {
        let kv = (0..layers)
            .map(|_| Ok((Tensor::zeros(b, shape, dtype)?, Tensor::zeros(b, shape, dtype)?)))
            .collect::<Result<Vec<_>>>()?;
        FixedKvCache::from_parts(kv, Tensor::from_vec(b, vec![0i64], [1])?)
    }

    /// A cache from its tensors (all `[batch, kv_heads, capacity, head_dim]`) and its length
    /// (`I64`, shape `[1]`).
    pub fn from_parts(layers: Vec<LayerKv<B>>, len: Tensor<B>) -> Result<Self> {
        let capacity = layers.first().map_or(0, |(k, _)| k.dims().get(2).copied().unwrap_or(0));
        if let Some((k, _)) =
            layers.iter().find(|(k, v)| k.rank() != 4 || k.shape() != v.shape() || k.dims()[2] != capacity)
        {
            return Err(Error::invalid(
                "fixed_kv_cache",
                format!("keys and values must share [batch, kv_heads, {capacity}, head_dim], got {}", k.shape()),
            ));
        }
        if len.dtype() != DType::I64 || len.dims() != [1] {
            return Err(Error::invalid(
                "fixed_kv_cache",
                format!("the length must be I64 of shape [1], got {:?} {}", len.dtype(), len.shape()),
            ));
        }
        Ok(FixedKvCache { layers, len, capacity })
    }

    /// The tensors and the length.
    pub fn into_parts(self) -> (Vec<LayerKv<B>>, Tensor<B>) {
        (self.layers, self.len)
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The written length (`I64`, `[1]`, on the device).
    pub fn len(&self) -> &Tensor<B> {
        &self.len
    }

    /// The positions of `t` new tokens: `len, len + 1, ..`, shape `[t]`.
    pub fn positions(&self, t: usize) -> Result<Tensor<B>> {
        Tensor::arange(self.len.backend(), t)?.add(&self.len)
    }

    /// The keep mask of `t` new queries over the capacity, `[batch or 1, 1, t, capacity]`:
    /// query `i` sees the written positions up to its own (`j <= len + i`), and, with a
    /// `[batch, capacity]` padding `mask`, only the kept ones.
    pub fn keep_mask(&self, t: usize, mask: Option<&Tensor<B>>) -> Result<Tensor<B>> {
        let b = self.len.backend();
        let q = self.positions(t)?.reshape([t, 1])?;
        let j = Tensor::arange(b, self.capacity)?.reshape([1, self.capacity])?;
        let keep = j.compare(&q, CmpOp::Le)?.reshape([1, 1, t, self.capacity])?;
        match mask {
            None => Ok(keep),
            Some(m) => {
                if m.rank() != 2 || m.dims()[1] != self.capacity {
                    return Err(Error::invalid(
                        "fixed_kv_cache",
                        format!("the padding mask must be [batch, {}], got {}", self.capacity, m.shape()),
                    ));
                }
                let m = m.compare_scalar(0.0, CmpOp::Ne)?.reshape([m.dims()[0], 1, 1, self.capacity])?;
                keep.mul(&m)
            }
        }
    }

    /// Writes `k`, `v` (`[batch, kv_heads, t, head_dim]`) at positions `len..len + t` of
    /// layer `layer` and returns the layer's whole keys and values.
    pub fn write(&mut self, layer: usize, k: Tensor<B>, v: Tensor<B>) -> Result<(Tensor<B>, Tensor<B>)> {
        let n = self.layers.len();
        let cap = self.capacity;
        let len = self.len.clone();
        let (ck, cv) = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| Error::invalid("fixed_kv_cache", format!("layer {layer} out of range for {n} layers")))?;
        if k.rank() != 4 || k.dims()[..2] != ck.dims()[..2] || k.dims()[3] != ck.dims()[3] {
            return Err(Error::invalid(
                "fixed_kv_cache",
                format!("new keys {} do not fit the cache {}", k.shape(), ck.shape()),
            ));
        }
        let t = k.dims()[2];
        let full = ck.shape().clone();
        let b = len.backend();
        // offset of each cache position from the write start; inside = 0 <= rel < t
        let rel = Tensor::arange(b, cap)?.sub(&len)?;
        let inside = rel.compare_scalar(0.0, CmpOp::Ge)?.mul(&rel.compare_scalar(t as f64, CmpOp::Lt)?)?;
        let place = |new: &Tensor<B>| -> Result<Tensor<B>> {
            if t == 1 {
                return new.expand(full.clone());
            }
            let zero = Tensor::zeros(b, [cap], DType::I64)?;
            let idx = inside.where_cond(&rel, &zero)?.reshape([1, 1, cap, 1])?.expand(full.clone())?;
            new.gather(&idx, 2)
        };
        let keep = inside.reshape([1, 1, cap, 1])?;
        *ck = keep.where_cond(&place(&k)?, ck)?;
        *cv = keep.where_cond(&place(&v)?, cv)?;
        Ok((ck.clone(), cv.clone()))
    }

    /// Counts `t` more written positions (after every layer wrote them).
    pub fn advance(&mut self, t: usize) -> Result<()> {
        let step = Tensor::from_vec(self.len.backend(), vec![t as i64], [1])?;
        self.len = self.len.add(&step)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::KvCache;
    use crate::hf::config::HfConfig;
    use crate::llama::Llama;
    use redco_cpu::Cpu;

    /// Prompt then two single tokens through a fixed cache of 12 positions give the logits
    /// of the growing cache, on the CPU backend; padding masks narrow what is seen.
    #[test]
    fn a_fixed_cache_gives_the_growing_caches_logits() {
        let b = Cpu::new(2);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny");
        let cfg = HfConfig::from_dir(&dir).unwrap();
        let m = Llama::new(&b, &cfg, DType::F32, 5).unwrap();
        let mut grow = KvCache::new(cfg.layers);
        let mut fixed = FixedKvCache::zeros(&b, cfg.layers, [2, cfg.kv_heads, 12, cfg.head_dim], DType::F32).unwrap();
        let steps: [Vec<i64>; 3] = [vec![3, 9, 4, 1, 7, 2, 8, 6], vec![5, 11], vec![13, 2]];
        for (i, ids) in steps.iter().enumerate() {
            let t = ids.len() / 2;
            let x = Tensor::from_vec(&b, ids.clone(), [2, t]).unwrap();
            let want = m.head(&m.hidden_states(&x, None, None, Some(&mut grow)).unwrap()).unwrap();
            let got = m.head(&m.hidden_states_fixed(&x, None, &mut fixed).unwrap()).unwrap();
            let (w, g) = (want.to_host().unwrap().to_f64_vec(), got.to_host().unwrap().to_f64_vec());
            let e = w.iter().zip(&g).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(e < 1e-5, "step {i}: logits differ by {e}");
        }
        assert_eq!(fixed.len().to_host().unwrap().to_f64_vec(), [6.0]);
        // a padding mask of the wrong width is refused
        let bad = Tensor::from_vec(&b, vec![1u8; 2 * 5], [2, 5]).unwrap();
        assert!(fixed.keep_mask(1, Some(&bad)).unwrap_err().to_string().contains("[batch, 12]"));
    }
}
