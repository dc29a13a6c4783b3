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

/// A sparse mixture-of-experts block against an f64 loop over tokens (each token's top-k
/// experts, their renormalised weights, each expert's gated MLP), its gradients against
/// finite differences, and transformers' load-balancing and z losses recomputed the way
/// transformers writes them (one-hot masks over the concatenated logits).
#[test]
fn sparse_moe_equals_a_loop_over_each_tokens_experts_and_its_router_losses_transformers_formulas() {
    use redco_core::nn::{load_balancing_loss, router_z_loss, Activation, Experts, Linear, SparseMoe};
    use redco_core::{DType, Shape, Tensor};
    use redco_tests::check::{assert_close, grad_check, tensor, values};
    let b = redco_tests::cpu();
    let (t, h, i, e, k) = (7, 6, 5, 4, 2);
    let vx = values(t * h, 1, -1.0, 1.0);
    let vr = values(e * h, 2, -1.0, 1.0);
    let (vg, vu, vd) =
        (values(e * i * h, 3, -0.5, 0.5), values(e * i * h, 4, -0.5, 0.5), values(e * h * i, 5, -0.5, 0.5));
    let block = |ts: &[Tensor<redco_cpu::Cpu>], norm: bool| SparseMoe {
        capacity_factor: None,
        router: Linear::from_tensors(ts[1].clone(), None).unwrap(),
        experts: Experts {
            gate: ts[2].clone(),
            up: ts[3].clone(),
            down: ts[4].clone(),
            names: ["*.w1", "*.w3", "*.w2"],
        },
        top_k: k,
        norm_topk_prob: norm,
        act: Activation::Silu,
    };
    let shapes = [vec![t, h], vec![e, h], vec![e, i, h], vec![e, i, h], vec![e, h, i]];
    let vals = [&vx, &vr, &vg, &vu, &vd];
    let ts: Vec<Tensor<_>> = vals.iter().zip(&shapes).map(|(v, s)| tensor(&b, v, s.clone(), DType::F64)).collect();
    let silu = |z: f64| z / (1.0 + (-z).exp());
    // dropless, and with a capacity of ceil(0.75 * 7 * 2 / 4) = 3 slots per expert (first
    // choices first, each in token order)
    for (norm, capacity) in [(true, None), (false, None), (true, Some(0.75)), (false, Some(0.75))] {
        let moe = SparseMoe { capacity_factor: capacity, ..block(&ts, norm) };
        let (out, stats) = moe.forward(&ts[0]).unwrap();
        let mut tops = Vec::new();
        for r in 0..t {
            let x = &vx[r * h..(r + 1) * h];
            let logit: Vec<f64> = (0..e).map(|j| (0..h).map(|c| x[c] * vr[j * h + c]).sum()).collect();
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &c| logit[c].total_cmp(&logit[a]));
            tops.push(idx[..k].to_vec());
        }
        let mut live = vec![vec![true; k]; t];
        let mut dropped = 0;
        if let Some(f) = capacity {
            let cap = (f * (t * k) as f64 / e as f64).ceil() as usize;
            assert_eq!(cap, 3);
            let mut taken = vec![0; e];
            for j in 0..k {
                for r in 0..t {
                    let x = tops[r][j];
                    live[r][j] = taken[x] < cap;
                    taken[x] += usize::from(live[r][j]);
                    dropped += usize::from(!live[r][j]);
                }
            }
            assert!(dropped > 0, "the capacity drops some of the 14 slots");
        }
        assert_eq!(stats.dropped, dropped, "dropped slots (capacity {capacity:?})");
        let mut want = Vec::new();
        let (mut frac, mut psum, mut z) = (vec![0.0; e], vec![0.0; e], 0.0);
        for r in 0..t {
            let x = &vx[r * h..(r + 1) * h];
            let logit: Vec<f64> = (0..e).map(|j| (0..h).map(|c| x[c] * vr[j * h + c]).sum()).collect();
            let m = logit.iter().cloned().fold(f64::MIN, f64::max);
            let s: f64 = logit.iter().map(|l| (l - m).exp()).sum();
            let p: Vec<f64> = logit.iter().map(|l| (l - m).exp() / s).collect();
            z += (m + s.ln()).powi(2);
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &c| p[c].total_cmp(&p[a]));
            let top = &idx[..k];
            let wsum: f64 = if norm { top.iter().map(|&j| p[j]).sum() } else { 1.0 };
            for (j, pj) in p.iter().enumerate() {
                psum[j] += pj;
                frac[j] += top.iter().filter(|&&c| c == j).count() as f64;
            }
            let mut y = vec![0.0; h];
            for (&j, _) in top.iter().zip(&live[r]).filter(|(_, &l)| l) {
                let a: Vec<f64> = (0..i)
                    .map(|q| {
                        let g: f64 = (0..h).map(|c| x[c] * vg[(j * i + q) * h + c]).sum();
                        let u: f64 = (0..h).map(|c| x[c] * vu[(j * i + q) * h + c]).sum();
                        silu(g) * u
                    })
                    .collect();
                for (c, yc) in y.iter_mut().enumerate() {
                    *yc += p[j] / wsum * (0..i).map(|q| a[q] * vd[(j * h + c) * i + q]).sum::<f64>();
                }
            }
            want.extend(y);
        }
        assert_close(&out.to_vec_f64().unwrap(), &want, 1e-9, &format!("moe output (norm {norm}, {capacity:?})"));
        // transformers: E * sum_e mean_t(one-hot of the chosen e) * mean_t(p_e), the
        // one-hot mean taken per choice rank j and summed over j
        let aux: f64 = (0..e).map(|j| frac[j] / t as f64 * psum[j] / t as f64).sum::<f64>() * e as f64;
        let got = load_balancing_loss(std::slice::from_ref(&stats), e).unwrap().to_scalar().unwrap();
        assert!((got - aux).abs() < 1e-9, "load balancing: {got} vs {aux}");
        let got = router_z_loss(std::slice::from_ref(&stats)).unwrap().to_scalar().unwrap();
        assert!((got - z / t as f64).abs() < 1e-9, "z loss: {got} vs {}", z / t as f64);
    }
    let inputs: Vec<(Vec<f64>, Shape)> =
        vals.iter().zip(&shapes).map(|(v, s)| (v.to_vec(), Shape::new(s.clone()))).collect();
    grad_check(&b, &inputs, |v| Ok(block(v, true).forward(&v[0])?.0), 1e-6, "moe gradients (input, router, experts)");
    let capped = |v: &[Tensor<redco_cpu::Cpu>]| SparseMoe { capacity_factor: Some(0.75), ..block(v, true) };
    grad_check(&b, &inputs, |v| Ok(capped(v).forward(&v[0])?.0), 1e-6, "moe gradients with a capacity");
    // the router's gradient through the auxiliary loss
    grad_check(
        &b,
        &inputs,
        |v| {
            let (_, s) = block(v, true).forward(&v[0])?;
            load_balancing_loss(&[s], e)
        },
        1e-6,
        "load-balancing loss gradient",
    );
}
