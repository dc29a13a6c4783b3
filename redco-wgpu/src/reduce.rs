//! Reductions along one dimension (`kernels/reduce.wgsl`: one invocation per output;
//! `kernels/reduce_row.wgsl`: one workgroup per contiguous row, for long rows).

use crate::device::err;
use crate::elementwise;
use crate::{tpl, u32p, Dev, Wgpu, WgpuStorage};
use redco_core::backend::ReduceOp;
use redco_core::{DType, Result, Shape};

/// Rows at least this long reduce with a workgroup each.
const ROW_MIN: usize = 512;

/// Reduces `x` (shape `shape`) along `dim`, keeping it with size 1.
pub(crate) fn reduce(w: &Wgpu, op: ReduceOp, x: &WgpuStorage, shape: &Shape, dim: usize) -> Result<WgpuStorage> {
    if dim >= shape.rank() {
        return Err(err(format!("reduce: dim {dim} out of range for {shape}")));
    }
    let (outer, size, inner) = shape.split_at_dim(dim);
    let out_dt = if op == ReduceOp::ArgMax { DType::I64 } else { x.dtype };
    let n_out = outer * inner;
    if size == 0 {
        let v = match op {
            ReduceOp::Sum | ReduceOp::ArgMax => 0.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
        };
        return elementwise::full(w, n_out, v, out_dt);
    }
    let ty = match Dev::of(x.dtype) {
        Dev::F32 => "f32",
        _ => "i32",
    };
    let (store, xt) = (w.store(x.dtype), w.elem_as(x.dtype, ty));
    let finish = match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => format!("{store}(acc)"),
        ReduceOp::ArgMax => "i32(arg)".to_string(),
    };
    let out_ty = if op == ReduceOp::ArgMax { "i32" } else { xt };
    let step = match op {
        ReduceOp::Sum => "acc = acc + v;",
        ReduceOp::Max => "acc = max(acc, v);",
        ReduceOp::Min => "acc = min(acc, v);",
        ReduceOp::ArgMax => "if (v > acc) { acc = v; arg = s; }",
    };
    let p_size = u32p(size, "reduced size")?;
    if inner == 1 && size >= ROW_MIN {
        let merge = match op {
            ReduceOp::Sum => "vals[t] = a0 + a1;",
            ReduceOp::Max | ReduceOp::ArgMax => {
                "if (i1 != 0xffffffffu && (i0 == 0xffffffffu || a1 > a0 || (a1 == a0 && i1 < i0))) \
                 { vals[t] = a1; args[t] = i1; }"
            }
            ReduceOp::Min => {
                "if (i1 != 0xffffffffu && (i0 == 0xffffffffu || a1 < a0 || (a1 == a0 && i1 < i0))) \
                 { vals[t] = a1; args[t] = i1; }"
            }
        };
        let init = format!("{ty}(0)");
        let key = format!("reduce_row/{op:?}/{ty}/{xt}/{store}");
        let src = || {
            tpl(
                include_str!("kernels/reduce_row.wgsl"),
                &[
                    ("$T", ty),
                    ("$XT", xt),
                    ("$OUT", out_ty),
                    ("$INIT", &init),
                    ("$STEP", step),
                    ("$MERGE", merge),
                    ("$FINISH", &finish),
                ],
            )
        };
        let out = w.alloc(n_out, out_dt)?;
        let rows = n_out;
        let groups = if rows <= 65535 { (rows as u32, 1, 1) } else { (65535, rows.div_ceil(65535) as u32, 1) };
        w.launch(&key, src, &[x], &out, &[u32p(rows, "rows")?, p_size], groups)?;
        return Ok(out);
    }
    let key = format!("reduce/{op:?}/{ty}/{xt}/{store}");
    let src = || {
        tpl(
            include_str!("kernels/reduce.wgsl"),
            &[("$T", ty), ("$XT", xt), ("$OUT", out_ty), ("$STEP", step), ("$FINISH", &finish)],
        )
    };
    let params = [u32p(n_out, "outputs")?, p_size, u32p(inner, "inner size")?];
    w.map_kernel(&key, src, &[x], n_out, out_dt, &params)
}
