//! Elementwise ops: unary maps, broadcasting binary ops, comparisons, `where`, casts.

use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::sharding::rules::{self, Linearity};
use crate::{Backend, DType, Result, Tensor};

/// True for maps that commute with sums (safe on partial values).
fn is_linear(op: UnaryOp) -> bool {
    matches!(op, UnaryOp::Neg | UnaryOp::Affine { add: 0.0, .. })
}

type GradFn<B> = fn(&Tensor<B>, &Tensor<B>, &Tensor<B>) -> Result<Tensor<B>>;

impl<B: Backend> Tensor<B> {
    /// Applies `op` without recording a gradient (used by gradient formulas), except while
    /// a graph of the gradients is being built ([`Tensor::backward_graph`]): then a tensor
    /// that depends on variables goes through the recorded op, so the formula can be
    /// differentiated again.
    pub(crate) fn map(&self, op: UnaryOp) -> Result<Tensor<B>> {
        if self.requires_grad() && crate::is_grad_enabled() {
            return self.unary_recorded(op);
        }
        self.expect_float("unary")?;
        let x = rules::unary(self, is_linear(op))?;
        let s = x.backend().unary(op, x.storage(), x.local_shape().elem_count())?;
        Ok(x.same_layout(s, x.dtype()))
    }

    /// A tensor with this one's global shape, local shape and placements over new storage.
    pub(crate) fn same_layout(&self, s: B::Storage, dtype: DType) -> Tensor<B> {
        Tensor::from_local(
            self.backend(),
            s,
            self.shape().clone(),
            self.local_shape().clone(),
            self.placements(),
            dtype,
        )
    }

    /// Records an op whose output has `x`'s layout.
    pub(crate) fn record_like<F>(
        x: &Tensor<B>,
        s: B::Storage,
        dtype: DType,
        name: &'static str,
        inputs: &[&Tensor<B>],
        f: F,
    ) -> Tensor<B>
    where
        F: Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync + 'static,
    {
        let (shape, local) = (x.shape().clone(), x.local_shape().clone());
        Tensor::from_op_placed(x.backend(), s, shape, local, x.placements(), dtype, name, inputs, f)
    }

    fn unary_op(&self, op: UnaryOp, name: &'static str, grad: GradFn<B>) -> Result<Tensor<B>> {
        self.expect_float(name)?;
        let x = rules::unary(self, is_linear(op))?;
        let s = x.backend().unary(op, x.storage(), x.local_shape().elem_count())?;
        let y = x.same_layout(s.clone(), x.dtype());
        let xc = x.clone();
        Ok(Tensor::record_like(&x, s, x.dtype(), name, &[&x], move |g| {
            // building a graph of the gradients: the output again, as a recorded op of x
            if crate::is_grad_enabled() && xc.requires_grad() {
                return Ok(vec![Some(grad(g, &xc, &xc.unary_recorded(op)?)?)]);
            }
            Ok(vec![Some(grad(g, &xc, &y)?)])
        }))
    }

    /// `op` as the recorded (differentiable) op; the derivative maps are written as
    /// compositions of recorded ops, and the step function has a zero gradient.
    fn unary_recorded(&self, op: UnaryOp) -> Result<Tensor<B>> {
        use UnaryOp::*;
        match op {
            Neg => self.neg(),
            Exp => self.exp(),
            Log => self.log(),
            Sqrt => self.sqrt(),
            Rsqrt => self.rsqrt(),
            Recip => self.recip(),
            Abs => self.abs(),
            Tanh => self.tanh(),
            Sigmoid => self.sigmoid(),
            Relu => self.relu(),
            Silu => self.silu(),
            GeluErf => self.gelu(),
            GeluTanh => self.gelu_tanh(),
            Erf => self.erf(),
            Sin => self.sin(),
            Cos => self.cos(),
            Square => self.square(),
            Affine { mul, add } => self.affine(mul, add),
            Powf(e) => self.powf(e),
            ClampMin(c) => self.clamp_min(c),
            // piecewise constant: its derivative is zero wherever it exists
            Step => Ok(self.detach().map(Step)?),
            // s (1 + x (1 - s)) with s = sigmoid(x)
            SiluDeriv => {
                let sg = self.sigmoid()?;
                sg.mul(&self.mul(&sg.affine(-1.0, 1.0)?)?.add_scalar(1.0)?)
            }
            // Phi(x) + x phi(x)
            GeluErfDeriv => {
                let cdf = self.scale(std::f64::consts::FRAC_1_SQRT_2)?.erf()?.add_scalar(1.0)?.scale(0.5)?;
                let pdf = self
                    .square()?
                    .scale(-0.5)?
                    .exp()?
                    .scale(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2)?;
                cdf.add(&self.mul(&pdf)?)
            }
            // 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3))
            GeluTanhDeriv => {
                let (k, c) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
                let x2 = self.square()?;
                let t = self.add(&self.mul(&x2)?.scale(c)?)?.scale(k)?.tanh()?;
                let a = t.add_scalar(1.0)?.scale(0.5)?;
                let b = self.mul(&t.square()?.affine(-1.0, 1.0)?)?.mul(&x2.affine(3.0 * c, 1.0)?)?.scale(0.5 * k)?;
                a.add(&b)
            }
        }
    }

    /// -x
    pub fn neg(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Neg, "neg", |g, _, _| g.map(UnaryOp::Neg))
    }
    /// e^x
    pub fn exp(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Exp, "exp", |g, _, y| g.mul(y))
    }
    /// ln x
    pub fn log(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Log, "log", |g, x, _| g.div(x))
    }
    /// sqrt x
    pub fn sqrt(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Sqrt, "sqrt", |g, _, y| g.div(y)?.scale(0.5))
    }
    /// 1 / sqrt x
    pub fn rsqrt(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Rsqrt, "rsqrt", |g, _, y| g.mul(&y.map(UnaryOp::Powf(3.0))?)?.scale(-0.5))
    }
    /// 1 / x
    pub fn recip(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Recip, "recip", |g, _, y| g.mul(&y.map(UnaryOp::Square)?)?.scale(-1.0))
    }
    /// |x|
    pub fn abs(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Abs, "abs", |g, x, _| {
            let sign = x.map(UnaryOp::Step)?.sub(&x.map(UnaryOp::Neg)?.map(UnaryOp::Step)?)?;
            g.mul(&sign)
        })
    }
    /// tanh x
    pub fn tanh(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Tanh, "tanh", |g, _, y| {
            g.mul(&y.map(UnaryOp::Square)?.map(UnaryOp::Affine { mul: -1.0, add: 1.0 })?)
        })
    }
    /// 1 / (1 + e^-x)
    pub fn sigmoid(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Sigmoid, "sigmoid", |g, _, y| {
            g.mul(&y.mul(&y.map(UnaryOp::Affine { mul: -1.0, add: 1.0 })?)?)
        })
    }
    /// max(x, 0)
    pub fn relu(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Relu, "relu", |g, x, _| g.mul(&x.map(UnaryOp::Step)?))
    }
    /// x * sigmoid(x)
    pub fn silu(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Silu, "silu", |g, x, _| g.mul(&x.map(UnaryOp::SiluDeriv)?))
    }
    /// GELU, exact erf form (`gelu` in transformers).
    pub fn gelu(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::GeluErf, "gelu", |g, x, _| g.mul(&x.map(UnaryOp::GeluErfDeriv)?))
    }
    /// GELU, tanh approximation (`gelu_new` in transformers).
    pub fn gelu_tanh(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::GeluTanh, "gelu_tanh", |g, x, _| g.mul(&x.map(UnaryOp::GeluTanhDeriv)?))
    }
    /// erf x
    pub fn erf(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Erf, "erf", |g, x, _| {
            let d = x
                .map(UnaryOp::Square)?
                .map(UnaryOp::Neg)?
                .map(UnaryOp::Exp)?
                .scale(2.0 / std::f64::consts::PI.sqrt())?;
            g.mul(&d)
        })
    }
    /// sin x
    pub fn sin(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Sin, "sin", |g, x, _| g.mul(&x.map(UnaryOp::Cos)?))
    }
    /// cos x
    pub fn cos(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Cos, "cos", |g, x, _| g.mul(&x.map(UnaryOp::Sin)?)?.scale(-1.0))
    }
    /// x^2
    pub fn square(&self) -> Result<Tensor<B>> {
        self.unary_op(UnaryOp::Square, "square", |g, x, _| g.mul(x)?.scale(2.0))
    }
    /// x * mul + add
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor<B>> {
        self.expect_float("affine")?;
        let op = UnaryOp::Affine { mul, add };
        let x = rules::unary(self, is_linear(op))?;
        let s = x.backend().unary(op, x.storage(), x.local_shape().elem_count())?;
        Ok(Tensor::record_like(&x, s, x.dtype(), "affine", &[&x], move |g| {
            Ok(vec![Some(g.map(UnaryOp::Affine { mul, add: 0.0 })?)])
        }))
    }
    /// x * c
    pub fn scale(&self, c: f64) -> Result<Tensor<B>> {
        self.affine(c, 0.0)
    }
    /// x + c
    pub fn add_scalar(&self, c: f64) -> Result<Tensor<B>> {
        self.affine(1.0, c)
    }
    /// x ^ e
    pub fn powf(&self, e: f64) -> Result<Tensor<B>> {
        self.expect_float("powf")?;
        let x = rules::no_partial(self)?;
        let s = x.backend().unary(UnaryOp::Powf(e), x.storage(), x.local_shape().elem_count())?;
        let xc = x.clone();
        Ok(Tensor::record_like(&xc, s, x.dtype(), "powf", &[&xc], move |g| {
            Ok(vec![Some(g.mul(&x.map(UnaryOp::Powf(e - 1.0))?)?.scale(e)?)])
        }))
    }
    /// max(x, c)
    pub fn clamp_min(&self, c: f64) -> Result<Tensor<B>> {
        self.expect_float("clamp_min")?;
        let x = rules::no_partial(self)?;
        let s = x.backend().unary(UnaryOp::ClampMin(c), x.storage(), x.local_shape().elem_count())?;
        let xc = x.clone();
        Ok(Tensor::record_like(&xc, s, x.dtype(), "clamp_min", &[&xc], move |g| {
            Ok(vec![Some(g.mul(&x.map(UnaryOp::Affine { mul: 1.0, add: -c })?.map(UnaryOp::Step)?)?)])
        }))
    }

    fn binary_op(&self, rhs: &Tensor<B>, op: BinaryOp, name: &'static str) -> Result<Tensor<B>> {
        self.same_dtype(rhs, name)?;
        let out = self.shape().broadcast(rhs.shape(), name)?;
        let lin = match op {
            BinaryOp::Add | BinaryOp::Sub => Linearity::Additive,
            BinaryOp::Mul | BinaryOp::Div => Linearity::Multiplicative,
            BinaryOp::Max | BinaryOp::Min => Linearity::None,
        };
        let (a, b, placed) = rules::binary(self, rhs, lin)?;
        let local = a.local_shape().broadcast(b.local_shape(), name)?;
        let s = a.backend().binary(op, (a.storage(), a.local_shape()), (b.storage(), b.local_shape()), &local)?;
        let (ai, bi, be, dt) = (a.clone(), b.clone(), a.backend().clone(), a.dtype());
        Ok(Tensor::from_op_placed(&be, s, out, local, placed, dt, name, &[&ai, &bi], move |g| {
            let (ga, gb) = match op {
                BinaryOp::Add => (g.clone(), g.clone()),
                BinaryOp::Sub => (g.clone(), g.map(UnaryOp::Neg)?),
                BinaryOp::Mul => (g.mul(&b)?, g.mul(&a)?),
                BinaryOp::Div => {
                    let gb = g.mul(&a)?.div(&b.map(UnaryOp::Square)?)?.map(UnaryOp::Neg)?;
                    (g.div(&b)?, gb)
                }
                BinaryOp::Max | BinaryOp::Min => {
                    let cmp = if op == BinaryOp::Max { CmpOp::Ge } else { CmpOp::Le };
                    let pick_a = a.compare(&b, cmp)?;
                    let zero = Tensor::zeros(g.backend(), [], g.dtype())?;
                    (pick_a.where_cond(g, &zero)?, pick_a.where_cond(&zero, g)?)
                }
            };
            Ok(vec![Some(ga.sum_to(a.shape())?), Some(gb.sum_to(b.shape())?)])
        }))
    }

    /// a + b (broadcasting)
    pub fn add(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary_op(rhs, BinaryOp::Add, "add")
    }
    /// a - b (broadcasting)
    pub fn sub(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary_op(rhs, BinaryOp::Sub, "sub")
    }
    /// a * b (broadcasting)
    pub fn mul(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary_op(rhs, BinaryOp::Mul, "mul")
    }
    /// a / b (broadcasting)
    pub fn div(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary_op(rhs, BinaryOp::Div, "div")
    }
    /// max(a, b) (broadcasting; ties send the gradient to `a`)
    pub fn maximum(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary_op(rhs, BinaryOp::Max, "maximum")
    }
    /// min(a, b) (broadcasting; ties send the gradient to `a`)
    pub fn minimum(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary_op(rhs, BinaryOp::Min, "minimum")
    }

    /// Elementwise comparison, a `U8` mask (no gradient).
    pub fn compare(&self, rhs: &Tensor<B>, op: CmpOp) -> Result<Tensor<B>> {
        self.same_dtype(rhs, "compare")?;
        let out = self.shape().broadcast(rhs.shape(), "compare")?;
        let (a, b, placed) = rules::binary(self, rhs, Linearity::None)?;
        let local = a.local_shape().broadcast(b.local_shape(), "compare")?;
        let s = a.backend().compare(op, (a.storage(), a.local_shape()), (b.storage(), b.local_shape()), &local)?;
        Ok(Tensor::from_local(a.backend(), s, out, local, placed, DType::U8))
    }

    /// Elementwise comparison with a scalar, a `U8` mask.
    pub fn compare_scalar(&self, c: f64, op: CmpOp) -> Result<Tensor<B>> {
        let s = Tensor::scalar(self.backend(), c, self.dtype())?;
        self.compare(&s, op)
    }

    /// `self ? a : b` where `self` is a `U8` mask (broadcasting all three).
    pub fn where_cond(&self, a: &Tensor<B>, b: &Tensor<B>) -> Result<Tensor<B>> {
        if self.dtype() != DType::U8 {
            return Err(crate::Error::UnsupportedDType { op: "where_cond (condition)", dtype: self.dtype() });
        }
        a.same_dtype(b, "where_cond")?;
        let out = self.shape().broadcast(a.shape(), "where_cond")?.broadcast(b.shape(), "where_cond")?;
        // The output takes the first split found among the condition and the values; each
        // operand then follows it (sliced where it has the dim whole, else replicated).
        let ro = out.rank();
        let (a, b) = (rules::no_partial(a)?, rules::no_partial(b)?);
        let mut placed = crate::Placements::REPLICATED;
        for axis in [crate::MeshAxis::Dp, crate::MeshAxis::Mp] {
            for t in [self, &a, &b] {
                if let crate::Placement::Shard(d) = t.placements().get(axis) {
                    placed = placed.with(axis, crate::Placement::Shard(d + ro - t.rank()));
                    break;
                }
            }
        }
        let cond = rules::follow(self, placed, ro)?;
        let (a, b) = (rules::follow(&a, placed, ro)?, rules::follow(&b, placed, ro)?);
        let local =
            cond.local_shape().broadcast(a.local_shape(), "where_cond")?.broadcast(b.local_shape(), "where_cond")?;
        let s = a.backend().where_cond(
            (cond.storage(), cond.local_shape()),
            (a.storage(), a.local_shape()),
            (b.storage(), b.local_shape()),
            &local,
        )?;
        let (c, sa, sb) = (cond.clone(), a.shape().clone(), b.shape().clone());
        Ok(Tensor::from_op_placed(a.backend(), s, out, local, placed, a.dtype(), "where_cond", &[&a, &b], move |g| {
            let zero = Tensor::zeros(g.backend(), [], g.dtype())?;
            let ga = c.where_cond(g, &zero)?.sum_to(&sa)?;
            let gb = c.where_cond(&zero, g)?.sum_to(&sb)?;
            Ok(vec![Some(ga), Some(gb)])
        }))
    }

    /// Converts to `dtype` (the gradient converts back).
    pub fn cast(&self, dtype: DType) -> Result<Tensor<B>> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if !self.backend().supports(dtype) {
            return Err(crate::Error::UnsupportedDType { op: "cast", dtype });
        }
        let s = self.backend().cast(self.storage(), self.local_shape().elem_count(), dtype)?;
        let from = self.dtype();
        let differentiable = from.is_float() && dtype.is_float();
        let inputs: Vec<&Tensor<B>> = if differentiable { vec![self] } else { vec![] };
        Ok(Tensor::record_like(self, s, dtype, "cast", &inputs, move |g| Ok(vec![Some(g.cast(from)?)])))
    }
}
