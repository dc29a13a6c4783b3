//! StableHLO collectives across the replicas of a replicated program (`all_reduce`,
//! `all_gather`, `reduce_scatter`, each over replica groups: one group per mesh-axis
//! group) and the replica's own id.

use super::{binary_region, list, Et, Func, Ty, Val};

/// `replica_groups = dense<[[..], ..]> : tensor<GxWxi64>`.
fn replica_groups(groups: &[Vec<usize>]) -> String {
    let width = groups.first().map_or(0, |g| g.len());
    let rows: Vec<String> = groups.iter().map(|g| list(g)).collect();
    format!("replica_groups = dense<[{}]> : tensor<{}x{width}xi64>", rows.join(", "), groups.len())
}

impl Func {
    /// `stablehlo.all_reduce` summing `v` over the replicas of each group.
    pub fn all_reduce_sum(&mut self, v: &Val, groups: &[Vec<usize>]) -> Val {
        self.all_reduce(v, groups, "add")
    }

    /// `stablehlo.all_reduce` combining `v` with `op` (`add`, `maximum`) over the
    /// replicas of each group.
    pub fn all_reduce(&mut self, v: &Val, groups: &[Vec<usize>], op: &str) -> Val {
        let region = binary_region(op, v.ty.et);
        self.op_with_region("all_reduce", &[v], &region, &replica_groups(groups), v.ty.clone())
    }

    /// `stablehlo.all_gather` of a flat `v` (`[n]`): the group's values concatenated in
    /// group order (`[k * n]`).
    pub fn all_gather(&mut self, v: &Val, groups: &[Vec<usize>]) -> Val {
        let k = groups.first().map_or(1, |g| g.len());
        let attr = format!("all_gather_dim = 0 : i64, {}", replica_groups(groups));
        self.op("all_gather", &[v], &attr, Ty::new(&[k * v.ty.len()], v.ty.et))
    }

    /// `stablehlo.reduce_scatter` of a flat `v` (`[n]`, `n` divisible by the group
    /// size `k`): the group's sum, member `i` keeping chunk `i` (`[n / k]`).
    pub fn reduce_scatter(&mut self, v: &Val, groups: &[Vec<usize>]) -> Val {
        let k = groups.first().map_or(1, |g| g.len()).max(1);
        let region = binary_region("add", v.ty.et);
        let attr = format!("scatter_dimension = 0 : i64, {}", replica_groups(groups));
        self.op_with_region("reduce_scatter", &[v], &region, &attr, Ty::new(&[v.ty.len() / k], v.ty.et))
    }

    /// This replica's id (`stablehlo.replica_id`) as an `i64` scalar.
    pub fn replica_index(&mut self) -> Val {
        let r = self.op("replica_id", &[], "", Ty::scalar(Et::U32));
        self.convert(&r, Et::I64)
    }
}
