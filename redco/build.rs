//! Records the git revision the binary is built from (`redco --version`, `redco info`).

use std::path::Path;
use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    println!("cargo:rustc-env=REDCO_GIT_REV={rev}{}", if dirty { "-dirty" } else { "" });
    // a new commit or checkout changes these
    for f in ["../.git/HEAD", "../.git/index"] {
        if Path::new(f).exists() {
            println!("cargo:rerun-if-changed={f}");
        }
    }
}
