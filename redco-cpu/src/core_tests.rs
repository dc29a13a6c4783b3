//! Tests of the core's tensors, layers and ops run on this backend (they need a backend,
//! and the core has none of its own).

mod display {
    use crate::Cpu;
    use redco_core::{DType, Tensor};

    #[test]
    fn prints_nested_values_shape_and_dtype() {
        let dev = Cpu::new(1);
        let t = Tensor::from_vec(&dev, vec![1.0f32, -2.5, 3.0, 4.25], [2, 2]).unwrap();
        assert_eq!(
            format!("{t}"),
            "tensor([[ 1.0000, -2.5000],\n        [ 3.0000,  4.2500]], shape=[2, 2], dtype=F32, backend=cpu)"
        );
        assert_eq!(
            format!("{t:.1}"),
            "tensor([[ 1.0, -2.5],\n        [ 3.0,  4.2]], shape=[2, 2], dtype=F32, backend=cpu)"
        );
    }

    #[test]
    fn prints_integers_scalars_and_specials() {
        let dev = Cpu::new(1);
        let ids = Tensor::from_vec(&dev, vec![3i64, 10, -1], [3]).unwrap();
        assert_eq!(format!("{ids}"), "tensor([ 3, 10, -1], shape=[3], dtype=I64, backend=cpu)");
        let s = Tensor::scalar(&dev, 0.5, DType::F64).unwrap();
        assert_eq!(format!("{s}"), "tensor(0.5000, shape=[], dtype=F64, backend=cpu)");
        let odd = Tensor::from_vec(&dev, vec![f32::NAN, f32::INFINITY, 1e-7], [3]).unwrap();
        let text = format!("{odd}");
        assert!(text.starts_with("tensor([      nan,       inf, 1.0000e-7]"), "{text}");
    }

    #[test]
    fn summarises_large_tensors() {
        let dev = Cpu::new(1);
        let t = Tensor::from_vec(&dev, (0..2000i64).collect::<Vec<_>>(), [2, 1000]).unwrap();
        let text = format!("{t}");
        assert!(text.contains("[   0,    1,    2, ...,  997,  998,  999]"), "{text}");
        assert!(text.contains("[1000, 1001, 1002, ..., 1997, 1998, 1999]"), "{text}");
        assert!(text.ends_with("shape=[2, 1000], dtype=I64, backend=cpu)"), "{text}");
    }
}

mod linear {
    use crate::Cpu;
    use redco_core::nn::Linear;
    use redco_core::nn::ModuleExt;
    use redco_core::DType;

    #[test]
    fn parameters_are_found_by_name() {
        let dev = Cpu::new(1);
        let fc = Linear::new(&dev, 3, 2, true, DType::F32, 0).unwrap();
        let names: Vec<String> = fc.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "bias"]);
        let w = fc.parameter("weight").unwrap();
        assert_eq!(w.dims(), [2, 3]);
        assert_eq!(w.to_vec_f32().unwrap(), fc.weight.to_vec_f32().unwrap());
        assert_eq!(fc.parameter("bias").unwrap().dims(), [2]);
        assert!(fc.parameter("weights").is_none());
    }
}

mod lora {
    use crate::Cpu;
    use redco_core::nn::lora::{add_lora, set_dropout_seed, LoraConfig};
    use redco_core::nn::Linear;
    use redco_core::DType;
    use redco_core::Tensor;

    fn layer(dropout: f64) -> Linear<Cpu> {
        let b = Cpu::new(1);
        let mut l = Linear::new(&b, 8, 6, true, DType::F32, 1).expect("layer");
        let cfg = LoraConfig { rank: 2, alpha: 4.0, dropout, targets: ".*".into() };
        add_lora(&mut l, &cfg, 5).expect("attach");
        // a non-zero B, as after some training
        if let Some(a) = &mut l.lora {
            a.b = Tensor::full(&b, [6, 2], 0.5, DType::F32).expect("b").into_var();
        }
        l
    }

    fn out(l: &Linear<Cpu>, x: &Tensor<Cpu>) -> Vec<f32> {
        l.forward(x).expect("forward").to_vec_f32().expect("values")
    }

    #[test]
    fn dropout_applies_while_training_from_the_set_seed_and_never_in_eval() {
        let b = Cpu::new(1);
        let x = Tensor::from_vec(&b, (0..16).map(|i| i as f32 * 0.25 - 2.0).collect::<Vec<f32>>(), [2, 8]).expect("x");
        let (plain, dropped) = (layer(0.0), layer(0.5));
        let eval = redco_core::no_grad(|| out(&dropped, &x));
        assert_eq!(eval, out(&plain, &x), "no dropout without gradients");
        set_dropout_seed(&dropped, 3);
        let (a, again) = (out(&dropped, &x), out(&dropped, &x));
        assert_eq!(a, again, "the same seed draws the same masks");
        assert_ne!(a, out(&plain, &x), "dropout changes the adapter's output while training");
        set_dropout_seed(&dropped, 4);
        assert_ne!(out(&dropped, &x), a, "another seed, other masks");
    }

    #[test]
    fn bad_configs_and_targets_are_errors() {
        let b = Cpu::new(1);
        let mut l = Linear::new(&b, 4, 4, false, DType::F32, 1).expect("layer");
        for cfg in [
            LoraConfig { rank: 0, ..LoraConfig::default() },
            LoraConfig { alpha: f64::NAN, ..LoraConfig::default() },
            LoraConfig { dropout: 1.0, ..LoraConfig::default() },
            LoraConfig { targets: "(".into(), ..LoraConfig::default() },
            LoraConfig { targets: "nothing".into(), ..LoraConfig::default() },
        ] {
            assert!(add_lora(&mut l, &cfg, 0).is_err(), "{cfg:?}");
        }
        let all = LoraConfig { targets: ".*".into(), ..LoraConfig::default() };
        // a bare Linear is visited under the empty name
        assert_eq!(add_lora(&mut l, &all, 0).expect("adapters"), vec![String::new()]);
        assert!(add_lora(&mut l, &all, 0).is_err(), "a second adapter on the same layer");
    }
}

mod index {
    use crate::Cpu;
    use redco_core::Tensor;
    use std::sync::Arc;

    #[test]
    fn write_rows_on_the_cpu_writes_the_buffer_itself_when_nothing_else_holds_it() {
        let b = Cpu::new(1);
        let mut t = Tensor::from_vec(&b, vec![0f32; 12], [4, 3]).unwrap();
        let src = Tensor::from_vec(&b, vec![1f32, 2., 3.], [1, 3]).unwrap();
        let at = Arc::as_ptr(&t.storage().0);
        t.write_rows(&[2], &src).unwrap();
        assert_eq!(Arc::as_ptr(&t.storage().0), at, "written in place");
        // shared: written on a copy, the other holder unchanged
        let other = t.clone();
        t.write_rows(&[0], &src).unwrap();
        assert_ne!(Arc::as_ptr(&t.storage().0), at);
        assert_eq!(other.to_vec_f64().unwrap()[..3], [0.0, 0.0, 0.0]);
        assert_eq!(t.to_vec_f64().unwrap()[..9], [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
    }
}

mod random {
    use crate::Cpu;
    use redco_core::{DType, Tensor};

    #[test]
    fn rand_is_seeded_uniform() {
        let dev = Cpu::new(1);
        let a = Tensor::rand(&dev, [100, 50], DType::F32, 7).unwrap().to_vec_f64().unwrap();
        let b = Tensor::rand(&dev, [5000], DType::F32, 7).unwrap().to_vec_f64().unwrap();
        assert_eq!(a, b, "the values depend on the seed and the index only");
        assert!(a.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        let c = Tensor::rand(&dev, [5000], DType::F32, 8).unwrap().to_vec_f64().unwrap();
        assert_ne!(a, c);
        assert!(Tensor::rand(&dev, [2], DType::I64, 0).is_err());
    }

    #[test]
    fn randn_has_unit_moments() {
        let dev = Cpu::new(1);
        let v = Tensor::randn(&dev, [20_000], DType::F64, 3).unwrap().to_vec_f64().unwrap();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        // 5 standard errors
        assert!(mean.abs() < 5.0 / n.sqrt(), "mean {mean}");
        assert!((var - 1.0).abs() < 5.0 * (2.0 / n).sqrt(), "variance {var}");
        let within_one = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / n;
        assert!((within_one - 0.6827).abs() < 0.02, "P(|x| < 1) = {within_one}");
        assert!(Tensor::randn(&dev, [2], DType::U8, 0).is_err());
    }
}
