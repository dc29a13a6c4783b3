//! Tensor-parallel serving in lockstep: every rank of the model's `mp` group runs an
//! [`Engine`](crate::engine::Engine) of its own over its shard of the model (its heads of
//! the KV cache), and the engines stay identical because they are handed the same commands
//! in the same order. The leader (rank 0, which serves HTTP) collects each step's new
//! requests and cancellations and broadcasts them over the communicator before the step
//! ([`Lockstep::lead`]); the followers receive them ([`Lockstep::follow`]). The scheduling,
//! the block tables and the sampling (from the gathered logits) are deterministic, so each
//! rank runs the same ragged batch, and the row-parallel all-reduces inside the model meet.
//! As Megatron's and vLLM's workers do, only the leader talks to clients.

use crate::engine::Request;
use crate::guide::GuideSpec;
use redco_core::runtime::Comm;
use redco_core::{Backend, Error, HostData, MeshAxis, Result};
use redco_models::generate::Sampling;

/// What the leader tells every rank before a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Queue a request ([`Engine::add`](crate::engine::Engine::add)).
    Add(Request),
    /// Cancel a request ([`Engine::cancel`](crate::engine::Engine::cancel)).
    Cancel(u64),
    /// The server is stopping: the ranks leave their loops.
    Stop,
}

/// The broadcast of each step's commands from rank 0 along `mp`.
pub struct Lockstep<B: Backend> {
    comm: Comm<B>,
    backend: B,
}

impl<B: Backend> Lockstep<B> {
    /// Over `comm`'s model-parallel group (a serving mesh is `1 x mp`).
    pub fn new(b: &B, comm: Comm<B>) -> Result<Self> {
        let mesh = comm.mesh();
        if mesh.dp != 1 {
            return Err(Error::unsupported(
                "serve",
                format!("a serving mesh is 1 x mp (tensor parallel); {}x{} has dp > 1", mesh.dp, mesh.mp),
            ));
        }
        Ok(Lockstep { comm, backend: b.clone() })
    }

    /// This rank's position along `mp` (0: the leader).
    pub fn rank(&self) -> usize {
        self.comm.mesh().index_along(self.comm.rank(), MeshAxis::Mp)
    }

    /// Ranks in lockstep.
    pub fn size(&self) -> usize {
        self.comm.mesh().mp
    }

    /// The leader's side: broadcasts `cmds` to the followers.
    pub fn lead(&self, cmds: &[Command]) -> Result<()> {
        let bytes = encode(cmds);
        self.broadcast(bytes.len(), Some(bytes)).map(|_| ())
    }

    /// A follower's side: the leader's commands for the next step.
    pub fn follow(&self) -> Result<Vec<Command>> {
        decode(&self.broadcast(0, None)?)
    }

    /// The leader's `bytes` (its length first) on every rank.
    fn broadcast(&self, len: usize, bytes: Option<Vec<u8>>) -> Result<Vec<u8>> {
        let b = &self.backend;
        let n = b.upload(&HostData::I64(vec![len as i64]))?;
        let n = self.comm.broadcast(MeshAxis::Mp, &n, 0, 8)?;
        let len = match b.download(&n)? {
            HostData::I64(v) if v.len() == 1 && v[0] >= 0 => v[0] as usize,
            other => return Err(Error::data("serve", format!("a command length of {other:?}"))),
        };
        if len == 0 {
            return Ok(Vec::new());
        }
        let data = bytes.unwrap_or_else(|| vec![0; len]);
        if data.len() != len {
            return Err(Error::data("serve", format!("{} command bytes announced as {len}", data.len())));
        }
        let got = self.comm.broadcast(MeshAxis::Mp, &b.upload(&HostData::U8(data))?, 0, len)?;
        match b.download(&got)? {
            HostData::U8(v) if v.len() == len => Ok(v),
            other => Err(Error::data("serve", format!("{} command bytes received, {len} sent", other.len()))),
        }
    }
}

/// The commands as bytes (little-endian fields, tagged).
pub fn encode(cmds: &[Command]) -> Vec<u8> {
    let mut w = Vec::new();
    put(&mut w, cmds.len() as u64);
    for c in cmds {
        match c {
            Command::Add(r) => {
                w.push(0);
                put(&mut w, r.id);
                put_list(&mut w, &r.prompt);
                put(&mut w, r.max_tokens as u64);
                match &r.sampling {
                    Sampling::Greedy => w.push(0),
                    Sampling::Sample { temperature, top_k, top_p, seed } => {
                        w.push(1);
                        put(&mut w, temperature.to_bits());
                        put(&mut w, top_k.map_or(u64::MAX, |k| k as u64));
                        put(&mut w, top_p.map_or(u64::MAX, f64::to_bits));
                        put(&mut w, *seed);
                    }
                }
                put_list(&mut w, &r.stop_tokens);
                put(&mut w, r.logprobs.map_or(u64::MAX, |n| n as u64));
                put(&mut w, r.prompt_logprobs.map_or(u64::MAX, |n| n as u64));
                let guide = r.guide.as_ref().map_or(Vec::new(), |g| g.to_json().to_string().into_bytes());
                put(&mut w, guide.len() as u64);
                w.extend_from_slice(&guide);
            }
            Command::Cancel(id) => {
                w.push(1);
                put(&mut w, *id);
            }
            Command::Stop => w.push(2),
        }
    }
    w
}

/// The commands [`encode`] wrote; an error for bytes it did not write.
pub fn decode(bytes: &[u8]) -> Result<Vec<Command>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader { bytes, at: 0 };
    let n = r.u64()?;
    let mut cmds = Vec::new();
    for _ in 0..n {
        cmds.push(match r.byte()? {
            0 => {
                let id = r.u64()?;
                let prompt = r.list()?;
                let max_tokens = r.u64()? as usize;
                let sampling = match r.byte()? {
                    0 => Sampling::Greedy,
                    1 => Sampling::Sample {
                        temperature: f64::from_bits(r.u64()?),
                        top_k: r.opt()?.map(|k| k as usize),
                        top_p: r.opt()?.map(f64::from_bits),
                        seed: r.u64()?,
                    },
                    t => return Err(Error::data("serve", format!("sampling tag {t} in a command"))),
                };
                let stop_tokens = r.list()?;
                let logprobs = r.opt()?.map(|n| n as usize);
                let prompt_logprobs = r.opt()?.map(|n| n as usize);
                let guide = match r.bytes()? {
                    [] => None,
                    b => Some(
                        serde_json::from_slice(b)
                            .ok()
                            .and_then(|v| GuideSpec::from_json(&v))
                            .map(std::sync::Arc::new)
                            .ok_or_else(|| Error::data("serve", "a command's grammar is not one encode wrote"))?,
                    ),
                };
                Command::Add(Request {
                    id,
                    prompt,
                    max_tokens,
                    sampling,
                    stop_tokens,
                    logprobs,
                    prompt_logprobs,
                    guide,
                })
            }
            1 => Command::Cancel(r.u64()?),
            2 => Command::Stop,
            t => return Err(Error::data("serve", format!("command tag {t}"))),
        });
    }
    if r.at != bytes.len() {
        return Err(Error::data("serve", format!("{} bytes after the commands", bytes.len() - r.at)));
    }
    Ok(cmds)
}

fn put(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_list(w: &mut Vec<u8>, v: &[i64]) {
    put(w, v.len() as u64);
    for &x in v {
        put(w, x as u64);
    }
}

/// Reads what [`encode`] wrote.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8> {
        let b = *self.bytes.get(self.at).ok_or_else(|| Error::data("serve", "the commands end early"))?;
        self.at += 1;
        Ok(b)
    }

    fn u64(&mut self) -> Result<u64> {
        let s = self.bytes.get(self.at..self.at + 8).ok_or_else(|| Error::data("serve", "the commands end early"))?;
        self.at += 8;
        Ok(u64::from_le_bytes(s.try_into().expect("eight bytes")))
    }

    fn opt(&mut self) -> Result<Option<u64>> {
        Ok(Some(self.u64()?).filter(|&v| v != u64::MAX))
    }

    fn bytes(&mut self) -> Result<&[u8]> {
        let n = self.u64()? as usize;
        let b = self
            .bytes
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| Error::data("serve", format!("{n} bytes asked for, {} left", self.bytes.len() - self.at)))?;
        self.at += n;
        Ok(b)
    }

    fn list(&mut self) -> Result<Vec<i64>> {
        let n = self.u64()? as usize;
        if n > (self.bytes.len() - self.at) / 8 {
            return Err(Error::data("serve", format!("a list of {n} in {} bytes", self.bytes.len() - self.at)));
        }
        (0..n).map(|_| self.u64().map(|v| v as i64)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request() -> impl Strategy<Value = Request> {
        let sampling = prop_oneof![
            Just(Sampling::Greedy),
            (0.01f64..4.0, proptest::option::of(1usize..100), proptest::option::of(0.01f64..1.0), any::<u64>())
                .prop_map(|(temperature, top_k, top_p, seed)| Sampling::Sample { temperature, top_k, top_p, seed }),
        ];
        (
            any::<u64>(),
            proptest::collection::vec(any::<i64>(), 0..40),
            0usize..5000,
            sampling,
            proptest::collection::vec(any::<i64>(), 0..4),
            proptest::option::of(0usize..20),
            proptest::option::of(0usize..20),
            proptest::option::of(
                prop_oneof![
                    "[a-z]{1,8}".prop_map(GuideSpec::Regex),
                    proptest::collection::vec("[a-z ]{0,6}", 1..4).prop_map(GuideSpec::Choice),
                    Just(GuideSpec::JsonSchema(serde_json::json!({"type": "object"}))),
                ]
                .prop_map(std::sync::Arc::new),
            ),
        )
            .prop_map(|(id, prompt, max_tokens, sampling, stop_tokens, logprobs, prompt_logprobs, guide)| {
                Request { id, prompt, max_tokens, sampling, stop_tokens, logprobs, prompt_logprobs, guide }
            })
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![request().prop_map(Command::Add), any::<u64>().prop_map(Command::Cancel), Just(Command::Stop)]
    }

    proptest! {
        /// Any list of commands comes back as it was; every cut of its bytes is refused.
        #[test]
        fn commands_round_trip_and_truncations_are_refused(cmds in proptest::collection::vec(command(), 0..6)) {
            let bytes = encode(&cmds);
            prop_assert_eq!(decode(&bytes).unwrap(), cmds.clone());
            if !cmds.is_empty() {
                for cut in [1, bytes.len() / 2, bytes.len() - 1] {
                    prop_assert!(decode(&bytes[..cut]).is_err());
                }
                let mut longer = bytes.clone();
                longer.push(0);
                prop_assert!(decode(&longer).is_err());
            }
        }
    }
}
