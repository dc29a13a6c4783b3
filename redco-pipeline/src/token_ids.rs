//! Token ids against a model's vocabulary: the one check every path that feeds ids to an
//! embedding runs once, before the first step, so an id past the table is reported naming
//! where it came from instead of failing deep inside an `index_select`.

use redco_core::{Error, Result};

/// The label value the losses skip (`-100`, as in PyTorch and transformers).
pub const IGNORE_INDEX: i64 = -100;

/// An id outside a model's vocabulary: where it sits in the checked ids, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadId {
    /// Its position in the ids checked (row-major).
    pub position: usize,
    /// The id.
    pub id: i64,
}

/// The first id of `ids` outside `0..vocab_size` ([`IGNORE_INDEX`] passes when
/// `labels`: label tensors use it to mark positions without a target).
pub fn first_out_of_range(ids: &[i64], vocab_size: usize, labels: bool) -> Option<BadId> {
    let vocab = i64::try_from(vocab_size).unwrap_or(i64::MAX);
    ids.iter()
        .position(|&id| !((0..vocab).contains(&id) || (labels && id == IGNORE_INDEX)))
        .map(|position| BadId { position, id: ids[position] })
}

/// Refuses ids outside `0..vocab_size`, naming `source` (a data file, a batch entry, the
/// tokenizer file), the first bad id and its position, and `vocab_size`.
pub fn check_token_ids(ids: &[i64], vocab_size: usize, labels: bool, source: &str) -> Result<()> {
    match first_out_of_range(ids, vocab_size, labels) {
        None => Ok(()),
        Some(bad) => Err(Error::invalid(
            "token ids",
            format!(
                "{source}: token id {} (position {}) is outside the model's vocabulary (vocab_size {vocab_size}: ids \
                 0..{vocab_size})",
                bad.id, bad.position
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_id_past_the_table() {
        assert_eq!(first_out_of_range(&[0, 5, 63], 64, false), None);
        assert_eq!(first_out_of_range(&[0, 64, 70], 64, false), Some(BadId { position: 1, id: 64 }));
        assert_eq!(first_out_of_range(&[3, -1], 64, false), Some(BadId { position: 1, id: -1 }));
        // -100 is a label's "no target", not an input id
        assert_eq!(first_out_of_range(&[-100, 2], 64, true), None);
        assert_eq!(first_out_of_range(&[-100, 2], 64, false), Some(BadId { position: 0, id: -100 }));
        assert_eq!(first_out_of_range(&[-7], 64, true), Some(BadId { position: 0, id: -7 }));
    }

    #[test]
    fn the_error_names_source_id_and_vocab() {
        let e = check_token_ids(&[1, 2, 99], 64, false, "data.jsonl").unwrap_err().to_string();
        assert!(e.contains("data.jsonl") && e.contains("token id 99") && e.contains("vocab_size 64"), "{e}");
        assert!(e.contains("position 2"), "{e}");
    }
}
