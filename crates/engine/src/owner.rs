//! The owner of each active session ([`Owners`]): one task per session key that orders the
//! session's turns in this process (one at a time, first come first served, a waiter free to give
//! up), makes every append to its transcript, builds its context, and runs the work that moves its
//! transcript aside or rewrites it (a reset, a delete, a trim) between two appends, never during
//! one. Everything else sends it a command and awaits the answer; an owner with nothing to do for
//! [`LINGER`] retires, so only sessions in use have one.
//!
//! An owner keeps its session's entry in two tables only owners write: the contexts
//! ([`ContextCache`]: one byte budget for every session, idle contexts making room first) and the
//! positions of the entries appended lately ([`Positions`]: read when they are announced).

use crate::config::CONTEXT_CACHE_BYTES;
use crate::error::{EngineError, GatewayError};
use crate::sessions::{SessionRef, Sessions};
use pincer_agent::{CancellationToken, ContextMessage, Messages};
use pincer_pi::lock;
use pincer_store::{build_context, Appended, NewEntry, Pos, StoreError, Transcripts, TranscriptsExt};
use serde_json::Value;
use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Told of every entry this gateway appends (in its transcript's writer lane, in order) and of
/// every transcript replaced in place: an index an adapter keeps over the transcripts (the OpenAI
/// endpoint's conversation index) registers itself with [`Owners::observe`].
pub trait TranscriptObserver: Send + Sync {
    /// `entry` was appended to `path`, the transcript of session `key`.
    fn appended(&self, key: &str, path: &std::path::Path, entry: &Value);
    /// The transcript of session `key` at `path` was replaced (trimmed): read it anew.
    fn replaced(&self, key: &str, path: &std::path::Path);
}

/// How long an owner with no turn held or waiting and no command stays at least before it retires
/// (idleness is looked at every `LINGER`, so it goes within twice that).
const LINGER: Duration = Duration::from_secs(30);

type Ack<T> = oneshot::Sender<T>;

/// Work run in an owner's order ([`Owners::exclusive`]).
type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What an owner is asked.
enum Cmd {
    /// A place in the session's turn order, answered with the turn when it comes.
    Turn(Ack<Permit>),
    /// The turn was let go (its [`Permit`] dropped).
    Release,
    /// Entries to append in one durable commit (only while the leaf is `at_leaf`, when given).
    Append(Pending),
    /// The LLM context of the session's active branch.
    Context { session: SessionRef, ack: Ack<Result<Messages, GatewayError>> },
    /// Work no append may overlap.
    Exclusive(Work),
}

/// The session's turn in this process, held; dropping it hands the turn to the next in line.
pub struct Permit {
    /// The owner's commands (`None`: a permit its waiter never took, which releases nothing).
    owner: Option<mpsc::UnboundedSender<Cmd>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            let _ = owner.send(Cmd::Release);
        }
    }
}

/// Why [`Owners::turn`] gave no turn.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// Cancelled while waiting.
    #[error("cancelled while waiting for the session's previous run")]
    Cancelled,
    /// The owner stopped (it panicked) before the turn came.
    #[error("the session's owner stopped")]
    Gone,
}

/// The owners of the sessions in use, and the tables they keep their sessions' entries in.
pub struct Owners {
    store: Arc<dyn Transcripts>,
    sessions: Arc<Sessions>,
    /// Told of every append and replaced transcript ([`Owners::observe`]).
    observers: std::sync::RwLock<Vec<Arc<dyn TranscriptObserver>>>,
    /// Each owner's commands, by session key. A command is sent with this lock held, and an owner
    /// retires only with it held and its queue empty: no command is ever sent to an owner gone.
    map: Mutex<foldhash::HashMap<String, mpsc::UnboundedSender<Cmd>>>,
    contexts: Mutex<ContextCache>,
    positions: Mutex<Positions>,
    /// How long an idle owner stays, in ms ([`LINGER`]; shorter in tests).
    linger_ms: std::sync::atomic::AtomicU64,
}

impl Owners {
    pub fn new(store: Arc<dyn Transcripts>, sessions: Arc<Sessions>, context_budget: usize) -> Owners {
        Owners {
            store,
            sessions,
            observers: Default::default(),
            map: Mutex::default(),
            contexts: Mutex::new(ContextCache::with_budget(context_budget)),
            positions: Mutex::default(),
            linger_ms: (LINGER.as_millis() as u64).into(),
        }
    }

    /// Tells `observer` of every append and replaced transcript from now on.
    pub fn observe(&self, observer: Arc<dyn TranscriptObserver>) {
        if let Ok(mut all) = self.observers.write() {
            all.push(observer);
        }
    }

    fn observers(&self) -> Vec<Arc<dyn TranscriptObserver>> {
        self.observers.read().map(|all| all.clone()).unwrap_or_default()
    }

    fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Sends `cmd` to the owner of `key`, started if it has none (or if it panicked).
    fn send(self: &Arc<Self>, key: &str, cmd: Cmd) {
        let mut map = lock(&self.map);
        let cmd = match map.get(key) {
            Some(tx) => match tx.send(cmd) {
                Ok(()) => return,
                Err(mpsc::error::SendError(cmd)) => cmd,
            },
            None => cmd,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(cmd);
        map.insert(key.to_owned(), tx.clone());
        tokio::spawn(run(self.clone(), key.to_owned(), tx, rx));
    }

    /// Whether the owner of `key` may retire: nothing is waiting in its queue. Removes it then.
    fn retire(&self, key: &str, rx: &mpsc::UnboundedReceiver<Cmd>) -> bool {
        let mut map = lock(&self.map);
        if !rx.is_empty() {
            return false;
        }
        map.remove(key);
        true
    }

    /// Sessions with an owner now.
    pub fn active(&self) -> usize {
        lock(&self.map).len()
    }

    /// Waits for session `key`'s turn in this process. Fails when `cancel` fires first (the place
    /// in line is given up; the others keep theirs).
    pub async fn turn(self: &Arc<Self>, key: &str, cancel: &CancellationToken) -> Result<Permit, TurnError> {
        if cancel.is_cancelled() {
            return Err(TurnError::Cancelled);
        }
        let (ack, turn) = oneshot::channel();
        self.send(key, Cmd::Turn(ack));
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(TurnError::Cancelled),
            permit = turn => permit.map_err(|_| TurnError::Gone),
        }
    }

    /// Appends `entries` to `session`'s transcript through its owner.
    pub async fn append(
        self: &Arc<Self>,
        session: &SessionRef,
        entries: Vec<NewEntry>,
    ) -> Result<Vec<Appended>, StoreError> {
        self.append_where(session, entries, None).await
    }

    /// Appends `entry` to `session`'s transcript only while its leaf is `leaf` (a compaction,
    /// summarised from the branch as it was): [`StoreError::LeafMoved`] else, nothing written.
    pub async fn append_at_leaf(
        self: &Arc<Self>,
        session: &SessionRef,
        entry: NewEntry,
        leaf: Option<String>,
    ) -> Result<Appended, StoreError> {
        let mut all = self.append_where(session, vec![entry], Some(leaf)).await?;
        all.pop().ok_or_else(|| StoreError::Internal("the append returned nothing".into()))
    }

    async fn append_where(
        self: &Arc<Self>,
        session: &SessionRef,
        entries: Vec<NewEntry>,
        at_leaf: Option<Option<String>>,
    ) -> Result<Vec<Appended>, StoreError> {
        let (ack, done) = oneshot::channel();
        self.send(&session.key, Cmd::Append(Pending { session: session.clone(), entries, at_leaf, ack }));
        done.await.map_err(|_| StoreError::Internal("the session's owner stopped before the append".into()))?
    }

    /// The context of `session`'s active branch: from memory when it is there at the transcript's
    /// leaf (only owners write it, so reading it here is safe), else built by its owner.
    pub async fn context(self: &Arc<Self>, session: &SessionRef) -> Result<Messages, GatewayError> {
        if let Some(m) = self.cached_context(session) {
            return Ok(m);
        }
        let (ack, done) = oneshot::channel();
        self.send(&session.key, Cmd::Context { session: session.clone(), ack });
        done.await.map_err(|_| GatewayError::Store(StoreError::Internal("the session's owner stopped".into())))?
    }

    /// Runs `work` in session `key`'s owner, between two of its appends: work that moves the
    /// transcript aside or rewrites it (a reset, a delete, a trim). `work` must not wait for the
    /// session's own appends, context or turn (it would wait for itself).
    pub async fn exclusive<T: Send + 'static>(
        self: &Arc<Self>,
        key: &str,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, EngineError> {
        let (ack, done) = oneshot::channel();
        self.send(
            key,
            Cmd::Exclusive(Box::pin(async move {
                let _ = ack.send(work.await);
            })),
        );
        done.await.map_err(|_| EngineError::Internal("the session's work stopped before it answered".into()))
    }

    /// The context kept for `session` if it was built at the leaf its transcript has now (known
    /// without reading the file).
    fn cached_context(&self, session: &SessionRef) -> Option<Messages> {
        let (leaf, version) = self.store.peek_leaf_version(&session.path)?;
        lock(&self.contexts).get(&session.path, leaf.as_deref()?, version)
    }

    /// Where entry `id` of `path` landed, when an owner appended it lately.
    pub fn position(&self, path: &Path, id: &str) -> Option<Pos> {
        lock(&self.positions).map.get(&(path.to_path_buf(), id.to_owned())).copied()
    }

    /// Drops what is kept about a session whose transcript was replaced in place (trimmed by
    /// `sessions.compact {maxLines}`): its context, and the observers read it anew.
    pub fn replaced(&self, session: &SessionRef) {
        lock(&self.contexts).remove(&session.path);
        // A rewrite moves byte offsets: the positions noted before it are not where the entries are.
        lock(&self.positions).forget(&session.path);
        for o in self.observers() {
            o.replaced(&session.key, &session.path);
        }
    }
}

/// An append waiting for its turn to write.
struct Pending {
    session: SessionRef,
    entries: Vec<NewEntry>,
    /// Written only while the transcript's leaf is this one ([`StoreError::LeafMoved`] else).
    at_leaf: Option<Option<String>>,
    ack: Ack<Result<Vec<Appended>, StoreError>>,
}

/// What woke an owner.
enum Wake {
    Cmd(Option<Cmd>),
    /// The transcript's lock for the first waiting append.
    Locked(Result<pincer_store::Held, StoreError>),
    Idle,
}

/// An owner: takes its session's commands one at a time, in the order they came. Appends are
/// written in that order too, each once it holds the transcript's lock; while the first waits for
/// the lock (another process holds it) the owner goes on taking commands, so work that moves the
/// transcript aside is not held up by another program: an append that gets the lock after it finds
/// the transcript moved and writes nothing.
async fn run(owners: Arc<Owners>, key: String, tx: mpsc::UnboundedSender<Cmd>, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    let mut waiting: VecDeque<Ack<Permit>> = VecDeque::new();
    let mut held = false;
    let mut appends: VecDeque<Pending> = VecDeque::new();
    let mut locking: Option<pincer_store::StoreFuture<pincer_store::Held>> = None;
    // Idleness is looked at on a tick (one timer for the owner's life, not one per idle spell).
    let linger = owners.linger();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + linger, linger);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut active = tokio::time::Instant::now();
    loop {
        if locking.is_none() {
            locking = appends.front().map(|a| owners.store.clone().lock_for_append(a.session.path.clone()));
        }
        let idle = !held && waiting.is_empty() && appends.is_empty();
        // A free lock is taken before the next command: only an append that really waits (another
        // program holds the lock) lets later commands go first.
        let wake = tokio::select! {
            biased;
            lock = async {
                match locking.as_mut() {
                    Some(l) => l.await,
                    None => std::future::pending().await,
                }
            } => Wake::Locked(lock),
            cmd = rx.recv() => Wake::Cmd(cmd),
            _ = tick.tick(), if idle => Wake::Idle,
        };
        match wake {
            Wake::Idle if active.elapsed() >= linger && owners.retire(&key, &rx) => return,
            Wake::Idle => continue,
            // (Never `None`: the owner holds a sender itself.)
            Wake::Cmd(None) => return,
            Wake::Cmd(Some(cmd)) => {
                active = tokio::time::Instant::now();
                match cmd {
                    Cmd::Turn(ack) => waiting.push_back(ack),
                    Cmd::Release => held = false,
                    Cmd::Append(pending) => appends.push_back(pending),
                    Cmd::Context { session, ack } => {
                        let built = unwound(owners.build_context(&session)).await;
                        let _ = ack.send(built.unwrap_or_else(|what| {
                            Err(GatewayError::Store(StoreError::Internal(format!("building the context {what}"))))
                        }));
                    }
                    Cmd::Exclusive(work) => {
                        // (A panic drops the work's answer: its caller hears the owner stopped.)
                        let _ = unwound(work).await;
                        // Appends that waited for another program's lock may be for a transcript the
                        // work moved aside: refused now, so they hold up nothing behind them.
                        if owners.refuse_moved(&mut appends).await {
                            locking = None;
                        }
                    }
                }
            }
            Wake::Locked(lock) => {
                locking = None;
                if let Some(Pending { session, entries, at_leaf, ack }) = appends.pop_front() {
                    let written = match lock {
                        Ok(lock) => unwound(owners.write(lock, &session, entries, at_leaf))
                            .await
                            .unwrap_or_else(|what| Err(StoreError::Internal(format!("the append {what}")))),
                        Err(e) => Err(e),
                    };
                    let _ = ack.send(written);
                }
            }
        }
        while !held {
            let Some(next) = waiting.pop_front() else { break };
            match next.send(Permit { owner: Some(tx.clone()) }) {
                Ok(()) => held = true,
                // Its waiter gave up: the permit it never took releases nothing.
                Err(mut unused) => unused.owner = None,
            }
        }
    }
}

/// `f`, its panic caught: a command that panics must not take the owner (and the turn it has handed
/// out) with it. `Err`: "panicked", for the caller's message.
async fn unwound<T>(f: impl Future<Output = T>) -> Result<T, &'static str> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(f).catch_unwind().await.map_err(|_| "panicked")
}

impl Owners {
    /// Refuses the waiting appends whose transcript was moved aside (`MovedAside`, nothing
    /// written); true when the first of them was one (its lock wait is then dropped).
    async fn refuse_moved(&self, appends: &mut VecDeque<Pending>) -> bool {
        let mut first = false;
        let mut kept = VecDeque::with_capacity(appends.len());
        for (i, p) in std::mem::take(appends).into_iter().enumerate() {
            if self.sessions.moved_aside(&p.session).await {
                first |= i == 0;
                let _ = p.ack.send(Err(StoreError::MovedAside(p.session.path.display().to_string())));
            } else {
                kept.push_back(p);
            }
        }
        *appends = kept;
        first
    }

    /// Appends entries to a session's transcript in order, in one durable commit; keeps the session's
    /// context and positions in step with what was written. Fails with [`StoreError::MovedAside`] when
    /// the transcript was moved aside (a reset, a delete) before the write: nothing is ever written
    /// under an archived name. (A reset of this process runs in the owner's order, so it comes wholly
    /// before or after the write; a reset by another process is not looked for here.) `held`: the
    /// transcript's lock, released once the entries are written; `at_leaf`: the leaf the
    /// transcript must still have, read under the transcript's lock (taken for it: on PostgreSQL
    /// `held` holds nothing), else nothing is written.
    async fn write(
        &self,
        held: pincer_store::Held,
        session: &SessionRef,
        entries: Vec<NewEntry>,
        at_leaf: Option<Option<String>>,
    ) -> Result<Vec<Appended>, StoreError> {
        if self.sessions.moved_aside(session).await {
            return Err(StoreError::MovedAside(session.path.display().to_string()));
        }
        let mut leaf_lock = None;
        if let Some(expected) = at_leaf {
            let (store, path) = (self.store.clone(), session.path.clone());
            let (lock, now) = tokio::task::spawn_blocking(move || {
                let lock = store.lock(&path)?;
                Ok::<_, StoreError>((lock, store.leaf(&path)?))
            })
            .await
            .map_err(|e| StoreError::Internal(format!("the leaf's task failed: {e}")))??;
            if now != expected {
                return Err(StoreError::LeafMoved { expected, now });
            }
            leaf_lock = Some(lock);
        }
        let (observers, key, path) = (self.observers(), session.key.clone(), session.path.clone());
        let after: pincer_store::AfterCommit = Box::new(move |all| {
            for a in all.iter().filter(|a| a.appended) {
                for o in &observers {
                    o.appended(&key, &path, &a.entry);
                }
            }
        });
        let (path, sid) = (session.path.clone(), Some(session.session_id.clone()));
        let r = self.store.clone().append_held(held, path, entries, sid, after).await;
        drop(leaf_lock);
        match &r {
            Ok(all) => {
                let mut positions = lock(&self.positions);
                for a in all {
                    if let Some(id) = a.id() {
                        positions.insert(&session.path, id, a.pos);
                    }
                }
                drop(positions);
                let mut contexts = lock(&self.contexts);
                for a in all.iter().filter(|a| a.appended) {
                    let parent = a.entry.get("parentId").and_then(Value::as_str);
                    let is_message = a.entry.get("type").and_then(Value::as_str) == Some("message");
                    let message = a.entry.get("message").filter(|_| is_message);
                    contexts.extend(&session.path, parent, a.id(), message);
                }
            }
            Err(_) => lock(&self.contexts).remove(&session.path),
        }
        r
    }

    /// The LLM context of a session's active branch (empty for a missing file). Served from memory
    /// while the file's leaf (and rewrite count, [`Transcripts::leaf_version`]) is the one the context
    /// was built at (every append of the owner keeps it in step), so a turn does not re-read a long
    /// transcript; rebuilt from the file when anything else moved the leaf (another process, a
    /// compaction, a branch).
    async fn build_context(&self, session: &SessionRef) -> Result<Messages, GatewayError> {
        let path = session.path.clone();
        let store = self.store.clone();
        let task = |source| GatewayError::Task { what: "context", source };
        let (leaf, version) = match store.peek_leaf_version(&path) {
            Some(known) => known,
            None => {
                let (store, path) = (store.clone(), path.clone());
                tokio::task::spawn_blocking(move || store.leaf_version(&path)).await.map_err(task)??
            }
        };
        if let Some(m) = leaf.as_deref().and_then(|l| lock(&self.contexts).get(&path, l, version)) {
            return Ok(m);
        }
        let (messages, bytes, read_at) = tokio::task::spawn_blocking(move || match store.read_session(&path) {
            Ok(Some(s)) => {
                let c = build_context(&s, &s.leaf);
                let size = c.messages.iter().map(|m| m.len()).sum::<usize>();
                let messages = c.messages.iter().map(|m| Arc::new(ContextMessage::from_json(m))).collect::<Messages>();
                Ok((messages, size, s.leaf_id().map(str::to_owned)))
            }
            Ok(None) => Ok((Messages::new(), 0, None)),
            Err(e) => Err(GatewayError::Store(e)),
        })
        .await
        .map_err(task)??;
        // Kept only as the context at `leaf` when the file read was still there (another process may
        // have moved the leaf in between).
        if let Some(leaf) = leaf.filter(|l| read_at.as_deref() == Some(l.as_str())) {
            lock(&self.contexts).insert(session.path.clone(), (leaf, version), messages.clone(), bytes);
        }
        Ok(messages)
    }
}

/// What a context costs beyond its messages' JSON (its map entry, path, leaf and message list).
const CONTEXT_OVERHEAD: usize = 1024;
/// Only contexts unused this long make room for another: when the busy ones fill the budget, a
/// newcomer is not kept (rather than all of them taking turns at being evicted and rebuilt).
const CONTEXT_CACHE_IDLE: Duration = Duration::from_secs(30);

/// A session's context as of `leaf`. Messages are shared with the runs that use them: a turn
/// copies pointers, never the history.
struct CachedContext {
    leaf: String,
    /// The transcript's rewrite count it was built at ([`Transcripts::leaf_version`]).
    version: u64,
    messages: Messages,
    /// JSON bytes of the messages, and the context's overhead.
    bytes: usize,
    /// When it was last used.
    used: Instant,
}

/// The contexts kept in memory (see [`CONTEXT_CACHE_BYTES`]).
struct ContextCache {
    map: foldhash::HashMap<std::path::PathBuf, CachedContext>,
    bytes: usize,
    /// Message JSON bytes held at most.
    budget: usize,
}

impl Default for ContextCache {
    fn default() -> ContextCache {
        ContextCache::with_budget(CONTEXT_CACHE_BYTES)
    }
}

impl ContextCache {
    fn with_budget(budget: usize) -> ContextCache {
        ContextCache { map: foldhash::HashMap::default(), bytes: 0, budget }
    }

    /// The context of `path` if it was built at `leaf` of the transcript's `version`.
    fn get(&mut self, path: &std::path::Path, leaf: &str, version: u64) -> Option<Messages> {
        let c = self.map.get_mut(path).filter(|c| c.leaf == leaf && c.version == version)?;
        c.used = Instant::now();
        Some(c.messages.clone())
    }

    /// Extends the context of `path` by a message entry `id` whose parent is `parent`; forgets the
    /// context when the entry does not continue it.
    fn extend(&mut self, path: &std::path::Path, parent: Option<&str>, id: Option<&str>, message: Option<&Value>) {
        let continued = self.map.get_mut(path).filter(|c| Some(c.leaf.as_str()) == parent);
        let (Some(c), Some(id), Some(m)) = (continued, id, message) else {
            return self.remove(path);
        };
        // Wire forms are built now for the APIs the context already goes out in.
        let m = ContextMessage::shared_like(m, c.messages.last().map(|l| &**l));
        let n = m.json().len();
        c.leaf = id.to_owned();
        c.used = Instant::now(); // a long tool loop extends its context without reading it
        c.messages.push(m);
        c.bytes += n;
        self.bytes += n;
        if !self.make_room(0) {
            self.remove(path);
        }
    }

    fn remove(&mut self, path: &std::path::Path) {
        if let Some(c) = self.map.remove(path) {
            self.bytes -= c.bytes;
        }
    }

    fn insert(&mut self, path: std::path::PathBuf, (leaf, version): (String, u64), messages: Messages, json: usize) {
        self.remove(&path);
        let bytes = json + CONTEXT_OVERHEAD;
        if !self.make_room(bytes) {
            return;
        }
        self.bytes += bytes;
        self.map.insert(path, CachedContext { leaf, version, messages, bytes, used: Instant::now() });
    }

    /// Drops idle contexts, least recently used first, until `room` more bytes fit; false when
    /// they cannot.
    fn make_room(&mut self, room: usize) -> bool {
        while self.bytes + room > self.budget {
            let idle = self
                .map
                .iter()
                .filter(|(_, c)| c.used.elapsed() >= CONTEXT_CACHE_IDLE)
                .min_by_key(|(_, c)| c.used)
                .map(|(p, _)| p.clone());
            match idle {
                Some(p) => self.remove(&p),
                None => return false,
            }
        }
        true
    }
}

/// The durable positions of the entries this process appended lately, by (transcript, entry id):
/// the events announcing an entry are built from the entry alone (the agent's sink hands back the
/// entry, not where it went), so [`Engine::event_id`](crate::state::Engine::event_id) looks its position up here. Bounded: an
/// entry is announced right after its append, long before [`Positions::MAX`] newer ones.
#[derive(Default)]
struct Positions {
    map: foldhash::HashMap<(PathBuf, String), Pos>,
    order: std::collections::VecDeque<(PathBuf, String)>,
}

impl Positions {
    const MAX: usize = 4096;

    /// Forgets the positions noted in `path`.
    fn forget(&mut self, path: &Path) {
        self.map.retain(|(p, _), _| p != path);
        self.order.retain(|(p, _)| p != path);
    }

    fn insert(&mut self, path: &Path, id: &str, pos: Pos) {
        let k = (path.to_path_buf(), id.to_owned());
        if self.map.insert(k.clone(), pos).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > Self::MAX {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A user message entry with `text`.
    fn user_entry(text: &str) -> NewEntry {
        NewEntry::message(json!({"role": "user", "content": text, "timestamp": 1}))
    }

    /// [`user_entry`] as one append.
    fn user(text: &str) -> Vec<NewEntry> {
        vec![user_entry(text)]
    }

    /// Owners over a file store and session index in a temporary state directory.
    fn owners() -> (Arc<Owners>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store: Arc<dyn Transcripts> = Arc::new(pincer_store::Store::new(pincer_store::StoreOptions::default()));
        let sessions = Arc::new(Sessions::new(dir.path(), store.clone()));
        (Arc::new(Owners::new(store, sessions, CONTEXT_CACHE_BYTES)), dir)
    }

    /// Starts `f` on its own task once it has sent its first command (polled once here first), so
    /// commands sent this way reach the owner in the order of the calls.
    async fn started<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> tokio::task::JoinHandle<T> {
        let mut f = Box::pin(f);
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "it waits for the owner");
        tokio::spawn(f)
    }

    #[tokio::test]
    async fn turns_come_in_order_and_a_waiter_can_give_up() {
        let (owners, _dir) = owners();
        let never = CancellationToken::new();
        let first = owners.turn("s", &never).await.expect("the first turn");
        let order = Arc::new(Mutex::new(Vec::new()));
        let cancel_b = CancellationToken::new();
        let mut waiters = Vec::new();
        for (name, token) in [("a", never.clone()), ("b", cancel_b.clone()), ("c", never.clone())] {
            let (owners, order) = (owners.clone(), order.clone());
            waiters.push(
                started(async move {
                    match owners.turn("s", &token).await {
                        Ok(permit) => {
                            lock(&order).push(name);
                            tokio::task::yield_now().await;
                            drop(permit);
                        }
                        Err(e) => {
                            lock(&order).push(if matches!(e, TurnError::Cancelled) { "b gave up" } else { "gone" })
                        }
                    }
                })
                .await,
            );
        }
        // Another session's turn does not wait for this one's.
        let other = tokio::time::timeout(Duration::from_secs(30), owners.turn("t", &never)).await;
        let other = other.expect("another session's turn comes at once").expect("its turn");
        cancel_b.cancel();
        while lock(&order).is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(*lock(&order), vec!["b gave up"]);
        drop(first);
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(30), w).await.expect("in time").expect("waiter");
        }
        assert_eq!(*lock(&order), vec!["b gave up", "a", "c"]);
        assert_eq!(owners.active(), 2);
        drop(other);
    }

    #[tokio::test]
    async fn an_owner_with_nothing_to_do_retires_and_a_later_command_starts_another() {
        let (owners, _dir) = owners();
        let linger = Duration::from_millis(50);
        owners.linger_ms.store(50, std::sync::atomic::Ordering::Relaxed);
        let never = CancellationToken::new();
        drop(owners.turn("s", &never).await.expect("a turn"));
        assert_eq!(owners.active(), 1);
        for _ in 0..600 {
            if owners.active() == 0 {
                break;
            }
            tokio::time::sleep(linger).await;
        }
        assert_eq!(owners.active(), 0, "the idle owner retired");
        let again = owners.turn("s", &never).await.expect("a turn from a new owner");
        assert_eq!(owners.active(), 1);
        tokio::time::sleep(linger * 4).await;
        assert_eq!(owners.active(), 1, "an owner whose turn is held stays");
        drop(again);
    }

    #[tokio::test]
    async fn a_reset_in_the_owners_order_comes_wholly_before_an_append_sent_after_it() {
        let (owners, _dir) = owners();
        let s = owners.sessions.clone().session("main", true).await.expect("the index").expect("a session");
        owners.append(&s, user("before the reset")).await.expect("an append");
        // The reset holds the owner until told to go on.
        let (go, gate) = oneshot::channel::<()>();
        let (o, key) = (owners.clone(), s.key.clone());
        let reset = started(async move {
            let sessions = o.sessions.clone();
            let work = async move {
                let _ = gate.await;
                tokio::task::spawn_blocking(move || sessions.reset("main", "reset")).await.expect("the reset's thread")
            };
            o.exclusive(&key, work).await
        })
        .await;
        let (o, s2) = (owners.clone(), s.clone());
        let append = started(async move { o.append(&s2, user("sent during the reset")).await }).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!append.is_finished(), "the append waits for the reset in progress");
        let _ = go.send(());
        let (fresh, archived) = reset.await.expect("the reset's task").expect("its owner").expect("the reset");
        let archived = archived.expect("the old transcript was archived");
        let written = append.await.expect("the append's task");
        assert!(
            matches!(written, Err(StoreError::MovedAside(_))),
            "an append of the old transcript after its reset is refused: {written:?}"
        );
        let old = std::fs::read_to_string(&archived).expect("the archive");
        assert!(old.contains("before the reset") && !old.contains("sent during the reset"), "{old}");
        assert_ne!(fresh.path, s.path);
        let now = std::fs::read_to_string(&fresh.path).unwrap_or_default();
        assert!(!now.contains("sent during the reset"), "nothing written under a name it was not sent for: {now}");
    }

    #[tokio::test]
    async fn an_append_at_a_leaf_is_written_only_while_the_leaf_is_that_one() {
        let (owners, _dir) = owners();
        let s = owners.sessions.clone().session("main", true).await.expect("the index").expect("a session");
        let first = owners.append(&s, user("one")).await.expect("an append").remove(0);
        let first_id = first.id().map(str::to_owned);
        let second = owners.append_at_leaf(&s, user_entry("two"), first_id.clone()).await.expect("at its leaf");
        assert_eq!(second.entry["parentId"].as_str(), first_id.as_deref());
        // The leaf is `two` now: an entry made for `one`'s branch is refused, and nothing written.
        let stale = owners.append_at_leaf(&s, user_entry("three"), first_id.clone()).await;
        match stale {
            Err(StoreError::LeafMoved { expected, now }) => {
                assert_eq!((expected, now.as_deref()), (first_id, second.id()));
            }
            other => panic!("a moved leaf refuses the append: {other:?}"),
        }
        let file = std::fs::read_to_string(&s.path).expect("the transcript");
        assert!(file.contains("two") && !file.contains("three"), "{file}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_waiting_for_another_programs_lock_holds_up_neither_a_reset_nor_the_new_transcript() {
        let (owners, _dir) = owners();
        let s = owners.sessions.clone().session("main", true).await.expect("the index").expect("a session");
        owners.append(&s, user("before")).await.expect("an append");
        let (other, lock_path) = lock_as_another_program(&s.path).await;
        let (o, s2) = (owners.clone(), s.clone());
        let append = started(async move { o.append(&s2, user("waits for the lock")).await }).await;
        let sessions = owners.sessions.clone();
        let reset = owners.exclusive(&s.key, async move {
            tokio::task::spawn_blocking(move || sessions.reset("main", "reset")).await.expect("the reset's thread")
        });
        let reset = tokio::time::timeout(Duration::from_secs(20), reset).await;
        let (fresh, archived) = reset.expect("the reset is not held up").expect("its owner").expect("the reset");
        // The append waited for the old transcript: refused once it is moved aside, before the
        // other program lets go of its lock; the new transcript's appends do not queue behind it.
        let written = tokio::time::timeout(Duration::from_secs(20), append).await.expect("in time").expect("its task");
        let to_fresh =
            tokio::time::timeout(Duration::from_secs(20), owners.append(&fresh, user("to the new one"))).await;
        drop(other);
        let _ = std::fs::remove_file(&lock_path);
        assert!(matches!(written, Err(StoreError::MovedAside(_))), "{written:?}");
        assert!(to_fresh.is_ok_and(|r| r.is_ok()), "the new transcript's append is not held up by the old one's lock");
        let old = std::fs::read_to_string(archived.expect("archived")).expect("the archive");
        assert!(old.contains("before") && !old.contains("waits for the lock"), "{old}");
    }

    /// Takes `transcript`'s lock as another program would: its file, under an `flock` (once this
    /// process's own lock on it has lingered out).
    async fn lock_as_another_program(transcript: &Path) -> (std::fs::File, PathBuf) {
        let lock_path = PathBuf::from(format!("{}.lock", transcript.display()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let other = loop {
            assert!(Instant::now() < deadline, "the lock stayed held");
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&lock_path) {
                Ok(f) => break f,
                Err(_) if std::fs::File::open(&lock_path).is_ok_and(|f| f.try_lock().is_ok()) => {
                    let _ = std::fs::remove_file(&lock_path);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let body = json!({"pid": std::process::id(), "createdAt": "2026-01-01T00:00:00.000Z"}).to_string();
        std::fs::write(&lock_path, body).expect("the lock's body");
        other.lock().expect("flock");
        (other, lock_path)
    }

    #[tokio::test]
    async fn an_append_sent_before_a_reset_is_written_before_it() {
        let (owners, _dir) = owners();
        let s = owners.sessions.clone().session("main", true).await.expect("the index").expect("a session");
        owners.append(&s, user("first")).await.expect("an append");
        // The owner is busy (work held on a gate) while an append and then a reset are sent.
        let (go, gate) = oneshot::channel::<()>();
        let (o, key) = (owners.clone(), s.key.clone());
        let busy = started(async move {
            o.exclusive(&key, async move {
                let _ = gate.await;
            })
            .await
        })
        .await;
        let (o, s2) = (owners.clone(), s.clone());
        let append = started(async move { o.append(&s2, user("sent before the reset")).await }).await;
        let (o, key, sessions) = (owners.clone(), s.key.clone(), owners.sessions.clone());
        let reset = started(async move {
            let work = async move {
                tokio::task::spawn_blocking(move || sessions.reset("main", "reset")).await.expect("the reset's thread")
            };
            o.exclusive(&key, work).await
        })
        .await;
        let _ = go.send(());
        busy.await.expect("its task").expect("its owner");
        let (_, archived) = reset.await.expect("its task").expect("its owner").expect("the reset");
        let written = append.await.expect("its task");
        assert!(written.is_ok(), "the append sent before the reset is written: {written:?}");
        let old = std::fs::read_to_string(archived.expect("archived")).expect("the archive");
        assert!(old.contains("sent before the reset"), "it is in the transcript the reset archived: {old}");
    }

    #[tokio::test]
    async fn a_command_that_panics_leaves_the_owner_and_its_turn_in_place() {
        let (owners, _dir) = owners();
        let never = CancellationToken::new();
        let first = owners.turn("s", &never).await.expect("the first turn");
        let failed = owners.exclusive("s", async { panic!("the work panicked") }).await;
        assert!(failed.is_err(), "the work's caller hears it failed");
        let second = tokio::time::timeout(Duration::from_millis(500), owners.turn("s", &never)).await;
        assert!(second.is_err(), "no second turn while the first is held");
        drop(first);
        let again = tokio::time::timeout(Duration::from_secs(20), owners.turn("s", &never)).await;
        assert!(again.is_ok_and(|t| t.is_ok()), "the turn comes once the first is let go");
    }

    fn msgs(n: usize) -> Messages {
        (0..n).map(|i| ContextMessage::shared(json!({"role": "user", "content": format!("m{i}")}))).collect()
    }

    #[test]
    fn the_context_cache_keeps_within_its_byte_budget_and_busy_contexts_stay() {
        let mut c = ContextCache::default();
        let third = CONTEXT_CACHE_BYTES / 3 - CONTEXT_OVERHEAD;
        for name in ["a", "b", "c"] {
            c.insert(PathBuf::from(name), ("leaf".into(), 0), msgs(1), third);
        }
        c.insert(PathBuf::from("d"), ("leaf".into(), 0), msgs(1), third);
        assert!(
            c.get(Path::new("d"), "leaf", 0).is_none(),
            "no room while the others are busy: the newcomer is not kept"
        );
        assert_eq!(c.map.len(), 3);
        // b and c have been idle long enough to make room; a was just used.
        let long_ago = Instant::now().checked_sub(CONTEXT_CACHE_IDLE * 2).expect("an instant in the past");
        for name in ["b", "c"] {
            c.map.get_mut(Path::new(name)).expect("cached").used = long_ago;
        }
        c.map.get_mut(Path::new("c")).expect("cached").used = long_ago + Duration::from_secs(1);
        c.insert(PathBuf::from("d"), ("leaf".into(), 0), msgs(1), third);
        assert!(c.get(Path::new("b"), "leaf", 0).is_none(), "the least recently used idle context went");
        assert!(c.get(Path::new("c"), "leaf", 0).is_some() && c.get(Path::new("d"), "leaf", 0).is_some());
        assert!(c.bytes <= CONTEXT_CACHE_BYTES, "{} bytes", c.bytes);
        assert!(c.get(Path::new("a"), "other-leaf", 0).is_none(), "a context is served only at its leaf");
        assert!(c.get(Path::new("a"), "leaf", 1).is_none(), "nor after the transcript was rewritten");
        c.insert(PathBuf::from("huge"), ("leaf".into(), 0), msgs(1), CONTEXT_CACHE_BYTES + 1);
        assert!(c.get(Path::new("huge"), "leaf", 0).is_none(), "a context larger than the budget is not kept");
        let mut off = ContextCache::with_budget(0);
        off.insert(PathBuf::from("s"), ("leaf".into(), 0), msgs(1), 1);
        assert!(off.get(Path::new("s"), "leaf", 0).is_none() && off.bytes == 0, "a budget of 0 keeps nothing");

        // Many short sessions fit as well as a few long ones: the budget alone bounds the cache.
        let mut c = ContextCache::default();
        for i in 0..2000 {
            c.insert(PathBuf::from(format!("short-{i}")), ("leaf".into(), 0), msgs(2), 100);
        }
        assert_eq!(c.map.len(), 2000, "2,000 busy short sessions are all kept");
        let mut c = ContextCache::with_budget(10 * (100 + CONTEXT_OVERHEAD));
        for i in 0..20 {
            c.insert(PathBuf::from(format!("short-{i}")), ("leaf".into(), 0), msgs(2), 100);
        }
        assert_eq!(c.map.len(), 10, "each context is charged its overhead");

        let mut c = ContextCache::default();
        c.insert(PathBuf::from("s"), ("l1".into(), 0), msgs(2), 10);
        c.extend(Path::new("s"), Some("l1"), Some("l2"), Some(&json!({"role": "assistant", "content": []})));
        assert_eq!(
            c.get(Path::new("s"), "l2", 0).map(|m| m.len()),
            Some(3),
            "an append continuing the leaf extends it"
        );
        assert!(c.bytes > 10 + CONTEXT_OVERHEAD);
        // A context a long tool loop keeps extending is in use, even if nobody read it for a while.
        let long_ago = Instant::now().checked_sub(CONTEXT_CACHE_IDLE * 2).expect("an instant in the past");
        c.map.get_mut(Path::new("s")).expect("cached").used = long_ago;
        c.extend(Path::new("s"), Some("l2"), Some("l2b"), Some(&json!({"role": "user", "content": "x"})));
        assert!(c.map.get(Path::new("s")).is_some_and(|s| s.used > long_ago), "an extension marks it used");
        c.extend(Path::new("s"), Some("elsewhere"), Some("l3"), Some(&json!({})));
        assert!(c.get(Path::new("s"), "l3", 0).is_none() && c.map.is_empty(), "a branch forgets it");
        assert_eq!(c.bytes, 0);
    }
}
