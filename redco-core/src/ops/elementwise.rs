//! Elementwise ops: unary maps, broadcasting binary ops, comparisons, `where`, casts.

use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::{Backend, DType, Result, Tensor};

type GradFn<B> = fn(&Tensor<B>, &Tensor<B>, &Tensor<B>) -> Result<Tensor<B>>;

impl<B: Backend> Tensor<B> {
    /// Applies `op` without recording a gradient (used by gradient formulas).
    pub(crate) fn map(&self, op: UnaryOp) -> Result<Tensor<B>> {
        self.expect_float("unary")?;
        let s = self.backend().unary(op, self.storage(), self.elem_count())?;
        Ok(Tensor::from_storage(self.backend(), s, self.shape().clone(), self.dtype()))
    }

    fn unary_op(&self, op: UnaryOp, name: &'static str, grad: GradFn<B>) -> Result<Tensor<B>> {
        self.expect_float(name)?;
        let s = self.backend().unary(op, self.storage(), self.elem_count())?;
        let (x, shape, dtype) = (self.clone(), self.shape().clone(), self.dtype());
        let y = Tensor::from_storage(self.backend(), s.clone(), shape.clone(), dtype);
        Ok(Tensor::from_op(self.backend(), s, shape, dtype, name, &[self], move |g| Ok(vec![Some(grad(g, &x, &y)?)])))
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
        let s = self.backend().unary(UnaryOp::Affine { mul, add }, self.storage(), self.elem_count())?;
        Ok(Tensor::from_op(self.backend(), s, self.shape().clone(), self.dtype(), "affine", &[self], move |g| {
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
        let s = self.backend().unary(UnaryOp::Powf(e), self.storage(), self.elem_count())?;
        let x = self.clone();
        Ok(Tensor::from_op(self.backend(), s, self.shape().clone(), self.dtype(), "powf", &[self], move |g| {
            Ok(vec![Some(g.mul(&x.map(UnaryOp::Powf(e - 1.0))?)?.scale(e)?)])
        }))
    }
    /// max(x, c)
    pub fn clamp_min(&self, c: f64) -> Result<Tensor<B>> {
        self.expect_float("clamp_min")?;
        let s = self.backend().unary(UnaryOp::ClampMin(c), self.storage(), self.elem_count())?;
        let x = self.clone();
        Ok(Tensor::from_op(self.backend(), s, self.shape().clone(), self.dtype(), "clamp_min", &[self], move |g| {
            Ok(vec![Some(g.mul(&x.map(UnaryOp::Affine { mul: 1.0, add: -c })?.map(UnaryOp::Step)?)?)])
        }))
    }

    fn binary_op(&self, rhs: &Tensor<B>, op: BinaryOp, name: &'static str) -> Result<Tensor<B>> {
        self.same_dtype(rhs, name)?;
        let out = self.shape().broadcast(rhs.shape(), name)?;
        let s = self.backend().binary(op, (self.storage(), self.shape()), (rhs.storage(), rhs.shape()), &out)?;
        let (a, b) = (self.clone(), rhs.clone());
        Ok(Tensor::from_op(self.backend(), s, out, self.dtype(), name, &[self, rhs], move |g| {
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
        let s = self.backend().compare(op, (self.storage(), self.shape()), (rhs.storage(), rhs.shape()), &out)?;
        Ok(Tensor::from_storage(self.backend(), s, out, DType::U8))
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
        let s = self.backend().where_cond(
            (self.storage(), self.shape()),
            (a.storage(), a.shape()),
            (b.storage(), b.shape()),
            &out,
        )?;
        let (cond, sa, sb) = (self.clone(), a.shape().clone(), b.shape().clone());
        Ok(Tensor::from_op(self.backend(), s, out, a.dtype(), "where_cond", &[a, b], move |g| {
            let zero = Tensor::zeros(g.backend(), [], g.dtype())?;
            let ga = cond.where_cond(g, &zero)?.sum_to(&sa)?;
            let gb = cond.where_cond(&zero, g)?.sum_to(&sb)?;
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
        let s = self.backend().cast(self.storage(), self.elem_count(), dtype)?;
        let from = self.dtype();
        let differentiable = from.is_float() && dtype.is_float();
        let inputs: Vec<&Tensor<B>> = if differentiable { vec![self] } else { vec![] };
        Ok(Tensor::from_op(self.backend(), s, self.shape().clone(), dtype, "cast", &inputs, move |g| {
            Ok(vec![Some(g.cast(from)?)])
        }))
    }
}
