//! Intel AMX (Advanced Matrix Extensions): detection, the tile configuration and the
//! bf16 micro-kernel.
//!
//! A tile register holds up to 16 rows of 64 bytes. `TDPBF16PS c, a, b` adds to the
//! 16 x 16 f32 tile `c` the product of `a` (16 rows of 32 bf16: 16 rows x 32 k) and `b`
//! (16 rows of 16 bf16 *pairs*: row `r`, pair `j` holds `B[2r][j]`, `B[2r + 1][j]`, the
//! "VNNI" layout), in f32. One instruction is 16 x 16 x 32 multiply-adds.
//!
//! The micro-kernel keeps a 32 x 32 block of C in four tiles (`tmm0..tmm3`) and streams
//! two A tiles (`tmm4`, `tmm5`) and two B tiles (`tmm6`, `tmm7`) per 32 steps of k: four
//! tile products per four tile loads, all eight tiles in use.

use super::Micro;
use std::arch::asm;
use std::sync::OnceLock;

/// Rows and columns of a C block computed by one [`kernel`] call.
pub(super) const BLOCK: usize = 32;
/// Steps of k per tile product (32 bf16 = 64 bytes per tile row).
pub(super) const KSTEP: usize = 32;
/// u16 elements in one packed tile (16 rows x 32).
pub(super) const TILE: usize = 16 * 32;

/// `arch_prctl` code asking the kernel for permission to use an extended state component.
#[cfg(target_os = "linux")]
const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
/// The AMX tile data state component (XFEATURE_XTILEDATA).
#[cfg(target_os = "linux")]
const XFEATURE_XTILEDATA: i64 = 18;
/// The `arch_prctl` system call number on x86-64 Linux.
#[cfg(target_os = "linux")]
const SYS_ARCH_PRCTL: i64 = 158;

#[cfg(target_os = "linux")]
extern "C" {
    fn syscall(number: i64, ...) -> i64;
}

/// True when the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22).
fn cpu_reports_amx() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // leaf 7 is defined where the maximum basic leaf (leaf 0's eax) is at least 7
    if __cpuid_count(0, 0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 22) != 0
}

/// True when AMX-BF16 tiles may be used in this process: the CPU has them (with AVX-512F
/// and AVX-512BW, which the packing uses) and the operating system granted this process
/// the tile state (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once).
/// Elsewhere than Linux, false. Read once per process.
pub(super) fn ready() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let cpu = cpu_reports_amx()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw");
        cpu && os_grants_tiles()
    })
}

#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only changes this process's permitted
    // extended state; it returns 0 or a negative error, and reads or writes no memory of ours.
    unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// The 64-byte tile configuration `LDTILECFG` reads: palette 1, all eight tiles 16 rows of
/// 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn full() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        for t in 0..8 {
            c[16 + 2 * t] = 64; // bytes per row (u16 little-endian, high byte 0)
            c[48 + t] = 16; // rows
        }
        TileConfig(c)
    }
}

/// Holds the tile state configured for this thread; releases it (`TILERELEASE`) when
/// dropped, so threads that stop using AMX do not carry 8 KiB of tile state through every
/// context switch.
pub(super) struct Tiles(());

impl Tiles {
    /// Configures this thread's tiles for [`kernel`].
    ///
    /// # Safety
    /// [`ready`] returned true.
    pub(super) unsafe fn configure() -> Tiles {
        let cfg = TileConfig::full();
        // SAFETY: AMX is available and permitted (caller); the config is a valid palette-1
        // configuration, 64 bytes, aligned.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        Tiles(())
    }
}

impl Micro for Tiles {
    #[inline]
    unsafe fn kernel(&self, kc: usize, a: *const u16, b: *const u16, c: *mut f32, ldc_bytes: usize, accumulate: bool) {
        debug_assert!(kc >= 1);
        // SAFETY: the tiles are configured (`self` exists); C's 32 rows of 128 bytes are
        // readable when accumulating (caller).
        unsafe {
            let c2 = c.cast::<u8>().add(16 * ldc_bytes);
            if accumulate {
                asm!(
                    "tileloadd tmm0, [{c} + {ldc}*1]",
                    "tileloadd tmm1, [{c} + {ldc}*1 + 64]",
                    "tileloadd tmm2, [{c2} + {ldc}*1]",
                    "tileloadd tmm3, [{c2} + {ldc}*1 + 64]",
                    c = in(reg) c,
                    c2 = in(reg) c2,
                    ldc = in(reg) ldc_bytes,
                    options(nostack, readonly)
                );
            } else {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            }
        }
        // SAFETY: every load and store stays inside the ranges the caller guarantees: step s
        // reads a[s * 1024 .. s * 1024 + 1024] and b likewise (2048 bytes each), the stores
        // write 32 rows of 128 bytes of c.
        unsafe {
            asm!(
                "2:",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tileloadd tmm6, [{b} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b} + {s}*1 + 1024]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a} + {s}*1 + 1024]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a}, 2048",
                "add {b}, 2048",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c} + {ldc}*1], tmm0",
                "tilestored [{c} + {ldc}*1 + 64], tmm1",
                "tilestored [{c2} + {ldc}*1], tmm2",
                "tilestored [{c2} + {ldc}*1 + 64], tmm3",
                a = inout(reg) a => _,
                b = inout(reg) b => _,
                n = inout(reg) kc => _,
                s = in(reg) 64usize,
                c = in(reg) c,
                c2 = in(reg) c.cast::<u8>().add(16 * ldc_bytes),
                ldc = in(reg) ldc_bytes,
                options(nostack)
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure`; TILERELEASE returns them to the
        // initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}
