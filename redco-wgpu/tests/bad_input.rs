//! Bad input on the wgpu backend: a tensor beyond the device's buffer limit is refused with
//! an error that names the limit (without allocating anything of that size).

use redco_core::{Backend, DType, Tensor};
use redco_wgpu::Wgpu;

fn device() -> Option<Wgpu> {
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

#[test]
fn a_tensor_beyond_the_buffer_limit_is_an_error_naming_the_limit() {
    let Some(w) = device() else { return };
    let max = w.max_buffer_bytes();
    let n = (max / 4 + 1) as usize; // one f32 more than the limit holds
    let e = w.full(n, 0.0, DType::F32).expect_err("a buffer beyond the limit must be refused");
    let msg = e.to_string();
    assert!(msg.contains(&max.to_string()) && msg.contains("limit"), "{msg}");
    // through the tensor API too, and for an op's output
    let e = Tensor::zeros(&w, [2, n / 2 + 1], DType::F32).expect_err("refused");
    assert!(e.to_string().contains(&max.to_string()), "{e}");
    let x = Tensor::zeros(&w, [1, 1], DType::F32).unwrap();
    let e = x.expand([n, 1]).expect_err("refused");
    assert!(e.to_string().contains(&max.to_string()), "{e}");
    // the device still works afterwards
    let y = Tensor::ones(&w, [3], DType::F32).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), vec![1.0; 3]);
    println!("refused {n} f32 elements: {msg}");
}
