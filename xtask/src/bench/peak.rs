//! The machine's f32 FMA peak, measured with independent FMA chains on every thread, at the
//! widest vectors the CPU backend uses here: AVX-512 unless the CPU lacks it or
//! `REDCO_ASSUME_NO_AVX512` is set (then AVX2, as on an AVX2-only machine).

use std::time::Instant;

/// Measured peak f32 GFLOP/s on `threads` threads (median of a few runs).
pub fn measure(threads: usize) -> f64 {
    let runs: Vec<f64> = (0..5).map(|_| once(threads, 20_000_000)).collect();
    super::stats::median(&runs)
}

fn once(threads: usize, iters: u64) -> f64 {
    let start = Instant::now();
    let flops: f64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|t| s.spawn(move || chain(iters, t as f32))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    });
    flops / start.elapsed().as_secs_f64() / 1e9
}

/// Runs `iters` rounds of 12 independent FMA chains; returns the flops done.
fn chain(iters: u64, seed: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if !crate::machine::assumes_no_avx512() && is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected at run time.
            let (sink, flops) = unsafe { chain_avx512(iters, seed) };
            std::hint::black_box(sink);
            return flops;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected at run time.
            let (sink, flops) = unsafe { chain_avx2(iters, seed) };
            std::hint::black_box(sink);
            return flops;
        }
    }
    let mut acc = [seed; 12];
    for _ in 0..iters / 16 {
        for a in acc.iter_mut() {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(acc);
    (iters / 16) as f64 * 12.0 * 2.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chain_avx512(iters: u64, seed: f32) -> (f32, f64) {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(seed); 12];
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm512_fmadd_ps(*r, a, b);
        }
    }
    let mut s = _mm512_setzero_ps();
    for r in acc {
        s = _mm512_add_ps(s, r);
    }
    (_mm512_reduce_add_ps(s), iters as f64 * 12.0 * 16.0 * 2.0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chain_avx2(iters: u64, seed: f32) -> (f32, f64) {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(seed); 12];
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm256_fmadd_ps(*r, a, b);
        }
    }
    let mut s = _mm256_setzero_ps();
    for r in acc {
        s = _mm256_add_ps(s, r);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    (out.iter().sum(), iters as f64 * 12.0 * 8.0 * 2.0)
}
