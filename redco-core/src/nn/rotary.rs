//! `RotaryEmbedding`: cos/sin tables from positions, applied in either convention.

use crate::backend::RotaryMode;
use crate::{Backend, DType, Error, HostData, Result, Tensor};

/// Rotary position embedding over the first `rot_dim` features of each head.
///
/// GPT-J uses [`RotaryMode::Interleaved`] with a partial `rot_dim` (`rotary_dim`); LLaMA and
/// GPT-NeoX use [`RotaryMode::HalfSplit`] over the whole head. `theta` is the base
/// (`rope_theta`, 10000 by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotaryEmbedding {
    /// Rotated features per head (even).
    pub rot_dim: usize,
    /// Frequency base.
    pub theta: f64,
    /// Pairing convention.
    pub mode: RotaryMode,
}

impl RotaryEmbedding {
    /// A rotary embedding; `rot_dim` must be even and positive.
    pub fn new(rot_dim: usize, theta: f64, mode: RotaryMode) -> Result<Self> {
        if rot_dim == 0 || !rot_dim.is_multiple_of(2) {
            return Err(Error::invalid("RotaryEmbedding", format!("rot_dim must be even and positive, got {rot_dim}")));
        }
        Ok(RotaryEmbedding { rot_dim, theta, mode })
    }

    /// `(cos, sin)` for integer `positions` of shape `[seq]` or `[batch, seq]`: tables of
    /// shape `[.., seq, rot_dim / 2]`, computed in f64 and stored in `dtype`.
    ///
    /// On a backend with f64 the tables are computed there from the positions (no host
    /// read, so a traced step stays one program; the CPU backend's f64 `cos`/`sin` give the
    /// bits the host would); a backend without f64 (wgpu) reads the positions back.
    pub fn tables<B: Backend>(&self, positions: &Tensor<B>, dtype: DType) -> Result<(Tensor<B>, Tensor<B>)> {
        positions.expect_int("RotaryEmbedding (positions)")?;
        let half = self.rot_dim / 2;
        let inv: Vec<f64> = (0..half).map(|i| self.theta.powf(-(2.0 * i as f64) / self.rot_dim as f64)).collect();
        let b = positions.backend();
        if b.supports(DType::F64) {
            let inv = Tensor::from_host(b, &HostData::F64(inv), [half])?;
            let angles = positions.cast(DType::F64)?.unsqueeze(-1)?.mul(&inv)?;
            return Ok((angles.cos()?.cast(dtype)?, angles.sin()?.cast(dtype)?));
        }
        let pos = positions.to_vec_i64()?;
        let mut c = Vec::with_capacity(pos.len() * half);
        let mut s = Vec::with_capacity(pos.len() * half);
        for &p in &pos {
            for f in &inv {
                let a = p as f64 * f;
                c.push(a.cos());
                s.push(a.sin());
            }
        }
        let mut shape = positions.dims().to_vec();
        shape.push(half);
        Ok((
            Tensor::from_host(b, &HostData::from_f64(&c, dtype), shape.clone())?,
            Tensor::from_host(b, &HostData::from_f64(&s, dtype), shape)?,
        ))
    }

    /// Rotates `x` (`[batch, heads, seq, head_dim]` or `[.., seq, head_dim]`) at `positions`.
    pub fn forward<B: Backend>(&self, x: &Tensor<B>, positions: &Tensor<B>) -> Result<Tensor<B>> {
        let (c, s) = self.tables(positions, x.dtype())?;
        x.rotary(&c, &s, self.mode)
    }
}
