//! Without a driver or a GPU, every entry point returns an error that says so (cudarc
//! would panic on the first CUDA call: the backend asks first).

#[test]
fn without_a_driver_the_backend_says_so() {
    if redco_cuda::driver_present() {
        // a machine with a driver: the other paths are the GPU check's
        let n = redco_cuda::devices().map(|d| d.len()).unwrap_or(0);
        eprintln!("a CUDA driver is present ({n} GPUs): the no-driver paths are not reachable here");
        match redco_cuda::Cuda::new(n + 7) {
            Err(e) => assert!(e.to_string().contains("there is no GPU"), "{e}"),
            Ok(_) => panic!("GPU {} should not exist", n + 7),
        }
        return;
    }
    let e = redco_cuda::Cuda::new(0).expect_err("no driver: no backend").to_string();
    assert!(e.contains("no CUDA driver") && e.contains("libcuda"), "{e}");
    let e = redco_cuda::devices().expect_err("no driver: no device list").to_string();
    assert!(e.contains("no CUDA driver"), "{e}");
}
