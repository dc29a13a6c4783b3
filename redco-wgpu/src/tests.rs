//! Unit tests of the device: the test device, the packed f16 layout, a lost device.

use super::*;

/// A device for the unit tests: `None` (with a note) without an adapter, a panic then with
/// `REDCO_REQUIRE_WGPU=1`.
pub(crate) fn test_device() -> Option<Wgpu> {
    match Wgpu::new() {
        Ok(w) => Some(w),
        Err(e) if std::env::var("REDCO_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("REDCO_REQUIRE_WGPU=1 but no wgpu adapter: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu adapter: {e}");
            None
        }
    }
}

/// With `SHADER_F16`, an f16 tensor takes 2 bytes per element on the device (4 with
/// the f32-word layout, and always for bf16) and round-trips exactly.
#[test]
fn f16_storage_is_packed_when_the_adapter_has_shader_f16() {
    let Some(w) = test_device() else { return };
    let n = 1001;
    let v: Vec<half::f16> = (0..n).map(|i| half::f16::from_f32(i as f32 * 0.37 - 150.0)).collect();
    let x = w.upload(&HostData::F16(v.clone())).unwrap();
    let y = w.alloc(n, DType::F16).unwrap();
    let b = w.alloc(n, DType::BF16).unwrap();
    println!("has_f16: {}, f16 buffer {} bytes for {n} elements", w.has_f16(), y.buf.raw().size());
    let per_elem = if w.has_f16() { 2 } else { 4 };
    assert_eq!(w.elem_bytes(DType::F16), per_elem);
    assert_eq!(w.elem_bytes(DType::BF16), 4);
    for s in [&x, &y] {
        let size = s.buf.raw().size();
        assert!(size >= n as u64 * per_elem && size < n as u64 * per_elem * 5 / 4 + 256, "{size}");
    }
    assert!(b.buf.raw().size() >= n as u64 * 4);
    let wanted_f16 = std::env::var("REDCO_WGPU_F16").map_or(true, |v| v.trim() != "0");
    let offered = device::adapters()
        .iter()
        .find(|a| a.get_info().name == w.ctx.info.name && a.get_info().backend == w.ctx.info.backend)
        .is_some_and(|a| a.features().contains(wgpu::Features::SHADER_F16));
    assert_eq!(w.has_f16(), wanted_f16 && offered);
    assert_eq!(w.download(&x).unwrap(), HostData::F16(v));
}

/// Every op family on f16 gives bit-identical results with packed f16 and with the
/// f32-word layout (both compute in f32 and round to f16 on every store).
#[test]
fn f16_packed_and_f32_word_layouts_agree_bit_for_bit() {
    let Some(packed) = test_device() else { return };
    if !packed.has_f16() {
        eprintln!("skipped: the device has no packed f16 (no SHADER_F16 or REDCO_WGPU_F16=0)");
        return;
    }
    let words = Wgpu { ctx: Arc::new(Ctx::open_with(false).unwrap()) };
    assert!(!words.has_f16());
    let results = |w: &Wgpu| -> Vec<HostData> { f16_workload(w).unwrap() };
    let (a, b) = (results(&packed), results(&words));
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "result {i} differs between the layouts");
    }
}

fn f16_workload(w: &Wgpu) -> Result<Vec<HostData>> {
    let h = |n: usize, s: f32| -> HostData {
        HostData::F16((0..n).map(|i| half::f16::from_f32(((i * 37 % 23) as f32 / 7.0 - 1.5) * s)).collect())
    };
    let sh = |d: &[usize]| Shape::new(d.to_vec());
    let x = w.upload(&h(7 * 12, 1.0))?; // [7, 12]
    let y = w.upload(&h(12, 2.0))?; // [12]
    let xs = sh(&[7, 12]);
    let mut out = vec![
        w.unary(UnaryOp::Exp, &x, 84)?,
        w.unary(UnaryOp::GeluTanh, &x, 83)?,
        w.binary(BinaryOp::Mul, (&x, &xs), (&y, &sh(&[12])), &xs)?,
        w.compare(CmpOp::Gt, (&x, &xs), (&y, &sh(&[12])), &xs)?,
    ];
    out.push(w.where_cond((&out[3], &xs), (&x, &xs), (&y, &sh(&[12])), &xs)?);
    out.push(w.full(5, 1.2345, DType::F16)?);
    let f = w.cast(&x, 84, DType::F32)?;
    out.push(w.cast(&w.unary(UnaryOp::Affine { mul: 1.001, add: 0.0 }, &f, 84)?, 84, DType::F16)?);
    out.push(w.cast(&x, 84, DType::BF16)?);
    out.push(w.cast(&out[7], 84, DType::F16)?);
    out.push(w.cast(&x, 84, DType::I32)?);
    out.push(w.cast(&out[9], 84, DType::F16)?);
    out.push(f);
    out.push(w.permute(&x, &xs, &[1, 0])?);
    out.push(w.narrow(&x, &xs, 1, 3, 5)?);
    out.push(w.narrow(&x, &xs, 0, 1, 3)?);
    out.push(w.cat(&[(&x, &xs), (&y, &sh(&[1, 12]))], 0)?);
    out.push(w.expand(&y, &sh(&[1, 12]), &xs)?);
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax] {
        out.push(w.reduce(op, &x, &xs, 1)?);
        out.push(w.reduce(op, &x, &xs, 0)?);
    }
    let long = w.upload(&h(3 * 700, 0.5))?;
    out.push(w.reduce(ReduceOp::Sum, &long, &sh(&[3, 700]), 1)?);
    out.push(w.reduce(ReduceOp::Max, &long, &sh(&[3, 700]), 1)?);
    let ids = w.upload(&HostData::I64(vec![3, 0, 3, 6]))?;
    out.push(w.index_select(&x, &xs, 0, &ids, 4)?);
    let src = w.upload(&h(4 * 12, 3.0))?;
    out.push(w.index_add(&x, &xs, 0, &ids, &src)?);
    let gi = w.upload(&HostData::I64((0..84).map(|i| (i * 5 % 12) as i64).collect()))?;
    out.push(w.gather(&x, &xs, 1, &gi, &xs)?);
    out.push(w.scatter_add(&x, &xs, 1, &gi, &xs, &x)?);
    for (m, n, k) in [(7, 12, 12), (7, 5, 12), (8, 12, 4)] {
        let spec = MatmulSpec { batch: 1, m, n, k, trans_a: false, trans_b: true, a_batched: true, b_batched: true };
        out.push(w.matmul(&x, &w.upload(&h(n * k, 0.5))?, &spec)?);
        let spec = MatmulSpec { trans_b: false, ..spec };
        out.push(w.matmul(&x, &w.upload(&h(n * k, 0.5))?, &spec)?);
    }
    out.push(w.softmax(&x, &xs)?);
    out.push(w.log_softmax(&x, &xs)?);
    out.push(w.layer_norm(&x, &xs, Some(&y), Some(&y), 1e-5)?);
    out.push(w.rms_norm(&x, &xs, Some(&y), 1e-5)?);
    let cs = w.upload(&h(7 * 3, 0.3))?;
    out.push(w.rotary(&x, &xs, &cs, &cs, &sh(&[7, 3]), RotaryMode::HalfSplit)?);
    out.push(w.rotary(&x, &xs, &cs, &cs, &sh(&[7, 3]), RotaryMode::Interleaved)?);
    let t = w.upload(&HostData::I64(vec![1, 0, -100, 11, 5, 2, 3]))?;
    out.push(w.cross_entropy(&x, &xs, &t, -100)?);
    let step = AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, bias1: 0.1, bias2: 0.001 };
    let (p, m, v) = w.adamw(&x, &x, &x, &w.unary(UnaryOp::Abs, &x, 84)?, 84, &step)?;
    out.extend([p, m, v]);
    let q = w.upload(&h(2 * 3 * 8, 0.7))?;
    let spec = AttentionSpec {
        batch: 1,
        q_heads: 2,
        kv_heads: 1,
        q_len: 3,
        kv_len: 4,
        head_dim: 8,
        scale: 0.35,
        causal: true,
        mask_shape: None,
    };
    let kv = w.upload(&h(4 * 8, 0.9))?;
    out.push(w.attention(&q, &kv, &kv, None, &spec)?);
    out.iter().map(|s| w.download(s)).collect()
}

/// A device that goes away (here destroyed) makes the next op and read-back return an
/// error, promptly, instead of hanging or panicking.
#[test]
fn a_lost_device_gives_an_error_not_a_hang() {
    let Some(w) = test_device() else { return };
    let x = w.upload(&HostData::F32(vec![1.0, 2.0, 3.0])).unwrap();
    let y = w.unary(UnaryOp::Exp, &x, 3).unwrap();
    w.download(&y).unwrap();
    w.ctx.device.destroy();
    let t0 = std::time::Instant::now();
    let r = w.unary(UnaryOp::Exp, &x, 3).and_then(|z| w.download(&z));
    let e = r.expect_err("an op on a destroyed device must fail");
    println!("after destroy: {e} ({:?})", t0.elapsed());
    assert!(e.to_string().contains("lost"), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    // and it stays failed
    assert!(w.download(&x).is_err());
    assert!(w.sync().is_err());
}
