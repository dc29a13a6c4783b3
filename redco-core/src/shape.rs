//! `Shape`: the dimensions of a tensor, and the helpers that reason about them.

use crate::{Error, Result};
use std::fmt;

/// The dimensions of a row-major tensor. A scalar has rank 0.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// The number of elements (1 for a scalar).
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }
    /// Size of dimension `d` (already resolved).
    pub fn dim(&self, d: usize) -> usize {
        self.0[d]
    }
    /// Resolves a possibly negative dimension index (-1 is the last) for `op`.
    pub fn resolve(&self, dim: isize, op: &'static str) -> Result<usize> {
        let r = self.rank() as isize;
        let d = if dim < 0 { dim + r } else { dim };
        if d < 0 || d >= r {
            return Err(Error::DimOutOfRange { op, dim, shape: self.clone() });
        }
        Ok(d as usize)
    }
    /// Row-major strides, in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.rank()];
        for i in (0..self.rank().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.0[i + 1];
        }
        s
    }
    /// Splits the shape around `dim` into (outer, size, inner) element counts.
    pub fn split_at_dim(&self, dim: usize) -> (usize, usize, usize) {
        let outer = self.0[..dim].iter().product();
        let inner = self.0[dim + 1..].iter().product();
        (outer, self.0[dim], inner)
    }
    /// The same shape with dimension `dim` set to `size`.
    pub fn with_dim(&self, dim: usize, size: usize) -> Shape {
        let mut d = self.0.clone();
        d[dim] = size;
        Shape(d)
    }
    /// The shape both operands broadcast to (NumPy rules), or an error naming `op`.
    pub fn broadcast(&self, other: &Shape, op: &'static str) -> Result<Shape> {
        let r = self.rank().max(other.rank());
        let mut out = vec![0; r];
        for (i, o) in out.iter_mut().enumerate() {
            let a = dim_from_right(&self.0, r - 1 - i);
            let b = dim_from_right(&other.0, r - 1 - i);
            *o = if a == b || b == 1 {
                a
            } else if a == 1 {
                b
            } else {
                return Err(Error::ShapeMismatch { op, lhs: self.clone(), rhs: other.clone() });
            };
        }
        Ok(Shape(out))
    }
    /// Strides of `self` when broadcast to `target` (0 along broadcast dims).
    pub fn broadcast_strides(&self, target: &Shape) -> Vec<usize> {
        let own = self.strides();
        let off = target.rank() - self.rank();
        (0..target.rank()).map(|i| if i < off || self.0[i - off] == 1 { 0 } else { own[i - off] }).collect()
    }
}

fn dim_from_right(d: &[usize], i: usize) -> usize {
    if i < d.len() {
        d[d.len() - 1 - i]
    } else {
        1
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}
