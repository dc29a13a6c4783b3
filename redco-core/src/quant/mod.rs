//! Block-quantized weights: llama.cpp's formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q4_K`, `Q6_K`),
//! read and written byte for byte as GGUF files hold them. `Q4_1` (a scale and an offset a
//! block of 32) is also what AWQ and GPTQ int4 checkpoints load as.
//!
//! A quantized matrix `[n, k]` (a linear layer's `[out, in]`) is stored as a `U8` tensor
//! `[n, row_bytes]`: each row is `k / block_values` blocks, each block a scale (and for
//! the `K` formats, sub-block scales and minimums) and its packed codes. A row is
//! therefore whole blocks, and a split of the matrix along `k` is a split of its bytes at
//! block boundaries. [`crate::Tensor::matmul_quant`] multiplies by such a matrix without
//! making it whole in floats; [`blocks::dequantize`] and [`quantize`] convert.

pub mod blocks;
mod quantize;

pub use quantize::quantize;

use crate::{Error, Result};

/// A block-quantized format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 32 values a block: an f16 scale and 32 signed bytes (8.5 bits a value).
    Q8_0,
    /// 32 values a block: an f16 scale and 32 nibbles minus 8 (4.5 bits a value).
    Q4_0,
    /// 32 values a block: an f16 scale `d` and offset `m`, 32 nibbles `q`, each value
    /// `d * q + m` (5 bits a value).
    Q4_1,
    /// 256 values a super-block: f16 scale and minimum, eight 6-bit sub-block scales and
    /// minimums, 256 nibbles (4.5 bits a value).
    Q4K,
    /// 256 values a super-block: 4 low and 2 high bits a value minus 32, sixteen 8-bit
    /// sub-block scales, an f16 scale (6.5625 bits a value).
    Q6K,
}

impl QuantFormat {
    /// Every format, in GGML's type order.
    pub const ALL: [QuantFormat; 5] =
        [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0, QuantFormat::Q4K, QuantFormat::Q6K];

    /// Values in one block.
    pub fn block_values(self) -> usize {
        match self {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q4_1 => 32,
            QuantFormat::Q4K | QuantFormat::Q6K => 256,
        }
    }
    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q4K => 144,
            QuantFormat::Q6K => 210,
        }
    }
    /// GGML's type code (`ggml_type`), as GGUF files record it.
    pub fn ggml_type(self) -> u32 {
        match self {
            QuantFormat::Q4_0 => 2,
            QuantFormat::Q4_1 => 3,
            QuantFormat::Q8_0 => 8,
            QuantFormat::Q4K => 12,
            QuantFormat::Q6K => 14,
        }
    }
    /// The format of GGML type code `code`, if it is one of these.
    pub fn from_ggml_type(code: u32) -> Option<QuantFormat> {
        QuantFormat::ALL.into_iter().find(|f| f.ggml_type() == code)
    }
    /// The name llama.cpp gives it (`Q8_0`, `Q4_K`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q4K => "Q4_K",
            QuantFormat::Q6K => "Q6_K",
        }
    }
    /// The format named `s` (`q8_0`, `Q4_K`, ...; case ignored).
    pub fn parse(s: &str) -> Result<QuantFormat> {
        QuantFormat::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            Error::config(
                "quantize",
                format!("`{s}` is not a quantized format this build reads (q8_0, q4_0, q4_1, q4_k, q6_k are)"),
            )
        })
    }
    /// Bytes of a row of `k` values; `k` must be whole blocks.
    pub fn row_bytes(self, k: usize) -> Result<usize> {
        if !k.is_multiple_of(self.block_values()) {
            return Err(Error::invalid(
                "quantize",
                format!("rows of {k} values are not whole {} blocks of {}", self.name(), self.block_values()),
            ));
        }
        Ok(k / self.block_values() * self.block_bytes())
    }
    /// The format a rank's part of a weight in this format is held in, when its rows have
    /// `k` values and the rank's part of each `local` of them: this one where both are
    /// whole blocks; `Q8_0` for a K format whose rows are whole blocks but whose split over
    /// ranks falls inside them, between blocks of 32 (a 7B's `down_proj`, 11008 inputs, at
    /// mp = 2: 5504 a rank), near-lossless for values already on a 4- or 6-bit grid;
    /// `None` otherwise (held in floats).
    pub fn held_as(self, k: usize, local: usize) -> Option<QuantFormat> {
        let whole = |n: usize, b: usize| n > 0 && n.is_multiple_of(b);
        if !whole(k, self.block_values()) {
            None
        } else if whole(local, self.block_values()) {
            Some(self)
        } else if self.block_values() == 256 && whole(local, 32) {
            Some(QuantFormat::Q8_0)
        } else {
            None
        }
    }
    /// Values in a row of `bytes` bytes; `bytes` must be whole blocks.
    pub fn row_values(self, bytes: usize) -> Result<usize> {
        if !bytes.is_multiple_of(self.block_bytes()) {
            return Err(Error::invalid(
                "quantize",
                format!("rows of {bytes} bytes are not whole {} blocks of {} bytes", self.name(), self.block_bytes()),
            ));
        }
        Ok(bytes / self.block_bytes() * self.block_values())
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::QuantFormat::*;

    #[test]
    fn a_split_inside_k_blocks_is_held_as_q8_0_and_nothing_else_changes_format() {
        // whole blocks everywhere: the format itself
        assert_eq!(Q4K.held_as(4096, 2048), Some(Q4K));
        assert_eq!(Q8_0.held_as(11008, 5504), Some(Q8_0));
        // a 7B's down projection at mp 2: 5504 is 21.5 blocks of 256, 172 of 32
        assert_eq!(Q4K.held_as(11008, 5504), Some(Q8_0));
        assert_eq!(Q6K.held_as(11008, 5504), Some(Q8_0));
        // rows that are not whole blocks at all stay floats, split or not
        assert_eq!(Q4K.held_as(4096 + 32, 4096 + 32), None);
        assert_eq!(Q4_0.held_as(64, 16), None);
        assert_eq!(Q4K.held_as(256 * 3, 128 + 16), None);
        assert_eq!(Q8_0.held_as(0, 0), None);
    }
}
