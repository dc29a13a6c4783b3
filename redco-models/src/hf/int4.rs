//! AWQ and GPTQ int4 checkpoints, as AutoAWQ, AutoGPTQ / GPTQModel and optimum save them
//! (`quantization_config.quant_method` `awq` or `gptq`): each quantized linear `X` is stored
//! as `X.qweight` (eight 4-bit codes an `i32`), `X.qzeros` (the groups' zero points, packed
//! the same way), `X.scales` (one scale a group and output) and, for GPTQ, `X.g_idx` (the
//! group of each input). A weight is `scale * (code - zero)` of its group.
//!
//! The layouts:
//! - GPTQ: `qweight [in / 8, out]` packed along the input (input `8r + j` in bits `4j..4j+4`
//!   of row `r`); `qzeros [groups, out / 8]` packed along the output, each stored as
//!   `zero - 1` in the original (`checkpoint_format` `gptq`) format and as `zero` in
//!   `gptq_v2`.
//! - AWQ (`version` `gemm`): `qweight [in, out / 8]` and `qzeros [groups, out / 8]` packed
//!   along the output in the interleaved order `0, 2, 4, 6, 1, 3, 5, 7` (nibble `j` holds
//!   output `8c + ORDER[j]`).
//!
//! Where every block of 32 inputs lies in one group (a group size that is a multiple of 32,
//! without GPTQ's activation order), a layer becomes `Q4_1` blocks in place: the block's
//! scale is the group's, its offset `-scale * zero` rounded to f16 (within 2^-12 of the
//! value, a small fraction of one step), its nibbles the codes; it is then multiplied from
//! 5 bits a weight. Otherwise (activation order, groups of other sizes) the layer is
//! dequantized to floats as it is read.

use super::checkpoint::Checkpoint;
use redco_core::quant::QuantFormat;
use redco_core::{DType, Error, HostData, Result, Shape};
use serde_json::Value;

/// AWQ's packing order: nibble `j` of a packed word holds output `ORDER[j]` of its eight.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Which library's layout a checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Method {
    /// AutoAWQ's GEMM layout.
    Awq,
    /// GPTQ; `v2` when the zero points are stored as they are (`checkpoint_format`
    /// `gptq_v2`), not minus one.
    Gptq {
        /// Zero points stored without the original format's offset of one.
        v2: bool,
    },
}

/// An int4 checkpoint's `quantization_config`, as far as reading it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Int4Layout {
    /// The layout.
    pub method: Int4Method,
    /// Inputs a group shares a scale and zero over; `None`: the whole row (`group_size` -1).
    pub group: Option<usize>,
    /// GPTQ's activation order (`desc_act`): groups follow `g_idx`, not the input order.
    pub act_order: bool,
    /// GPTQ's `lm_head`: the output layer is quantized too.
    pub lm_head: bool,
    /// Module names (or their last parts) left in floats (`modules_to_not_convert`).
    pub not_converted: Vec<String>,
}

fn refuse(method: &str, what: String) -> Error {
    Error::unsupported("config", format!("`quantization_config` of `{method}`: {what}"))
}

impl Int4Layout {
    /// The layout `quantization_config` `q` describes; `None` when its method is neither
    /// `awq` nor `gptq`. Variants not read (other bit widths, AWQ's GEMV and
    /// zero-point-free layouts, ...) are errors naming the field.
    pub fn from_config(q: &Value) -> Result<Option<Int4Layout>> {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        let method = match method.to_ascii_lowercase().as_str() {
            "awq" => {
                let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm");
                if !version.eq_ignore_ascii_case("gemm") {
                    return Err(refuse(
                        "awq",
                        format!("`version` `{version}` is not read (the GEMM layout, `gemm`, is)"),
                    ));
                }
                if q.get("zero_point").and_then(Value::as_bool) == Some(false) {
                    return Err(refuse("awq", "`zero_point: false` is not read (zero points are)".into()));
                }
                Int4Method::Awq
            }
            "gptq" => {
                let format = q.get("checkpoint_format").and_then(Value::as_str).unwrap_or("gptq");
                match format {
                    "gptq" => Int4Method::Gptq { v2: false },
                    "gptq_v2" => Int4Method::Gptq { v2: true },
                    other => {
                        return Err(refuse(
                            "gptq",
                            format!("`checkpoint_format` `{other}` is not read (`gptq` and `gptq_v2` are)"),
                        ))
                    }
                }
            }
            _ => return Ok(None),
        };
        let name = if method == Int4Method::Awq { "awq" } else { "gptq" };
        let bits = q.get("bits").or_else(|| q.get("w_bit")).and_then(Value::as_u64).unwrap_or(0);
        if bits != 4 {
            return Err(refuse(name, format!("`bits` {bits} is not read (4 is)")));
        }
        let group = match q.get("group_size").or_else(|| q.get("q_group_size")).and_then(Value::as_i64) {
            Some(-1) => None,
            Some(g) if g > 0 && g % 8 == 0 => Some(g as usize),
            other => return Err(refuse(name, format!("`group_size` {other:?} is not a positive multiple of 8 or -1"))),
        };
        let flag = |k: &str| q.get(k).and_then(Value::as_bool).unwrap_or(false);
        let not_converted = q
            .get("modules_to_not_convert")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        Ok(Some(Int4Layout { method, group, act_order: flag("desc_act"), lm_head: flag("lm_head"), not_converted }))
    }

    /// The method's name as configs write it.
    pub fn name(&self) -> &'static str {
        match self.method {
            Int4Method::Awq => "awq",
            Int4Method::Gptq { .. } => "gptq",
        }
    }

    /// Whether the float weight `name` (`X.weight`, `[out, in]`) of a LLaMA-family model is
    /// stored as int4: the decoder layers' projections, and the output layer where GPTQ's
    /// `lm_head` says so, less `modules_to_not_convert`.
    pub fn quantizes(&self, name: &str) -> bool {
        let Some(module) = name.strip_suffix(".weight") else { return false };
        let linear =
            (module.contains(".layers.") && module.ends_with("_proj")) || (self.lm_head && module == "lm_head");
        linear
            && !self
                .not_converted
                .iter()
                .any(|m| module == m || module.ends_with(&format!(".{m}")) || module.contains(&format!(".{m}.")))
    }

    /// Whether layers of `in` inputs load as `Q4_1` blocks (every block of 32 inputs in one
    /// group), rather than as floats. Under GPTQ's activation order the groups follow
    /// `g_idx`, so blocks of 32 inputs may mix groups, unless there is one group a row
    /// (`group_size` -1: every input's group is 0, whatever the order).
    pub fn as_blocks(&self, inp: usize) -> bool {
        let g = self.group.unwrap_or(inp);
        (!self.act_order || self.group.is_none()) && g.is_multiple_of(32) && inp.is_multiple_of(32) && inp > 0
    }

    /// The tensors (name, shape) that stand for the float weight `name` `[out, in]`.
    pub fn stored(&self, name: &str, out: usize, inp: usize) -> Result<Vec<(String, Shape)>> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let g = self.group.unwrap_or(inp);
        if !out.is_multiple_of(8) || !inp.is_multiple_of(8) || g == 0 || !inp.is_multiple_of(g) {
            return Err(Error::Parameter {
                name: name.into(),
                msg: format!(
                    "`{name}` [{out}, {inp}] cannot be {} int4 with groups of {g}: sizes must be multiples of 8 and of the group",
                    self.name()
                ),
            });
        }
        let groups = inp / g;
        let mut v = vec![
            (
                format!("{module}.qweight"),
                match self.method {
                    Int4Method::Awq => Shape::new([inp, out / 8]),
                    Int4Method::Gptq { .. } => Shape::new([inp / 8, out]),
                },
            ),
            (format!("{module}.qzeros"), Shape::new([groups, out / 8])),
            (format!("{module}.scales"), Shape::new([groups, out])),
        ];
        if matches!(self.method, Int4Method::Gptq { .. }) {
            v.push((format!("{module}.g_idx"), Shape::new([inp])));
        }
        Ok(v)
    }

    /// The codes, zero points, scales and groups of the float weight `name` `[out, in]`.
    pub fn read(&self, ckpt: &Checkpoint, name: &str, out: usize, inp: usize) -> Result<Int4Weight> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let bad = |msg: String| Error::Parameter { name: name.into(), msg };
        let ints = |part: &str| -> Result<Vec<i32>> {
            match ckpt.read_as(&format!("{module}.{part}"), DType::I32)?.data {
                HostData::I32(v) => Ok(v),
                _ => Err(bad(format!("`{module}.{part}` should hold 32-bit integers"))),
            }
        };
        let g = self.group.unwrap_or(inp);
        let groups = inp / g.max(1);
        let (qw, qz) = (ints("qweight")?, ints("qzeros")?);
        let scale = ckpt.read_as(&format!("{module}.scales"), DType::F32)?.data.to_f32_vec();
        let nib = |w: i32, j: usize| ((w as u32 >> (4 * j)) & 0xF) as u8;
        let (mut code, mut zero) = (vec![0u8; out * inp], vec![0u8; groups * out]);
        let packed = out / 8;
        if qw.len() != out * inp / 8 || qz.len() != groups * packed || scale.len() != groups * out {
            return Err(bad(format!("`{module}`'s int4 tensors do not hold [{out}, {inp}] in groups of {g}")));
        }
        let group_of: Vec<usize> = match self.method {
            Int4Method::Awq => {
                for i in 0..inp {
                    for c in 0..packed {
                        let w = qw[i * packed + c];
                        for (j, &o) in AWQ_ORDER.iter().enumerate() {
                            code[(8 * c + o) * inp + i] = nib(w, j);
                        }
                    }
                }
                for gi in 0..groups {
                    for c in 0..packed {
                        let w = qz[gi * packed + c];
                        for (j, &o) in AWQ_ORDER.iter().enumerate() {
                            zero[gi * out + 8 * c + o] = nib(w, j);
                        }
                    }
                }
                (0..inp).map(|i| i / g).collect()
            }
            Int4Method::Gptq { v2 } => {
                for r in 0..inp / 8 {
                    for o in 0..out {
                        let w = qw[r * out + o];
                        for j in 0..8 {
                            code[o * inp + 8 * r + j] = nib(w, j);
                        }
                    }
                }
                let off = if v2 { 0 } else { 1 };
                for gi in 0..groups {
                    for c in 0..packed {
                        let w = qz[gi * packed + c];
                        for j in 0..8 {
                            zero[gi * out + 8 * c + j] = (nib(w, j) + off) & 0xF;
                        }
                    }
                }
                let idx = ints("g_idx")?;
                if idx.len() != inp {
                    return Err(bad(format!("`{module}.g_idx` has {} entries, not {inp}", idx.len())));
                }
                let mut v = Vec::with_capacity(inp);
                for (i, &gi) in idx.iter().enumerate() {
                    if gi < 0 || gi as usize >= groups {
                        return Err(bad(format!("`{module}.g_idx[{i}]` is {gi}, not a group of the {groups}")));
                    }
                    if !self.act_order && gi as usize != i / g {
                        // the config promised the inputs' order (and the planner counted
                        // blocks): a file that disagrees is named, not read another way
                        return Err(bad(format!(
                            "`{module}.g_idx[{i}]` is {gi}, but `desc_act` is false: input {i} belongs to group {}",
                            i / g
                        )));
                    }
                    v.push(gi as usize);
                }
                v
            }
        };
        if let Some(i) = scale.iter().position(|s| !s.is_finite()) {
            return Err(bad(format!("`{module}.scales` holds {} at {i}", scale[i])));
        }
        Ok(Int4Weight { out, inp, code, zero, scale, group_of })
    }
}

/// One int4 linear weight `[out, in]`, unpacked: a code per weight, a zero point and scale
/// per group and output, the group of each input.
#[derive(Debug, Clone)]
pub struct Int4Weight {
    out: usize,
    inp: usize,
    code: Vec<u8>,
    zero: Vec<u8>,
    scale: Vec<f32>,
    group_of: Vec<usize>,
}

impl Int4Weight {
    /// The weight in f32, row after row: `scale * (code - zero)` of each input's group.
    pub fn dequantize(&self) -> Vec<f32> {
        let (out, inp) = (self.out, self.inp);
        let mut w = vec![0f32; out * inp];
        for (o, row) in w.chunks_exact_mut(inp).enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                let at = self.group_of[i] * out + o;
                *v = self.scale[at] * (self.code[o * inp + i] as f32 - self.zero[at] as f32);
            }
        }
        w
    }

    /// The weight as `Q4_1` blocks `[out, row_bytes]` (the scale, the offset
    /// `-scale * zero` and the codes of each block of 32 inputs), or `None` where a block's
    /// inputs do not share one group.
    pub fn to_q4_1(&self) -> Option<Vec<u8>> {
        let (out, inp) = (self.out, self.inp);
        if !inp.is_multiple_of(32) {
            return None;
        }
        let blocks = inp / 32;
        for b in 0..blocks {
            let g = self.group_of[32 * b];
            if self.group_of[32 * b..32 * b + 32].iter().any(|&x| x != g) {
                return None;
            }
        }
        let size = QuantFormat::Q4_1.block_bytes();
        let mut bytes = vec![0u8; out * blocks * size];
        for (o, row) in bytes.chunks_exact_mut(blocks * size).enumerate() {
            for (b, blk) in row.chunks_exact_mut(size).enumerate() {
                let at = self.group_of[32 * b] * out + o;
                let s = self.scale[at];
                blk[0..2].copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
                blk[2..4].copy_from_slice(&half::f16::from_f32(-s * self.zero[at] as f32).to_le_bytes());
                let c = &self.code[o * inp + 32 * b..o * inp + 32 * b + 32];
                for l in 0..16 {
                    blk[4 + l] = c[l] | (c[l + 16] << 4);
                }
            }
        }
        Some(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn configs_name_what_is_not_read() {
        let ok = |v: Value| Int4Layout::from_config(&v).unwrap().unwrap();
        let awq =
            ok(json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": true}));
        assert_eq!((awq.method, awq.group), (Int4Method::Awq, Some(128)));
        let gptq = ok(json!({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": true}));
        assert_eq!((gptq.method, gptq.group, gptq.act_order), (Int4Method::Gptq { v2: false }, None, true));
        // one group a row: blocks whatever the order; groups of 128 under activation order:
        // floats; groups of 128 in the inputs' order: blocks
        assert!(gptq.as_blocks(4096));
        assert!(!ok(json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true})).as_blocks(4096));
        assert!(ok(json!({"quant_method": "gptq", "bits": 4, "group_size": 128})).as_blocks(4096));
        assert!(Int4Layout::from_config(&json!({"quant_method": "bitsandbytes"})).unwrap().is_none());
        for (cfg, field) in [
            (json!({"quant_method": "gptq", "bits": 8, "group_size": 128}), "`bits` 8"),
            (json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}), "`gemv`"),
            (json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false}), "zero_point"),
            (json!({"quant_method": "gptq", "bits": 4, "group_size": 100}), "`group_size`"),
            (json!({"quant_method": "gptq", "bits": 4, "group_size": 64, "checkpoint_format": "marlin"}), "marlin"),
        ] {
            let e = Int4Layout::from_config(&cfg).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn the_decoder_projections_are_the_quantized_layers() {
        let mut l =
            Int4Layout::from_config(&json!({"quant_method": "awq", "bits": 4, "group_size": 32})).unwrap().unwrap();
        assert!(l.quantizes("model.layers.3.self_attn.q_proj.weight"));
        assert!(l.quantizes("model.layers.0.mlp.down_proj.weight"));
        assert!(!l.quantizes("lm_head.weight") && !l.quantizes("model.embed_tokens.weight"));
        assert!(!l.quantizes("model.layers.0.input_layernorm.weight"));
        l.not_converted = vec!["down_proj".into()];
        assert!(!l.quantizes("model.layers.0.mlp.down_proj.weight"));
        l.lm_head = true;
        assert!(l.quantizes("lm_head.weight"));
    }

    /// A weight with codes `(o + 3i) % 16`, zeros `(g + o) % 16`, scales `0.01 (1 + g + o)`.
    fn sample(group_of: Vec<usize>, groups: usize, out: usize) -> Int4Weight {
        let inp = group_of.len();
        Int4Weight {
            out,
            inp,
            code: (0..out * inp).map(|k| ((k / inp + 3 * (k % inp)) % 16) as u8).collect(),
            zero: (0..groups * out).map(|k| ((k / out + k % out) % 16) as u8).collect(),
            scale: (0..groups * out).map(|k| 0.01 * (1 + k / out + k % out) as f32).collect(),
            group_of,
        }
    }

    #[test]
    fn q4_1_blocks_hold_the_groups_values() {
        let w = sample((0..128).map(|i| i / 64).collect(), 2, 8);
        let blocks = w.to_q4_1().unwrap();
        let back = redco_core::quant::blocks::dequantize(QuantFormat::Q4_1, &blocks, 8 * 128).unwrap();
        for (k, (a, b)) in w.dequantize().iter().zip(&back).enumerate() {
            // the scale and the offset are rounded to f16: each within 2^-11 of scale * 15
            let s = w.scale[w.group_of[k % 128] * 8 + k / 128];
            assert!((a - b).abs() <= s * 30.0 / 2048.0, "weight {k}: {a} vs {b}");
        }
        // a block whose inputs span two groups has no Q4_1 form
        let w = sample((0..64).map(|i| (i / 16) % 2).collect(), 2, 8);
        assert!(w.to_q4_1().is_none());
    }

    /// The unpacking against AutoAWQ's and AutoGPTQ's own (the fixtures' `weight.*`, their
    /// f16 products): within f16 rounding as floats, and within the offsets' f16 rounding
    /// more as `Q4_1` blocks.
    #[test]
    fn unpacked_weights_are_the_libraries_own() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        for name in ["llama-awq-tiny", "llama-gptq-tiny", "llama-gptq-actorder-tiny"] {
            let dir = root.join(name);
            let cfg = crate::hf::config::HfConfig::from_dir(&dir).unwrap();
            let layout = cfg.int4().unwrap().unwrap();
            let ckpt = Checkpoint::open(&dir).unwrap();
            let reference = crate::hf::safetensors::read_all(&dir.join("reference.safetensors")).unwrap();
            let mut layers = 0;
            for (n, shape) in cfg.param_shapes().unwrap() {
                if !layout.quantizes(&n) {
                    continue;
                }
                layers += 1;
                let (out, inp) = (shape.dims()[0], shape.dims()[1]);
                let w = layout.read(&ckpt, &n, out, inp).unwrap();
                let want = reference[&format!("weight.{n}")].data.to_f32_vec();
                for (k, (a, b)) in w.dequantize().iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= b.abs() / 1024.0 + 1e-7, "{name} {n} [{k}]: {a} vs {b}");
                }
                match w.to_q4_1() {
                    Some(blocks) => {
                        assert!(layout.as_blocks(inp), "{name}");
                        let back =
                            redco_core::quant::blocks::dequantize(QuantFormat::Q4_1, &blocks, out * inp).unwrap();
                        for (k, (a, b)) in back.iter().zip(&want).enumerate() {
                            let s = w.scale[w.group_of[k % inp] * out + k / inp];
                            assert!(
                                (a - b).abs() <= b.abs() / 1024.0 + s * 15.0 / 2048.0,
                                "{name} {n} [{k}]: {a} vs {b}"
                            );
                        }
                    }
                    None => assert!(layout.act_order, "{name} {n}: no Q4_1 form"),
                }
            }
            assert_eq!(layers, 14, "{name}");
        }
    }
}
