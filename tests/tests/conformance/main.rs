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

/// What each recompute mode runs again, counted in matmul kernels over a LLaMA's training
/// step (forward and backward): block recompute runs every layer's matmuls once more,
/// selective recompute none (it keeps their outputs), and all three give the same
/// gradients.
#[test]
fn selective_recompute_runs_no_matmul_twice_and_block_recompute_runs_each_layers_again() {
    use redco_core::nn::ModuleExt;
    use redco_core::{DType, Recompute, Tensor};
    use redco_models::hf::config::HfConfig;
    use redco_models::llama::Llama;
    use redco_tests::composite::matmul_calls;
    let cfg = HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":3,"vocab_size":64,"max_position_embeddings":32}"#,
    )
    .unwrap();
    let b = redco_tests::composite_cpu();
    let ids = Tensor::from_vec(&b, (0..16).map(|i| (i * 5 % 64) as i64).collect::<Vec<_>>(), [2, 8]).unwrap();
    let mut counts = Vec::new();
    let mut grads = Vec::new();
    for mode in [Recompute::None, Recompute::Block, Recompute::Selective] {
        let mut m = Llama::new(&b, &cfg, DType::F32, 3).unwrap();
        for (_, p) in m.named_parameters() {
            assert!(p.requires_grad());
        }
        m.set_recompute(mode);
        let before = matmul_calls();
        let g = m.loss(&ids, None, &ids).unwrap().backward().unwrap();
        counts.push(matmul_calls() - before);
        grads.push(
            m.named_parameters().into_iter().map(|(_, p)| g.get(&p).unwrap().to_vec_f64().unwrap()).collect::<Vec<_>>(),
        );
    }
    // per layer: q, k, v, o, gate, up, down, and the composite attention's two (scores,
    // probabilities times values) in the forward
    let per_layer_forward = 9 * cfg.layers;
    assert_eq!(counts[1], counts[0] + per_layer_forward, "block recompute: {counts:?}");
    assert_eq!(counts[2], counts[0], "selective recompute: {counts:?}");
    for (mode, g) in [("block", &grads[1]), ("selective", &grads[2])] {
        for (a, b) in g.iter().zip(&grads[0]) {
            redco_tests::check::assert_close(a, b, 1e-5, mode);
        }
    }
}
