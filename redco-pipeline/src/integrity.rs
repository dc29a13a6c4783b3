//! Checksums of checkpoint files: every file a checkpoint's manifest lists carries its
//! length and its XXH3-128 digest, checked before the file is used (on resume, on
//! `convert`), so a shard corrupted on disk is refused, naming the file, instead of being
//! trained on or exported.
//!
//! XXH3 rather than a cryptographic hash: the threat is bit rot, torn copies and truncation,
//! not an adversary, and a checkpoint of a billion-parameter model with its optimizer state
//! is tens of gigabytes, which XXH3 digests at memory speed.

use redco_core::{Error, Result};
use std::io::Read;
use std::path::Path;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

/// The length and digest of one file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileSum {
    /// Its length in bytes.
    pub bytes: u64,
    /// Its XXH3-128 digest, as 32 hex digits.
    pub xxh3: String,
}

impl FileSum {
    /// The sum of `data`.
    pub fn of(data: &[u8]) -> Self {
        FileSum { bytes: data.len() as u64, xxh3: format!("{:032x}", xxh3_128(data)) }
    }

    /// The sum of the file at `path`, read in 8 MiB pieces (never whole into memory).
    pub fn of_file(path: &Path) -> Result<Self> {
        let err = |e: std::io::Error| Error::io("checkpoint", "cannot read", path, e);
        let mut f = std::fs::File::open(path).map_err(err)?;
        let mut h = Xxh3::new();
        let mut buf = vec![0u8; 8 << 20];
        let mut bytes = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(err)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            bytes += n as u64;
        }
        Ok(FileSum { bytes, xxh3: format!("{:032x}", h.digest128()) })
    }

    /// Ok when `found` (of the file at `path`) is this recorded sum; else an error naming the
    /// file and how it differs.
    pub fn check(&self, found: &FileSum, path: &Path) -> Result<()> {
        if self.bytes != found.bytes {
            return Err(Error::invalid(
                "checkpoint",
                format!(
                    "{} is corrupt: {} bytes, but the manifest recorded {} (truncated or overwritten)",
                    path.display(),
                    found.bytes,
                    self.bytes
                ),
            ));
        }
        if self.xxh3 != found.xxh3 {
            return Err(Error::invalid(
                "checkpoint",
                format!(
                    "{} is corrupt: its XXH3-128 digest is {}, but the manifest recorded {} (the file changed after it was written)",
                    path.display(),
                    found.xxh3,
                    self.xxh3
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_or_a_lost_byte_is_caught_and_named() {
        let dir = std::env::temp_dir().join(format!("redco-integrity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("rank-0.safetensors");
        let data: Vec<u8> = (0..(9u32 << 20)).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let want = FileSum::of(&data);
        assert_eq!(FileSum::of_file(&p).unwrap(), want, "streamed and whole digests agree");
        want.check(&FileSum::of_file(&p).unwrap(), &p).unwrap();
        let mut flipped = data.clone();
        flipped[5 << 20] ^= 0x40;
        std::fs::write(&p, &flipped).unwrap();
        let e = want.check(&FileSum::of_file(&p).unwrap(), &p).unwrap_err().to_string();
        assert!(e.contains("rank-0.safetensors") && e.contains("digest"), "{e}");
        std::fs::write(&p, &data[..data.len() - 1]).unwrap();
        let e = want.check(&FileSum::of_file(&p).unwrap(), &p).unwrap_err().to_string();
        assert!(e.contains("rank-0.safetensors") && e.contains("bytes"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
