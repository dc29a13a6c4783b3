//! StableHLO text: a builder for one `func.func @main` in MLIR's generic op syntax (stable
//! across StableHLO versions), the element types, and constants.
//!
//! Values are SSA names with a static tensor type. Every op is written
//! `%v = "stablehlo.op"(%a, %b) {attrs} : (types) -> type`; ops with a region (reduce,
//! scatter) carry their body inline.

use redco_core::DType;
use std::fmt::Write;

/// A StableHLO element type: redco's dtypes plus the predicate `i1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Et {
    /// f32
    F32,
    /// f64
    F64,
    /// f16
    F16,
    /// bf16
    BF16,
    /// i64
    I64,
    /// i32
    I32,
    /// ui8 (redco's `U8` masks)
    U8,
    /// i1 (comparison results)
    Pred,
    /// ui32 (replica ids; converted before anything stores them)
    U32,
}

impl Et {
    /// The element type of a redco dtype.
    pub fn of(d: DType) -> Et {
        match d {
            DType::F32 => Et::F32,
            DType::F64 => Et::F64,
            DType::F16 => Et::F16,
            DType::BF16 => Et::BF16,
            DType::I64 => Et::I64,
            DType::I32 => Et::I32,
            DType::U8 => Et::U8,
        }
    }

    /// The redco dtype (predicates are stored as `U8`).
    pub fn dtype(self) -> DType {
        match self {
            Et::F32 => DType::F32,
            Et::F64 => DType::F64,
            Et::F16 => DType::F16,
            Et::BF16 => DType::BF16,
            Et::I64 => DType::I64,
            Et::I32 => DType::I32,
            Et::U8 | Et::Pred => DType::U8,
            // never stored: a replica id is converted to i64 where it is read
            Et::U32 => DType::I64,
        }
    }

    /// The MLIR spelling.
    pub fn name(self) -> &'static str {
        match self {
            Et::F32 => "f32",
            Et::F64 => "f64",
            Et::F16 => "f16",
            Et::BF16 => "bf16",
            Et::I64 => "i64",
            Et::I32 => "i32",
            Et::U8 => "ui8",
            Et::Pred => "i1",
            Et::U32 => "ui32",
        }
    }

    /// True for the float types.
    pub fn is_float(self) -> bool {
        matches!(self, Et::F32 | Et::F64 | Et::F16 | Et::BF16)
    }

    /// The type floats of this type are computed in: f32 for the 16-bit floats (as the CPU
    /// backend computes them), else itself.
    pub fn compute(self) -> Et {
        match self {
            Et::F16 | Et::BF16 => Et::F32,
            e => e,
        }
    }

    /// The comparison type of `stablehlo.compare`.
    pub fn compare_type(self) -> &'static str {
        match self {
            Et::F32 | Et::F64 | Et::F16 | Et::BF16 => "FLOAT",
            Et::I64 | Et::I32 => "SIGNED",
            Et::U8 | Et::Pred | Et::U32 => "UNSIGNED",
        }
    }
}

/// A static tensor type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ty {
    /// Dimensions (empty for a scalar).
    pub dims: Vec<usize>,
    /// Element type.
    pub et: Et,
}

impl Ty {
    /// A tensor type.
    pub fn new(dims: &[usize], et: Et) -> Ty {
        Ty { dims: dims.to_vec(), et }
    }

    /// A scalar type.
    pub fn scalar(et: Et) -> Ty {
        Ty { dims: Vec::new(), et }
    }

    /// The same dims with another element type.
    pub fn with(&self, et: Et) -> Ty {
        Ty { dims: self.dims.clone(), et }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// True when the type holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.et.name())
    }
}

/// An SSA value of the function being built.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Val {
    /// The SSA name without `%`.
    pub name: String,
    /// Its type.
    pub ty: Ty,
}

/// `array<i64: ...>`.
pub fn i64_array(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    if items.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// `[a, b, ...]` (dimension lists inside `#stablehlo` attributes).
pub fn list(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// An MLIR literal of `v` in element type `et` (hex bit patterns for the non-finite floats).
pub fn literal(v: f64, et: Et) -> String {
    match et {
        Et::F32 | Et::F16 | Et::BF16 if !v.is_finite() => format!("0x{:08X}", (v as f32).to_bits()),
        Et::F64 if !v.is_finite() => format!("0x{:016X}", v.to_bits()),
        Et::F32 | Et::F16 | Et::BF16 => format!("{:.9e}", v as f32),
        Et::F64 => format!("{v:.17e}"),
        Et::Pred => (if v != 0.0 { "true" } else { "false" }).into(),
        _ => format!("{}", v as i64),
    }
}

/// One function `@main` under construction.
#[derive(Debug, Default, Clone)]
pub struct Func {
    params: Vec<Ty>,
    body: Vec<Stmt>,
    next: usize,
}

/// One op of the body: the value it defines, the values it reads, its text.
#[derive(Debug, Clone)]
struct Stmt {
    def: String,
    uses: Vec<String>,
    text: String,
}

/// The value a name belongs to (`v3` for the result `v3#1` of a multi-result op).
fn base(name: &str) -> &str {
    name.split('#').next().unwrap_or(name)
}

impl Func {
    /// An empty function.
    pub fn new() -> Func {
        Func::default()
    }

    /// Adds a parameter of type `ty`.
    pub fn param(&mut self, ty: Ty) -> Val {
        let v = Val { name: format!("arg{}", self.params.len()), ty: ty.clone() };
        self.params.push(ty);
        v
    }

    /// The parameter types so far.
    pub fn params(&self) -> &[Ty] {
        &self.params
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("v{}", self.next)
    }

    /// Emits `"stablehlo.<op>"(operands) {attrs} : (operand types) -> out`.
    pub fn op(&mut self, op: &str, operands: &[&Val], attrs: &str, out: Ty) -> Val {
        self.op_with_region(op, operands, "", attrs, out)
    }

    /// Like [`Func::op`] with a region (`region` is the text between the parentheses of
    /// `({ ... })`, including the braces).
    pub fn op_with_region(&mut self, op: &str, operands: &[&Val], region: &str, attrs: &str, out: Ty) -> Val {
        let name = self.fresh();
        self.push(&name, &format!("%{name}"), op, operands, region, attrs, &out.to_string());
        Val { name, ty: out }
    }

    /// Emits an op with several results (`%v:n = ...`), returning each.
    pub fn op_multi(&mut self, op: &str, operands: &[&Val], region: &str, attrs: &str, outs: &[Ty]) -> Vec<Val> {
        let name = self.fresh();
        let out_tys: Vec<String> = outs.iter().map(|t| t.to_string()).collect();
        let lhs = format!("%{name}:{}", outs.len());
        self.push(&name, &lhs, op, operands, region, attrs, &format!("({})", out_tys.join(", ")));
        outs.iter().enumerate().map(|(i, t)| Val { name: format!("{name}#{i}"), ty: t.clone() }).collect()
    }

    /// Appends `lhs = "op"(operands) (region) {attrs} : (types) -> out` defining `name`.
    #[allow(clippy::too_many_arguments)]
    fn push(&mut self, name: &str, lhs: &str, op: &str, operands: &[&Val], region: &str, attrs: &str, out: &str) {
        let args: Vec<String> = operands.iter().map(|v| format!("%{}", v.name)).collect();
        let tys: Vec<String> = operands.iter().map(|v| v.ty.to_string()).collect();
        let mut text = format!("    {lhs} = \"{}\"({})", qualified(op), args.join(", "));
        if !region.is_empty() {
            let _ = write!(text, " ({region})");
        }
        if !attrs.is_empty() {
            let _ = write!(text, " {{{attrs}}}");
        }
        let _ = writeln!(text, " : ({}) -> {out}", tys.join(", "));
        let uses = operands.iter().map(|v| base(&v.name).to_string()).collect();
        self.body.push(Stmt { def: name.to_string(), uses, text });
    }

    /// A constant of type `ty` with every element `v`.
    pub fn constant(&mut self, v: f64, ty: Ty) -> Val {
        let attr = format!("value = dense<{}> : {ty}", literal(v, ty.et));
        self.op("constant", &[], &attr, ty)
    }

    /// The module text returning `outs`, with only the ops they depend on and the
    /// parameters those read (dead code, such as the initial values of parameters a step
    /// replaces, is dropped with its inputs), and the indices of the kept parameters.
    /// `donated` maps a parameter to the output that may reuse its buffer
    /// (`tf.aliasing_output`).
    pub fn module(&self, outs: &[&Val], donated: &[(usize, usize)]) -> (String, Vec<usize>) {
        let mut live: std::collections::HashSet<&str> = outs.iter().map(|v| base(&v.name)).collect();
        let mut keep = vec![false; self.body.len()];
        for (i, st) in self.body.iter().enumerate().rev() {
            if live.contains(st.def.as_str()) {
                keep[i] = true;
                live.extend(st.uses.iter().map(String::as_str));
            }
        }
        let kept: Vec<usize> = (0..self.params.len()).filter(|i| live.contains(format!("arg{i}").as_str())).collect();
        let params: Vec<String> = kept
            .iter()
            .map(|&i| match donated.iter().find(|(p, _)| *p == i) {
                Some((_, o)) => format!("%arg{i}: {} {{tf.aliasing_output = {o} : i32}}", self.params[i]),
                None => format!("%arg{i}: {}", self.params[i]),
            })
            .collect();
        let body: String = self.body.iter().zip(&keep).filter(|(_, k)| **k).map(|(st, _)| st.text.as_str()).collect();
        let out_tys: Vec<String> = outs.iter().map(|v| v.ty.to_string()).collect();
        let out_names: Vec<String> = outs.iter().map(|v| format!("%{}", v.name)).collect();
        let text = format!(
            "module @redco {{\n  func.func public @main({}) -> ({}) {{\n{}    \"func.return\"({}) : ({}) -> ()\n  }}\n}}\n",
            params.join(", "),
            out_tys.join(", "),
            body,
            out_names.join(", "),
            out_tys.join(", ")
        );
        (text, kept)
    }
}

/// `op` with its dialect: `stablehlo.` unless it names one (`chlo.erf`).
fn qualified(op: &str) -> String {
    if op.contains('.') {
        op.to_string()
    } else {
        format!("stablehlo.{op}")
    }
}

/// The body of a two-argument scalar region computing `op` (for reduce and scatter):
/// `({ ^bb0(%a: T, %b: T): %r = op(%a, %b); return %r })`.
pub fn binary_region(op: &str, et: Et) -> String {
    let t = Ty::scalar(et);
    format!(
        "{{\n    ^bb0(%ra: {t}, %rb: {t}):\n      %rr = \"stablehlo.{op}\"(%ra, %rb) : ({t}, {t}) -> {t}\n      \"stablehlo.return\"(%rr) : ({t}) -> ()\n    }}"
    )
}

mod collectives;
mod ops;
mod unary;
