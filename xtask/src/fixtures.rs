//! `cargo xtask fixtures --python PY`: regenerates the transformers reference fixtures in
//! `tests/fixtures/` (needs torch and transformers for that Python; not part of CI).
//! `cargo xtask fixtures --datasets --python PY`: regenerates only the Hugging Face
//! `datasets` fixtures in `tests/fixtures/datasets/` (needs `datasets` and `pyarrow`).

use crate::args::Args;
use std::process::Command;

/// Runs `xtask/python/gen_fixtures.py`, or with `--datasets` `xtask/python/gen_datasets.py`.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["datasets"])?;
    args.only(&["python", "datasets"])?;
    let py = args.get("python").unwrap_or("python3");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let (script, out, needs) = if args.has("datasets") {
        ("gen_datasets.py", "tests/fixtures/datasets", "datasets and pyarrow")
    } else {
        ("gen_fixtures.py", "tests/fixtures", "torch and transformers")
    };
    let status = Command::new(py)
        .args([&format!("{root}/xtask/python/{script}"), "--out", &format!("{root}/{out}")])
        .status()
        .map_err(|e| format!("cannot run `{py}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the fixture generator failed ({status}); it needs {needs} for `{py}`"))
    }
}
