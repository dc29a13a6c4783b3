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

/// cuDNN's loading path: a file that is not there is an error naming it and where cuDNN
/// comes from; a library that is not cuDNN is refused by name; where cuDNN is installed
/// (a GPU machine with the wheel), its version is read. The library is loaded once per
/// process, so each case runs this test again in a process of its own
/// (`REDCO_CUDNN_PROBE` set: it prints what loading gives, and stops there).
#[test]
fn cudnn_is_found_or_its_absence_explained() {
    if std::env::var_os("REDCO_CUDNN_PROBE").is_some() {
        match redco_cuda::cudnn::cudnn() {
            Ok(c) => println!("cudnn: {:?} from {}", c.version, c.file),
            Err(e) => println!("{e}"),
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let run = |file: &str| {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "cudnn_is_found_or_its_absence_explained", "--nocapture"])
            .env("REDCO_CUDNN_PROBE", "1")
            .env("REDCO_CUDNN_LIBRARY", file)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let missing = run("/nonexistent/libcudnn.so.9");
    assert!(missing.contains("cuDNN is not available") && missing.contains("/nonexistent/libcudnn.so.9"), "{missing}");
    assert!(missing.contains("nvidia-cudnn-cu13"), "{missing}");
    // the C library is a shared library without cudnnGetVersion
    let libc = run("libc.so.6");
    assert!(libc.contains("has no cudnnGetVersion"), "{libc}");
    match redco_cuda::cudnn::cudnn() {
        Ok(c) => assert!(c.version.0 >= 8, "{:?}", c.version),
        Err(e) => assert!(e.to_string().contains("cuDNN is not available"), "{e}"),
    }
    let old = redco_cuda::cudnn::require_fused_attention((7, 5));
    assert!(old.is_err(), "a Turing GPU or no cuDNN: no fused attention");
}
