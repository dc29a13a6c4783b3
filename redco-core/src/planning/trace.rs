//! The two rules, read off one traced forward pass.
//!
//! 1. *Pairs.* A weight whose matmul output reaches another weight's matmul, as the
//!    contracted dim (or an expert stack's grouped matmul reaches another's), only through
//!    ops that stay local along the split (elementwise ops,
//!    reshapes that carry the split, permutes, per-head attention matmuls, softmax or a
//!    norm over another dim, rotary embedding) forms a pair with it: the first is split on its
//!    output dim (column), the second on its input dim (row). Weights met on the way whose
//!    outputs join the split path (gate and up, q and k and v) are columns of the same
//!    pair, and biases added to a column output split with it.
//! 2. *Vocabulary and the rest.* Lookup tables and a head whose split output reaches the
//!    loss (or the model output) along the vocabulary dim split the vocabulary; a lookup
//!    table whose features feed a pair (T5's relative-attention bias) splits its features
//!    with it; everything else is replicated.
//!
//! Names play no part: the plan is the same after every parameter is renamed.

use super::plan::{ParamPlan, Role, ShardPlan};
use crate::autograd::OpMeta;
use crate::runtime::mesh::Mesh;
use crate::sharding::rules::reshape_dim;
use crate::{Backend, Error, Placement, Result, Tensor, TensorId};
use std::collections::{BTreeMap, HashMap, HashSet};

const ELEMENTWISE_UNARY: &[&str] = &[
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "recip",
    "abs",
    "tanh",
    "sigmoid",
    "relu",
    "silu",
    "gelu",
    "gelu_tanh",
    "erf",
    "sin",
    "cos",
    "square",
    "affine",
    "powf",
    "clamp_min",
    "cast",
];
const BINARY: &[&str] = &["add", "sub", "mul", "div", "maximum", "minimum", "where_cond"];
/// Ops besides the elementwise ones that pass a value through unchanged in kind (for
/// tracing a value back to its weight).
const PASS_EXTRA: &[&str] =
    &["reshape", "permute", "expand", "rotary", "narrow", "softmax", "log_softmax", "where_cond"];

fn passes(op: &str) -> bool {
    ELEMENTWISE_UNARY.contains(&op) || PASS_EXTRA.contains(&op)
}

/// The recorded graph behind some outputs.
struct Graph<B: Backend> {
    nodes: HashMap<TensorId, Tensor<B>>,
    consumers: HashMap<TensorId, Vec<(TensorId, usize)>>,
    outputs: HashSet<TensorId>,
    params: HashMap<TensorId, String>,
}

impl<B: Backend> Graph<B> {
    fn new(params: &[(String, Tensor<B>)], outputs: &[&Tensor<B>]) -> Self {
        let mut nodes = HashMap::new();
        let mut consumers: HashMap<TensorId, Vec<(TensorId, usize)>> = HashMap::new();
        let mut stack: Vec<Tensor<B>> = outputs.iter().map(|t| (*t).clone()).collect();
        while let Some(t) = stack.pop() {
            if nodes.contains_key(&t.id()) {
                continue;
            }
            for (i, inp) in t.op_inputs().iter().enumerate() {
                consumers.entry(inp.id()).or_default().push((t.id(), i));
                stack.push(inp.clone());
            }
            nodes.insert(t.id(), t);
        }
        Graph {
            nodes,
            consumers,
            outputs: outputs.iter().map(|t| t.id()).collect(),
            params: params.iter().map(|(n, t)| (t.id(), n.clone())).collect(),
        }
    }

    fn op(&self, id: TensorId) -> &str {
        self.nodes[&id].op_name().unwrap_or("")
    }

    /// The weight whose matmul produced `id`, following value-preserving ops and bias adds.
    fn source_weight(&self, mut id: TensorId) -> Option<TensorId> {
        for _ in 0..64 {
            let t = &self.nodes[&id];
            let op = t.op_name()?;
            let ins = t.op_inputs();
            if op == "grouped_matmul" {
                // an expert stack's product: the stack is the weight
                return ins.get(1).map(|w| w.id()).filter(|w| self.params.contains_key(w));
            }
            if op == "matmul" {
                // a weight matmul ends the search; a product of activations (attention
                // scores) is split like its left operand
                match ins.get(1).map(|w| w.id()).filter(|w| self.params.contains_key(w)) {
                    Some(w) => return Some(w),
                    None => {
                        id = ins.first()?.id();
                        continue;
                    }
                }
            }
            if op == "index_select" {
                return ins.first().map(|w| w.id()).filter(|w| self.params.contains_key(w));
            }
            if op == "attention" {
                // split like its queries
                id = ins.first()?.id();
                continue;
            }
            id = if passes(op) {
                ins.first()?.id()
            } else if op == "add" {
                // a bias add: follow the non-parameter side
                ins.iter().find(|x| !self.params.contains_key(&x.id()))?.id()
            } else {
                return None;
            };
        }
        None
    }
}

/// What the walk from one candidate column found.
#[derive(Default)]
struct Walk {
    rows: Vec<(TensorId, usize)>,
    columns: Vec<TensorId>,
    biases: Vec<TensorId>,
    vocab_end: bool,
    why_not: Option<String>,
}

/// Follows a split on dim `s` of `start` through its consumers.
fn walk<B: Backend>(g: &Graph<B>, start: TensorId, s0: usize, mp: usize) -> Walk {
    let mut w = Walk::default();
    let mut stack = vec![(start, s0)];
    let mut seen = HashSet::new();
    let fail = |w: &mut Walk, msg: String| {
        if w.why_not.is_none() {
            w.why_not = Some(msg);
        }
    };
    while let Some((id, s)) = stack.pop() {
        if !seen.insert((id, s)) || w.why_not.is_some() {
            continue;
        }
        let t = &g.nodes[&id];
        let rank = t.rank();
        let cons = g.consumers.get(&id).cloned().unwrap_or_default();
        if cons.is_empty() || g.outputs.contains(&id) {
            if s + 1 == rank {
                w.vocab_end = true;
            } else if cons.is_empty() {
                fail(&mut w, format!("the split reaches an output along dim {s}"));
            }
        }
        for (cid, idx) in cons {
            let c = &g.nodes[&cid];
            let op = g.op(cid);
            let meta = c.op_meta().cloned().unwrap_or_default();
            let cr = c.rank();
            if ELEMENTWISE_UNARY.contains(&op) || op == "redistribute" {
                stack.push((cid, s));
            } else if BINARY.contains(&op) {
                let os = s + cr - rank;
                for (j, other) in c.op_inputs().iter().enumerate() {
                    if j == idx {
                        continue;
                    }
                    let off = cr - other.rank();
                    let full = os >= off && other.dims()[os - off] > 1;
                    if !full {
                        continue;
                    }
                    if g.params.contains_key(&other.id()) && other.rank() == 1 && (op == "add" || op == "sub") {
                        w.biases.push(other.id());
                    } else if let Some(src) = g.source_weight(other.id()) {
                        w.columns.push(src);
                    } else {
                        fail(&mut w, format!("{op} combines the split with an unsplit value"));
                    }
                }
                stack.push((cid, os));
            } else if op == "reshape" {
                match reshape_dim(t.shape(), c.shape(), s, mp) {
                    Some(ns) => stack.push((cid, ns)),
                    None => fail(
                        &mut w,
                        format!(
                            "does not split {mp} ways: reshape {} -> {} cannot carry the split of dim {s}",
                            t.shape(),
                            c.shape()
                        ),
                    ),
                }
            } else if op == "permute" {
                match meta {
                    OpMeta::Permute(p) => stack.push((cid, p.iter().position(|&x| x == s).unwrap_or(s))),
                    _ => fail(&mut w, "permute without its permutation".into()),
                }
            } else if op == "expand" {
                stack.push((cid, s + cr - rank));
            } else if matches!(op, "sum" | "max" | "min" | "narrow" | "cat") {
                match meta {
                    OpMeta::Dim(d) if d != s => stack.push((cid, s)),
                    _ => fail(&mut w, format!("{op} along the split dim")),
                }
            } else if matches!(op, "softmax" | "log_softmax") {
                if s + 1 == rank {
                    fail(&mut w, format!("{op} over the split dim"));
                } else {
                    stack.push((cid, s));
                }
            } else if matches!(op, "rms_norm" | "layer_norm") && idx == 0 {
                // normalised over the last dim (Qwen3's QK-norm: each head over its own
                // features): local along any other; its weight and bias stay whole
                if s + 1 == rank {
                    fail(&mut w, format!("{op} over the split dim"));
                } else {
                    stack.push((cid, s));
                }
            } else if op == "rotary" {
                if s + 2 >= rank {
                    fail(&mut w, "rotary over the split dim".into());
                } else {
                    stack.push((cid, s));
                }
            } else if op == "attention" && idx < 3 {
                // q, k and v split by batch or heads: the output splits the same way, and
                // the other two are split alike by their own weights' walks
                if s + 2 >= rank {
                    fail(&mut w, "attention over the split dim".into());
                } else {
                    for (j, other) in c.op_inputs().iter().enumerate().take(3) {
                        if j != idx {
                            if let Some(src) = g.source_weight(other.id()) {
                                w.columns.push(src);
                            }
                        }
                    }
                    stack.push((cid, s));
                }
            } else if op == "cross_entropy" && s + 1 == rank {
                w.vocab_end = true;
            } else if op == "grouped_matmul" {
                // the experts' product `x [T, k]` by a stack `w [E, n, k]` (or `[E, k, n]`):
                // a split of x's last dim is contracted against the stack (a row of the
                // pair), a split of its rows passes to the output's rows
                let OpMeta::Matmul { trans_b, .. } = meta else {
                    fail(&mut w, "grouped_matmul without its flags".into());
                    continue;
                };
                let other = &c.op_inputs()[1];
                if idx == 0 && s + 1 == rank && g.params.contains_key(&other.id()) {
                    w.rows.push((other.id(), if trans_b { 2 } else { 1 }));
                } else if idx == 0 && s + 1 < rank {
                    stack.push((cid, s));
                } else {
                    fail(&mut w, "the split reaches an expert stack".into());
                }
            } else if op == "matmul" {
                let OpMeta::Matmul { trans_a, trans_b } = meta else {
                    fail(&mut w, "matmul without its flags".into());
                    continue;
                };
                let ins = c.op_inputs();
                let other = &ins[1 - idx];
                let (tr, is_lhs) = if idx == 0 { (trans_a, true) } else { (trans_b, false) };
                let last = s + 1 == rank;
                let batch = s + 2 < rank;
                let contracted = !batch && (if is_lhs { last != tr } else { last == tr });
                if batch {
                    // The other operand of a per-head matmul (keys for queries, values for
                    // probabilities) is split the same way by its own weight's walk.
                    if other.rank() > 2 {
                        if let Some(src) = g.source_weight(other.id()) {
                            w.columns.push(src);
                        }
                    }
                    stack.push((cid, s + cr - rank));
                } else if contracted {
                    if is_lhs && g.params.contains_key(&other.id()) && other.rank() == 2 {
                        let in_dim = if trans_b { 1 } else { 0 };
                        w.rows.push((other.id(), in_dim));
                    } else {
                        fail(&mut w, "the split is contracted against an activation".into());
                    }
                } else {
                    // a split of rows of the lhs or columns of the rhs passes to the output
                    stack.push((cid, if is_lhs { cr - 2 } else { cr - 1 }));
                }
            } else {
                fail(&mut w, format!("{op} needs the split dim whole"));
            }
        }
    }
    w
}

/// Derives the plan for `params` from the graph recorded behind `outputs` (a forward pass
/// run with the parameters as variables, on one device), for `mesh`.
///
/// `strict`: when a pair cannot split evenly (heads or sizes the mesh does not divide),
/// return an error instead of replicating it.
pub fn plan_from_trace<B: Backend>(
    params: &[(String, Tensor<B>)],
    outputs: &[&Tensor<B>],
    mesh: Mesh,
    strict: bool,
) -> Result<ShardPlan> {
    let g = Graph::new(params, outputs);
    let mp = mesh.mp;
    let mut chosen: BTreeMap<TensorId, (Placement, Role, String)> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut failed: HashMap<TensorId, String> = HashMap::new();
    let name = |id: &TensorId| g.params.get(id).cloned().unwrap_or_default();
    for (pname, p) in params {
        if p.rank() != 2 && p.rank() != 3 {
            continue;
        }
        for (cid, idx) in g.consumers.get(&p.id()).cloned().unwrap_or_default() {
            let op = g.op(cid);
            let meta = g.nodes[&cid].op_meta().cloned().unwrap_or_default();
            let (out_dim, table) = match (op, meta, idx, p.rank()) {
                ("matmul", OpMeta::Matmul { trans_b, .. }, 1, 2) => (if trans_b { 0 } else { 1 }, false),
                // a stack of experts `[E, n, k]` (or `[E, k, n]`): each expert's output dim
                ("grouped_matmul", OpMeta::Matmul { trans_b, .. }, 1, 3) => (if trans_b { 1 } else { 2 }, false),
                ("index_select", OpMeta::Dim(0), 0, 2) => (1, true),
                _ => continue,
            };
            let c = &g.nodes[&cid];
            let w = walk(&g, cid, c.rank() - 1, mp);
            if let Some(why) = &w.why_not {
                if why.starts_with("does not split") {
                    problems.push(format!("{pname}: {why}"));
                    failed.entry(p.id()).or_insert_with(|| format!("replicated: {why}"));
                }
            }
            // A row partner that is also a lookup table (a head tied to the embedding) is
            // split over the vocabulary instead, so it cannot close a pair: the column side
            // stays replicated (OPT-350m's project_out before the tied head).
            let tied_row = w.rows.iter().any(|(r, _)| {
                g.consumers.get(r).is_some_and(|v| v.iter().any(|(x, i)| g.op(*x) == "index_select" && *i == 0))
            });
            if tied_row {
                break;
            }
            if w.why_not.is_none() && !w.rows.is_empty() && !w.vocab_end {
                let pair = w.rows.iter().map(|(r, _)| name(r)).collect::<Vec<_>>().join(", ");
                let mut members: Vec<(TensorId, Placement, Role, String)> =
                    vec![(p.id(), Placement::Shard(out_dim), Role::Column, format!("column of pair with {pair}"))];
                for c in &w.columns {
                    let lookup = g.consumers.get(c).is_some_and(|v| v.iter().any(|(x, _)| g.op(*x) == "index_select"));
                    // an expert stack splits each expert's output dim
                    let stacked = g.consumers.get(c).and_then(|v| {
                        v.iter().find(|(x, i)| g.op(*x) == "grouped_matmul" && *i == 1).map(|(x, _)| {
                            match g.nodes[x].op_meta() {
                                Some(OpMeta::Matmul { trans_b: false, .. }) => 2,
                                _ => 1,
                            }
                        })
                    });
                    members.push((
                        *c,
                        Placement::Shard(stacked.unwrap_or(if lookup { 1 } else { 0 })),
                        Role::Column,
                        format!("column of pair with {pair}"),
                    ));
                }
                for b in &w.biases {
                    members.push((*b, Placement::Shard(0), Role::Column, "bias of a column".into()));
                }
                for (r, d) in &w.rows {
                    members.push((*r, Placement::Shard(*d), Role::Row, format!("row of pair with {pname}")));
                }
                let uneven: Vec<String> = members
                    .iter()
                    .filter_map(|(id, pl, _, _)| match pl {
                        Placement::Shard(d) => {
                            let t = &g
                                .nodes
                                .get(id)
                                .cloned()
                                .or_else(|| params.iter().find(|(_, t)| t.id() == *id).map(|(_, t)| t.clone()))?;
                            (t.dims()[*d] % mp != 0).then(|| format!("{} dim {d} ({})", name(id), t.dims()[*d]))
                        }
                        _ => None,
                    })
                    .collect();
                if !uneven.is_empty() {
                    problems.push(format!("pair of {pname} does not split {mp} ways: {}", uneven.join(", ")));
                    for (id, _, _, _) in members {
                        chosen.insert(
                            id,
                            (
                                Placement::Replicate,
                                Role::Replicated,
                                format!("replicated: pair does not split {mp} ways"),
                            ),
                        );
                    }
                } else {
                    for (id, pl, role, why) in members {
                        chosen.entry(id).or_insert((pl, role, why));
                    }
                }
                break;
            }
            if w.why_not.is_none() && w.rows.is_empty() && w.vocab_end && !table {
                chosen.insert(p.id(), (Placement::Shard(out_dim), Role::VocabHead, "vocabulary split (head)".into()));
                for b in &w.biases {
                    chosen.insert(*b, (Placement::Shard(0), Role::Column, "bias of a vocabulary-split head".into()));
                }
                break;
            }
            if table {
                chosen
                    .insert(p.id(), (Placement::Shard(0), Role::VocabTable, "vocabulary split (lookup table)".into()));
                break;
            }
        }
    }
    if strict && !problems.is_empty() {
        return Err(Error::invalid("sharding plan", problems.join("; ")));
    }
    let mut out = BTreeMap::new();
    for (pname, p) in params {
        let fallback = match failed.get(&p.id()) {
            Some(why) => why.clone(),
            None if p.rank() < 2 => "replicated (under two dims)".into(),
            None => "replicated (no pair)".into(),
        };
        let (mut placement, mut role, mut reason) =
            chosen.get(&p.id()).cloned().unwrap_or((Placement::Replicate, Role::Replicated, fallback));
        if let Placement::Shard(d) = placement {
            if p.dims()[d] % mp != 0 {
                if strict {
                    return Err(Error::Parameter {
                        name: pname.clone(),
                        msg: format!("dim {d} ({}) does not split {mp} ways", p.dims()[d]),
                    });
                }
                reason = format!("replicated: dim {d} ({}) does not split {mp} ways (was: {reason})", p.dims()[d]);
                placement = Placement::Replicate;
                role = Role::Replicated;
            }
        }
        if mp == 1 {
            placement = Placement::Replicate;
        }
        out.insert(pname.clone(), ParamPlan { role, shape: p.shape().clone(), placement, reason, quant: None });
    }
    Ok(ShardPlan { mesh, params: out, rank: None, ep: 1 })
}
