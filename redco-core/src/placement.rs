//! Placements: how a tensor's global value is laid out over each mesh axis.
//!
//! On one device every tensor is [`Placement::Replicate`] on every axis. The sharding
//! layer (`sharding/`) fills in shards and partial sums; the type lives here, beside
//! [`Shape`](crate::Shape), because it is tensor metadata.

/// The two axes of a device mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MeshAxis {
    /// The data-parallel axis: ranks hold different examples.
    Dp = 0,
    /// The model-parallel axis: ranks hold different slices of parameters.
    Mp = 1,
}

/// How a pending partial value is reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartialOp {
    /// The global value is the sum of the ranks' local values.
    Sum,
    /// The global value is the elementwise maximum.
    Max,
}

/// The layout of a tensor's global value over one mesh axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// Every rank holds the whole value.
    #[default]
    Replicate,
    /// Each rank holds a contiguous slice along dimension `.0`.
    Shard(usize),
    /// Each rank holds a partial value; the global value is their reduction.
    Partial(PartialOp),
}

/// One [`Placement`] per mesh axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Placements(pub [Placement; 2]);

impl Placements {
    /// Replicated on every axis: the placement of every tensor on one device.
    pub const REPLICATED: Placements = Placements([Placement::Replicate, Placement::Replicate]);

    /// The placement along `axis`.
    pub fn get(&self, axis: MeshAxis) -> Placement {
        self.0[axis as usize]
    }
    /// A copy with `axis` set to `p`.
    pub fn with(mut self, axis: MeshAxis, p: Placement) -> Self {
        self.0[axis as usize] = p;
        self
    }
    /// True when the tensor is replicated on every axis.
    pub fn is_replicated(&self) -> bool {
        self.0.iter().all(|p| *p == Placement::Replicate)
    }
}

/// `p` with every `Partial` replaced by `Replicate`: the placement of the gradient of a
/// tensor laid out as `p` (the gradient of a partial sum reaches every term whole).
pub fn without_partial(p: Placements) -> Placements {
    let f = |x: Placement| if matches!(x, Placement::Partial(_)) { Placement::Replicate } else { x };
    Placements([f(p.0[0]), f(p.0[1])])
}

/// The local shape of a tensor of global `shape` laid out as `p` over axes of `sizes`
/// (`[dp, mp]`); errors when a sharded dim is not divisible by its axis size.
pub fn local_shape(shape: &crate::Shape, p: Placements, sizes: [usize; 2]) -> crate::Result<crate::Shape> {
    let mut d = shape.dims().to_vec();
    for (axis, pl) in p.0.iter().enumerate() {
        if let Placement::Shard(dim) = *pl {
            let k = sizes[axis];
            if dim >= d.len() || !d[dim].is_multiple_of(k) {
                return Err(crate::Error::invalid(
                    "placement",
                    format!("dim {dim} of {shape} cannot be split into {k} equal shards"),
                ));
            }
            d[dim] /= k;
        }
    }
    Ok(crate::Shape::new(d))
}
