//! `cargo xtask test`: everything CI checks, in order, stopping at the first failure.
//!
//! Tests that need AVX-512F (every test under a module named `avx512`, such as
//! `sgemm::tests::sweeps::avx512::*` in redco-cpu) are left out on a CPU without it, and named:
//! xtask prints a line listing them and why, and nextest prints each as `SKIP`; on a CPU
//! without AVX2 and FMA, the tests under `avx2` modules are left out too, and the `amx`
//! ones (the AMX bf16 GEMM's) where `redco_cpu::amx_bf16` is false, the `dot` ones (the
//! AVX512-BF16 GEMM's) where `redco_cpu::avx512_bf16` is false. Set
//! `REDCO_ASSUME_NO_AVX512=1` to do the same on an AVX-512 machine; the variable reaches
//! the tests, where it also turns the CPU backend's AVX-512 code paths off, so the run
//! is the one an AVX2-only CPU gets.

use crate::args::Args;
use std::process::Command;

fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// Runs cargo and returns its standard output (its standard error passes through).
fn cargo_stdout(args: &[&str]) -> Result<String, String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("`cargo {}` failed ({})", args.join(" "), out.status))
    }
}

fn has_nextest() -> bool {
    Command::new("cargo").args(["nextest", "--version"]).output().map(|o| o.status.success()).unwrap_or(false)
}

/// Optional backends and transports compiled into the checks and tests: the facade's
/// `wgpu` feature (its CLI tests run on lavapipe in CI; redco-wgpu itself is always built,
/// by redco-tests), its `mpi` feature (the CLI over processes; redco-mpi is a workspace
/// member) and xtask's (the wgpu rows of `bench llm`, the process rows).
const FEATURES: &str = "redco/wgpu,redco/mpi,redco/tpu,redco/cuda,xtask/wgpu,xtask/mpi,xtask/tpu,xtask/cuda";

/// The Debian packages the suite needs beyond the Rust toolchain: Open MPI (redco-mpi and
/// the multi-process tests), libclang (rsmpi's bindgen) and Mesa's Vulkan drivers (the
/// wgpu suite on lavapipe).
const PACKAGES: [&str; 5] = ["libopenmpi-dev", "openmpi-bin", "libclang-dev", "mesa-vulkan-drivers", "iproute2"];

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Installs the missing [`PACKAGES`] with apt-get when this is root on Debian/Ubuntu, or
/// stops at once with the command to run; a machine without dpkg must provide MPI (mpicc,
/// mpirun), libclang and a Vulkan driver itself.
fn setup() -> Result<(), String> {
    let has_dpkg = Command::new("dpkg-query").arg("--version").output().is_ok_and(|o| o.status.success());
    if !has_dpkg {
        let mpi = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
        if !mpi {
            return Err("the tests need MPI (mpicc, mpirun), libclang and a Vulkan driver; install Open MPI or MPICH \
                        with its development files, libclang and Mesa's Vulkan drivers, then run again"
                .into());
        }
        return Ok(());
    }
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let cmd = format!("apt-get update && apt-get install -y {}", missing.join(" "));
    if !is_root() {
        return Err(format!("the tests need {}: run `sudo sh -c '{cmd}'`, then run again", missing.join(", ")));
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let ok = Command::new("sh")
        .args(["-c", &format!("apt-get update -qq && apt-get install -y -qq {}", missing.join(" "))])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(format!("installing {} failed; run `{cmd}` by hand, then run again", missing.join(", ")))
    }
}

/// Tests left out because this CPU cannot run their instruction set: why, and the module
/// names (`avx512`, `avx2`) whose tests are left out.
struct Skip {
    why: String,
    modules: Vec<&'static str>,
}

impl Skip {
    /// The nextest filterset of the skipped tests.
    fn filter(&self) -> String {
        self.modules.iter().map(|m| format!("test(/::{m}::/)")).collect::<Vec<_>>().join(" | ")
    }

    /// The nextest filterset of every other test.
    fn others(&self) -> String {
        format!("not ({})", self.filter())
    }

    /// The libtest `--skip` patterns (substrings of the names).
    fn patterns(&self) -> Vec<String> {
        self.modules.iter().map(|m| format!("::{m}::")).collect()
    }
}

/// Which kernel tests cannot run here, and why; `None` where all can.
fn skipped_here() -> Option<Skip> {
    let mut modules = Vec::new();
    let mut why = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let assumed = crate::machine::assumes_no_avx512();
        if assumed || !has!("avx512f") {
            modules.push("avx512");
            why.push(if assumed { "REDCO_ASSUME_NO_AVX512 is set" } else { "this CPU lacks AVX-512F" });
        }
        if !(has!("avx2") && has!("fma")) {
            modules.push("avx2");
            why.push("this CPU lacks AVX2 and FMA");
        }
        if !redco_cpu::amx_bf16() {
            modules.push("amx");
            why.push("the AMX bf16 GEMM does not run here (no AMX-BF16, or turned off)");
        }
        if !redco_cpu::avx512_bf16() {
            modules.push("dot");
            why.push("the AVX512-BF16 GEMM does not run here (no AVX512-BF16)");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        modules.extend(["avx512", "avx2", "amx", "dot"]);
        why.push("this CPU is not x86-64");
    }
    (!modules.is_empty()).then(|| Skip { why: why.join(", "), modules })
}

/// Lists the tests `skip` leaves out (as `crate test::path` with nextest, `test::path` with
/// libtest), building the test binaries as the run that follows will.
fn skipped_tests(nextest: bool, skip: &Skip) -> Result<Vec<String>, String> {
    if nextest {
        let out = cargo_stdout(&[
            "nextest",
            "list",
            "--workspace",
            "--features",
            FEATURES,
            "-E",
            &skip.filter(),
            "--message-format",
            "oneline",
        ])?;
        Ok(out.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
    } else {
        let out = cargo_stdout(&["test", "--workspace", "--features", FEATURES, "--tests", "--", "--list"])?;
        Ok(out
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .filter(|name| skip.patterns().iter().any(|p| name.contains(p.as_str())))
            .map(String::from)
            .collect())
    }
}

/// Runs fmt, clippy, the API docs with warnings as errors (broken links), the tests
/// (nextest when installed) and the doc tests.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["no-lint"])?;
    args.only(&["no-lint"])?;
    setup()?;
    let plugin = crate::pjrt::ensure_plugin()?;
    eprintln!("xtask: PJRT tests use {}", plugin.display());
    let nvrtc = crate::nvrtc::ensure()?;
    eprintln!("xtask: CUDA kernel-compilation tests use NVRTC from {}", nvrtc.display());
    if is_root() {
        // Open MPI refuses to start as root without these (the multi-process tests)
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT", "1");
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    if !args.has("no-lint") {
        cargo(&["fmt", "--all", "--check"])?;
        cargo(&["clippy", "--workspace", "--all-targets", "--features", FEATURES, "--", "-D", "warnings"])?;
        // the core as an embedder takes it, alone and with the CPU backend: without the
        // pipeline's dependencies
        cargo(&["clippy", "-p", "redco-core", "-p", "redco-cpu", "--all-targets", "--", "-D", "warnings"])?;
        cargo_env(&["doc", "--workspace", "--no-deps", "--features", FEATURES], &[("RUSTDOCFLAGS", "-D warnings")])?;
    }
    let nextest = has_nextest();
    let skip = skipped_here();
    if let Some(skip) = &skip {
        let names = skipped_tests(nextest, skip)?;
        eprintln!(
            "xtask: skipping {} tests of kernels this CPU cannot run ({}; the CPU backend's dispatch tests cover \
             the GEMM used instead): {}",
            names.len(),
            skip.why,
            names.join(", ")
        );
    }
    let others = skip.as_ref().map(Skip::others);
    let patterns = skip.as_ref().map(Skip::patterns).unwrap_or_default();
    if nextest {
        let mut args = vec!["nextest", "run", "--workspace", "--features", FEATURES, "--no-fail-fast"];
        if let Some(others) = &others {
            args.extend(["-E", others, "--status-level", "skip", "--final-status-level", "skip"]);
        }
        cargo(&args)?;
    } else {
        let mut args = vec!["test", "--workspace", "--features", FEATURES, "--no-fail-fast"];
        if !patterns.is_empty() {
            args.push("--");
            for p in &patterns {
                args.extend(["--skip", p.as_str()]);
            }
        }
        cargo(&args)?;
    }
    cargo(&["test", "--workspace", "--doc"])?;
    eprintln!("xtask: all checks passed");
    Ok(())
}
