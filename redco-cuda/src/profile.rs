//! Device time by op family, from CUDA events around every kernel launch, cuBLAS GEMM,
//! NCCL call and host copy ([`Cuda::start_profile`], [`Cuda::take_profile`]; the core's
//! `Backend::profile_ops` and `Backend::op_profile`). Off by default: when on, each timed
//! call records two events on the backend's one stream, so the table costs a few
//! microseconds of host time a launch and nothing on the device. The kernels of one stream
//! run one after another, so the families' times add up to the time the device was busy;
//! what a step's wall time has beyond that is the host's (launch overhead, syncs, Python-
//! free but not free).

use crate::context::Cuda;
use crate::device::err;
use cudarc::driver::{sys, CudaEvent};
use redco_core::backend::OpTime;
use redco_core::Result;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The op family a kernel of `module` (its `kernels/<module>.cu`) named `kernel` is
/// counted in.
pub fn op_family(module: &str, kernel: &str) -> &'static str {
    match module {
        "attention" if kernel.starts_with("attn_fwd") => "attention forward",
        "attention" if kernel.starts_with("attn_bwd") => "attention backward",
        "attention" => "paged attention",
        "norm" => "norms",
        "rotary" => "rotary",
        "cross_entropy" => "cross-entropy",
        "adamw" => "AdamW",
        "softmax" => "softmax",
        "reduce" if kernel.starts_with("sum_squares") || kernel == "sum_partials" => "gradient norm",
        "reduce" => "reductions",
        "elementwise" if kernel.starts_with("cast_") => "casts",
        "elementwise" => "elementwise (SwiGLU, residuals, scaling)",
        "layout" => "layout copies",
        "index" => "embedding and indexing",
        "quant" if kernel.starts_with("quant_dequant") => "quantized weights dequantized",
        "quant" => "quantized matmul (blocks in place)",
        _ => "other kernels",
    }
}

/// The events of one timed call.
struct Mark {
    family: &'static str,
    start: CudaEvent,
    end: CudaEvent,
}

/// What a profile has recorded since it started.
#[derive(Default)]
struct Open {
    marks: Vec<Mark>,
    /// Events of taken marks, for reuse (creating one is a driver call).
    spare: Vec<CudaEvent>,
    /// Host nanoseconds the allocator had spent in the driver when the profile started.
    alloc_nanos: u64,
    /// Calls to the driver's allocator when the profile started.
    alloc_calls: u64,
}

/// A backend's profiler: `None` when off.
#[derive(Default)]
pub(crate) struct Profiler(Mutex<Option<Open>>);

impl Profiler {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Open>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Adds `seconds` of `family` (one call) to `table`.
pub(crate) fn add(table: &mut BTreeMap<&'static str, (u64, f64)>, family: &'static str, seconds: f64) {
    let e = table.entry(family).or_insert((0, 0.0));
    e.0 += 1;
    e.1 += seconds;
}

/// The table as the core reports it, longest first.
pub(crate) fn rows(table: BTreeMap<&'static str, (u64, f64)>) -> Vec<OpTime> {
    let mut v: Vec<OpTime> =
        table.into_iter().map(|(f, (calls, seconds))| OpTime { family: f.to_string(), calls, seconds }).collect();
    v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.family.cmp(&b.family)));
    v
}

impl Cuda {
    /// Starts timing by op family (dropping what an earlier profile recorded).
    pub fn start_profile(&self) {
        let s = self.inner.pool.stats();
        let mut p = self.inner.profiler.lock();
        let spare = p.take().map(|o| o.spare).unwrap_or_default();
        *p = Some(Open { marks: Vec::new(), spare, alloc_nanos: s.driver_nanos, alloc_calls: s.fresh + s.freed });
    }

    /// Waits for the device and returns the time of each op family since
    /// [`Cuda::start_profile`] (empty when no profile was started), then stops timing. The
    /// allocator's row is host time in the driver's allocation and free calls.
    pub fn take_profile(&self) -> Result<Vec<OpTime>> {
        let Some(open) = self.inner.profiler.lock().take() else { return Ok(Vec::new()) };
        self.inner.stream.synchronize().map_err(|e| err(format!("a kernel failed: {e}")))?;
        let mut table = BTreeMap::new();
        for m in &open.marks {
            let ms = m.start.elapsed_ms(&m.end).map_err(|e| err(format!("reading a profile event: {e}")))?;
            add(&mut table, m.family, ms as f64 / 1e3);
        }
        let s = self.inner.pool.stats();
        let calls = (s.fresh + s.freed).saturating_sub(open.alloc_calls);
        if calls > 0 {
            let secs = s.driver_nanos.saturating_sub(open.alloc_nanos) as f64 / 1e9;
            table.insert("allocator (driver calls, host)", (calls, secs));
        }
        Ok(rows(table))
    }

    /// Runs `f`, timing what it queues on the stream as `family` when a profile is on.
    pub(crate) fn timed<T>(&self, family: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = match self.inner.profiler.lock().as_mut() {
            None => return f(),
            Some(open) => self.event(open)?,
        };
        start.record(&self.inner.stream).map_err(err)?;
        let out = f()?;
        let mut p = self.inner.profiler.lock();
        // a profile taken meanwhile (another thread) drops this call
        if let Some(open) = p.as_mut() {
            let end = self.event(open)?;
            end.record(&self.inner.stream).map_err(err)?;
            open.marks.push(Mark { family, start, end });
        }
        Ok(out)
    }

    /// A timing event, reused where one is spare.
    fn event(&self, open: &mut Open) -> Result<CudaEvent> {
        match open.spare.pop() {
            Some(e) => Ok(e),
            None => self.inner.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{add, op_family, rows};
    use std::collections::BTreeMap;

    #[test]
    fn kernels_fall_in_the_families_a_step_is_read_by() {
        assert_eq!(op_family("attention", "attn_fwd_bf16"), "attention forward");
        assert_eq!(op_family("attention", "attn_bwd_kv_bf16"), "attention backward");
        assert_eq!(op_family("attention", "attn_bwd_q_f32"), "attention backward");
        assert_eq!(op_family("attention", "paged_attn_bf16"), "paged attention");
        assert_eq!(op_family("reduce", "sum_squares_many_f32"), "gradient norm");
        assert_eq!(op_family("reduce", "sum_partials"), "gradient norm");
        assert_eq!(op_family("reduce", "reduce_rows_f32"), "reductions");
        assert_eq!(op_family("elementwise", "cast_bf16_f32"), "casts");
        assert_eq!(op_family("elementwise", "binary_bf16"), "elementwise (SwiGLU, residuals, scaling)");
        assert_eq!(op_family("adamw", "adamw_master_bf16_bf16"), "AdamW");
        assert_eq!(op_family("quant", "quant_gemv_bf16"), "quantized matmul (blocks in place)");
        assert_eq!(op_family("quant", "quant_dequant_f32"), "quantized weights dequantized");
        assert_eq!(op_family("somewhere", "new"), "other kernels");
        // every family of kernels/ has a row of its own
        for (module, _) in crate::kernels::FAMILIES {
            if *module != "attention" && *module != "reduce" && *module != "elementwise" {
                assert_ne!(op_family(module, "k"), "other kernels", "{module}");
            }
        }
    }

    #[test]
    fn rows_add_calls_and_time_and_come_longest_first() {
        let mut t = BTreeMap::new();
        add(&mut t, "norms", 0.002);
        add(&mut t, "matmul", 0.010);
        add(&mut t, "norms", 0.001);
        let r = rows(t);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].family.as_str(), r[0].calls), ("matmul", 1));
        assert_eq!((r[1].family.as_str(), r[1].calls), ("norms", 2));
        assert!((r[1].seconds - 0.003).abs() < 1e-12);
    }
}
