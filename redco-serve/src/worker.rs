//! The engine's thread ([`EngineHandle`]): the [`Engine`] runs steps on a thread of its own
//! while requests arrive from the HTTP tasks; each request's tokens go back on its own
//! channel. A request whose channel is gone (its client disconnected) is cancelled at the
//! next token, its blocks released.

use crate::engine::{Engine, EngineStats, Event, Finish, Logprob, Request};
use redco_core::Backend;
use redco_models::generate::CausalLm;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use tokio::sync::{mpsc as tmpsc, oneshot};

/// What a request's channel carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A new token, with its log-probability when asked.
    Token(i64, Option<Logprob>),
    /// The request ended.
    Finished(Finish),
    /// The engine failed; the request ended without its tokens.
    Failed(String),
}

enum Msg {
    Submit(Request, tmpsc::UnboundedSender<Output>, oneshot::Sender<Result<(), String>>),
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
    /// its tensors never cross threads). Returns once it is built, or its error.
    pub fn start<B, M, F>(build: F) -> Result<Self, String>
    where
        B: Backend,
        M: CausalLm<B> + 'static,
        F: FnOnce() -> redco_core::Result<Engine<B, M>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("redco-engine".into())
            .spawn(move || match build() {
                Ok(engine) => {
                    let _ = ready_tx.send(Ok(()));
                    run(engine, rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                }
            })
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        ready_rx.recv().map_err(|_| "the engine thread ended while it was built".to_string())??;
        Ok(EngineHandle { tx, next: std::sync::Arc::new(AtomicU64::new(1)) })
    }

    /// A fresh request id.
    pub fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `req`; its outputs arrive on the returned channel. Refused (the queue full,
    /// the prompt too long) with the engine's message.
    pub async fn submit(&self, req: Request) -> Result<tmpsc::UnboundedReceiver<Output>, String> {
        let (out_tx, out_rx) = tmpsc::unbounded_channel();
        let (ok_tx, ok_rx) = oneshot::channel();
        self.tx.send(Msg::Submit(req, out_tx, ok_tx)).map_err(|_| "the engine has stopped".to_string())?;
        ok_rx.await.map_err(|_| "the engine has stopped".to_string())??;
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

/// The engine's loop: take messages (waiting for one when there is nothing to run), run a
/// step, hand out its events; ends when every handle is dropped and nothing runs.
fn run<B: Backend, M: CausalLm<B>>(mut engine: Engine<B, M>, rx: mpsc::Receiver<Msg>) {
    let mut outs: HashMap<u64, tmpsc::UnboundedSender<Output>> = HashMap::new();
    let handle =
        |engine: &mut Engine<B, M>, outs: &mut HashMap<u64, tmpsc::UnboundedSender<Output>>, msg: Msg| match msg {
            Msg::Submit(req, out, ok) => {
                let id = req.id;
                let r = engine.add(req).map_err(|e| e.to_string());
                if r.is_ok() {
                    outs.insert(id, out);
                }
                let _ = ok.send(r);
            }
            Msg::Cancel(id) => {
                engine.cancel(id);
                outs.remove(&id);
            }
            Msg::Stats(tx) => {
                let _ = tx.send(engine.stats());
            }
        };
    loop {
        if !engine.has_work() {
            // nothing to run: wait for a message (every handle gone: the end)
            match rx.recv() {
                Ok(m) => handle(&mut engine, &mut outs, m),
                Err(_) => return,
            }
        }
        // the messages waiting, a bounded number, before the next step
        for _ in 0..256 {
            match rx.try_recv() {
                Ok(m) => handle(&mut engine, &mut outs, m),
                Err(_) => break,
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
                        Event::Finished { id, reason } => (id, Output::Finished(reason)),
                    };
                    let finished = matches!(out, Output::Finished(_));
                    let gone = outs.get(&id).is_none_or(|tx| tx.send(out).is_err());
                    if gone {
                        // the client went away: its sequence and blocks go too
                        engine.cancel(id);
                    }
                    if gone || finished {
                        outs.remove(&id);
                    }
                }
            }
            Err(e) => {
                // a failed step fails the requests it ran; the engine keeps serving
                let msg = e.to_string();
                for (id, tx) in outs.drain() {
                    let _ = tx.send(Output::Failed(msg.clone()));
                    engine.cancel(id);
                }
            }
        }
    }
}
