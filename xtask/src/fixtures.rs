//! `cargo xtask fixtures --python PY`: regenerates the transformers reference fixtures in
//! `tests/fixtures/` (needs torch and transformers for that Python; not part of CI).

use crate::args::Args;
use std::process::Command;

/// Runs `xtask/python/gen_fixtures.py`.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &[])?;
    args.only(&["python"])?;
    let py = args.get("python").unwrap_or("python3");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let status = Command::new(py)
        .args([&format!("{root}/xtask/python/gen_fixtures.py"), "--out", &format!("{root}/tests/fixtures")])
        .status()
        .map_err(|e| format!("cannot run `{py}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the fixture generator failed ({status}); it needs torch and transformers for `{py}`"))
    }
}
