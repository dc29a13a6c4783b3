//! The backend conformance suite: one file per op family, each test generic over the
//! backend and instantiated for every enabled backend by `redco_tests::conformance!`.

mod attention;
mod autograd;
mod cross_entropy;
mod elementwise;
mod index;
mod layout;
mod matmul;
mod nn;
mod norm;
mod optim;
mod random;
mod reduce;
mod rotary;
mod softmax;
