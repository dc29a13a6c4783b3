//! StableHLO emitters for redco's primitive ops, on [`Func`]: conversions, broadcasting,
//! elementwise maps, comparisons, layout, matmul, reductions, gathers and scatters.

use super::{binary_region, i64_array, list, Et, Func, Ty, Val};
use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, ReduceOp};

impl Func {
    /// `v` converted to `et` (itself when it already is).
    pub fn convert(&mut self, v: &Val, et: Et) -> Val {
        if v.ty.et == et {
            return v.clone();
        }
        self.op("convert", &[v], "", v.ty.with(et))
    }

    /// `v` reshaped to `dims` (itself when it already has them).
    pub fn reshape(&mut self, v: &Val, dims: &[usize]) -> Val {
        if v.ty.dims == dims {
            return v.clone();
        }
        self.op("reshape", &[v], "", Ty::new(dims, v.ty.et))
    }

    /// `v` broadcast to `dims` with NumPy's rules (trailing dims aligned; size-1 dims
    /// expanded).
    pub fn broadcast(&mut self, v: &Val, dims: &[usize]) -> Val {
        if v.ty.dims == dims {
            return v.clone();
        }
        let off = dims.len() - v.ty.rank();
        let map: Vec<usize> = (0..v.ty.rank()).map(|i| off + i).collect();
        let attr = format!("broadcast_dimensions = {}", i64_array(&map));
        self.op("broadcast_in_dim", &[v], &attr, Ty::new(dims, v.ty.et))
    }

    /// A scalar `v` broadcast to `dims`.
    pub fn splat(&mut self, v: &Val, dims: &[usize]) -> Val {
        let s = self.reshape(v, &[]);
        self.broadcast(&s, dims)
    }

    /// A constant like `like` (same type) with every element `x`.
    pub fn const_like(&mut self, x: f64, like: &Val) -> Val {
        let c = self.constant(x, Ty::scalar(like.ty.et));
        self.splat(&c, &like.ty.dims.clone())
    }

    /// An elementwise op of one operand (`negate`, `exponential`, `log`, ...).
    pub fn map1(&mut self, op: &str, a: &Val) -> Val {
        self.op(op, &[a], "", a.ty.clone())
    }

    /// An elementwise op of two operands of the same type (`add`, `multiply`, ...).
    pub fn map2(&mut self, op: &str, a: &Val, b: &Val) -> Val {
        self.op(op, &[a, b], "", a.ty.clone())
    }

    /// A [`BinaryOp`] of two operands of the same type.
    pub fn binary_op(&mut self, op: BinaryOp, a: &Val, b: &Val) -> Val {
        let name = match op {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "subtract",
            BinaryOp::Mul => "multiply",
            BinaryOp::Div => "divide",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
        };
        self.map2(name, a, b)
    }

    /// `a <op> b` as a predicate.
    pub fn compare(&mut self, op: CmpOp, a: &Val, b: &Val) -> Val {
        let dir = match op {
            CmpOp::Eq => "EQ",
            CmpOp::Ne => "NE",
            CmpOp::Lt => "LT",
            CmpOp::Le => "LE",
            CmpOp::Gt => "GT",
            CmpOp::Ge => "GE",
        };
        let attr = format!(
            "comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {}>",
            a.ty.et.compare_type()
        );
        self.op("compare", &[a, b], &attr, a.ty.with(Et::Pred))
    }

    /// `p ? a : b`, all of the same dims.
    pub fn select(&mut self, p: &Val, a: &Val, b: &Val) -> Val {
        self.op("select", &[p, a, b], "", a.ty.clone())
    }

    /// The dimensions of `v` permuted (`out[i] = dims[perm[i]]`).
    pub fn transpose(&mut self, v: &Val, perm: &[usize]) -> Val {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return v.clone();
        }
        let dims: Vec<usize> = perm.iter().map(|&p| v.ty.dims[p]).collect();
        let attr = format!("permutation = {}", i64_array(perm));
        self.op("transpose", &[v], &attr, Ty::new(&dims, v.ty.et))
    }

    /// The slice `start..start + len` of dimension `dim`.
    pub fn slice(&mut self, v: &Val, dim: usize, start: usize, len: usize) -> Val {
        let mut lo = vec![0; v.ty.rank()];
        let mut hi = v.ty.dims.clone();
        lo[dim] = start;
        hi[dim] = start + len;
        let mut dims = v.ty.dims.clone();
        dims[dim] = len;
        let attr = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array(&lo),
            i64_array(&hi),
            i64_array(&vec![1; v.ty.rank()])
        );
        self.op("slice", &[v], &attr, Ty::new(&dims, v.ty.et))
    }

    /// Concatenation along `dim`.
    pub fn concat(&mut self, vs: &[&Val], dim: usize) -> Val {
        let mut dims = vs[0].ty.dims.clone();
        dims[dim] = vs.iter().map(|v| v.ty.dims[dim]).sum();
        let attr = format!("dimension = {dim} : i64");
        self.op("concatenate", vs, &attr, Ty::new(&dims, vs[0].ty.et))
    }

    /// `0, 1, 2, ...` along `dim` of a tensor of `dims`.
    pub fn iota(&mut self, dims: &[usize], dim: usize, et: Et) -> Val {
        let attr = format!("iota_dimension = {dim} : i64");
        self.op("iota", &[], &attr, Ty::new(dims, et))
    }

    /// The batched matmul of [`MatmulSpec`], as `[batch, m, n]`, in the operands' type
    /// (floats at full precision).
    pub fn matmul(&mut self, a: &Val, b: &Val, s: &MatmulSpec) -> Val {
        let a_dims = if s.trans_a { [s.k, s.m] } else { [s.m, s.k] };
        let b_dims = if s.trans_b { [s.n, s.k] } else { [s.k, s.n] };
        let a_full: Vec<usize> = if s.a_batched { vec![s.batch, a_dims[0], a_dims[1]] } else { a_dims.to_vec() };
        let b_full: Vec<usize> = if s.b_batched { vec![s.batch, b_dims[0], b_dims[1]] } else { b_dims.to_vec() };
        let a = self.reshape(a, &a_full);
        let b = self.reshape(b, &b_full);
        let (ab, bb) = (s.a_batched as usize, s.b_batched as usize);
        let a_contract = ab + if s.trans_a { 0 } else { 1 };
        let b_contract = bb + if s.trans_b { 1 } else { 0 };
        let batching = if s.a_batched && s.b_batched { "[0]" } else { "[]" };
        let precision = if a.ty.et.is_float() {
            ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]"
        } else {
            ""
        };
        let attr = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {batching}, rhs_batching_dimensions = {batching}, \
             lhs_contracting_dimensions = [{a_contract}], rhs_contracting_dimensions = [{b_contract}]>{precision}"
        );
        let et = a.ty.et;
        match (s.a_batched, s.b_batched) {
            (true, true) | (true, false) => self.op("dot_general", &[&a, &b], &attr, Ty::new(&[s.batch, s.m, s.n], et)),
            (false, true) => {
                let out = self.op("dot_general", &[&a, &b], &attr, Ty::new(&[s.m, s.batch, s.n], et));
                self.transpose(&out, &[1, 0, 2])
            }
            (false, false) => {
                let out = self.op("dot_general", &[&a, &b], &attr, Ty::new(&[s.m, s.n], et));
                self.broadcast(&out, &[s.batch, s.m, s.n])
            }
        }
    }

    /// The identity of a reduction in `et`.
    fn reduce_init(&mut self, op: ReduceOp, et: Et) -> Val {
        let v = match (op, et.is_float()) {
            (ReduceOp::Sum, _) => 0.0,
            (ReduceOp::Max | ReduceOp::ArgMax, true) => f64::NEG_INFINITY,
            (ReduceOp::Min, true) => f64::INFINITY,
            (ReduceOp::Max | ReduceOp::ArgMax, false) => int_limit(et, false),
            (ReduceOp::Min, false) => int_limit(et, true),
        };
        self.constant(v, Ty::scalar(et))
    }

    /// Sum, max or min of `v` along `dim`, keeping it with size 1.
    pub fn reduce(&mut self, op: ReduceOp, v: &Val, dim: usize) -> Val {
        if op == ReduceOp::ArgMax {
            return self.argmax(v, dim);
        }
        let name = match op {
            ReduceOp::Sum => "add",
            ReduceOp::Max => "maximum",
            _ => "minimum",
        };
        let init = self.reduce_init(op, v.ty.et);
        let mut dims = v.ty.dims.clone();
        dims.remove(dim);
        let region = binary_region(name, v.ty.et);
        let attr = format!("dimensions = {}", i64_array(&[dim]));
        let r = self.op_with_region("reduce", &[v, &init], &region, &attr, Ty::new(&dims, v.ty.et));
        let mut keep = v.ty.dims.clone();
        keep[dim] = 1;
        self.reshape(&r, &keep)
    }

    /// The index (`i64`) of the first maximum of `v` along `dim`, keeping it with size 1.
    pub fn argmax(&mut self, v: &Val, dim: usize) -> Val {
        let et = v.ty.et;
        let idx = self.iota(&v.ty.dims.clone(), dim, Et::I64);
        let init_v = self.reduce_init(ReduceOp::ArgMax, et);
        let init_i = self.constant(0.0, Ty::scalar(Et::I64));
        let (t, i, p) = (Ty::scalar(et), Ty::scalar(Et::I64), Ty::scalar(Et::Pred));
        let cmp = |d: &str, ct: &str| {
            format!("comparison_direction = #stablehlo<comparison_direction {d}>, compare_type = #stablehlo<comparison_type {ct}>")
        };
        let ct = et.compare_type();
        let region = format!(
            "{{\n    ^bb0(%av: {t}, %ai: {i}, %bv: {t}, %bi: {i}):\n\
             \x20     %gt = \"stablehlo.compare\"(%av, %bv) {{{}}} : ({t}, {t}) -> {p}\n\
             \x20     %eq = \"stablehlo.compare\"(%av, %bv) {{{}}} : ({t}, {t}) -> {p}\n\
             \x20     %lt = \"stablehlo.compare\"(%ai, %bi) {{{}}} : ({i}, {i}) -> {p}\n\
             \x20     %tie = \"stablehlo.and\"(%eq, %lt) : ({p}, {p}) -> {p}\n\
             \x20     %take = \"stablehlo.or\"(%gt, %tie) : ({p}, {p}) -> {p}\n\
             \x20     %rv = \"stablehlo.select\"(%take, %av, %bv) : ({p}, {t}, {t}) -> {t}\n\
             \x20     %ri = \"stablehlo.select\"(%take, %ai, %bi) : ({p}, {i}, {i}) -> {i}\n\
             \x20     \"stablehlo.return\"(%rv, %ri) : ({t}, {i}) -> ()\n    }}",
            cmp("GT", ct),
            cmp("EQ", ct),
            cmp("LT", "SIGNED")
        );
        let mut dims = v.ty.dims.clone();
        dims.remove(dim);
        let attr = format!("dimensions = {}", i64_array(&[dim]));
        let outs = self.op_multi(
            "reduce",
            &[v, &idx, &init_v, &init_i],
            &region,
            &attr,
            &[Ty::new(&dims, et), Ty::new(&dims, Et::I64)],
        );
        let mut keep = v.ty.dims.clone();
        keep[dim] = 1;
        self.reshape(&outs[1], &keep)
    }

    /// Rows `ids` (any integer type, `[n]`) of `x` viewed as `[outer, size, inner]`, as
    /// `[outer, n, inner]`.
    pub fn take(&mut self, x: &Val, ids: &Val, outer: usize, size: usize, inner: usize) -> Val {
        let x = self.reshape(x, &[outer, size, inner]);
        let n = ids.ty.len();
        let ids = self.reshape(ids, &[n]);
        let attr = format!(
            "dimension_numbers = #stablehlo.gather<offset_dims = [0, 2], collapsed_slice_dims = [1], start_index_map = [1], \
             index_vector_dim = 1>, slice_sizes = {}, indices_are_sorted = false",
            i64_array(&[outer, 1, inner])
        );
        self.op("gather", &[&x, &ids], &attr, Ty::new(&[outer, n, inner], x.ty.et))
    }

    /// `x` (`[outer, size, inner]`) with rows `src` (`[outer, n, inner]`) added at `ids`.
    pub fn put_add(&mut self, x: &Val, ids: &Val, src: &Val, outer: usize, size: usize, inner: usize) -> Val {
        let x = self.reshape(x, &[outer, size, inner]);
        let n = ids.ty.len();
        let ids = self.reshape(ids, &[n]);
        let src = self.reshape(src, &[outer, n, inner]);
        let attr = "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], \
                    scatter_dims_to_operand_dims = [1], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
        let region = binary_region("add", x.ty.et);
        self.op_with_region("scatter", &[&x, &ids, &src], &region, attr, x.ty.clone())
    }

    /// Full coordinates (`[idx dims..., rank]`, `i64`) of a gather along `dim` by `idx`:
    /// the index itself along `dim`, the position elsewhere.
    fn coordinates(&mut self, idx: &Val, dim: usize, rank: usize) -> Val {
        let dims = idx.ty.dims.clone();
        let mut one = dims.clone();
        one.push(1);
        let parts: Vec<Val> = (0..rank)
            .map(|j| {
                let c = if j == dim { self.convert(idx, Et::I64) } else { self.iota(&dims, j, Et::I64) };
                self.reshape(&c, &one)
            })
            .collect();
        let refs: Vec<&Val> = parts.iter().collect();
        self.concat(&refs, rank)
    }

    /// `out[.., i, ..] = x[.., idx[.., i, ..], ..]` along `dim` (`x` shaped `shape`).
    pub fn gather_along(&mut self, x: &Val, shape: &[usize], dim: usize, idx: &Val, idx_shape: &[usize]) -> Val {
        let rank = shape.len();
        let x = self.reshape(x, shape);
        let idx = self.reshape(idx, idx_shape);
        let coords = self.coordinates(&idx, dim, rank);
        let all: Vec<usize> = (0..rank).collect();
        let attr = format!(
            "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = {}, start_index_map = {}, index_vector_dim = {rank}>, \
             slice_sizes = {}, indices_are_sorted = false",
            list(&all),
            list(&all),
            i64_array(&vec![1; rank])
        );
        self.op("gather", &[&x, &coords], &attr, Ty::new(idx_shape, x.ty.et))
    }

    /// `x` with `src` (shaped `idx_shape`) added at the positions [`Func::gather_along`]
    /// reads.
    pub fn scatter_add_along(
        &mut self,
        x: &Val,
        shape: &[usize],
        dim: usize,
        idx: &Val,
        idx_shape: &[usize],
        src: &Val,
    ) -> Val {
        let rank = shape.len();
        let x = self.reshape(x, shape);
        let idx = self.reshape(idx, idx_shape);
        let src = self.reshape(src, idx_shape);
        let coords = self.coordinates(&idx, dim, rank);
        let all: Vec<usize> = (0..rank).collect();
        let attr = format!(
            "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = {}, scatter_dims_to_operand_dims = {}, \
             index_vector_dim = {rank}>, indices_are_sorted = false, unique_indices = false",
            list(&all),
            list(&all)
        );
        let region = binary_region("add", x.ty.et);
        self.op_with_region("scatter", &[&x, &coords, &src], &region, &attr, x.ty.clone())
    }
}

impl Func {}

/// The smallest (`min`) or largest value of an integer type, as f64.
fn int_limit(et: Et, largest: bool) -> f64 {
    match (et, largest) {
        (Et::I64, false) => i64::MIN as f64,
        (Et::I64, true) => i64::MAX as f64,
        (Et::I32, false) => i32::MIN as f64,
        (Et::I32, true) => i32::MAX as f64,
        (_, false) => 0.0,
        (_, true) => 255.0,
    }
}
