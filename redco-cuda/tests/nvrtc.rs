//! Every kernel family compiles with NVRTC for sm_80 and sm_90, and defines the kernels
//! the host code launches. NVRTC runs without a GPU or a driver; `cargo xtask test`
//! fetches it (the `nvidia-cuda-nvrtc` wheel) and sets `REDCO_REQUIRE_NVRTC=1`, so there a
//! missing NVRTC fails instead of skipping.

use redco_cuda::kernels::{compile, FAMILIES};

fn nvrtc_or_skip() -> bool {
    if redco_cuda::nvrtc_present() {
        return true;
    }
    assert!(
        std::env::var("REDCO_REQUIRE_NVRTC").map_or(true, |v| v != "1"),
        "REDCO_REQUIRE_NVRTC=1 but libnvrtc.so cannot be loaded (LD_LIBRARY_PATH={:?})",
        std::env::var("LD_LIBRARY_PATH")
    );
    eprintln!("skipped: NVRTC (libnvrtc.so) is not available");
    false
}

#[test]
fn every_kernel_compiles_for_ampere_and_hopper() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut total = 0;
    for arch in ["sm_80", "sm_90"] {
        for (family, _) in FAMILIES {
            let c = compile(family, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.kernels.is_empty(), "{family} defines no kernel");
            total += c.kernels.len();
        }
    }
    println!("NVRTC compiled {total} kernels ({} per architecture) for sm_80 and sm_90", total / 2);
}

#[test]
fn the_kernels_the_host_launches_exist() {
    if !nvrtc_or_skip() {
        return;
    }
    let names = |family: &'static str| compile(family, "sm_90").unwrap_or_else(|e| panic!("{e}")).kernels;
    let dts = ["f32", "f64", "bf16", "f16"];
    let all = ["f32", "f64", "bf16", "f16", "i64", "i32", "u8"];
    let el = names("elementwise");
    for t in dts {
        for k in ["unary", "binary", "fill", "compare", "where"] {
            assert!(el.contains(&format!("{k}_{t}")), "elementwise has no {k}_{t}");
        }
    }
    for a in all {
        for b in all {
            assert!(el.contains(&format!("cast_{a}_{b}")), "no cast_{a}_{b}");
        }
        for k in ["binary", "fill", "compare", "where"] {
            assert!(el.contains(&format!("{k}_{a}")), "elementwise has no {k}_{a}");
        }
    }
    let ix = names("index");
    for t in all {
        for id in ["i64", "i32"] {
            assert!(ix.contains(&format!("index_select_{t}_{id}")) && ix.contains(&format!("gather_{t}_{id}")));
        }
    }
    for (family, prefix) in [
        ("softmax", vec!["softmax"]),
        ("norm", vec!["layer_norm", "rms_norm", "norm_bwd"]),
        ("rotary", vec!["rotary"]),
        ("adamw", vec!["adamw", "adamw_many"]),
        ("attention", vec!["attn_fwd", "attn_bwd_q", "attn_bwd_kv", "paged_attn"]),
        ("quant", vec!["quant_gemv", "quant_dequant"]),
        ("reduce", vec!["reduce_rows", "reduce_strided", "argmax"]),
    ] {
        let ks = names(family);
        for p in prefix {
            for t in dts {
                assert!(ks.contains(&format!("{p}_{t}")), "{family} has no {p}_{t}");
            }
        }
    }
    let ce = names("cross_entropy");
    for t in dts {
        assert!(ce.contains(&format!("xent_{t}_i64")) && ce.contains(&format!("xent_grad_{t}_i32")));
    }
    let lay = names("layout");
    for w in [1, 2, 4, 8] {
        assert!(lay.contains(&format!("copy_b{w}")));
    }
}

#[test]
fn a_compile_error_carries_nvrtcs_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let e = compile("elementwise", "sm_1").err().expect("sm_1 is no architecture").to_string();
    assert!(e.contains("elementwise") && e.contains("sm_1"), "{e}");
}

#[test]
fn compiled_ptx_is_cached_on_disk_and_read_back() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("redco-cuda-cache-{}", std::process::id()));
    std::env::set_var("REDCO_CUDA_CACHE", &dir);
    let first = redco_cuda::kernels::ptx_cached("rotary", "sm_80").unwrap_or_else(|e| panic!("{e}"));
    let files: Vec<_> = std::fs::read_dir(&dir).expect("cache dir").filter_map(|e| e.ok()).collect();
    assert_eq!(files.len(), 1, "one cached file");
    let path = files[0].path();
    assert!(path.file_name().unwrap().to_string_lossy().starts_with("rotary-sm_80-"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
    // the same family again: from memory, equal
    assert_eq!(redco_cuda::kernels::ptx_cached("rotary", "sm_80").unwrap(), first);
    let _ = std::fs::remove_dir_all(&dir);
}
