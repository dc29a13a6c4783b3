//! Bad input to the PJRT backend: a missing plugin, a library that is no plugin, a plugin
//! of another API version, a program XLA rejects, a buffer larger than the device.

use redco_core::{Backend, DType, HostData};
use redco_tpu::{Api, Client, CompileOptions, Pjrt};
use std::path::Path;

fn message<T: std::fmt::Debug>(r: redco_core::Result<T>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn a_missing_plugin_names_the_file() {
    let e = message(Api::load(Path::new("/nonexistent/pjrt_plugin.so")));
    assert!(e.contains("cannot open the PJRT plugin /nonexistent/pjrt_plugin.so"), "{e}");
}

#[test]
fn a_library_without_get_pjrt_api_is_no_plugin() {
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a libc to load");
    let e = message(Api::load(Path::new(libc)));
    assert!(e.contains("is not a PJRT plugin (no GetPjrtApi symbol"), "{e}");
}

/// Builds a shared library whose `GetPjrtApi` reports API `major.minor` with a table of
/// `table` bytes, with the system C compiler.
fn fake_plugin(major: i32, minor: i32, table: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("redco-fake-pjrt-{}-{major}-{minor}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fake.c");
    let so = dir.join("libfake_pjrt.so");
    std::fs::write(
        &src,
        format!(
            "#include <stddef.h>\n\
             struct v {{ size_t s; void* e; int major; int minor; }};\n\
             struct api {{ size_t s; void* e; struct v ver; void* fns[512]; }};\n\
             static struct api A = {{ {table}, 0, {{ 24, 0, {major}, {minor} }}, {{0}} }};\n\
             const struct api* GetPjrtApi(void) {{ return &A; }}\n"
        ),
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ok = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("the C compiler `{cc}` (needed to build a fake plugin) did not run: {e}"));
    assert!(ok.success(), "{cc} failed");
    so
}

#[test]
fn a_plugin_of_another_api_version_names_both_versions() {
    let e = message(Api::load(&fake_plugin(1, 3, 4096)));
    assert!(e.contains("implements PJRT C API 1.3") && e.contains("redco is built against API 0."), "{e}");
    // the right major version but a table too short for the entry points redco calls
    let e = message(Api::load(&fake_plugin(0, 20, 200)));
    assert!(e.contains("implements PJRT C API 0.20 (function table of 200 bytes)"), "{e}");
}

fn pjrt() -> Pjrt {
    Pjrt::from_env(1).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin")
}

#[test]
fn a_program_xla_rejects_gives_xla_message_and_the_op() {
    let b = pjrt();
    let bad = "func.func @main(%a: tensor<3xf32>) -> tensor<4xf32> {\n  %0 = \"stablehlo.add\"(%a, %a) : (tensor<3xf32>, tensor<3xf32>) -> tensor<4xf32>\n  \"func.return\"(%0) : (tensor<4xf32>) -> ()\n}";
    let e = message(b.client().compile(bad.as_bytes(), &CompileOptions::portable(), "my-op"));
    assert!(e.contains("XLA rejected the program of `my-op`") && e.contains("PJRT_Client_Compile"), "{e}");
    assert!(e.contains("tensor<4xf32>") || e.contains("shape") || e.contains("type"), "XLA's message: {e}");
}

#[test]
fn buffers_larger_than_the_device_are_refused_before_allocation() {
    let b = pjrt();
    let dev = &b.client().devices()[0];
    let limit = dev.memory_bytes.expect("the CPU plugin's devices report the host's memory, a GPU's its own");
    let platform = b.client().platform().to_string();
    let n = (limit / 4 + 1) as usize;
    let e = message(b.full(n, 1.0, DType::F32));
    assert!(e.contains(&format!("does not fit on {platform} device 0")), "{e}");
    let e = message(Client::upload(b.client(), 0, &HostData::F32(vec![1.0; 4]), &[5]));
    assert!(e.contains("shape [5] needs 5 elements, the data has 4"), "{e}");
    let e = message(b.on_device(7));
    let n = b.client().devices().len();
    assert!(e.contains(&format!("device 7 requested but the {platform} client has {n}")), "{e}");
}
