//! [`Bounds`]: what the host knows of an integer buffer's values without reading it back.
//!
//! Token ids and labels come from the host: their range is taken when they are uploaded
//! and follows them through the layout copies (narrow, permute, expand, cat, integer
//! casts). An index op or the cross-entropy whose ids are known to be in range then needs
//! no read-back of its error flag, so a training step queues its kernels without waiting
//! for the GPU. Ids made on the device (an argmax, a comparison) have no bounds and are
//! checked through the flag as before: a bad id is still an error at the op.

/// The ranges of an integer buffer's non-negative and negative values (`None`: no such
/// value). Kept apart so that a label buffer of ids and `-100` is still known exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    nonneg: Option<(i64, i64)>,
    neg: Option<(i64, i64)>,
}

fn widen(r: Option<(i64, i64)>, v: i64) -> Option<(i64, i64)> {
    Some(r.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))))
}

fn join(a: Option<(i64, i64)>, b: Option<(i64, i64)>) -> Option<(i64, i64)> {
    match (a, b) {
        (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
        (x, None) | (None, x) => x,
    }
}

impl Bounds {
    /// The bounds of `values`.
    pub(crate) fn of(values: impl IntoIterator<Item = i64>) -> Bounds {
        let mut b = Bounds { nonneg: None, neg: None };
        for v in values {
            if v < 0 {
                b.neg = widen(b.neg, v);
            } else {
                b.nonneg = widen(b.nonneg, v);
            }
        }
        b
    }

    /// The bounds of the concatenation of two buffers.
    pub(crate) fn union(self, o: Bounds) -> Bounds {
        Bounds { nonneg: join(self.nonneg, o.nonneg), neg: join(self.neg, o.neg) }
    }

    /// The smallest and largest value (`None` for an empty buffer).
    pub(crate) fn range(&self) -> Option<(i64, i64)> {
        match (self.neg, self.nonneg) {
            (Some((lo, _)), Some((_, hi))) => Some((lo, hi)),
            (Some(r), None) | (None, Some(r)) => Some(r),
            (None, None) => None,
        }
    }

    /// Whether every value is an index into `0..size` or equals `except` (the
    /// cross-entropy's ignored label). False when the bounds cannot tell.
    pub(crate) fn within(&self, size: usize, except: Option<i64>) -> bool {
        let neg_ok = match self.neg {
            None => true,
            Some((lo, hi)) => except.is_some_and(|e| lo == e && hi == e),
        };
        let nonneg_ok = self.nonneg.is_none_or(|(_, hi)| (hi as u64) < size as u64);
        neg_ok && nonneg_ok
    }
}

#[cfg(test)]
mod tests {
    use super::Bounds;

    #[test]
    fn ids_in_range_are_known_and_others_are_not() {
        let b = Bounds::of([3, 0, 7]);
        assert!(b.within(8, None));
        assert!(!b.within(7, None), "7 is past a size of 7");
        let labels = Bounds::of([5, -100, 2, -100]);
        assert!(labels.within(6, Some(-100)));
        assert!(!labels.within(6, None), "-100 is no index");
        assert!(!labels.within(6, Some(-1)), "another ignored label");
        assert!(!Bounds::of([-100, -3, 1]).within(6, Some(-100)), "-3 is neither an index nor ignored");
        assert!(Bounds::of([]).within(0, None), "no ids: nothing out of range");
    }

    #[test]
    fn a_concatenation_knows_both_parts() {
        let b = Bounds::of([1, 2]).union(Bounds::of([-100, 9]));
        assert_eq!(b, Bounds::of([1, 2, -100, 9]));
        assert_eq!(b.range(), Some((-100, 9)));
        assert!(b.within(10, Some(-100)) && !b.within(9, Some(-100)));
        assert_eq!(Bounds::of([]).union(Bounds::of([4])).range(), Some((4, 4)));
        assert_eq!(Bounds::of([]).range(), None);
    }
}
