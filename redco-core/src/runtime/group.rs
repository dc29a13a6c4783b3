//! Process groups: the sets of ranks a collective runs over, one per mesh-axis group.
//!
//! A `dp x mp` mesh has `mp` groups along `dp` and `dp` groups along `mp`, plus the whole
//! mesh (for barriers). Each group is identified the way every transport splits a
//! communicator: its *colour* (which group along the axis) and each member's *key* (its
//! index along the axis), as in `MPI_Comm_split`, `ncclCommSplit` and XLA's replica groups.
//! Transports create their communicators once per group from these, at the start of a run.

use crate::backend::mesh::Mesh;
use crate::MeshAxis;
use std::fmt;

/// What a group spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupAxis {
    /// The ranks along one mesh axis.
    Axis(MeshAxis),
    /// Every rank of the mesh.
    Mesh,
}

impl fmt::Display for GroupAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupAxis::Axis(MeshAxis::Dp) => f.write_str("dp"),
            GroupAxis::Axis(MeshAxis::Mp) => f.write_str("mp"),
            GroupAxis::Mesh => f.write_str("mesh"),
        }
    }
}

/// The group of one rank along one axis (or the whole mesh).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessGroup {
    /// What the group spans.
    pub axis: GroupAxis,
    /// Which group along the axis (the same for every member; 0 for the mesh).
    pub color: usize,
    /// This rank's index in the group (its position along the axis).
    pub key: usize,
    /// The members' mesh ranks, in key order.
    pub members: Vec<usize>,
}

impl ProcessGroup {
    /// The group along `axis` that holds `rank`.
    pub fn along(mesh: Mesh, rank: usize, axis: MeshAxis) -> Self {
        ProcessGroup {
            axis: GroupAxis::Axis(axis),
            color: mesh.group_along(rank, axis),
            key: mesh.index_along(rank, axis),
            members: mesh.group_members(rank, axis),
        }
    }

    /// The whole mesh, as seen by `rank`.
    pub fn mesh(mesh: Mesh, rank: usize) -> Self {
        ProcessGroup { axis: GroupAxis::Mesh, color: 0, key: rank, members: (0..mesh.size()).collect() }
    }

    /// The three groups of `rank`: along `dp`, along `mp`, the mesh.
    pub fn all_of(mesh: Mesh, rank: usize) -> [ProcessGroup; 3] {
        [
            ProcessGroup::along(mesh, rank, MeshAxis::Dp),
            ProcessGroup::along(mesh, rank, MeshAxis::Mp),
            ProcessGroup::mesh(mesh, rank),
        ]
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// An identifier shared by the members and distinct between groups of the mesh.
    pub fn id(&self) -> (GroupAxis, usize) {
        (self.axis, self.color)
    }
}

impl fmt::Display for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} group {} (ranks {:?})", self.axis, self.color, self.members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_a_2x2_mesh() {
        let m = Mesh::new(2, 2).unwrap();
        // rank 3 = (dp 1, mp 1)
        let [dp, mp, all] = ProcessGroup::all_of(m, 3);
        assert_eq!((dp.color, dp.key, dp.members.clone()), (1, 1, vec![1, 3]));
        assert_eq!((mp.color, mp.key, mp.members.clone()), (1, 1, vec![2, 3]));
        assert_eq!((all.key, all.size()), (3, 4));
        // every member of a group agrees on its id, and the keys are the positions
        for r in 0..4 {
            for axis in [MeshAxis::Dp, MeshAxis::Mp] {
                let g = ProcessGroup::along(m, r, axis);
                assert_eq!(g.members[g.key], r);
                for &o in &g.members {
                    assert_eq!(ProcessGroup::along(m, o, axis).id(), g.id());
                }
            }
        }
    }
}
