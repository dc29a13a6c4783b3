//! The XLA CPU PJRT plugin for the tests and benches: `REDCO_PJRT_PLUGIN` when set, else
//! `target/pjrt/pjrt_c_api_cpu_plugin.so`, fetched once with
//! `pip download --no-deps lammps-jax-pjrt-cpu` (a 63 MB Apache-2.0 wheel) and unpacked.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel holding the plugin, pinned for reproducible runs.
const WHEEL: &str = "lammps-jax-pjrt-cpu==0.11.2";

/// The plugin's file name inside the wheel.
const PLUGIN: &str = "pjrt_c_api_cpu_plugin.so";

/// The plugin to test with: `REDCO_PJRT_PLUGIN`, else the cached one under `target/pjrt`,
/// fetched when missing. The variable is set for the commands that follow.
pub fn ensure_plugin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("REDCO_PJRT_PLUGIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(format!("REDCO_PJRT_PLUGIN={} is not a file", p.display()));
    }
    let dir = Path::new("target").join("pjrt");
    let plugin = dir.join(PLUGIN);
    if !plugin.is_file() {
        fetch(&dir)?;
    }
    let abs = std::fs::canonicalize(&plugin).map_err(|e| format!("{}: {e}", plugin.display()))?;
    std::env::set_var("REDCO_PJRT_PLUGIN", &abs);
    Ok(abs)
}

/// `python3 -m pip download --no-deps --quiet -d dir wheel`; whether it succeeded.
pub(crate) fn pip_download(wheel: &str, dir: &Path) -> bool {
    Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(dir)
        .arg(wheel)
        .status()
        .is_ok_and(|s| s.success())
}

fn fetch(dir: &Path) -> Result<(), String> {
    let wheels = dir.join("wheel");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    eprintln!("xtask: fetching the XLA CPU PJRT plugin (pip download --no-deps {WHEEL}, 63 MB)");
    if !pip_download(WHEEL, &wheels) {
        return Err(format!(
            "fetching the PJRT CPU plugin failed: run `python3 -m pip download --no-deps {WHEEL} -d {}` (pip from \
             PyPI; `apt-get install python3-pip`), or set REDCO_PJRT_PLUGIN to a plugin's path",
            wheels.display()
        ));
    }
    // A wheel is a zip file: unpack the plugin with Python's zipfile (no unzip needed).
    let script = format!(
        "import glob, zipfile, sys\n\
         w = sorted(glob.glob(sys.argv[1] + '/*.whl'))[-1]\n\
         z = zipfile.ZipFile(w)\n\
         n = [m for m in z.namelist() if m.endswith('/{PLUGIN}')][0]\n\
         open(sys.argv[2], 'wb').write(z.read(n))\n"
    );
    let out = dir.join(PLUGIN);
    let ok = Command::new("python3").args(["-c", &script]).arg(&wheels).arg(&out).status().is_ok_and(|s| s.success());
    if ok && out.is_file() {
        Ok(())
    } else {
        Err(format!("unpacking {PLUGIN} from the wheel in {} failed", wheels.display()))
    }
}
