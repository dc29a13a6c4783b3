//! The float unary ops of [`UnaryOp`], written as StableHLO (and `chlo.erf`) with the CPU
//! backend's formulas.

use super::{Func, Val};
use redco_core::backend::UnaryOp;
use std::f64::consts::{FRAC_1_SQRT_2, PI};

impl Func {
    /// `op` of the float `x` (already in its compute type). `scalar` gives the op's runtime
    /// parameters (the multiplier and addend of `Affine`, the exponent of `Powf`, the bound
    /// of `ClampMin`) as scalar values, so they are program inputs rather than constants.
    pub fn unary(&mut self, op: UnaryOp, x: &Val, scalar: &mut dyn FnMut(&mut Func, f64) -> Val) -> Val {
        let c = |f: &mut Func, v: f64| f.const_like(v, x);
        match op {
            UnaryOp::Neg => self.map1("negate", x),
            UnaryOp::Exp => self.map1("exponential", x),
            UnaryOp::Log => self.map1("log", x),
            UnaryOp::Sqrt => self.map1("sqrt", x),
            UnaryOp::Rsqrt => self.map1("rsqrt", x),
            UnaryOp::Recip => {
                let one = c(self, 1.0);
                self.map2("divide", &one, x)
            }
            UnaryOp::Abs => self.map1("abs", x),
            UnaryOp::Tanh => self.map1("tanh", x),
            UnaryOp::Sigmoid => self.sigmoid(x),
            UnaryOp::Relu => {
                let zero = c(self, 0.0);
                let p = self.compare(redco_core::backend::CmpOp::Gt, x, &zero);
                self.select(&p, x, &zero)
            }
            UnaryOp::Silu => {
                let s = self.sigmoid(x);
                self.map2("multiply", x, &s)
            }
            UnaryOp::GeluErf => {
                // 0.5 x (1 + erf(x / sqrt 2))
                let e = self.erf_scaled(x, FRAC_1_SQRT_2);
                let one = c(self, 1.0);
                let t = self.map2("add", &one, &e);
                let h = self.scale(x, 0.5);
                self.map2("multiply", &h, &t)
            }
            UnaryOp::GeluTanh => {
                let t = self.gelu_tanh_inner(x);
                let one = c(self, 1.0);
                let t1 = self.map2("add", &one, &t);
                let h = self.scale(x, 0.5);
                self.map2("multiply", &h, &t1)
            }
            UnaryOp::Erf => self.op("chlo.erf", &[x], "", x.ty.clone()),
            UnaryOp::Sin => self.map1("sine", x),
            UnaryOp::Cos => self.map1("cosine", x),
            UnaryOp::Square => self.map2("multiply", x, x),
            UnaryOp::Step => {
                let zero = c(self, 0.0);
                let one = c(self, 1.0);
                let p = self.compare(redco_core::backend::CmpOp::Gt, x, &zero);
                self.select(&p, &one, &zero)
            }
            UnaryOp::SiluDeriv => {
                // s (1 + x (1 - s))
                let s = self.sigmoid(x);
                let one = c(self, 1.0);
                let oms = self.map2("subtract", &one, &s);
                let xo = self.map2("multiply", x, &oms);
                let t = self.map2("add", &one, &xo);
                self.map2("multiply", &s, &t)
            }
            UnaryOp::GeluErfDeriv => {
                // 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
                let e = self.erf_scaled(x, FRAC_1_SQRT_2);
                let one = c(self, 1.0);
                let t = self.map2("add", &one, &e);
                let a = self.scale(&t, 0.5);
                let x2 = self.map2("multiply", x, x);
                let nx2 = self.scale(&x2, -0.5);
                let ex = self.map1("exponential", &nx2);
                let xs = self.scale(x, 1.0 / (2.0 * PI).sqrt());
                let b = self.map2("multiply", &xs, &ex);
                self.map2("add", &a, &b)
            }
            UnaryOp::GeluTanhDeriv => {
                // 0.5 (1 + t) + 0.5 x (1 - t^2) du, t = tanh(u), du = sqrt(2/pi) (1 + 3c x^2)
                let t = self.gelu_tanh_inner(x);
                let one = c(self, 1.0);
                let a0 = self.map2("add", &one, &t);
                let a = self.scale(&a0, 0.5);
                let t2 = self.map2("multiply", &t, &t);
                let omt = self.map2("subtract", &one, &t2);
                let x2 = self.map2("multiply", x, x);
                let k = self.scale(&x2, 3.0 * 0.044715);
                let k1 = self.map2("add", &one, &k);
                let du = self.scale(&k1, (2.0 / PI).sqrt());
                let hx = self.scale(x, 0.5);
                let b0 = self.map2("multiply", &hx, &omt);
                let b = self.map2("multiply", &b0, &du);
                self.map2("add", &a, &b)
            }
            UnaryOp::Affine { mul, add } => {
                let m = scalar(self, mul);
                let a = scalar(self, add);
                let m = self.splat(&m, &x.ty.dims);
                let a = self.splat(&a, &x.ty.dims);
                let xm = self.map2("multiply", x, &m);
                self.map2("add", &xm, &a)
            }
            UnaryOp::Powf(e) => {
                let e = scalar(self, e);
                let e = self.splat(&e, &x.ty.dims);
                self.map2("power", x, &e)
            }
            UnaryOp::ClampMin(b) => {
                let b = scalar(self, b);
                let b = self.splat(&b, &x.ty.dims);
                let p = self.compare(redco_core::backend::CmpOp::Lt, x, &b);
                self.select(&p, &b, x)
            }
        }
    }

    /// `x * k` for a structural constant `k`.
    fn scale(&mut self, x: &Val, k: f64) -> Val {
        let c = self.const_like(k, x);
        self.map2("multiply", x, &c)
    }

    /// `1 / (1 + e^-x)`, as the CPU backend computes it.
    fn sigmoid(&mut self, x: &Val) -> Val {
        let n = self.map1("negate", x);
        let e = self.map1("exponential", &n);
        let one = self.const_like(1.0, x);
        let d = self.map2("add", &one, &e);
        self.map2("divide", &one, &d)
    }

    /// `erf(x * k)`.
    fn erf_scaled(&mut self, x: &Val, k: f64) -> Val {
        let s = self.scale(x, k);
        self.op("chlo.erf", &[&s], "", s.ty.clone())
    }

    /// `tanh(sqrt(2/pi) (x + 0.044715 x^3))`.
    fn gelu_tanh_inner(&mut self, x: &Val) -> Val {
        let x2 = self.map2("multiply", x, x);
        let x3 = self.map2("multiply", &x2, x);
        let cx3 = self.scale(&x3, 0.044715);
        let u0 = self.map2("add", x, &cx3);
        let u = self.scale(&u0, (2.0 / PI).sqrt());
        self.map1("tanh", &u)
    }
}
