//! NVRTC for redco-cuda's kernel-compilation tests: `target/nvrtc/lib` (libnvrtc.so.13 and
//! its builtins), fetched once with `pip download --no-deps nvidia-cuda-nvrtc` (a 58 MB
//! wheel) and unpacked; NVRTC compiles CUDA C to PTX with no GPU and no driver. The
//! directory goes in front of `LD_LIBRARY_PATH` and `REDCO_REQUIRE_NVRTC=1` is set for
//! the commands that follow, so a missing NVRTC fails the tests instead of skipping them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel, pinned for reproducible runs.
const WHEEL: &str = "nvidia-cuda-nvrtc==13.5.37";

/// Makes NVRTC loadable by the tests and returns its directory.
pub fn ensure() -> Result<PathBuf, String> {
    let dir = Path::new("target").join("nvrtc");
    let lib = dir.join("lib");
    if !lib.join("libnvrtc.so.13").is_file() {
        fetch(&dir, &lib)?;
    }
    let abs = std::fs::canonicalize(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let path = if old.is_empty() { abs.display().to_string() } else { format!("{}:{old}", abs.display()) };
    std::env::set_var("LD_LIBRARY_PATH", path);
    std::env::set_var("REDCO_REQUIRE_NVRTC", "1");
    Ok(abs)
}

fn fetch(dir: &Path, lib: &Path) -> Result<(), String> {
    let wheels = dir.join("wheel");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    std::fs::create_dir_all(lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    eprintln!("xtask: fetching NVRTC (pip download --no-deps {WHEEL}, 58 MB)");
    if !crate::pjrt::pip_download(WHEEL, &wheels) {
        return Err(format!(
            "fetching NVRTC failed: run `python3 -m pip download --no-deps {WHEEL} -d {}` (pip from PyPI)",
            wheels.display()
        ));
    }
    // a wheel is a zip file: the shared libraries under nvidia/cu13/lib/ go to `lib`
    let script = "import glob, os, zipfile, sys\n\
         w = sorted(glob.glob(sys.argv[1] + '/nvidia_cuda_nvrtc-*.whl'))[-1]\n\
         z = zipfile.ZipFile(w)\n\
         for m in z.namelist():\n    \
             if '/lib/' in m and '.so' in m:\n        \
                 open(os.path.join(sys.argv[2], os.path.basename(m)), 'wb').write(z.read(m))\n";
    let ok = Command::new("python3").args(["-c", script]).arg(&wheels).arg(lib).status().is_ok_and(|s| s.success());
    if ok && lib.join("libnvrtc.so.13").is_file() {
        Ok(())
    } else {
        Err(format!("unpacking NVRTC from the wheel in {} failed", wheels.display()))
    }
}
