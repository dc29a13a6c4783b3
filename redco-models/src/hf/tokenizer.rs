//! Hugging Face tokenizers: `tokenizer.json` through the `tokenizers` crate, with the special
//! tokens and the padding side of `tokenizer_config.json` (and `special_tokens_map.json`).
//!
//! The behaviour is that of transformers 5 loading the same directory with
//! `AutoTokenizer.from_pretrained` (the generic `TokenizersBackend`):
//!
//! * `tokenizer.json` is authoritative: its normalizer, pre-tokenizer, model, post-processor
//!   (which decides whether `<s>`/`</s>` are added) and decoder are used as they are. As in
//!   transformers, `add_bos_token`/`add_eos_token` of `tokenizer_config.json` are ignored
//!   when a `tokenizer.json` is present.
//! * `bos_token`, `eos_token`, `unk_token` and `pad_token` come from `tokenizer_config.json`,
//!   overridden by `special_tokens_map.json` when it has them; the padding token and side
//!   fall back to the `padding` section of `tokenizer.json`. Named special tokens missing
//!   from the added vocabulary are added as special tokens (so that decoding can skip them).
//! * The truncation and padding settings of `tokenizer.json` are switched off: `encode`
//!   never truncates (transformers' default `truncation=False`) and [`Tokenizer::encode_batch`]
//!   pads to the longest row itself.
//! * `clean_up_tokenization_spaces` is applied on decode when the config asks for it, except
//!   for BPE models (transformers skips it for them too).
//!
//! Token ids are `i64` throughout, as in the models, batches and generation of this crate
//! (the `tokenizers` crate's `u32` ids are converted at this boundary). An id that no
//! tokenizer can hold (negative, or beyond `u32`) is an error, as transformers' `decode`
//! raises one, never wrapped around.

use redco_core::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::{AddedToken, ModelWrapper, PaddingDirection};

/// The `tokenizers` crate's id of `id`: an error naming the id when it is negative or too
/// large to be a token id (instead of wrapping it around).
fn to_u32(id: i64) -> Result<u32> {
    u32::try_from(id).map_err(|_| {
        let why = if id < 0 { "negative" } else { "beyond the largest token id" };
        err(format!("token id {id} is {why}; token ids run from 0 to the vocabulary size - 1"))
    })
}

/// Texts longer than this many bytes are encoded in pieces by [`Tokenizer::encode_long`].
pub const LONG_TEXT: usize = 64 << 10;

/// The side a batch is padded on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingSide {
    /// Padding before the text (decoder-only models that generate, as LLaMA).
    Left,
    /// Padding after the text (the transformers default).
    #[default]
    Right,
}

impl PaddingSide {
    /// Parses `"left"` or `"right"` (as written in `tokenizer_config.json`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "left" => Some(PaddingSide::Left),
            "right" => Some(PaddingSide::Right),
            _ => None,
        }
    }
}

/// A padded batch of token ids, row-major `[batch, seq]`, ready for
/// `Tensor::from_vec(backend, ids, [batch, seq])`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, padded with the padding id on the padding side.
    pub ids: Vec<i64>,
    /// Attention mask: 1 for a real token, 0 for padding.
    pub mask: Vec<i64>,
    /// Number of rows.
    pub batch: usize,
    /// Length of every row (the longest text's token count).
    pub seq: usize,
}

/// A Hugging Face tokenizer (`tokenizer.json`) with its special tokens and padding side.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source: PathBuf,
    bos: Option<String>,
    eos: Option<String>,
    unk: Option<String>,
    pad: Option<String>,
    padding_side: PaddingSide,
    clean_up_spaces: bool,
}

/// Special tokens and options read from `tokenizer_config.json` / `special_tokens_map.json`.
#[derive(Default)]
struct Settings {
    bos: Option<String>,
    eos: Option<String>,
    unk: Option<String>,
    pad: Option<String>,
    padding_side: Option<PaddingSide>,
    clean_up_spaces: Option<bool>,
}

fn err(msg: String) -> Error {
    Error::invalid("tokenizer", msg)
}

/// A special token as written in the configs: a string, an `AddedToken` object with a
/// `content`, or null.
fn token_string(v: &Value, key: &str, path: &Path) -> Result<Option<String>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(err(format!("{}: `{key}` is an object without a string `content`", path.display()))),
        },
        Some(other) => Err(err(format!("{}: `{key}` must be a string, got {other}", path.display()))),
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| err(format!("{}: not valid JSON: {e}", path.display())))
}

impl Settings {
    /// Reads the special tokens and options of one config file; `only_tokens` for
    /// `special_tokens_map.json`, which holds nothing else.
    fn read(path: &Path, only_tokens: bool) -> Result<Self> {
        let v = read_json(path)?;
        if !v.is_object() {
            return Err(err(format!("{}: expected a JSON object", path.display())));
        }
        let mut s = Settings {
            bos: token_string(&v, "bos_token", path)?,
            eos: token_string(&v, "eos_token", path)?,
            unk: token_string(&v, "unk_token", path)?,
            pad: token_string(&v, "pad_token", path)?,
            ..Settings::default()
        };
        if only_tokens {
            return Ok(s);
        }
        s.padding_side = match v.get("padding_side") {
            None | Some(Value::Null) => None,
            Some(Value::String(side)) => Some(PaddingSide::parse(side).ok_or_else(|| {
                err(format!("{}: padding_side must be \"left\" or \"right\", got {side:?}", path.display()))
            })?),
            Some(other) => return Err(err(format!("{}: padding_side must be a string, got {other}", path.display()))),
        };
        s.clean_up_spaces = match v.get("clean_up_tokenization_spaces") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(err(format!(
                    "{}: clean_up_tokenization_spaces must be a boolean, got {other}",
                    path.display()
                )))
            }
        };
        Ok(s)
    }

    /// `other`'s tokens replace ours where it has them.
    fn override_tokens(&mut self, other: Settings) {
        self.bos = other.bos.or(self.bos.take());
        self.eos = other.eos.or(self.eos.take());
        self.unk = other.unk.or(self.unk.take());
        self.pad = other.pad.or(self.pad.take());
    }
}

/// transformers' `clean_up_tokenization`: removes the spaces a word-piece decode leaves
/// before punctuation and English contractions.
fn clean_up_tokenization(text: &str) -> String {
    const PAIRS: [(&str, &str); 10] = [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ];
    PAIRS.iter().fold(text.to_string(), |t, (from, to)| t.replace(from, to))
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, with `dir/tokenizer_config.json` and
    /// `dir/special_tokens_map.json` when present (see the module docs for what they set).
    ///
    /// Errors name the file at fault: a missing directory or `tokenizer.json`, a file that is
    /// not valid JSON or not a tokenizer, a malformed special token or padding side.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(err(format!("tokenizer directory {} does not exist", dir.display())));
        }
        let mut settings = Settings::default();
        let config = dir.join("tokenizer_config.json");
        if config.exists() {
            settings = Settings::read(&config, false)?;
        }
        let map = dir.join("special_tokens_map.json");
        if map.exists() {
            settings.override_tokens(Settings::read(&map, true)?);
        }
        Self::load(&dir.join("tokenizer.json"), settings)
    }

    /// Loads a `tokenizer.json` alone: no bos, eos or unk token is known (unless added later
    /// through a config), the padding token and side come from its `padding` section, if any.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::load(path.as_ref(), Settings::default())
    }

    fn load(path: &Path, settings: Settings) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        let invalid = |e: &dyn std::fmt::Display| err(format!("{}: not a valid tokenizer.json: {e}", path.display()));
        // The tokenizers crate panics on some malformed files (a cut one, inside its decoder
        // section) instead of answering an error: the JSON is checked whole first, and a
        // panic left in its reader is turned into the same error.
        let json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| invalid(&e))?;
        if !json.is_object() {
            return Err(invalid(&"the file is not a JSON object"));
        }
        check_templates(&json).map_err(|e| invalid(&e))?;
        let mut inner = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(&bytes))
            .map_err(|_| invalid(&"the tokenizers crate could not read it"))?
            .map_err(|e| invalid(&e))?;
        let json_padding = inner.get_padding().map(|p| (p.pad_token.clone(), p.direction));
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| err(format!("{}: {e}", path.display())))?;

        let mut tok = Tokenizer {
            inner,
            source: path.to_path_buf(),
            bos: settings.bos,
            eos: settings.eos,
            unk: settings.unk,
            pad: settings.pad.or_else(|| json_padding.as_ref().map(|(t, _)| t.clone())),
            padding_side: settings.padding_side.unwrap_or(match json_padding {
                Some((_, PaddingDirection::Left)) => PaddingSide::Left,
                _ => PaddingSide::Right,
            }),
            clean_up_spaces: settings.clean_up_spaces.unwrap_or(false),
        };
        // named special tokens the added vocabulary lacks become special added tokens
        let added: Vec<String> = tok.inner.get_added_tokens_decoder().into_values().map(|t| t.content).collect();
        let missing: Vec<AddedToken> = [&tok.bos, &tok.eos, &tok.unk, &tok.pad]
            .into_iter()
            .flatten()
            .filter(|t| !added.contains(t))
            .map(|t| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        if !missing.is_empty() {
            tok.inner
                .add_special_tokens(missing)
                .map_err(|e| err(format!("{}: cannot add special tokens: {e}", path.display())))?;
        }
        Ok(tok)
    }

    /// The wrapped `tokenizers` tokenizer (truncation and padding switched off).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The `tokenizer.json` this tokenizer was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Token ids of `text`; with `add_special_tokens`, the ones the post-processor of
    /// `tokenizer.json` adds (`<s>` at the start for LLaMA).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>> {
        let fail = |e: &dyn std::fmt::Display| {
            let shown: String = text.chars().take(80).collect();
            err(format!("{}: cannot encode {shown:?}: {e}", self.source.display()))
        };
        // a tokenizer.json the crate read may still panic on use (see `load`)
        std::panic::catch_unwind(|| self.inner.encode(text, add_special_tokens))
            .map_err(|_| fail(&"the tokenizers crate failed on this tokenizer.json"))?
            .map(|e| e.get_ids().iter().map(|&id| i64::from(id)).collect())
            .map_err(|e| fail(&e))
    }

    /// [`Tokenizer::encode`] for texts of any length: a text longer than [`LONG_TEXT`]
    /// bytes is encoded in pieces cut at a whitespace, so the memory the tokenizer's
    /// per-token bookkeeping takes (offsets, token strings: hundreds of bytes per token) is
    /// bounded by a piece. Whether the whitespace begins the next piece (byte-level BPE:
    /// `Ġword`) or is dropped (SentencePiece normalizers that prepend `▁` themselves) is
    /// probed on this tokenizer; one that splits neither way the whole text does is given
    /// the whole text at once. The special tokens go around the whole.
    pub fn encode_long(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>> {
        if text.len() <= LONG_TEXT {
            return self.encode(text, add_special_tokens);
        }
        let Some(keep_space) = self.piece_rule()? else { return self.encode(text, add_special_tokens) };
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut cut = rest.len().min(LONG_TEXT);
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut skip = 0;
            if cut < rest.len() {
                match rest[..cut].rfind(' ').filter(|&w| w > 0) {
                    Some(ws) => {
                        cut = ws;
                        skip = usize::from(!keep_space);
                    }
                    // no space to cut at: the rest at once
                    None => cut = rest.len(),
                }
            }
            out.extend(self.encode(&rest[..cut], false)?);
            rest = &rest[cut + skip..];
        }
        if add_special_tokens {
            // the specials the post-processor adds around an empty text, placed around the
            // pieces (`<s>` before; T5's `</s>` after)
            let around = self.encode("", true)?;
            let lead = around.iter().take_while(|id| Some(**id) != self.eos_id()).count();
            out.splice(0..0, around[..lead].iter().copied());
            out.extend(&around[lead..]);
        }
        Ok(out)
    }

    /// How texts may be cut for [`Tokenizer::encode_long`]: `Some(true)` when a piece may
    /// begin with the space before its first word, `Some(false)` when that space must be
    /// dropped, `None` when neither gives the ids of the uncut text.
    fn piece_rule(&self) -> Result<Option<bool>> {
        let (a, b) = ("the quick brown fox", " jumps over the lazy dog");
        let whole = self.encode(&format!("{a}{b}"), false)?;
        let head = self.encode(a, false)?;
        for keep in [true, false] {
            let tail = self.encode(if keep { b } else { &b[1..] }, false)?;
            if head.len() + tail.len() == whole.len() && whole.starts_with(&head) && whole.ends_with(&tail) {
                return Ok(Some(keep));
            }
        }
        Ok(None)
    }

    /// The text of `ids`, without the special tokens when `skip_special_tokens`.
    ///
    /// A negative id (the `-100` of labels, say) or one beyond `u32` is an error naming it;
    /// an id past the end of the vocabulary (a model whose embedding is larger than its
    /// tokenizer) is skipped, as transformers does.
    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String> {
        let fail = |e: &dyn std::fmt::Display| {
            let shown = &ids[..ids.len().min(16)];
            err(format!("{}: cannot decode {shown:?}: {e}", self.source.display()))
        };
        let ids = ids.iter().map(|&id| to_u32(id)).collect::<Result<Vec<u32>>>()?;
        let text = std::panic::catch_unwind(|| self.inner.decode(&ids, skip_special_tokens))
            .map_err(|_| fail(&"the tokenizers crate failed on this tokenizer.json"))?
            .map_err(|e| fail(&e))?;
        let bpe = matches!(self.inner.get_model(), ModelWrapper::BPE(_));
        Ok(if self.clean_up_spaces && !bpe { clean_up_tokenization(&text) } else { text })
    }

    /// Encodes `texts` and pads them to the longest with [`Tokenizer::padding_id`] on the
    /// [`Tokenizer::padding_side`]. An empty `texts` gives a `0 x 0` batch.
    pub fn encode_batch(&self, texts: &[&str], add_special_tokens: bool) -> Result<Batch> {
        let rows = texts.iter().map(|t| self.encode(t, add_special_tokens)).collect::<Result<Vec<_>>>()?;
        let seq = rows.iter().map(Vec::len).max().unwrap_or(0);
        let pad = self.padding_id();
        let (mut ids, mut mask) = (Vec::with_capacity(rows.len() * seq), Vec::with_capacity(rows.len() * seq));
        for row in &rows {
            let n = seq - row.len();
            if self.padding_side == PaddingSide::Left {
                ids.extend(std::iter::repeat_n(pad, n));
                mask.extend(std::iter::repeat_n(0, n));
            }
            ids.extend_from_slice(row);
            mask.extend(std::iter::repeat_n(1, row.len()));
            if self.padding_side == PaddingSide::Right {
                ids.extend(std::iter::repeat_n(pad, n));
                mask.extend(std::iter::repeat_n(0, n));
            }
        }
        Ok(Batch { ids, mask, batch: rows.len(), seq })
    }

    /// Id of a token (special or not), `None` when it is not in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// The token of an id: `Ok(None)` when the id is past the end of the vocabulary (as
    /// transformers' `convert_ids_to_tokens`), an error naming the id when it is negative or
    /// beyond `u32` (no tokenizer has such an id).
    pub fn id_to_token(&self, id: i64) -> Result<Option<String>> {
        Ok(self.inner.id_to_token(to_u32(id)?))
    }

    fn id_of(&self, token: &Option<String>) -> Option<i64> {
        token.as_deref().and_then(|t| self.token_to_id(t))
    }

    /// Id of the beginning-of-sequence token, if the configs name one.
    pub fn bos_id(&self) -> Option<i64> {
        self.id_of(&self.bos)
    }

    /// Id of the end-of-sequence token, if the configs name one.
    pub fn eos_id(&self) -> Option<i64> {
        self.id_of(&self.eos)
    }

    /// Id of the unknown token, if the configs name one.
    pub fn unk_id(&self) -> Option<i64> {
        self.id_of(&self.unk)
    }

    /// Id of the padding token, if the configs (or the `padding` of `tokenizer.json`) name one.
    pub fn pad_id(&self) -> Option<i64> {
        self.id_of(&self.pad)
    }

    /// The id [`Tokenizer::encode_batch`] pads with: the padding token, else the
    /// end-of-sequence token, else 0 (the mask marks padding either way).
    pub fn padding_id(&self) -> i64 {
        self.pad_id().or_else(|| self.eos_id()).unwrap_or(0)
    }

    /// The side [`Tokenizer::encode_batch`] pads on.
    pub fn padding_side(&self) -> PaddingSide {
        self.padding_side
    }

    /// This tokenizer, padding on `side`.
    pub fn with_padding_side(mut self, side: PaddingSide) -> Self {
        self.padding_side = side;
        self
    }

    /// Number of tokens, added (special) tokens included: transformers' `len(tokenizer)`,
    /// the smallest embedding size that covers every id this tokenizer produces.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Refuses a `TemplateProcessing` post-processor (alone or inside a `Sequence`) whose
/// templates name a special token its `special_tokens` map lacks, or whose special tokens'
/// `ids` and `tokens` differ in length: the tokenizers crate checks these when it builds a
/// template, not when it reads one, and then panics while encoding.
fn check_templates(v: &serde_json::Value) -> std::result::Result<(), String> {
    use serde_json::Value;
    let mut stack = vec![&v["post_processor"]];
    while let Some(p) = stack.pop() {
        if let Some(list) = p.get("processors").and_then(Value::as_array) {
            stack.extend(list);
        }
        if p.get("type").and_then(Value::as_str) != Some("TemplateProcessing") {
            continue;
        }
        let known = p.get("special_tokens").and_then(Value::as_object);
        for (name, t) in known.into_iter().flatten() {
            let len = |k: &str| t.get(k).and_then(Value::as_array).map(Vec::len);
            if len("ids") != len("tokens") {
                return Err(format!(
                    "the post-processor's special token `{name}` has ids and tokens of different lengths"
                ));
            }
        }
        for template in ["single", "pair"] {
            for piece in p.get(template).and_then(Value::as_array).into_iter().flatten() {
                let id = piece.get("SpecialToken").and_then(|s| s.get("id")).and_then(Value::as_str);
                if let Some(id) = id.filter(|id| !known.is_some_and(|k| k.contains_key(*id))) {
                    return Err(format!(
                        "the post-processor's `{template}` template names the special token `{id}`, which its \
                         `special_tokens` does not define"
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text three pieces long encodes in pieces to the ids of the whole (the fixtures'
    /// LLaMA and T5 tokenizers: SentencePiece BPE and Unigram, the second appending `</s>`).
    #[test]
    fn long_texts_encode_in_pieces_to_the_same_ids() {
        let words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs,", "and", "runs."];
        let text: String =
            (0..3 * LONG_TEXT / 5).map(|i| words[(i * 7 + i / 3) % words.len()]).collect::<Vec<_>>().join(" ");
        assert!(text.len() > 2 * LONG_TEXT);
        for fixture in ["llama-tiny", "t5-tiny"] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(fixture);
            let tok = Tokenizer::from_dir(&dir).unwrap();
            assert!(tok.piece_rule().unwrap().is_some(), "{fixture}: the text is cut, not encoded whole");
            for special in [true, false] {
                let (long, whole) = (tok.encode_long(&text, special).unwrap(), tok.encode(&text, special).unwrap());
                let first = long.iter().zip(&whole).position(|(a, b)| a != b);
                assert!(
                    long.len() == whole.len() && first.is_none(),
                    "{fixture} {special}: {} vs {} ids, first difference at {first:?}",
                    long.len(),
                    whole.len()
                );
            }
            let short = "a short one";
            assert_eq!(tok.encode_long(short, true).unwrap(), tok.encode(short, true).unwrap());
        }
    }

    fn llama_tiny() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny");
        Tokenizer::from_dir(dir).expect("the llama-tiny fixture's tokenizer")
    }

    /// Ids are `i64` on the way in and out: encode, decode, the batch and the special ids
    /// agree with transformers' (the fixture's `tokenizer_expected.json`).
    #[test]
    fn i64_ids_round_trip() {
        let tok = llama_tiny();
        let text = "the cat sat on the mat.";
        let ids: Vec<i64> = tok.encode(text, true).unwrap();
        assert_eq!(ids, [1, 23, 29, 37, 30, 23, 57]);
        assert_eq!(tok.decode(&ids, true).unwrap(), text);
        assert_eq!(tok.decode(&ids, false).unwrap(), format!("<s> {text}"));
        assert_eq!((tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()), (Some(1), Some(2), Some(0), Some(2)));
        assert_eq!(tok.padding_id(), 2);
        let cat = tok.token_to_id("▁cat").expect("a token of the vocabulary");
        assert_eq!(cat, 29);
        assert_eq!(tok.id_to_token(cat).unwrap().as_deref(), Some("▁cat"));
        let batch = tok.encode_batch(&[text, "the cat"], true).unwrap();
        assert_eq!(&batch.ids[..7], &ids[..]);
        assert_eq!(&batch.ids[7..], &[2, 2, 2, 2, 1, 23, 29]);
        assert_eq!(tok.decode(&batch.ids[7..], true).unwrap(), "the cat");
    }

    /// A negative id or one beyond `u32` is an error naming it, never wrapped around; an
    /// id past the vocabulary is skipped by `decode` and has no token (as in transformers).
    #[test]
    fn out_of_range_ids_are_errors() {
        let tok = llama_tiny();
        for bad in [-1, -100, i64::from(u32::MAX) + 1, i64::MAX] {
            let e = tok.decode(&[1, 23, bad], true).expect_err("a bad id").to_string();
            assert!(e.contains(&format!("token id {bad} is")), "{e}");
            let e = tok.id_to_token(bad).expect_err("a bad id").to_string();
            assert!(e.contains(&format!("token id {bad} is")), "{e}");
        }
        let past = tok.vocab_size() as i64 + 5;
        assert_eq!(tok.id_to_token(past).unwrap(), None);
        assert_eq!(tok.decode(&[23, past, 29], true).unwrap(), "the cat");
    }

    #[test]
    fn clean_up_matches_transformers() {
        assert_eq!(clean_up_tokenization("it 's a test , is n't it ?"), "it's a test, isn't it?");
    }

    #[test]
    fn padding_side_parse() {
        assert_eq!(PaddingSide::parse("left"), Some(PaddingSide::Left));
        assert_eq!(PaddingSide::parse("right"), Some(PaddingSide::Right));
        assert_eq!(PaddingSide::parse("top"), None);
    }
}
