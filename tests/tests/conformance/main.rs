//! The backend conformance suite: one file per op family, each test generic over the
//! backend and instantiated for every enabled backend by `redco_tests::conformance!`.

mod elementwise;
mod matmul;
mod reduce;
