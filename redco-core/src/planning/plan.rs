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
    /// The block format it is held in, when quantized ([`ShardPlan::with_quant`]).
    pub quant: Option<crate::quant::QuantFormat>,
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
    /// Expert parallelism: the number of `dp` ranks the experts of a mixture of experts are
    /// split over (1: every rank holds every expert). Set with [`ShardPlan::with_ep`].
    pub ep: usize,
}

/// Whether `name` is a parameter stacked over the experts of a mixture of experts: its name
/// has a `*` where a checkpoint names the expert (`mlp.experts.*.gate_proj.weight` is the
/// `[E, ..]` stack of `mlp.experts.0.gate_proj.weight`, …).
pub fn is_expert_stack(name: &str) -> bool {
    name.split('.').any(|p| p == "*")
}

/// The expert a parameter of a mixture of experts belongs to, under a checkpoint's names
/// (`…experts.3.w1.weight`: `Some(3)`); `None` for every other name.
pub fn expert_index(name: &str) -> Option<usize> {
    let mut parts = name.split('.');
    while let Some(p) = parts.next() {
        if p == "experts" {
            return parts.next().and_then(|i| i.parse().ok());
        }
    }
    None
}

/// Whether `name` is an expert's weight: a stack over experts ([`is_expert_stack`]) or one
/// expert's own tensor under a checkpoint's names ([`expert_index`]).
pub fn is_expert_param(name: &str) -> bool {
    is_expert_stack(name) || expert_index(name).is_some()
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

    /// The placements of parameter `name` (replicated when the plan does not name it); a
    /// stack of experts ([`is_expert_stack`]) is split on its expert dim over `dp` under
    /// expert parallelism.
    pub fn placements(&self, name: &str) -> Placements {
        let p = self.params.get(name).map(|p| p.placement).unwrap_or(Placement::Replicate);
        let placed = Placements::REPLICATED.with(MeshAxis::Mp, p);
        if self.ep > 1 && is_expert_stack(name) {
            placed.with(MeshAxis::Dp, Placement::Shard(0))
        } else {
            placed
        }
    }

    /// The experts `lo..hi` of the `count` stacked as `stack` that dp position `at` keeps:
    /// its share where the plan splits the stack over dp (expert parallelism), else all.
    pub fn expert_share(&self, stack: &str, count: usize, at: usize) -> (usize, usize) {
        match self.placements(stack).get(MeshAxis::Dp) {
            Placement::Shard(0) if self.mesh.dp > 1 && count.is_multiple_of(self.mesh.dp) => {
                let each = count / self.mesh.dp;
                (at * each, (at + 1) * each)
            }
            _ => (0, count),
        }
    }

    /// The plan with the experts split over `ep` ranks of `dp` (expert parallelism). `ep`
    /// must be the mesh's `dp` (a split over part of `dp` is not supported yet), and every
    /// stack of experts must split evenly; `ep` = 1 keeps every expert on every rank.
    pub fn with_ep(mut self, ep: usize) -> Result<Self> {
        if ep == 0 {
            return Err(Error::config("expert parallelism", "--ep 0: at least one rank holds the experts"));
        }
        if ep > 1 && ep != self.mesh.dp {
            return Err(Error::unsupported(
                "expert parallelism",
                format!(
                    "--ep {ep} on mesh {} splits the experts over part of dp, which is not supported yet: use --ep {} (all of dp) or 1",
                    self.mesh, self.mesh.dp
                ),
            ));
        }
        if ep > 1 {
            if !self.params.keys().any(|n| is_expert_param(n)) {
                return Err(Error::config("expert parallelism", format!("--ep {ep}: the model has no experts")));
            }
            // stacks carry the expert count in their first dim; a checkpoint's names in
            // their indices
            let stack = self.params.iter().find(|(n, p)| is_expert_stack(n) && !p.shape.dims().is_empty());
            let experts = match stack {
                Some((_, p)) => p.shape.dims()[0],
                None => self.params.keys().filter_map(|n| expert_index(n)).max().map_or(0, |m| m + 1),
            };
            if !experts.is_multiple_of(ep) {
                return Err(Error::config(
                    "expert parallelism",
                    format!("{experts} experts do not split over --ep {ep} ranks"),
                ));
            }
        }
        self.ep = ep;
        Ok(self)
    }

    /// The model-parallel placement of every parameter.
    pub fn summary(&self) -> BTreeMap<String, Placement> {
        self.params.iter().map(|(k, v)| (k.clone(), v.placement)).collect()
    }

    /// Bytes of parameters held by one rank (for `dtype_bytes` per element; a quantized
    /// parameter its blocks' bytes).
    pub fn bytes_per_rank(&self, dtype_bytes: usize) -> usize {
        self.params
            .iter()
            .map(|(name, p)| {
                let n = p.shape.elem_count();
                let n = match p.placement {
                    Placement::Shard(_) => n / self.mesh.mp,
                    _ => n,
                };
                let n = if is_expert_param(name) { n / self.ep.max(1) } else { n };
                match p.quant {
                    Some(f) => n / f.block_values() * f.block_bytes(),
                    None => n * dtype_bytes,
                }
            })
            .sum::<usize>()
    }

    /// The plan with the linear weights (rank 2, not embeddings, norms or a mixture's
    /// routers) held as blocks of `format` where each rank's part of a row is whole blocks
    /// (`Q8_0` where a K format's split falls between blocks of 32 only, floats where not
    /// even those: [`crate::quant::QuantFormat::held_as`]), and the parameters `stored`
    /// names in the formats a checkpoint holds them in (a GGUF file's blocks), the same way.
    pub fn with_quant(
        mut self,
        format: Option<crate::quant::QuantFormat>,
        stored: &BTreeMap<String, crate::quant::QuantFormat>,
    ) -> Self {
        let mp = self.mesh.mp;
        for (name, p) in self.params.iter_mut() {
            // a rank's part of each row must be whole blocks (else `Q8_0`, or floats:
            // `--quantize` leaves it, a stored one is dequantized as it is read)
            let k = p.shape.dims().get(1).copied().unwrap_or(0);
            let local = k / if p.placement == Placement::Shard(1) { mp } else { 1 };
            if let Some(&f) = stored.get(name) {
                p.quant = f.held_as(k, local);
                continue;
            }
            let Some(f) = format else { continue };
            let linear = p.shape.rank() == 2
                && name.ends_with(".weight")
                && !name.contains("embed")
                && !name.ends_with(".gate.weight")
                && !name.contains("norm")
                && !is_expert_param(name);
            if linear {
                p.quant = f.held_as(k, local);
            }
        }
        self
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
        if self.ep > 1 {
            writeln!(f, "  experts split over {} ranks of dp (expert parallelism)", self.ep)?;
        }
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
