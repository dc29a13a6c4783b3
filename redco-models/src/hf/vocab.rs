//! A tokenizer, token ids and a model's embedding table checked against each other, once,
//! before a run: an id past the table is reported naming its source, the id, its token and
//! `vocab_size`, instead of failing as an out-of-range lookup inside the embedding.
//!
//! When a model is loaded with a tokenizer, [`check_tokenizer`] compares them:
//! - a token the tokenizer's model can emit (its base vocabulary), or a special token it
//!   adds by itself (`<s>`, `</s>`, unknown, padding, the post-processor's), whose id is past
//!   the embedding's rows is an error: such an id occurs in ordinary use;
//! - other added tokens past the rows are a warning: they reach the model only when a text
//!   spells them out, and the data check ([`check_ids`]) then refuses that text by name.

use super::tokenizer::Tokenizer;
use redco_core::{Error, Result};
use redco_pipeline::token_ids::first_out_of_range;

/// How a tokenizer fits a model's embedding of `vocab_size` rows: `Ok(None)` when every id
/// it has is a row, `Ok(Some(warning))` when only added tokens that no ordinary encoding
/// produces are past the rows, and an error when an id that ordinary encoding produces is.
pub fn check_tokenizer(tok: &Tokenizer, vocab_size: usize) -> Result<Option<String>> {
    let past = |id: u32| id as usize >= vocab_size;
    let file = tok.source().display();
    let mut base: Vec<(u32, String)> =
        tok.inner().get_vocab(false).into_iter().filter(|(_, id)| past(*id)).map(|(t, id)| (id, t)).collect();
    base.sort();
    if let Some((id, token)) = base.first() {
        return Err(Error::invalid(
            "tokenizer",
            format!(
                "{file}: {} token(s) of the tokenizer's vocabulary are past the model's embedding (vocab_size \
                 {vocab_size}), the first {token:?} with id {id}: this tokenizer is not the model's (its \
                 vocabulary with added tokens has {} entries)",
                base.len(),
                tok.vocab_size()
            ),
        ));
    }
    // the ids the tokenizer adds by itself: named specials, and what the post-processor
    // puts around an empty text
    let mut own: Vec<i64> = [tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()].into_iter().flatten().collect();
    own.extend(tok.encode("", true)?);
    let mut added: Vec<(u32, String)> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(id, _)| past(*id))
        .map(|(id, t)| (id, t.content))
        .collect();
    added.sort();
    if let Some((id, token)) = added.iter().find(|(id, _)| own.contains(&i64::from(*id))) {
        return Err(Error::invalid(
            "tokenizer",
            format!(
                "{file}: the special token {token:?} (id {id}), which the tokenizer adds to every text it \
                 encodes, is past the model's embedding (vocab_size {vocab_size}): this tokenizer is not the model's"
            ),
        ));
    }
    Ok(added.first().map(|(id, token)| {
        format!(
            "{file}: {} added token(s) are past the model's embedding (vocab_size {vocab_size}), the first {token:?} \
             with id {id}; ordinary text never encodes to them, and a text that spells one out is refused",
            added.len()
        )
    }))
}

/// Refuses `ids` holding an id outside `0..vocab_size` (labels may hold -100), naming
/// `source` (which names the tokenizer file where `tok` made the ids), the first bad id, its
/// position and token (looked up in `tok`, when given), and `vocab_size`.
pub fn check_ids(ids: &[i64], vocab_size: usize, labels: bool, source: &str, tok: Option<&Tokenizer>) -> Result<()> {
    let Some(bad) = first_out_of_range(ids, vocab_size, labels) else { return Ok(()) };
    let token = match tok.map(|t| t.id_to_token(bad.id)) {
        Some(Ok(Some(t))) => format!(" ({t:?})"),
        _ => String::new(),
    };
    let at = if ids.len() > 1 { format!(" at position {}", bad.position) } else { String::new() };
    Err(Error::invalid(
        "token ids",
        format!(
            "{source}: token id {}{token}{at} is outside the model's vocabulary (vocab_size {vocab_size}: ids \
             0..{vocab_size})",
            bad.id
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::SyntheticText;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("redco-vocab-{name}-{}", std::process::id()))
    }

    fn words_tokenizer(dir: &std::path::Path) -> Tokenizer {
        // 64 made-up words and 3 specials: ids 0..67
        SyntheticText::new(64, 8, 1).write_tokenizer(dir).unwrap();
        Tokenizer::from_dir(dir).unwrap()
    }

    #[test]
    fn a_tokenizer_past_the_embedding_is_refused_naming_a_token() {
        let dir = tmp("fit");
        let tok = words_tokenizer(&dir);
        assert_eq!(check_tokenizer(&tok, 67).unwrap(), None);
        assert_eq!(check_tokenizer(&tok, 100).unwrap(), None);
        let e = check_tokenizer(&tok, 64).unwrap_err().to_string();
        assert!(e.contains("vocab_size 64") && e.contains("id 64") && e.contains("3 token(s)"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_llama_fixture_tokenizer_fits_its_model() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        // 62 entries, the specials among them: every id is a row of the 64-row embedding
        assert_eq!(check_tokenizer(&tok, 64).unwrap(), None);
        assert!(check_tokenizer(&tok, 62).is_ok());
        assert!(check_tokenizer(&tok, 61).is_err());
    }

    #[test]
    fn ids_past_the_embedding_name_source_id_and_token() {
        let dir = tmp("ids");
        let tok = words_tokenizer(&dir);
        assert!(check_ids(&[1, 5, 63], 64, false, "data.jsonl", Some(&tok)).is_ok());
        let e = check_ids(&[1, 5, 66], 64, false, "data.jsonl", Some(&tok)).unwrap_err().to_string();
        let word = tok.id_to_token(66).unwrap().unwrap();
        assert!(e.contains("data.jsonl") && e.contains("token id 66") && e.contains(&format!("{word:?}")), "{e}");
        assert!(e.contains("vocab_size 64") && e.contains("position 2"), "{e}");
        let e = check_ids(&[-1], 64, false, "--stop-id", None).unwrap_err().to_string();
        assert!(e.contains("token id -1"), "{e}");
        assert!(check_ids(&[-100, 3], 64, true, "labels", None).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}
