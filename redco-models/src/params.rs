//! Where a model's parameters come from when it is built: a seeded random initialisation, or
//! a checkpoint, read whole or (under tensor parallelism) one rank's slice per tensor as a
//! [`ShardPlan`] places it. Models ask for `(name, shape, init)` and never see placements.

use crate::hf::checkpoint::Checkpoint;
use crate::hf::int4::Int4Layout;
use redco_core::nn::{Init, ParamPlacer};
use redco_core::planning::ShardPlan;
use redco_core::quant::QuantFormat;
use redco_core::{Backend, DType, Error, HostData, MeshAxis, Placement, Placements, Result, Shape, Tensor};
use std::collections::{BTreeMap, BTreeSet};

/// Gives a model its parameters by name while it is built.
pub trait ParamSource<B: Backend> {
    /// The parameter `name` of global `shape`; `init` is how a fresh model would fill it.
    fn param(&mut self, name: &str, shape: Shape, init: Init) -> Result<Tensor<B>>;
    /// The linear weight `name` of float shape `shape` (`[out, in]`) as the blocks it is
    /// stored in (`U8 [out, row_bytes]` and their format, under a plan this rank's part),
    /// when the source keeps it block-quantized; `None` (the default) when the layer is to
    /// ask [`ParamSource::param`] for floats.
    fn blocks(&mut self, name: &str, shape: &Shape) -> Result<Option<(Tensor<B>, QuantFormat)>> {
        let _ = (name, shape);
        Ok(None)
    }
    /// The experts `lo..hi` of the `count` stacked as `stack` (a name with a `*`) this
    /// rank keeps: its share under expert parallelism (the model asks only for those, and
    /// [`ParamSource::skip`]s the others), every expert by default.
    fn expert_range(&self, stack: &str, count: usize) -> (usize, usize) {
        let _ = stack;
        (0, count)
    }
    /// Parameter `name` is not made on this rank (another rank's expert): a seeded source
    /// still counts it, so that every later parameter is drawn as on one device; a
    /// checkpoint counts it as read.
    fn skip(&mut self, name: &str) {
        let _ = name;
    }
    /// The experts' tensors `parts` (each of `part_shape`) stacked as `stack` (a name with
    /// a `*`), `[E, ..]`: this rank's share only ([`ParamSource::expert_range`]), each
    /// expert read or drawn as [`ParamSource::param`] gives it ([`stack_experts_of`]).
    fn stack(&mut self, stack: &str, parts: &[String], part_shape: Shape, init: Init) -> Result<Tensor<B>> {
        stack_experts_of(self, stack, parts, part_shape, init)
    }
}

/// [`ParamSource::stack`] through `src`'s own `param`, `skip` and `expert_range`: the
/// experts outside this rank's share are skipped, and the stack of its share is split over
/// dp on the expert dim when it is not all of them.
pub fn stack_experts_of<B: Backend, S: ParamSource<B> + ?Sized>(
    src: &mut S,
    stack: &str,
    parts: &[String],
    part_shape: Shape,
    init: Init,
) -> Result<Tensor<B>> {
    let e = parts.len();
    let (lo, hi) = src.expert_range(stack, e);
    let mut mine = Vec::with_capacity(hi.saturating_sub(lo));
    for (j, name) in parts.iter().enumerate() {
        if (lo..hi).contains(&j) {
            mine.push(src.param(name, part_shape.clone(), init)?);
        } else {
            src.skip(name);
        }
    }
    let mine = stack_experts(&mine, stack)?;
    if (lo, hi) == (0, e) {
        return Ok(mine);
    }
    // this rank's share of the stack, split over dp on the expert dim
    let mut whole = mine.dims().to_vec();
    whole[0] = e;
    let placed = mine.placements().with(MeshAxis::Dp, Placement::Shard(0));
    let (b, local) = (mine.backend(), mine.local_shape().clone());
    Ok(Tensor::from_local(b, mine.storage().clone(), Shape::new(whole), local, placed, mine.dtype()).into_var())
}

/// Each expert's tensor `[out, in]` stacked into `[E, out, in]` (named `name`): whole, or
/// as this rank's pieces where a plan split each expert over `mp` (the stack is then split
/// one dim further in).
fn stack_experts<B: Backend>(parts: &[Tensor<B>], name: &str) -> Result<Tensor<B>> {
    let first = parts.first().ok_or_else(|| Error::config("moe", format!("`{name}`: no experts")))?;
    let placed = first.placements();
    if parts.iter().any(|t| t.placements() != placed) {
        return Err(Error::invalid("moe", format!("`{name}`: the experts are split differently")));
    }
    if !first.is_sharded() {
        let rows = parts.iter().map(|t| t.detach().unsqueeze(0)).collect::<Result<Vec<_>>>()?;
        return Ok(Tensor::cat(&rows.iter().collect::<Vec<_>>(), 0)?.into_var());
    }
    let d = match (placed.get(MeshAxis::Dp), placed.get(MeshAxis::Mp)) {
        (Placement::Replicate, Placement::Shard(d)) => d,
        _ => {
            return Err(Error::unsupported(
                "moe",
                format!("`{name}`: experts split over dp while they load (ZeRO-3 pieces) are not supported yet"),
            ))
        }
    };
    let b = first.backend();
    let local = parts
        .iter()
        .map(|t| Tensor::from_storage(b, t.storage().clone(), t.local_shape().clone(), t.dtype()).unsqueeze(0))
        .collect::<Result<Vec<_>>>()?;
    let cat = Tensor::cat(&local.iter().collect::<Vec<_>>(), 0)?;
    let mut whole = vec![parts.len()];
    whole.extend_from_slice(first.dims());
    let placed = Placements::REPLICATED.with(MeshAxis::Mp, Placement::Shard(d + 1));
    Ok(Tensor::from_local(b, cat.storage().clone(), Shape::new(whole), cat.shape().clone(), placed, first.dtype())
        .into_var())
}

/// Another source's parameters handed to a [`ParamPlacer`] as they are made (the trainer's
/// keeps only this rank's part of each, so a model built through it is never whole).
pub struct Placed<'a, B: Backend> {
    inner: &'a mut dyn ParamSource<B>,
    placer: &'a dyn ParamPlacer<B>,
}

impl<'a, B: Backend> Placed<'a, B> {
    /// `inner`'s parameters, placed by `placer`.
    pub fn new(inner: &'a mut dyn ParamSource<B>, placer: &'a dyn ParamPlacer<B>) -> Self {
        Placed { inner, placer }
    }
}

impl<B: Backend> ParamSource<B> for Placed<'_, B> {
    fn param(&mut self, name: &str, shape: Shape, init: Init) -> Result<Tensor<B>> {
        let inner = &mut *self.inner;
        self.placer.place(name, &shape, &mut || inner.param(name, shape.clone(), init))
    }
    fn blocks(&mut self, name: &str, shape: &Shape) -> Result<Option<(Tensor<B>, QuantFormat)>> {
        // blocks are only read to serve: they are placed by the plan the source reads with
        self.inner.blocks(name, shape)
    }
    fn expert_range(&self, stack: &str, count: usize) -> (usize, usize) {
        self.placer.expert_range(stack, count)
    }
    fn skip(&mut self, name: &str) {
        self.inner.skip(name)
    }
    fn stack(&mut self, stack: &str, parts: &[String], part_shape: Shape, init: Init) -> Result<Tensor<B>> {
        if !self.placer.shares_by_shape() {
            let made = stack_experts_of(self, stack, parts, part_shape, init)?;
            return self.placer.place_stack(stack, made);
        }
        // a placer that shares buffers by shape (the planning trace) gets the whole stack
        // as one parameter: one buffer per stack shape, not one stack per layer
        let mut whole = vec![parts.len()];
        whole.extend_from_slice(part_shape.dims());
        let inner = &mut *self.inner;
        self.placer.place(stack, &Shape::new(whole), &mut || inner.stack(stack, parts, part_shape.clone(), init))
    }
}

/// Another source whose linear weights (`*proj.weight`, `lm_head.weight`, ...: every
/// weight a layer asks for as [`ParamSource::blocks`], apart from a mixture's routers) are
/// quantized to blocks of `format` as they are made, each rank's part where it lies
/// (`--quantize`); a weight whose rows (this rank's part of them) are not whole blocks
/// stays in floats and is listed in [`Quantizing::left`]. The float model is never whole:
/// one layer's float weight at a time.
pub struct Quantizing<'a, B: Backend> {
    inner: &'a mut dyn ParamSource<B>,
    format: QuantFormat,
    left: Vec<String>,
    pending: Option<(String, Tensor<B>)>,
}

impl<'a, B: Backend> Quantizing<'a, B> {
    /// `inner`'s parameters with the linear weights as blocks of `format`.
    pub fn new(inner: &'a mut dyn ParamSource<B>, format: QuantFormat) -> Self {
        Quantizing { inner, format, left: Vec::new(), pending: None }
    }
    /// The weights left in floats so far (rows not whole blocks).
    pub fn left(&self) -> &[String] {
        &self.left
    }
}

impl<B: Backend> ParamSource<B> for Quantizing<'_, B> {
    fn param(&mut self, name: &str, shape: Shape, init: Init) -> Result<Tensor<B>> {
        match self.pending.take() {
            Some((n, t)) if n == name => Ok(t),
            _ => self.inner.param(name, shape, init),
        }
    }
    fn blocks(&mut self, name: &str, shape: &Shape) -> Result<Option<(Tensor<B>, QuantFormat)>> {
        if let Some(stored) = self.inner.blocks(name, shape)? {
            return Ok(Some(stored));
        }
        if name.ends_with(".gate.weight") || shape.rank() != 2 {
            return Ok(None);
        }
        let inp = shape.dims()[1];
        let bound = Init::Uniform(1.0 / (inp.max(1) as f64).sqrt());
        let w = self.inner.param(name, shape.clone(), bound)?;
        let mut l = redco_core::nn::Linear::from_tensors(w, None)?;
        let Some(held) = self.format.held_as(l.weight.dims()[1], l.weight.local_shape().dims()[1]) else {
            // left in floats: the layer asks `param` for it next, and gets this one
            self.left.push(name.to_string());
            self.pending = Some((name.to_string(), l.weight));
            return Ok(None);
        };
        l.quantize(held)?;
        Ok(Some((l.weight, held)))
    }
    fn expert_range(&self, stack: &str, count: usize) -> (usize, usize) {
        self.inner.expert_range(stack, count)
    }
    fn skip(&mut self, name: &str) {
        self.inner.skip(name)
    }
    fn stack(&mut self, stack: &str, parts: &[String], part_shape: Shape, init: Init) -> Result<Tensor<B>> {
        self.inner.stack(stack, parts, part_shape, init)
    }
}

/// Fresh parameters from a seed (each parameter's stream is derived from the seed and the
/// order in which it is asked for).
pub struct RandomInit<'a, B: Backend> {
    b: &'a B,
    dtype: DType,
    seed: u64,
    count: u64,
}

impl<'a, B: Backend> RandomInit<'a, B> {
    /// Parameters of `dtype` on `b`, drawn from `seed`.
    pub fn new(b: &'a B, dtype: DType, seed: u64) -> Self {
        RandomInit { b, dtype, seed, count: 0 }
    }
}

impl<B: Backend> ParamSource<B> for RandomInit<'_, B> {
    fn param(&mut self, _name: &str, shape: Shape, init: Init) -> Result<Tensor<B>> {
        self.count += 1;
        init.var(self.b, shape, self.dtype, self.seed.wrapping_mul(1_000_003).wrapping_add(self.count))
    }
    fn skip(&mut self, _name: &str) {
        self.count += 1;
    }
}

/// Parameters read from a checkpoint and converted to `dtype`. With a plan, inside an SPMD
/// run, each rank reads only the slice its placement keeps.
pub struct CheckpointSource<'a, B: Backend> {
    b: &'a B,
    ckpt: &'a Checkpoint,
    plan: Option<&'a ShardPlan>,
    dtype: DType,
    used: BTreeSet<String>,
    blocks: BTreeMap<String, QuantFormat>,
    int4: Option<Int4Layout>,
}

impl<'a, B: Backend> CheckpointSource<'a, B> {
    /// Reads from `ckpt` on `b`, laid out by `plan` when given.
    pub fn new(b: &'a B, ckpt: &'a Checkpoint, plan: Option<&'a ShardPlan>, dtype: DType) -> Self {
        CheckpointSource { b, ckpt, plan, dtype, used: BTreeSet::new(), blocks: BTreeMap::new(), int4: None }
    }

    /// The linear weights stored as blocks (name to format, from the config's
    /// `quantization_config`): read as they are ([`ParamSource::blocks`]).
    pub fn with_blocks(mut self, blocks: BTreeMap<String, QuantFormat>) -> Self {
        self.blocks = blocks;
        self
    }

    /// The checkpoint is AWQ or GPTQ int4 (`layout`, from the config's
    /// `quantization_config`): the layers it quantizes are read from their packed codes, as
    /// `Q4_1` blocks where [`CheckpointSource::with_blocks`] lists them, else as floats.
    pub fn with_int4(mut self, layout: Option<Int4Layout>) -> Self {
        self.int4 = layout;
        self
    }

    fn int4_of(&self, name: &str) -> Option<Int4Layout> {
        self.int4.as_ref().filter(|l| l.quantizes(name)).cloned()
    }

    /// The int4 weight `name` `[out, in]` unpacked, its tensors marked as read.
    fn read_int4(&mut self, layout: &Int4Layout, name: &str, shape: &Shape) -> Result<crate::hf::int4::Int4Weight> {
        let &[out, inp] = shape.dims() else {
            return Err(Error::Parameter { name: name.into(), msg: format!("`{name}` {shape} is not a matrix") });
        };
        let w = layout.read(self.ckpt, name, out, inp)?;
        for (n, _) in layout.stored(name, out, inp)? {
            self.used.insert(n);
        }
        Ok(w)
    }

    /// An int4 layer as `Q4_1` blocks, this rank's part under a plan; `None` when its
    /// groups do not fall on blocks, or its split over mp falls inside a block (the layer
    /// then asks for floats).
    fn int4_blocks(
        &mut self,
        layout: &Int4Layout,
        name: &str,
        shape: &Shape,
    ) -> Result<Option<(Tensor<B>, QuantFormat)>> {
        let Some(&format) = self.blocks.get(name) else { return Ok(None) };
        let &[out, inp] = shape.dims() else {
            return Err(Error::Parameter { name: name.into(), msg: format!("`{name}` {shape} is not a matrix") });
        };
        let placements = self.plan.map(|p| p.placements(name)).unwrap_or_default();
        if let (Placement::Shard(d), Some(plan)) = (placements.get(MeshAxis::Mp), self.plan) {
            let units = if d == 0 { out } else { inp / format.block_values() };
            if plan.mesh.mp > 1 && d < 2 && !units.is_multiple_of(plan.mesh.mp) {
                // the split falls inside a block: the layer asks `param` for floats next
                return Ok(None);
            }
        }
        let w = self.read_int4(layout, name, shape)?;
        let Some(bytes) = w.to_q4_1() else { return Ok(None) };
        let row = format.row_bytes(inp)?;
        let stored = Shape::new([out, row]);
        let t = match (placements.get(MeshAxis::Mp), self.plan) {
            (Placement::Shard(d), Some(plan)) if plan.mesh.mp > 1 && d < 2 => {
                let k = plan.mesh.mp;
                let i = plan.index_along(MeshAxis::Mp).ok_or_else(|| {
                    Error::config("load", format!("the plan for mesh {} is not bound to a rank", plan.mesh))
                })?;
                let (part, local) = if d == 0 {
                    let rows = out / k;
                    (bytes[i * rows * row..(i + 1) * rows * row].to_vec(), Shape::new([rows, row]))
                } else {
                    let cols = row / k;
                    let part =
                        bytes.chunks_exact(row).flat_map(|r| r[i * cols..(i + 1) * cols].iter().copied()).collect();
                    (part, Shape::new([out, cols]))
                };
                Tensor::from_local(
                    self.b,
                    self.b.upload_owned(HostData::U8(part))?,
                    stored,
                    local,
                    placements,
                    DType::U8,
                )
            }
            (Placement::Partial(_), _) => {
                return Err(Error::invalid("load", format!("parameter `{name}` cannot be planned as a partial sum")))
            }
            _ => Tensor::from_storage(self.b, self.b.upload_owned(HostData::U8(bytes))?, stored, DType::U8),
        };
        Ok(Some((t, format)))
    }

    /// Checks the checkpoint against the model's expected parameters before anything is read:
    /// every missing, unexpected (unless `ignore` says so) or mis-shaped tensor is named.
    pub fn check(ckpt: &Checkpoint, expected: &[(String, Shape)], ignore: &dyn Fn(&str) -> bool) -> Result<()> {
        let mut problems = Vec::new();
        let names: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        for (n, shape) in expected {
            match ckpt.shape(n) {
                None => problems.push(format!("`{n}` is missing")),
                Some(s) if s != shape => {
                    problems.push(format!("`{n}` has shape {s} in the checkpoint but the config needs {shape}"))
                }
                Some(_) => {}
            }
        }
        for (n, _, _) in ckpt.tensors() {
            if !names.contains(n) && !ignore(n) {
                problems.push(format!("`{n}` is unexpected"));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::Parameter {
            name: problems[0].trim_matches('`').split('`').next().unwrap_or("").into(),
            msg: problems.join("; "),
        })
    }

    /// The names read so far.
    pub fn used(&self) -> &BTreeSet<String> {
        &self.used
    }

    /// Stored blocks `name` asked for as floats of `shape` (`[out, in]`: a weight whose
    /// split over `mp` does not fall between blocks): dequantized whole, converted to the
    /// dtype, and this rank's part kept.
    fn dequantized(&mut self, name: &str, shape: Shape, f: QuantFormat) -> Result<Tensor<B>> {
        let bad = |msg: String| Error::Parameter { name: name.into(), msg };
        let HostData::U8(bytes) = self.ckpt.read_as(name, DType::U8)?.data else {
            return Err(bad(format!("`{name}` should hold {f} blocks as bytes")));
        };
        if shape.rank() != 2 || bytes.len() != shape.dims()[0] * f.row_bytes(shape.dims()[1])? {
            return Err(bad(format!("`{name}`: {} bytes are not {f} blocks of {shape}", bytes.len())));
        }
        self.used.insert(name.to_string());
        let values = redco_core::quant::blocks::dequantize(f, &bytes, shape.elem_count())?;
        self.place_whole(name, shape, values)
    }

    /// Stored blocks `name` (`[out, in]` of `f`) split along `in` over mp inside `f`'s
    /// blocks: dequantized whole, this rank's columns taken and quantized to `Q8_0`.
    fn requantized(&mut self, name: &str, shape: &Shape, f: QuantFormat) -> Result<(Tensor<B>, QuantFormat)> {
        let (out, inp) = (shape.dims()[0], shape.dims()[1]);
        let HostData::U8(bytes) = self.ckpt.read_as(name, DType::U8)?.data else {
            return Err(Error::Parameter {
                name: name.into(),
                msg: format!("`{name}` should hold {f} blocks as bytes"),
            });
        };
        let values = redco_core::quant::blocks::dequantize(f, &bytes, out * inp)?;
        let plan = self.plan.ok_or_else(|| Error::config("load", "a split weight needs a plan"))?;
        let k = plan.mesh.mp;
        let i = plan
            .index_along(MeshAxis::Mp)
            .ok_or_else(|| Error::config("load", format!("the plan for mesh {} is not bound to a rank", plan.mesh)))?;
        let cols = inp / k;
        let part: Vec<f32> =
            values.chunks_exact(inp).flat_map(|r| r[i * cols..(i + 1) * cols].iter().copied()).collect();
        let q8 = QuantFormat::Q8_0;
        let blocks = redco_core::quant::quantize(q8, &part)?;
        self.used.insert(name.to_string());
        let placements = plan.placements(name);
        let (global, local) = (Shape::new([out, q8.row_bytes(inp)?]), Shape::new([out, q8.row_bytes(cols)?]));
        let t = Tensor::from_local(
            self.b,
            self.b.upload_owned(HostData::U8(blocks))?,
            global,
            local,
            placements,
            DType::U8,
        );
        Ok((t, q8))
    }

    /// The whole float weight `values` of `shape`, converted to the dtype, this rank's part
    /// kept under a plan.
    fn place_whole(&mut self, name: &str, shape: Shape, values: Vec<f32>) -> Result<Tensor<B>> {
        let bad = |msg: String| Error::Parameter { name: name.into(), msg };
        let whole = Tensor::from_host(self.b, &HostData::F32(values).into_dtype(self.dtype), shape.clone())?;
        let placements = self.plan.map(|p| p.placements(name)).unwrap_or_default();
        let t = match (placements.get(MeshAxis::Mp), self.plan) {
            (Placement::Shard(d), Some(plan)) if plan.mesh.mp > 1 => {
                let (k, n) = (plan.mesh.mp, shape.dims()[d]);
                let i = plan.index_along(MeshAxis::Mp).ok_or_else(|| {
                    Error::config("load", format!("the plan for mesh {} is not bound to a rank", plan.mesh))
                })?;
                if !n.is_multiple_of(k) {
                    return Err(bad(format!("dim {d} of `{name}` {shape} does not split {k} ways")));
                }
                let part = whole.narrow(d as isize, i * (n / k), n / k)?;
                let local = part.shape().clone();
                Tensor::from_local(self.b, part.storage().clone(), shape, local, placements, self.dtype)
            }
            _ => whole,
        };
        Ok(t.into_var())
    }
}

impl<B: Backend> ParamSource<B> for CheckpointSource<'_, B> {
    fn blocks(&mut self, name: &str, shape: &Shape) -> Result<Option<(Tensor<B>, QuantFormat)>> {
        if let Some(layout) = self.int4_of(name) {
            return self.int4_blocks(&layout, name, shape);
        }
        let Some(&format) = self.blocks.get(name) else { return Ok(None) };
        let bad = |msg: String| Error::Parameter { name: name.into(), msg };
        let (out, inp) = match shape.dims() {
            &[o, i] => (o, i),
            _ => return Err(bad(format!("`{name}` is stored as {format} blocks but the model needs {shape}"))),
        };
        let row = format.row_bytes(inp).map_err(|e| bad(format!("`{name}`: {e}")))?;
        let stored = Shape::new([out, row]);
        if self.ckpt.shape(name) != Some(&stored) || self.ckpt.dtype(name) != Some(DType::U8) {
            return Err(bad(format!(
                "`{name}` should hold {format} blocks U8 {stored}, but the checkpoint has {:?} {:?}",
                self.ckpt.dtype(name),
                self.ckpt.shape(name)
            )));
        }
        self.used.insert(name.to_string());
        let placements = self.plan.map(|p| p.placements(name)).unwrap_or_default();
        let t = match (placements.get(MeshAxis::Mp), self.plan) {
            (Placement::Shard(d), Some(plan)) if plan.mesh.mp > 1 => {
                // the rules' dimension; along `in` the split must fall between blocks
                let k = plan.mesh.mp;
                let units = if d == 0 { out } else { inp / format.block_values() };
                if d > 1 {
                    return Err(bad(format!("`{name}` cannot be split along dim {d}")));
                }
                if !units.is_multiple_of(k) {
                    // the split does not fall between blocks: this rank's part as Q8_0
                    // where it is whole blocks of 32 (`QuantFormat::held_as`), else the
                    // layer asks `param` for floats next, and gets this weight dequantized
                    if d == 1 && format.held_as(inp, inp / k) == Some(QuantFormat::Q8_0) {
                        return self.requantized(name, shape, format).map(Some);
                    }
                    self.used.remove(name);
                    return Ok(None);
                }
                let i = plan.index_along(MeshAxis::Mp).ok_or_else(|| {
                    Error::config("load", format!("the plan for mesh {} is not bound to a rank", plan.mesh))
                })?;
                let n = stored.dims()[d];
                let part = self.ckpt.read_slice_as(name, d, i * (n / k), n / k, DType::U8)?;
                Tensor::from_local(self.b, self.b.upload_owned(part.data)?, stored, part.shape, placements, DType::U8)
            }
            (Placement::Partial(_), _) => {
                return Err(Error::invalid("load", format!("parameter `{name}` cannot be planned as a partial sum")))
            }
            _ => {
                let all = self.ckpt.read_as(name, DType::U8)?;
                Tensor::from_storage(self.b, self.b.upload_owned(all.data)?, stored, DType::U8)
            }
        };
        Ok(Some((t, format)))
    }
    fn expert_range(&self, stack: &str, count: usize) -> (usize, usize) {
        match (self.plan, self.plan.and_then(|p| p.index_along(MeshAxis::Dp))) {
            (Some(plan), Some(at)) => plan.expert_share(stack, count, at),
            _ => (0, count),
        }
    }
    fn skip(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }
    fn param(&mut self, name: &str, shape: Shape, _init: Init) -> Result<Tensor<B>> {
        if let Some(layout) = self.int4_of(name) {
            let values = self.read_int4(&layout, name, &shape)?.dequantize();
            return self.place_whole(name, shape, values);
        }
        if let Some(&f) = self.blocks.get(name) {
            return self.dequantized(name, shape, f);
        }
        let stored = self.ckpt.shape(name).ok_or_else(|| Error::Parameter {
            name: name.into(),
            msg: format!("`{name}` is missing from the checkpoint"),
        })?;
        if *stored != shape {
            return Err(Error::Parameter {
                name: name.into(),
                msg: format!("`{name}` has shape {stored} in the checkpoint but the model needs {shape}"),
            });
        }
        if let Some(d) = self.ckpt.dtype(name).filter(|d| self.dtype.is_float() && !d.is_float()) {
            return Err(Error::Parameter {
                name: name.into(),
                msg: format!("`{name}` is stored as {d:?} in the checkpoint; the model's weights must be floats"),
            });
        }
        self.used.insert(name.to_string());
        let placements = self.plan.map(|p| p.placements(name)).unwrap_or_default();
        let t = match (placements.get(MeshAxis::Mp), self.plan) {
            (Placement::Shard(d), Some(plan)) if plan.mesh.mp > 1 => {
                let k = plan.mesh.mp;
                let n = shape.dims()[d];
                if !n.is_multiple_of(k) {
                    return Err(Error::Parameter {
                        name: name.into(),
                        msg: format!("dim {d} of `{name}` {shape} does not split {k} ways"),
                    });
                }
                let i = plan.index_along(MeshAxis::Mp).ok_or_else(|| {
                    Error::config(
                        "load",
                        format!(
                            "the plan for mesh {} is not bound to a rank (`ShardPlan::at_rank`), so which slice of `{name}` to read is unknown",
                            plan.mesh
                        ),
                    )
                })?;
                let part = self.ckpt.read_slice_as(name, d, i * (n / k), n / k, self.dtype)?;
                let s = self.b.upload_owned(part.data)?;
                Tensor::from_local(self.b, s, shape, part.shape, placements, self.dtype)
            }
            (Placement::Replicate, _) | (Placement::Shard(_), _) => {
                // the file's buffer becomes the parameter where the dtypes agree
                let all = self.ckpt.read_as(name, self.dtype)?;
                Tensor::from_storage(self.b, self.b.upload_owned(all.data)?, shape, self.dtype)
            }
            (Placement::Partial(_), _) => {
                return Err(Error::invalid("load", format!("parameter `{name}` cannot be planned as a partial sum")))
            }
        };
        Ok(t.into_var())
    }
}

/// The shapes the checkpoint stores: those of `expected` (the config's float parameters),
/// with each weight `[out, in]` that `blocks` names as `U8 [out, row_bytes]`, and each
/// that an int4 `layout` quantizes as its packed tensors.
pub fn stored_shapes(
    expected: Vec<(String, Shape)>,
    blocks: &BTreeMap<String, QuantFormat>,
    int4: Option<&Int4Layout>,
) -> Result<Vec<(String, Shape)>> {
    if let Some(layout) = int4 {
        let mut v = Vec::with_capacity(expected.len());
        for (n, s) in expected {
            match s.dims() {
                &[o, i] if layout.quantizes(&n) => v.extend(layout.stored(&n, o, i)?),
                _ => v.push((n, s)),
            }
        }
        return Ok(v);
    }
    let names: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(n) = blocks.keys().find(|n| !names.contains(n.as_str())) {
        return Err(Error::Parameter {
            name: n.clone(),
            msg: format!("`quantization_config` names `{n}`, which the model does not have"),
        });
    }
    expected
        .into_iter()
        .map(|(n, s)| match (blocks.get(&n), s.dims()) {
            (None, _) => Ok((n, s)),
            (Some(f), &[o, i]) => {
                let row =
                    f.row_bytes(i).map_err(|e| Error::Parameter { name: n.clone(), msg: format!("`{n}`: {e}") })?;
                Ok((n, Shape::new([o, row])))
            }
            (Some(f), _) => Err(Error::Parameter { name: n.clone(), msg: format!("`{n}` {s} cannot be {f} blocks") }),
        })
        .collect()
}
