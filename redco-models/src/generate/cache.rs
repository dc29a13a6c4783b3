//! The key/value cache of a decoder: per layer, the keys and values of every position seen
//! so far, `[batch, kv_heads, len, head_dim]`. Under tensor parallelism the tensors keep the
//! placement the projections give them (split over heads), so each rank caches its heads.

use redco_core::{Backend, Error, Result, Tensor};

/// Keys and values per layer, grown by [`KvCache::append`].
pub struct KvCache<B: Backend> {
    layers: Vec<Option<(Tensor<B>, Tensor<B>)>>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `layers` layers.
    pub fn new(layers: usize) -> Self {
        KvCache { layers: (0..layers).map(|_| None).collect() }
    }

    /// Positions cached so far (0 when empty).
    pub fn len(&self) -> usize {
        self.layers.first().and_then(|l| l.as_ref()).map_or(0, |(k, _)| k.dims()[2])
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `k`, `v` (`[batch, kv_heads, new, head_dim]`) to layer `layer` and returns the
    /// keys and values of every cached position.
    pub fn append(&mut self, layer: usize, k: Tensor<B>, v: Tensor<B>) -> Result<(Tensor<B>, Tensor<B>)> {
        let n = self.layers.len();
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| Error::invalid("kv_cache", format!("layer {layer} out of range for {n} layers")))?;
        let (k, v) = match slot.take() {
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
            None => (k, v),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok((k, v))
    }

    /// Keeps only the rows `rows` of the batch (beam search and finished rows).
    pub fn select_rows(&mut self, rows: &Tensor<B>) -> Result<()> {
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(rows, 0)?;
            *v = v.index_select(rows, 0)?;
        }
        Ok(())
    }
}
