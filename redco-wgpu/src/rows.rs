//! The launch shape shared by the row kernels (softmax, norms, cross-entropy): rows of `d`
//! contiguous elements, `threads_per_row(d)` invocations per row, several short rows per
//! workgroup, a whole workgroup for a long row (`kernels/rows.wgsl`).

use crate::device::{groups_1d, WG};
use crate::{tpl, u32p};
use redco_core::Result;

/// Elements each invocation of a row takes at least before the row gets more invocations.
const PER_THREAD: usize = 4;

/// Invocations per row: a power of two from 1 to the workgroup size, so that each walks
/// about `PER_THREAD` or more elements (rows of 1024 and longer take a whole workgroup).
pub(crate) fn threads_per_row(d: usize) -> u32 {
    (d.div_ceil(PER_THREAD).next_power_of_two() as u32).clamp(1, WG)
}

/// The WGSL of row kernel `body` (a file of `kernels/`) for rows of `tpr` invocations, with
/// the body's own placeholders filled from `subs`.
pub(crate) fn source(body: &str, tpr: u32, subs: &[(&str, &str)]) -> String {
    let prelude = tpl(include_str!("kernels/rows.wgsl"), &[("$TPR", &tpr.to_string())]);
    format!("{prelude}\n{}", tpl(body, subs))
}

/// [`source`] for a body that also calls `row_max_sumexp` (`kernels/row_lse.wgsl`: the
/// row maximum and sum of exponentials of its input `x`).
pub(crate) fn source_lse(body: &str, tpr: u32, subs: &[(&str, &str)]) -> String {
    format!("{}\n{}", source(body, tpr, subs), include_str!("kernels/row_lse.wgsl"))
}

/// The workgroups covering `rows` rows of `tpr` invocations each.
pub(crate) fn groups(rows: usize, tpr: u32) -> Result<(u32, u32, u32)> {
    u32p(rows.saturating_mul(tpr as usize), "row invocations")?;
    Ok(groups_1d(rows * tpr as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_share_a_workgroup_and_long_rows_fill_one() {
        assert_eq!(threads_per_row(0), 1);
        assert_eq!(threads_per_row(1), 1);
        assert_eq!(threads_per_row(4), 1);
        assert_eq!(threads_per_row(5), 2);
        assert_eq!(threads_per_row(100), 32);
        assert_eq!(threads_per_row(1000), 256);
        assert_eq!(threads_per_row(1 << 20), 256);
    }
}
