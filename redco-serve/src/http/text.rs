//! A choice's text as its tokens arrive ([`Detok`]): decoded whole each time (a token may
//! end inside a character, or change how the previous ones decode), handed out as deltas
//! that never split a character or show part of a stop string, and cut at the first stop
//! string. The tokens are decoded after the prompt's last few, and the prompt's part of the
//! text taken off: the text is what the prompt's text continues with, so `prompt + text`
//! is the whole decoded sequence for every kind of tokenizer (a word-level decoder's space
//! between the prompt's last word and the first new one, a Metaspace decoder's leading
//! space, which decoding the new tokens alone would drop).

use redco_models::hf::tokenizer::Tokenizer;

/// Prompt tokens decoded in front of the new ones (enough for a decoder's joins and for a
/// character split across tokens).
const CONTEXT: usize = 6;

/// One choice's tokens and the text handed out so far.
#[derive(Debug, Default)]
pub struct Detok {
    /// The prompt's last tokens, and the length of their text (once decoded).
    context: Vec<i64>,
    context_len: Option<usize>,
    ids: Vec<i64>,
    sent: usize,
    stopped: bool,
}

impl Detok {
    /// A choice continuing `prompt`.
    pub fn after(prompt: &[i64]) -> Self {
        Detok { context: prompt[prompt.len().saturating_sub(CONTEXT)..].to_vec(), ..Default::default() }
    }

    /// The text of the tokens so far, as the prompt's text continues with it.
    fn text(&mut self, tok: &Tokenizer) -> Result<String, String> {
        if self.context.is_empty() {
            return tok.decode(&self.ids, true).map_err(|e| e.to_string());
        }
        let head = match self.context_len {
            Some(n) => n,
            None => {
                let n = tok.decode(&self.context, true).map_err(|e| e.to_string())?.len();
                self.context_len = Some(n);
                n
            }
        };
        let all: Vec<i64> = self.context.iter().chain(&self.ids).copied().collect();
        let full = tok.decode(&all, true).map_err(|e| e.to_string())?;
        // a decoder that rewrites the prompt's end (none of the usual ones) gets the new
        // tokens' own text
        match full.get(head..) {
            Some(t) => Ok(t.to_string()),
            None => tok.decode(&self.ids, true).map_err(|e| e.to_string()),
        }
    }

    /// Tokens so far.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// True once a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `token`; returns the new text that is safe to hand out (and whether a stop
    /// string ended the text with it).
    pub fn push(&mut self, tok: &Tokenizer, token: i64, stop: &[String]) -> Result<String, String> {
        self.ids.push(token);
        let full = self.text(tok)?;
        // the earliest stop string in the text not yet handed out (or straddling it)
        let from = floor_boundary(&full, self.sent.saturating_sub(stop.iter().map(String::len).max().unwrap_or(0)));
        if let Some(at) = stop.iter().filter_map(|s| full[from..].find(s.as_str()).map(|i| from + i)).min() {
            self.stopped = true;
            let end = at.max(self.sent);
            let delta = full.get(self.sent..end).unwrap_or("").to_string();
            self.sent = end;
            return Ok(delta);
        }
        // hold back an unfinished character and a tail that may begin a stop string
        let mut end = full.len();
        if full.ends_with('\u{FFFD}') {
            end -= '\u{FFFD}'.len_utf8();
        }
        for s in stop {
            for (k, _) in s.char_indices().skip(1) {
                if full[..end].ends_with(&s[..k]) {
                    end = end.min(full.len() - k);
                }
            }
        }
        let end = floor_boundary(&full, end);
        if end <= self.sent {
            return Ok(String::new());
        }
        let delta = full[self.sent..end].to_string();
        self.sent = end;
        Ok(delta)
    }

    /// What was held back, once the choice ended without a stop string.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String, String> {
        if self.stopped {
            return Ok(String::new());
        }
        let full = self.text(tok)?;
        let delta = full.get(self.sent..).unwrap_or("").to_string();
        self.sent = full.len();
        Ok(delta)
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::Detok;
    use redco_models::hf::tokenizer::Tokenizer;
    use std::path::Path;

    /// Streams `new` after `prompt` and checks that the prompt's text and the deltas make
    /// the whole sequence's text, with no U+FFFD handed out on the way.
    fn continues(tok: &Tokenizer, prompt: &[i64], new: &[i64]) -> String {
        let mut d = Detok::after(prompt);
        let mut text = String::new();
        for &t in new {
            let delta = d.push(tok, t, &[]).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "a half character streamed: {delta:?}");
            text.push_str(&delta);
        }
        text.push_str(&d.finish(tok).unwrap());
        let all: Vec<i64> = prompt.iter().chain(new).copied().collect();
        let whole = tok.decode(&all, true).unwrap();
        let head = tok.decode(prompt, true).unwrap();
        assert_eq!(format!("{head}{text}"), whole, "prompt {head:?} + completion {text:?}");
        text
    }

    fn fixture(name: &str) -> Tokenizer {
        Tokenizer::from_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)).unwrap()
    }

    #[test]
    fn prompt_plus_completion_is_the_whole_text_for_every_kind_of_tokenizer() {
        // word-level (the presets' corpus): the space between the prompt's last word and
        // the first new one is the completion's
        let dir = std::env::temp_dir().join(format!("redco-detok-words-{}", std::process::id()));
        redco_models::presets::SyntheticText::new(64, 32, 7).write_tokenizer(&dir).unwrap();
        let words = Tokenizer::from_dir(&dir).unwrap();
        let p = words.encode("lo fe", false).unwrap();
        let n = words.encode("bi se", false).unwrap();
        assert_eq!(continues(&words, &p, &n), " bi se");
        // Metaspace (T5's SentencePiece) and byte-level BPE (GPT-J's), over a character
        // split across byte tokens
        for (name, prompt, more) in [("t5-tiny", "Hello", " world again"), ("gptj-tiny", "Hello", " wörld ü 日本")]
        {
            let tok = fixture(name);
            let p = tok.encode(prompt, false).unwrap();
            let n = tok.encode(more, false).unwrap();
            let text = continues(&tok, &p, &n);
            assert!(text.starts_with(' '), "{name}: {text:?}");
        }
        // LLaMA's tokenizer (BPE with a Metaspace-like decoder sequence)
        let tok = fixture("llama-tiny");
        let p = tok.encode("The cat", true).unwrap();
        let n: Vec<i64> = (3..40).collect();
        continues(&tok, &p, &n);
        // an empty prompt (token ids given whole): the tokens' own text
        let mut d = Detok::after(&[]);
        assert_eq!(d.push(&words, n[0], &[]).unwrap(), words.decode(&n[..1], true).unwrap());
    }
}
