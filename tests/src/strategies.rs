//! proptest strategies for shapes: odd sizes, size-1 dims, broadcasting pairs.

use proptest::prelude::*;

/// A shape of rank `1..=max_rank` with dims in `1..=max_dim`.
pub fn shape(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1..=max_dim, 1..=max_rank)
}

/// Two shapes that broadcast together: each operand may drop leading dims and set any dim
/// to 1.
pub fn broadcast_pair(max_rank: usize, max_dim: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape(max_rank, max_dim).prop_flat_map(|out| {
        let r = out.len();
        let mk = move |out: Vec<usize>| {
            (0..=r, prop::collection::vec(any::<bool>(), r)).prop_map(move |(drop, ones)| {
                out.iter()
                    .zip(&ones)
                    .skip(drop.min(r - 1))
                    .map(|(&d, &one)| if one { 1 } else { d })
                    .collect::<Vec<_>>()
            })
        };
        (mk(out.clone()), mk(out))
    })
}

/// Runs a property over `cases` generated cases with a fixed seed (reproducible in CI).
pub fn run<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value)) {
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        proptest::test_runner::Config { cases, failure_persistence: None, ..Default::default() },
        proptest::test_runner::TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    runner
        .run(&strategy, |v| {
            test(v);
            Ok(())
        })
        .unwrap();
}
