//! The paged KV cache's tensors ([`PagedKv`]): per layer, one key and one value table of
//! `blocks x block_size` rows, each row a token's heads; a sequence's keys and values are
//! read through its [`BlockTable`].

use super::{BlockTable, KvGeometry};
use redco_core::{Backend, DType, Error, Result, Tensor};

/// Keys and values of every layer, `[blocks * block_size, kv_heads, head_dim]` each, in
/// the cache's dtype (the model's, or a narrower one: a bf16 cache under f32 weights holds
/// twice the tokens in the same memory; keys and values are rounded as they are written and
/// widened where attention reads them).
pub struct PagedKv<B: Backend> {
    geometry: KvGeometry,
    keys: Vec<Tensor<B>>,
    values: Vec<Tensor<B>>,
}

impl<B: Backend> PagedKv<B> {
    /// Zeroed tables for `blocks` blocks of `geometry` in `dtype`.
    pub fn new(b: &B, geometry: KvGeometry, blocks: usize, dtype: DType) -> Result<Self> {
        let rows = blocks * geometry.block_size;
        let shape = [rows, geometry.kv_heads, geometry.head_dim];
        let table = || Tensor::zeros(b, shape, dtype);
        Ok(PagedKv {
            geometry,
            keys: (0..geometry.layers).map(|_| table()).collect::<Result<_>>()?,
            values: (0..geometry.layers).map(|_| table()).collect::<Result<_>>()?,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &KvGeometry {
        &self.geometry
    }

    /// The cache rows of tokens `start..start + t` of `table`.
    pub fn slots(&self, table: &BlockTable, start: usize, t: usize) -> Result<Vec<usize>> {
        (start..start + t)
            .map(|i| {
                table.slot(i, self.geometry.block_size).ok_or_else(|| {
                    Error::invalid("paged_kv", format!("token {i} is past the sequence's {} tokens", table.len()))
                })
            })
            .collect()
    }

    /// Writes the keys and values of tokens `start..start + t` of the sequence of `table`
    /// in layer `layer`: `k`, `v` are `[1, kv_heads, t, head_dim]`, as a layer makes them.
    pub fn write(
        &mut self,
        layer: usize,
        table: &BlockTable,
        start: usize,
        k: &Tensor<B>,
        v: &Tensor<B>,
    ) -> Result<()> {
        let g = self.geometry;
        if layer >= g.layers {
            return Err(Error::invalid("paged_kv", format!("layer {layer} of {}", g.layers)));
        }
        if k.rank() != 4 || k.dims()[0] != 1 || k.dims()[1] != g.kv_heads || k.dims()[3] != g.head_dim {
            return Err(Error::invalid(
                "paged_kv",
                format!("keys {} are not [1, {}, t, {}]", k.shape(), g.kv_heads, g.head_dim),
            ));
        }
        let t = k.dims()[2];
        let rows = self.slots(table, start, t)?;
        self.put(layer, &rows, k, v)
    }

    /// Writes `k`, `v` (`[1, kv_heads, t, head_dim]`) to rows `rows` of layer `layer`,
    /// rounded to the cache's dtype where it is narrower than the model's.
    fn put(&mut self, layer: usize, rows: &[usize], k: &Tensor<B>, v: &Tensor<B>) -> Result<()> {
        let (g, t) = (self.geometry, rows.len());
        let dtype = self.keys[layer].dtype();
        let as_rows = |x: &Tensor<B>| {
            let x = x.transpose(1, 2)?.reshape([t, g.kv_heads, g.head_dim])?;
            if x.dtype() == dtype {
                Ok(x)
            } else {
                x.cast(dtype)
            }
        };
        self.keys[layer].write_rows(rows, &as_rows(k)?)?;
        self.values[layer].write_rows(rows, &as_rows(v)?)
    }

    /// Writes the keys and values of a ragged batch in layer `layer`: `k`, `v` are
    /// `[1, kv_heads, T, head_dim]`, token `i` going to cache row `rows[i]` (one write for
    /// the whole batch).
    pub fn write_rows(&mut self, layer: usize, rows: &[usize], k: &Tensor<B>, v: &Tensor<B>) -> Result<()> {
        let g = self.geometry;
        if layer >= g.layers {
            return Err(Error::invalid("paged_kv", format!("layer {layer} of {}", g.layers)));
        }
        let t = rows.len();
        if k.rank() != 4 || k.dims() != [1, g.kv_heads, t, g.head_dim] || v.dims() != k.dims() {
            return Err(Error::invalid(
                "paged_kv",
                format!("keys {} for {t} rows are not [1, {}, {t}, {}]", k.shape(), g.kv_heads, g.head_dim),
            ));
        }
        self.put(layer, rows, k, v)
    }

    /// Causal attention of a ragged batch's queries `q` (`[1, heads, T, head_dim]`) in layer
    /// `layer`, each segment over its own rows ([`Tensor::paged_attention`]: one op, the
    /// pools read in place where the backend can).
    pub fn attend_batch(
        &self,
        layer: usize,
        q: &Tensor<B>,
        segments: &[redco_core::ops::paged_attention::PagedSegment],
        scale: f64,
    ) -> Result<Tensor<B>> {
        match (self.keys.get(layer), self.values.get(layer)) {
            (Some(k), Some(v)) => q.paged_attention(k, v, segments, scale),
            _ => Err(Error::invalid("paged_kv", format!("layer {layer} of {}", self.geometry.layers))),
        }
    }

    /// The keys and values of the first `len` tokens of the sequence of `table` in layer
    /// `layer`, `[1, kv_heads, len, head_dim]` each.
    pub fn read(&self, layer: usize, table: &BlockTable, len: usize) -> Result<(Tensor<B>, Tensor<B>)> {
        let g = self.geometry;
        let (k, v) = match (self.keys.get(layer), self.values.get(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(Error::invalid("paged_kv", format!("layer {layer} of {}", g.layers))),
        };
        let rows: Vec<i64> = self.slots(table, 0, len)?.into_iter().map(|r| r as i64).collect();
        let ids = Tensor::from_vec(k.backend(), rows, [len])?;
        let gather =
            |x: &Tensor<B>| x.index_select(&ids, 0)?.reshape([1, len, g.kv_heads, g.head_dim])?.transpose(1, 2);
        Ok((gather(k)?, gather(v)?))
    }

    /// Causal attention of `q` (`[1, heads, t, head_dim]`, the sequence's last `t` tokens
    /// of `len`) over the sequence's first `len` keys and values, read through `table`.
    pub fn attend(&self, layer: usize, q: &Tensor<B>, table: &BlockTable, len: usize, scale: f64) -> Result<Tensor<B>> {
        let (k, v) = self.read(layer, table, len)?;
        let wide = |x: Tensor<B>| if x.dtype() == q.dtype() { Ok(x) } else { x.cast(q.dtype()) };
        q.attention(&wide(k)?, &wide(v)?, None, true, scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::BlockPool;
    use redco_cpu::Cpu;

    fn random(b: &Cpu, shape: [usize; 4], seed: u64) -> Tensor<Cpu> {
        Tensor::randn(b, shape, DType::F32, seed).unwrap()
    }

    /// Two sequences written token by token into interleaved blocks: attention read
    /// through each one's block table equals attention over its keys and values held
    /// contiguously, at every step of a decode and for a prefill chunk.
    #[test]
    fn attention_through_block_tables_equals_attention_over_contiguous_keys() {
        let b = Cpu::new(1);
        let g = KvGeometry { layers: 2, kv_heads: 2, head_dim: 4, dtype_bytes: 4, block_size: 3 };
        let mut pool = BlockPool::new(8, g.block_size);
        let mut kv = PagedKv::new(&b, g, 8, DType::F32).unwrap();
        let (n, heads) = (7, 4);
        let keys: Vec<Tensor<Cpu>> = (0..2).map(|s| random(&b, [1, g.kv_heads, n, g.head_dim], 10 + s)).collect();
        let vals: Vec<Tensor<Cpu>> = (0..2).map(|s| random(&b, [1, g.kv_heads, n, g.head_dim], 20 + s)).collect();
        let qs: Vec<Tensor<Cpu>> = (0..2).map(|s| random(&b, [1, heads, n, g.head_dim], 30 + s)).collect();
        let mut tables = [pool.allocate_prompt(&[1]).unwrap().table, pool.allocate_prompt(&[2]).unwrap().table];
        let scale = 0.5;
        for i in 0..n {
            for s in 0..2 {
                if i > 0 {
                    pool.append(&mut tables[s], 9).unwrap();
                }
                for layer in 0..2 {
                    let at = |x: &Tensor<Cpu>| x.narrow(2, i, 1).unwrap();
                    kv.write(layer, &tables[s], i, &at(&keys[s]), &at(&vals[s])).unwrap();
                    let got = kv.attend(layer, &at(&qs[s]), &tables[s], i + 1, scale).unwrap();
                    let (k, v) = (keys[s].narrow(2, 0, i + 1).unwrap(), vals[s].narrow(2, 0, i + 1).unwrap());
                    let want = at(&qs[s]).attention(&k, &v, None, true, scale).unwrap();
                    assert_eq!(got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap(), "seq {s} token {i}");
                }
            }
        }
        // the sequences' blocks interleave in the pool
        assert_eq!(tables[0].blocks(), &[0, 2, 4]);
        assert_eq!(tables[1].blocks(), &[1, 3, 5]);
        // a prefill chunk: the last 4 queries at once over all 7 keys
        let got = kv.attend(1, &qs[1].narrow(2, 3, 4).unwrap(), &tables[1], n, scale).unwrap();
        let want = qs[1].narrow(2, 3, 4).unwrap().attention(&keys[1], &vals[1], None, true, scale).unwrap();
        assert_eq!(got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap(), "prefill chunk");
        // reading past the sequence is an error, not a wrong row
        assert!(kv.read(0, &tables[0], n + 1).is_err());
        assert!(kv.write(2, &tables[0], 0, &keys[0], &vals[0]).is_err(), "layer out of range");
    }
}
