//! The communicator a compiled SPMD step is traced with: every collective the model's
//! sharded ops call becomes the program's own (`stablehlo.all_reduce`, `all_gather`,
//! `reduce_scatter` over the replica groups of one mesh axis), and a rank's index along an
//! axis is derived from `stablehlo.replica_id`, so one program runs on every device of the
//! mesh and XLA schedules the communication.
//!
//! Replica `r` of the program is mesh rank `r` (`dp_index * mp + mp_index`).

use crate::trace::{TVal, Tracer};
use redco_core::runtime::{Collective, Mesh, ReduceKind};
use redco_core::{MeshAxis, Result};

/// A [`Collective`] over the [`Tracer`] for the ranks of `mesh`, all at once.
#[derive(Debug, Clone)]
pub struct TracedCollective {
    t: Tracer,
    mesh: Mesh,
}

impl TracedCollective {
    /// Collectives recorded into `t`'s program for the ranks of `mesh`.
    pub fn new(t: &Tracer, mesh: Mesh) -> TracedCollective {
        TracedCollective { t: t.clone(), mesh }
    }

    /// The replica groups along `axis`: one per group of the mesh, members in axis order.
    pub fn groups(&self, axis: MeshAxis) -> Vec<Vec<usize>> {
        let other = match axis {
            MeshAxis::Dp => MeshAxis::Mp,
            MeshAxis::Mp => MeshAxis::Dp,
        };
        // the first member of each group: the ranks at position 0 along `axis`
        (0..self.mesh.size())
            .filter(|&r| self.mesh.index_along(r, axis) == 0)
            .map(|r| self.mesh.group_members(r, axis))
            .take(self.mesh.axis_size(other))
            .collect()
    }
}

impl Collective<Tracer> for TracedCollective {
    fn mesh(&self) -> Mesh {
        self.mesh
    }
    /// Rank 0: the program is the same on every rank, and everything rank-dependent in it
    /// comes from [`Collective::axis_index`], never from this number.
    fn rank(&self) -> usize {
        0
    }
    fn all_reduce(&self, axis: MeshAxis, x: &TVal, op: ReduceKind) -> Result<TVal> {
        let op = match op {
            ReduceKind::Sum => "add",
            ReduceKind::Max => "maximum",
        };
        let groups = self.groups(axis);
        Ok(self.t.emit(|f, _| f.all_reduce(&x.0, &groups, op)))
    }
    fn all_gather(&self, axis: MeshAxis, x: &TVal) -> Result<TVal> {
        let groups = self.groups(axis);
        Ok(self.t.emit(|f, _| f.all_gather(&x.0, &groups)))
    }
    fn reduce_scatter(&self, axis: MeshAxis, x: &TVal) -> Result<TVal> {
        let k = self.mesh.axis_size(axis);
        if !x.0.ty.len().is_multiple_of(k) {
            return Err(redco_core::Error::invalid(
                "reduce_scatter",
                format!("{} elements do not split {k} ways", x.0.ty.len()),
            ));
        }
        let groups = self.groups(axis);
        Ok(self.t.emit(|f, _| f.reduce_scatter(&x.0, &groups)))
    }
    fn broadcast(&self, axis: MeshAxis, x: &TVal, root: usize) -> Result<TVal> {
        // the root's value, zeros elsewhere, summed over the group
        let idx = self.axis_index(&self.t, axis)?;
        let groups = self.groups(axis);
        Ok(self.t.emit(|f, _| {
            let i = f.reshape(&idx.0, &[]);
            let r = f.constant(root as f64, i.ty.clone());
            let p = f.compare(redco_core::backend::CmpOp::Eq, &i, &r);
            let p = f.splat(&p, &x.0.ty.dims.clone());
            let zero = f.const_like(0.0, &x.0);
            let mine = f.select(&p, &x.0, &zero);
            f.all_reduce_sum(&mine, &groups)
        }))
    }
    fn barrier(&self) -> Result<()> {
        // one program: every replica runs it to the end together
        Ok(())
    }
    fn axis_index(&self, _b: &Tracer, axis: MeshAxis) -> Result<TVal> {
        let mp = self.mesh.mp as f64;
        Ok(self.t.emit(|f, _| {
            let r = f.replica_index();
            let m = f.constant(mp, r.ty.clone());
            match axis {
                MeshAxis::Dp => f.map2("divide", &r, &m),
                MeshAxis::Mp => f.map2("remainder", &r, &m),
            }
        }))
    }
}
