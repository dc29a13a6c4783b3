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
