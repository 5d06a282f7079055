//! OpenClaw's gateway protocol (v3/v4) over WebSocket: [`ws`] one connection (handshake, dispatch,
//! event forwarding, slow consumers), [`methods`] every method by name, and the methods by family:
//! [`chat`] (`chat.send` and friends), [`agent`] (`agent`/`agent.wait`), [`status`] (`status` and
//! the other read-only discovery methods), [`subscribe`] (the catching-up
//! `sessions.messages.subscribe`), [`tree`] (the session tree's methods), [`stubs`] (empty answers
//! for OpenClaw features Pincer lacks);
//! [`device`]: Ed25519 device signatures. The context of one request is [`Ctx`].

pub mod agent;
pub mod chat;
pub mod device;
pub mod methods;
pub mod status;
pub mod stubs;
pub mod subscribe;
pub mod tree;
pub mod ws;

use crate::{hub, protocol};
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Sends what waited for a session's catch-up (see [`Subs::flush`]).
pub type Flush = Box<dyn Fn(&str) + Send + Sync>;

/// What a connection subscribed to. The hub reads these sets while it holds its own lock (to
/// route an event), so none of them may be held while calling the hub.
#[derive(Default)]
pub struct Subs {
    /// `sessions.subscribe`: `sessions.changed` events.
    pub sessions: AtomicBool,
    /// `sessions.messages.subscribe`: `session.message` events of these session keys.
    pub messages: Mutex<HashSet<String>>,
    /// Sessions this connection works with (sent to, read the history of, subscribed to): it gets
    /// their `chat` and `agent` events. Other sessions' streams are not sent to it.
    pub chats: Mutex<HashSet<String>>,
    /// The connection's hub subscriber, told which sessions to route to it.
    pub route: std::sync::OnceLock<(Arc<hub::Hub>, u64)>,
    /// Sessions a `sessions.messages.subscribe {afterSeq}` caught up ([`subscribe::subscribe_messages`]).
    pub catchup: Mutex<std::collections::HashMap<String, subscribe::CatchingUp>>,
    /// Sends the events waiting in `catchup` for a session, then lets live ones through (set by
    /// the transport).
    pub flush: std::sync::OnceLock<Flush>,
}

impl Subs {
    fn watch(&self, key: &str) {
        if let Some((hub, id)) = self.route.get() {
            hub.watch(*id, key);
        }
    }

    /// Adds `key` to a set of followed sessions, within [`protocol::MAX_SESSIONS_PER_CONNECTION`].
    fn follow(&self, set: &Mutex<HashSet<String>>, key: String, what: &str) -> Result<(), protocol::RpcError> {
        {
            let mut set = pincer_pi::lock(set);
            if !set.contains(&key) && set.len() >= protocol::MAX_SESSIONS_PER_CONNECTION {
                return Err(protocol::RpcError::invalid(format!(
                    "this connection already {what} {} sessions, the most one connection may; unsubscribe or reconnect",
                    protocol::MAX_SESSIONS_PER_CONNECTION
                )));
            }
            set.insert(key.clone());
        }
        // The set's lock is released first: the hub reads it while holding its own.
        self.watch(&key);
        Ok(())
    }

    /// `sessions.messages.unsubscribe`: the connection leaves the session (its `session.message`,
    /// `chat` and `agent` events), making room for another.
    pub fn leave(&self, key: &str) {
        pincer_pi::lock(&self.messages).remove(key);
        pincer_pi::lock(&self.catchup).remove(key);
        pincer_pi::lock(&self.chats).remove(key);
        if let Some((hub, id)) = self.route.get() {
            hub.unwatch(*id, key);
        }
    }

    /// The connection works with this session: it gets its `chat` and `agent` events.
    pub fn add_chat(&self, key: String) -> Result<(), protocol::RpcError> {
        self.follow(&self.chats, key, "works with")
    }

    /// `sessions.messages.subscribe`: the connection gets the session's `session.message` events.
    pub fn add_messages(&self, key: String) -> Result<(), protocol::RpcError> {
        self.follow(&self.messages, key, "is subscribed to")
    }
}

/// Sends an interim `ok` response to the request (OpenClaw's `status: "accepted"` before the final).
pub type Interim = Box<dyn Fn(serde_json::Value) + Send + Sync>;

/// The context of one request.
pub struct Ctx {
    pub conn_id: u64,
    pub client_id: String,
    pub subs: Arc<Subs>,
    /// The connection was granted `operator.write` (true unless it asked for less).
    pub can_write: bool,
    /// The connection may answer approvals (`operator.approvals` or `operator.admin`, or it asked
    /// for no scopes).
    pub can_approve: bool,
    acks: Mutex<Vec<oneshot::Sender<()>>>,
    interim: Option<Interim>,
}

impl Ctx {
    pub fn new(conn_id: u64, client_id: String, subs: Arc<Subs>) -> Ctx {
        Ctx {
            conn_id,
            client_id,
            subs,
            can_write: true,
            can_approve: true,
            acks: Mutex::new(Vec::new()),
            interim: None,
        }
    }

    /// A transport that can answer a request more than once (the WebSocket) says how.
    pub fn with_interim(mut self, interim: Interim) -> Ctx {
        self.interim = Some(interim);
        self
    }

    /// Queues an interim response (nothing when the transport has none); the final one follows.
    pub fn interim(&self, payload: serde_json::Value) {
        if let Some(f) = &self.interim {
            f(payload);
        }
    }

    /// Resolves once the client has read this request's response (so a run's events reach it
    /// after its ack; on the WebSocket, its pong to a ping sent after the response), or fails when
    /// the transport gave up on it (the run goes on).
    pub fn after_response(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        pincer_pi::lock(&self.acks).push(tx);
        rx
    }

    /// The waiters of [`Self::after_response`], for the transport to resolve once the response has
    /// been read.
    pub fn take_acks(&self) -> Vec<oneshot::Sender<()>> {
        std::mem::take(&mut *pincer_pi::lock(&self.acks))
    }
}
