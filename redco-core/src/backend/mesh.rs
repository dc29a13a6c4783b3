//! The device mesh: `dp x mp` ranks, rank `r = dp_index * mp + mp_index`.

use crate::{Error, MeshAxis, Result};
use std::fmt;
use std::str::FromStr;

/// A two-axis device mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mesh {
    /// Data-parallel size.
    pub dp: usize,
    /// Model-parallel (tensor-parallel) size.
    pub mp: usize,
}

impl Mesh {
    /// A mesh; both sizes must be at least 1.
    pub fn new(dp: usize, mp: usize) -> Result<Self> {
        if dp == 0 || mp == 0 {
            return Err(Error::config("mesh", format!("sizes must be >= 1, got {dp}x{mp}")));
        }
        Ok(Mesh { dp, mp })
    }
    /// The one-device mesh.
    pub fn single() -> Self {
        Mesh { dp: 1, mp: 1 }
    }
    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.dp * self.mp
    }
    /// The size of one axis.
    pub fn axis_size(&self, axis: MeshAxis) -> usize {
        match axis {
            MeshAxis::Dp => self.dp,
            MeshAxis::Mp => self.mp,
        }
    }
    /// `(dp_index, mp_index)` of `rank`.
    pub fn coords(&self, rank: usize) -> (usize, usize) {
        (rank / self.mp, rank % self.mp)
    }
    /// The rank at `(dp_index, mp_index)`.
    pub fn rank_of(&self, dp_index: usize, mp_index: usize) -> usize {
        dp_index * self.mp + mp_index
    }
    /// The position of `rank` along `axis`.
    pub fn index_along(&self, rank: usize, axis: MeshAxis) -> usize {
        let (d, m) = self.coords(rank);
        match axis {
            MeshAxis::Dp => d,
            MeshAxis::Mp => m,
        }
    }
    /// Which group along `axis` holds `rank` (groups along `Dp` are indexed by the mp
    /// position and vice versa).
    pub fn group_along(&self, rank: usize, axis: MeshAxis) -> usize {
        let (d, m) = self.coords(rank);
        match axis {
            MeshAxis::Dp => m,
            MeshAxis::Mp => d,
        }
    }
    /// The ranks of the group along `axis` that holds `rank`, in axis order.
    pub fn group_members(&self, rank: usize, axis: MeshAxis) -> Vec<usize> {
        let (d, m) = self.coords(rank);
        match axis {
            MeshAxis::Dp => (0..self.dp).map(|i| self.rank_of(i, m)).collect(),
            MeshAxis::Mp => (0..self.mp).map(|i| self.rank_of(d, i)).collect(),
        }
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.dp, self.mp)
    }
}

impl FromStr for Mesh {
    type Err = Error;
    /// Parses `DPxMP`, e.g. `2x4`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::config("mesh", format!("`{s}` is not of the form DPxMP (for example 1x2)"));
        let (a, b) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        Mesh::new(a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?)
    }
}
