//! A choice's text as its tokens arrive ([`Detok`]): decoded whole each time (a token may
//! end inside a character, or change how the previous ones decode), handed out as deltas
//! that never split a character or show part of a stop string, and cut at the first stop
//! string.

use redco_models::hf::tokenizer::Tokenizer;

/// One choice's tokens and the text handed out so far.
#[derive(Debug, Default)]
pub struct Detok {
    ids: Vec<i64>,
    sent: usize,
    stopped: bool,
}

impl Detok {
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
        let full = tok.decode(&self.ids, true).map_err(|e| e.to_string())?;
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
        let full = tok.decode(&self.ids, true).map_err(|e| e.to_string())?;
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
