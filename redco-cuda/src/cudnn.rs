//! cuDNN, loaded at run time like the other CUDA libraries (`libcudnn.so.9` from the
//! toolkit or the `nvidia-cudnn-cu13` wheel on `LD_LIBRARY_PATH`; `REDCO_CUDNN_LIBRARY`
//! names a file instead). Its fused attention (the graph API's SDPA, forward and backward
//! on tensor cores) is the candidate for the attention of a real-size training step; this
//! is the loading path it starts from: the library found, its version read, and an error
//! that says what is missing and where to get it when it is not there.

use crate::device::err;
use redco_core::Result;
use std::sync::OnceLock;

/// The file names tried, newest first.
const NAMES: [&str; 3] = ["libcudnn.so.9", "libcudnn.so", "libcudnn.so.8"];

/// A loaded cuDNN.
pub struct Cudnn {
    /// Kept loaded for the process's life.
    _lib: libloading::Library,
    /// Where it was loaded from.
    pub file: String,
    /// (major, minor, patch).
    pub version: (u32, u32, u32),
}

/// `cudnnGetVersion`'s number as (major, minor, patch): `major * 10000 + minor * 100 +
/// patch` since cuDNN 9, `major * 1000 + minor * 100 + patch` before.
pub fn decode_version(v: usize) -> (u32, u32, u32) {
    let v = v as u32;
    if v >= 90000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    }
}

fn load() -> std::result::Result<Cudnn, String> {
    let names: Vec<String> = match std::env::var("REDCO_CUDNN_LIBRARY") {
        Ok(f) if !f.is_empty() => vec![f],
        _ => NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let mut tried = Vec::new();
    for name in &names {
        // SAFETY: loading cuDNN runs its initialisers, which only set up its own state
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                // SAFETY: `cudnnGetVersion` takes nothing and returns a size_t in every
                // cuDNN release
                let v = unsafe {
                    let f: libloading::Symbol<unsafe extern "C" fn() -> usize> = lib
                        .get(b"cudnnGetVersion\0")
                        .map_err(|e| format!("{name} has no cudnnGetVersion ({e}): not a cuDNN library"))?;
                    f()
                };
                return Ok(Cudnn { _lib: lib, file: name.clone(), version: decode_version(v) });
            }
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "cuDNN is not available ({}): install the CUDA toolkit's cuDNN or the nvidia-cudnn-cu13 wheel and add \
         its lib directory to LD_LIBRARY_PATH, or name the file in REDCO_CUDNN_LIBRARY",
        tried.join("; ")
    ))
}

/// cuDNN, loaded on first use; a clear error when it is missing.
pub fn cudnn() -> Result<&'static Cudnn> {
    static LIB: OnceLock<std::result::Result<Cudnn, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(err)
}

/// Whether cuDNN's fused attention can run here: cuDNN 9 or newer, and a GPU of compute
/// capability 8.0 or above (`capability`); an error naming what is missing otherwise.
pub fn require_fused_attention(capability: (i32, i32)) -> Result<&'static Cudnn> {
    let c = cudnn()?;
    if c.version.0 < 9 {
        return Err(err(format!(
            "cuDNN {}.{}.{} ({}) is older than the 9 whose fused attention redco uses",
            c.version.0, c.version.1, c.version.2, c.file
        )));
    }
    if capability.0 < 8 {
        return Err(err(format!(
            "cuDNN's fused attention needs a GPU of compute capability 8.0 or newer; this one is {}.{}",
            capability.0, capability.1
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::decode_version;

    #[test]
    fn versions_read_in_both_numberings() {
        assert_eq!(decode_version(91002), (9, 10, 2));
        assert_eq!(decode_version(90100), (9, 1, 0));
        assert_eq!(decode_version(8902), (8, 9, 2));
    }
}
