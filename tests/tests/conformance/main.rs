//! The backend conformance suite ([`redco_tests::suite`]) on the backends this crate
//! knows: the CPU backend, the composite defaults over it, and wgpu (on a device that packs
//! f16, and again keeping f16 in f32 words). Other backends instantiate it in their own
//! crates (`redco-tpu/tests/conformance.rs`).

mod cpu {
    redco_tests::suite!(redco_tests::cpu());
}

mod composite {
    redco_tests::suite!(redco_tests::composite_cpu());
}

mod wgpu {
    redco_tests::suite!(@optional redco_tests::wgpu());
}

mod wgpu_f32_words {
    redco_tests::suite!(@optional redco_tests::wgpu_f32_words());
}
