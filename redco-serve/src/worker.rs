//! The engine's loop ([`lead`], behind an [`EngineHandle`]): the [`Engine`] runs steps on a
//! thread of its own while requests arrive from the HTTP tasks; each request's tokens go
//! back on its own channel. A request whose channel is gone (its client disconnected) is
//! cancelled at the next step, its blocks released. Under tensor parallelism the leader's
//! thread is rank 0's and the other ranks [`follow`] it in lockstep ([`Lockstep`]).

use crate::engine::{Engine, EngineStats, Event, Finish, Logprob, Refused, Request};
use crate::lockstep::{Command, Lockstep};
use redco_core::Backend;
use redco_models::generate::CausalLm;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;
use tokio::sync::{mpsc as tmpsc, oneshot};

/// What a request's channel carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A new token, with its log-probability when asked.
    Token(i64, Option<Logprob>),
    /// Prompt tokens' log-probabilities (from the second token on, in order; when asked).
    PromptLogprobs(Vec<(i64, Logprob)>),
    /// The request ended.
    Finished(Finish),
    /// The engine failed; the request ended without its tokens.
    Failed(String),
}

/// A request's output channel and the sender of its admission's answer.
type Reply = (tmpsc::UnboundedSender<Output>, oneshot::Sender<Result<(), Refused>>);

enum Msg {
    Submit(Request, tmpsc::UnboundedSender<Output>, oneshot::Sender<Result<(), Refused>>),
    Cancel(u64),
    Stats(oneshot::Sender<EngineStats>),
}

/// Submits requests to the engine's thread; cloned into every HTTP task.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    next: std::sync::Arc<AtomicU64>,
}

impl EngineHandle {
    /// Starts the engine `build` makes on a thread of its own (the engine is made there:
    /// its tensors never cross threads), one rank. Returns once it is built, or its error.
    pub fn start<B, M, F>(build: F) -> Result<Self, String>
    where
        B: Backend,
        M: CausalLm<B> + Sync + 'static,
        F: FnOnce() -> redco_core::Result<Engine<B, M>> + Send + 'static,
    {
        let (handle, inbox) = EngineHandle::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("redco-engine".into())
            .spawn(move || match build() {
                Ok(engine) => {
                    let _ = ready_tx.send(Ok(()));
                    let _ = lead(engine, inbox, None);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                }
            })
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        ready_rx.recv().map_err(|_| "the engine thread ended while it was built".to_string())??;
        Ok(handle)
    }

    /// A handle and the inbox its messages arrive in: hand the inbox to [`lead`] on the
    /// thread that runs the engine (the leading rank's, under tensor parallelism).
    pub fn channel() -> (Self, Inbox) {
        let (tx, rx) = mpsc::channel();
        (EngineHandle { tx, next: std::sync::Arc::new(AtomicU64::new(1)) }, Inbox(rx))
    }

    /// A fresh request id.
    pub fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `req`; its outputs arrive on the returned channel. Refused (the queue full,
    /// the prompt too long, the engine stopped) with the kind and the engine's message.
    pub async fn submit(&self, req: Request) -> Result<tmpsc::UnboundedReceiver<Output>, Refused> {
        let (out_tx, out_rx) = tmpsc::unbounded_channel();
        let (ok_tx, ok_rx) = oneshot::channel();
        self.tx.send(Msg::Submit(req, out_tx, ok_tx)).map_err(|_| Refused::Stopped)?;
        ok_rx.await.map_err(|_| Refused::Stopped)??;
        Ok(out_rx)
    }

    /// Cancels request `id` (its blocks released).
    pub fn cancel(&self, id: u64) {
        let _ = self.tx.send(Msg::Cancel(id));
    }

    /// The engine's counts.
    pub async fn stats(&self) -> Option<EngineStats> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Msg::Stats(tx)).ok()?;
        rx.await.ok()
    }
}

/// Where an [`EngineHandle`]'s messages arrive ([`EngineHandle::channel`]).
pub struct Inbox(mpsc::Receiver<Msg>);

/// How long the leader waits for a message, with nothing to run, before it tells the
/// followers that nothing happened (they wait in a collective, which has a deadline).
const TICK: Duration = Duration::from_millis(500);

/// The leading rank's loop: take messages (waiting for one when there is nothing to run),
/// hand the step's commands to the followers through `sync` (none on one rank), apply them,
/// run a step, hand out its events. Ends when every handle is dropped and nothing runs
/// (the followers told to stop), or with the error of a failed broadcast (a rank gone).
pub fn lead<B: Backend, M: CausalLm<B> + Sync>(
    mut engine: Engine<B, M>,
    inbox: Inbox,
    sync: Option<&Lockstep<B>>,
) -> redco_core::Result<()> {
    let rx = inbox.0;
    let mut outs: HashMap<u64, tmpsc::UnboundedSender<Output>> = HashMap::new();
    let mut waiting_reply: HashMap<u64, Reply> = HashMap::new();
    // cancellations the leader found (clients gone, a failed step), applied at the next step
    let mut deferred: Vec<Command> = Vec::new();
    loop {
        let mut cmds = std::mem::take(&mut deferred);
        let mut stop = false;
        let mut take = |m: Msg, cmds: &mut Vec<Command>, engine: &Engine<B, M>| match m {
            Msg::Submit(req, out, ok) => {
                waiting_reply.insert(req.id, (out, ok));
                cmds.push(Command::Add(req));
            }
            Msg::Cancel(id) => cmds.push(Command::Cancel(id)),
            Msg::Stats(tx) => {
                let _ = tx.send(engine.stats());
            }
        };
        if !engine.has_work() && cmds.is_empty() {
            // nothing to run: wait for a message (every handle gone: the end)
            let got = match sync {
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(_) => rx.recv_timeout(TICK),
            };
            match got {
                Ok(m) => take(m, &mut cmds, &engine),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => stop = true,
            }
        }
        // the messages waiting, a bounded number, before the next step
        for _ in 0..256 {
            match rx.try_recv() {
                Ok(m) => take(m, &mut cmds, &engine),
                Err(_) => break,
            }
        }
        if stop {
            cmds.push(Command::Stop);
        }
        if let Some(sync) = sync {
            if let Err(e) = sync.lead(&cmds) {
                fail_all(&mut outs, &e.to_string());
                return Err(e);
            }
        }
        for c in cmds {
            match c {
                Command::Add(req) => {
                    let id = req.id;
                    let r = engine.add(req);
                    if let Some((out, ok)) = waiting_reply.remove(&id) {
                        if r.is_ok() {
                            outs.insert(id, out);
                        }
                        let _ = ok.send(r);
                    }
                }
                Command::Cancel(id) => {
                    engine.cancel(id);
                    outs.remove(&id);
                }
                Command::Stop => return Ok(()),
            }
        }
        if !engine.has_work() {
            continue;
        }
        match engine.step() {
            Ok(events) => {
                for e in events {
                    let (id, out) = match e {
                        Event::Token { id, token, logprob } => (id, Output::Token(token, logprob)),
                        Event::PromptLogprobs { id, logprobs, .. } => (id, Output::PromptLogprobs(logprobs)),
                        Event::Finished { id, reason } => (id, Output::Finished(reason)),
                    };
                    let finished = matches!(out, Output::Finished(_));
                    let gone = outs.get(&id).is_none_or(|tx| tx.send(out).is_err());
                    if gone && !finished {
                        // the client went away: its sequence and blocks go too (on every rank)
                        deferred.push(Command::Cancel(id));
                    }
                    if gone || finished {
                        outs.remove(&id);
                    }
                }
            }
            Err(e) => {
                // a failed step fails the requests it ran; the engine keeps serving
                deferred.extend(outs.keys().map(|&id| Command::Cancel(id)));
                fail_all(&mut outs, &e.to_string());
            }
        }
    }
}

/// A follower's loop: the leader's commands, then the same step; ends when the leader
/// says stop, or with the error of a failed broadcast.
pub fn follow<B: Backend, M: CausalLm<B> + Sync>(
    mut engine: Engine<B, M>,
    sync: &Lockstep<B>,
) -> redco_core::Result<()> {
    loop {
        for c in sync.follow()? {
            match c {
                Command::Add(req) => {
                    // refused here as on the leader (the same checks on the same state)
                    let _ = engine.add(req);
                }
                Command::Cancel(id) => {
                    engine.cancel(id);
                }
                Command::Stop => return Ok(()),
            }
        }
        if engine.has_work() {
            // a failed step fails on the leader too, which cancels its requests
            let _ = engine.step();
        }
    }
}

/// Ends every request with `msg`.
fn fail_all(outs: &mut HashMap<u64, tmpsc::UnboundedSender<Output>>, msg: &str) {
    for (_, tx) in outs.drain() {
        let _ = tx.send(Output::Failed(msg.to_string()));
    }
}
