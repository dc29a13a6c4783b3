//! The CUDA C kernel sources (`kernels/<family>.cu`, each compiled with
//! `kernels/common.cuh` in front) and their compilation by NVRTC for one GPU
//! architecture. No CUDA header is included: the 16-bit types and their conversions are
//! written out in `common.cuh`, so NVRTC needs nothing but itself.

use crate::device::{err, nvrtc_present};
use redco_core::Result;

/// What every family's source starts with.
const COMMON: &str = include_str!("../kernels/common.cuh");

/// Every kernel family: its name (the file name) and its source.
pub const FAMILIES: &[(&str, &str)] = &[
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    ("reduce", include_str!("../kernels/reduce.cu")),
    ("layout", include_str!("../kernels/layout.cu")),
    ("index", include_str!("../kernels/index.cu")),
    ("softmax", include_str!("../kernels/softmax.cu")),
    ("norm", include_str!("../kernels/norm.cu")),
    ("rotary", include_str!("../kernels/rotary.cu")),
    ("adamw", include_str!("../kernels/adamw.cu")),
    ("cross_entropy", include_str!("../kernels/cross_entropy.cu")),
    ("attention", include_str!("../kernels/attention.cu")),
    ("quant", include_str!("../kernels/quant.cu")),
];

/// The complete source of `family`, as NVRTC compiles it.
pub fn source(family: &str) -> Result<String> {
    let (_, body) =
        FAMILIES.iter().find(|(f, _)| *f == family).ok_or_else(|| err(format!("no kernel family `{family}`")))?;
    Ok(format!("{COMMON}\n#line 1 \"{family}.cu\"\n{body}"))
}

/// A family compiled for one architecture: its PTX and the names of its kernels.
pub struct Compiled {
    /// The family.
    pub family: &'static str,
    /// The PTX text.
    pub ptx: cudarc::nvrtc::Ptx,
    /// The `extern "C"` kernels it defines (read from the PTX's `.entry` lines).
    pub kernels: Vec<String>,
}

/// Compiles `family` for `arch` (`sm_90`, `sm_80`, ...) with NVRTC; the error carries
/// NVRTC's log.
pub fn compile(family: &'static str, arch: &str) -> Result<Compiled> {
    if !nvrtc_present() {
        return Err(err("NVRTC is not available: libnvrtc.so could not be loaded (install the CUDA toolkit or \
             `pip download --no-deps nvidia-cuda-nvrtc` and add its lib directory to LD_LIBRARY_PATH)"));
    }
    let src = source(family)?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into(), "--fmad=true".into()],
        name: Some(format!("{family}.cu")),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts)
        .map_err(|e| err(format!("NVRTC could not compile kernels/{family}.cu for {arch}: {e}")))?;
    let kernels = entries(&ptx.to_src());
    Ok(Compiled { family, ptx, kernels })
}

/// The PTX of `family` for `arch`, compiled once per process and kept on disk between
/// processes: a run of the test suite or of `gpu-check` opens the backend in several
/// processes, and NVRTC takes about a second per family. The disk cache is
/// `$REDCO_CUDA_CACHE`, else `$XDG_CACHE_HOME/redco/cuda`, else `~/.cache/redco/cuda`; a
/// file is named by a hash of the source, the architecture and NVRTC's version, so an
/// edited kernel or another toolkit never reads a stale entry. A cache that cannot be
/// read or written is skipped (the kernel is compiled instead).
pub fn ptx_cached(family: &'static str, arch: &str) -> Result<String> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static MEM: Mutex<Option<HashMap<(String, String), String>>> = Mutex::new(None);
    let key = (family.to_string(), arch.to_string());
    if let Some(p) = MEM.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).get(&key) {
        return Ok(p.clone());
    }
    let file = cache_dir().map(|d| d.join(format!("{family}-{arch}-{:016x}.ptx", cache_key(family, arch))));
    let ptx = match file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).filter(|p| p.contains(".entry")) {
        Some(p) => p,
        None => {
            let p = compile(family, arch)?.ptx.to_src();
            if let Some(f) = &file {
                // written whole, then renamed: a concurrent reader never sees half a file
                let tmp = f.with_extension(format!("tmp{}", std::process::id()));
                let ok = f.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok())
                    && std::fs::write(&tmp, &p).is_ok()
                    && std::fs::rename(&tmp, f).is_ok();
                if !ok {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            p
        }
    };
    MEM.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(key, ptx.clone());
    Ok(ptx)
}

fn cache_dir() -> Option<std::path::PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    env("REDCO_CUDA_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("redco/cuda")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/redco/cuda")))
}

/// A hash (FNV-1a) of what the PTX depends on: the source, the architecture, NVRTC's
/// version.
fn cache_key(family: &str, arch: &str) -> u64 {
    let (mut major, mut minor) = (0, 0);
    if nvrtc_present() {
        // SAFETY: the library is present; NVRTC writes two ints
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    }
    let version = (major, minor);
    let text = format!("{}\0{arch}\0{version:?}", source(family).unwrap_or_default());
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The kernel names a PTX text defines (`.visible .entry name(`).
pub fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or(l).trim().to_string())
        .collect()
}

/// The architecture name NVRTC takes for a compute capability (`(9, 0)` -> `sm_90`).
pub fn arch_of(capability: (i32, i32)) -> String {
    format!("sm_{}{}", capability.0, capability.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_its_source_behind_the_common_part() {
        for (f, body) in FAMILIES {
            let s = source(f).unwrap();
            assert!(s.starts_with(COMMON) && s.ends_with(body));
        }
        assert!(source("nope").is_err());
    }

    #[test]
    fn entry_names_are_read_from_ptx() {
        let ptx = ".version 8.0\n.visible .entry unary_f32(\n\t.param .u64 a\n)\n.visible .entry fill_u8(\n";
        assert_eq!(entries(ptx), vec!["unary_f32", "fill_u8"]);
        assert_eq!(arch_of((8, 6)), "sm_86");
    }
}
