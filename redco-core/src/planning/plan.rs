//! A sharding plan: a placement for every parameter, why it was chosen, and applying it
//! to a module (each rank keeps only its slice).

use crate::nn::Module;
use crate::runtime::{Comm, Mesh};
use crate::{Backend, Error, MeshAxis, Placement, Placements, Result, Shape};
use std::collections::BTreeMap;
use std::fmt;

/// The part a parameter plays in the split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// First weight of a pair, split on its output dim (and its bias).
    Column,
    /// Second weight of a pair, split on its input dim.
    Row,
    /// A lookup table split on its rows (vocabulary).
    VocabTable,
    /// An output head split on the vocabulary.
    VocabHead,
    /// Replicated.
    Replicated,
    /// Set by a user override.
    Override,
}

/// How one parameter is laid out, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamPlan {
    /// The part it plays.
    pub role: Role,
    /// Global shape.
    pub shape: Shape,
    /// Placement over the model-parallel axis (the data-parallel axis replicates
    /// parameters).
    pub placement: Placement,
    /// The rule that decided it (e.g. `column of pair with layers.0.mlp.down_proj.weight`).
    pub reason: String,
}

/// Placements for every parameter of a model on a mesh.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    /// The mesh the plan is for.
    pub mesh: Mesh,
    /// Parameter name -> plan.
    pub params: BTreeMap<String, ParamPlan>,
    /// The rank this copy of the plan is for, when bound ([`ShardPlan::at_rank`]): a
    /// sharded checkpoint load reads this rank's slices.
    pub rank: Option<usize>,
}

impl ShardPlan {
    /// The plan bound to `rank` of its mesh (what a sharded load needs to pick its slices);
    /// an error when the mesh has no such rank.
    pub fn at_rank(&self, rank: usize) -> Result<ShardPlan> {
        if rank >= self.mesh.size() {
            return Err(Error::config("shard plan", format!("rank {rank} is not in mesh {}", self.mesh)));
        }
        Ok(ShardPlan { rank: Some(rank), ..self.clone() })
    }

    /// This rank's position along `axis`, for a plan bound to a rank (`None` otherwise).
    pub fn index_along(&self, axis: MeshAxis) -> Option<usize> {
        self.rank.map(|r| self.mesh.index_along(r, axis))
    }

    /// The placements of parameter `name` (replicated when the plan does not name it).
    pub fn placements(&self, name: &str) -> Placements {
        let p = self.params.get(name).map(|p| p.placement).unwrap_or(Placement::Replicate);
        Placements::REPLICATED.with(MeshAxis::Mp, p)
    }

    /// The model-parallel placement of every parameter.
    pub fn summary(&self) -> BTreeMap<String, Placement> {
        self.params.iter().map(|(k, v)| (k.clone(), v.placement)).collect()
    }

    /// Bytes of parameters held by one rank (for `dtype_bytes` per element).
    pub fn bytes_per_rank(&self, dtype_bytes: usize) -> usize {
        self.params
            .values()
            .map(|p| {
                let n = p.shape.elem_count();
                match p.placement {
                    Placement::Shard(_) => n / self.mesh.mp,
                    _ => n,
                }
            })
            .sum::<usize>()
            * dtype_bytes
    }

    /// Applies user overrides, Redco-style: each `(regex, placement)` sets the model-parallel
    /// placement of every parameter whose name matches (later rules win). A regex that is
    /// invalid or matches no parameter is an error, as is a split the mesh does not divide.
    pub fn with_overrides(mut self, rules: &[(&str, Placement)]) -> Result<Self> {
        for (pat, pl) in rules {
            let re = regex::Regex::new(pat)
                .map_err(|e| Error::config("sharding override", format!("`{pat}` is not a valid regex: {e}")))?;
            let mut hit = false;
            for (name, p) in self.params.iter_mut() {
                if re.is_match(name) {
                    hit = true;
                    if let Placement::Shard(d) = pl {
                        if *d >= p.shape.rank() || p.shape.dims()[*d] % self.mesh.mp != 0 {
                            return Err(Error::Parameter {
                                name: name.clone(),
                                msg: format!(
                                    "override `{pat}` splits dim {d} of {}, which mp={} does not divide",
                                    p.shape, self.mesh.mp
                                ),
                            });
                        }
                    }
                    p.placement = *pl;
                    p.role = Role::Override;
                    p.reason = format!("override `{pat}`");
                }
            }
            if !hit {
                return Err(Error::config("sharding override", format!("`{pat}` matches no parameter")));
            }
        }
        Ok(self)
    }

    /// Lays out every parameter of `model` as planned: each rank keeps its slice (no
    /// communication) as a fresh variable. `comm` is this rank's communicator (`None` on one
    /// device); its mesh must be the plan's.
    pub fn apply<B: Backend, M: Module<B> + ?Sized>(&self, model: &mut M, comm: Option<&Comm<B>>) -> Result<()> {
        self.apply_except(model, comm, &|_| false)
    }

    /// [`ShardPlan::apply`] to every parameter but those `skip` names (already laid out
    /// otherwise, e.g. ZeRO-3 pieces cut while the model was built).
    pub fn apply_except<B: Backend, M: Module<B> + ?Sized>(
        &self,
        model: &mut M,
        comm: Option<&Comm<B>>,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<()> {
        let mesh = comm.map(|c| c.mesh()).unwrap_or_else(Mesh::single);
        if mesh != self.mesh {
            return Err(Error::config(
                "apply plan",
                match comm {
                    Some(_) => format!("the plan is for mesh {} but this run has mesh {mesh}", self.mesh),
                    None => "a plan for several ranks must be applied inside an SPMD run, with the rank's communicator"
                        .into(),
                },
            ));
        }
        let mut err = None;
        model.visit_mut("", &mut |name, t| {
            if err.is_some() || skip(name) {
                return;
            }
            match t.redistribute(self.placements(name)) {
                // a frozen parameter stays frozen
                Ok(s) => *t = if t.is_var() { s.detach().into_var() } else { s.detach() },
                Err(e) => err = Some(Error::Parameter { name: name.into(), msg: e.to_string() }),
            }
        });
        err.map_or(Ok(()), Err)
    }
}

impl fmt::Display for ShardPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "sharding plan for mesh {} (dp x mp)", self.mesh)?;
        for (name, p) in &self.params {
            let pl = match p.placement {
                Placement::Shard(0) if p.shape.rank() == 2 => "split rows (dim 0)".to_string(),
                Placement::Shard(d) => format!("split dim {d}"),
                Placement::Replicate => "replicated".into(),
                Placement::Partial(_) => "partial".into(),
            };
            writeln!(f, "  {name:<48} {:<14} {pl:<20} {}", p.shape.to_string(), p.reason)?;
        }
        Ok(())
    }
}
