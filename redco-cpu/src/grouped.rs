//! The grouped matmul of a mixture of experts on the CPU: each group's rows and its
//! expert's matrix are read where they lie (no copy of either), one generated GEMM per
//! non-empty group writing straight into that group's rows of the output. A decode step
//! thus reads only the experts its tokens chose, once.

use super::matmul::FastOut;
use super::sgemm::{self, MatRef};
use half::{bf16, f16};
use redco_core::{Error, GroupedSpec, HostData, Result};

/// `x` grouped by `spec.counts` times `w`, through the generated GEMM; `None` where it does
/// not run here for these dtypes (the caller takes the composite).
pub(crate) fn grouped_matmul(
    x: &HostData,
    w: &HostData,
    spec: &GroupedSpec,
    threads: usize,
) -> Option<Result<HostData>> {
    if !super::sgemm_enabled() {
        return None;
    }
    match (x, w) {
        (HostData::F32(a), HostData::F32(b)) => Some(run::<f32, f32>(a, b, spec, threads).map(HostData::F32)),
        (HostData::BF16(a), HostData::BF16(b)) if sgemm::supports::<bf16>() => {
            Some(run::<bf16, bf16>(a, b, spec, threads).map(HostData::BF16))
        }
        (HostData::F16(a), HostData::F16(b)) if sgemm::supports::<f16>() => {
            Some(run::<f16, f16>(a, b, spec, threads).map(HostData::F16))
        }
        _ => None,
    }
}

fn run<E: sgemm::Source, O: FastOut>(x: &[E], w: &[E], spec: &GroupedSpec, threads: usize) -> Result<Vec<O>> {
    let GroupedSpec { ref counts, k, n, trans_w } = *spec;
    let rows: usize = counts.iter().sum();
    if x.len() != rows * k || w.len() != counts.len() * n * k {
        return Err(Error::invalid(
            "grouped_matmul",
            format!("operands of {} and {} elements for {spec:?}", x.len(), w.len()),
        ));
    }
    let mut c: Vec<O> = Vec::with_capacity(rows * n);
    let (b_rs, b_cs) = if trans_w { (1, k) } else { (n, 1) };
    let mut rest = &mut c.spare_capacity_mut()[..rows * n];
    let mut start = 0;
    for (e, &cnt) in counts.iter().enumerate() {
        if cnt == 0 {
            continue;
        }
        let (ce, tail) = rest.split_at_mut(cnt * n);
        rest = tail;
        let a = MatRef { data: &x[start * k..(start + cnt) * k], rs: k, cs: 1 };
        let b = MatRef { data: &w[e * n * k..(e + 1) * n * k], rs: b_rs, cs: b_cs };
        if !O::gemm(cnt, n, k, a, b, ce, threads) {
            return Err(Error::invalid("grouped_matmul", "the generated GEMM was chosen on a CPU that cannot run it"));
        }
        start += cnt;
    }
    // SAFETY: the groups' row blocks tile the `rows x n` output, and `O::gemm` wrote every
    // element of each (it returned true)
    unsafe { c.set_len(rows * n) };
    Ok(c)
}
