//! The gateway's shared state: settings, the store, the session index, the event hub, active runs,
//! the `chat.send` dedupe window and the per-session run queue, plus small helpers that move store
//! work off the async threads.

use crate::config::Settings;
use crate::hub::Hub;
use crate::protocol::RpcError;
use crate::sessions::{SessionRef, Sessions};
use pincer_agent::{CancellationToken, ContextMessage, Messages, SessionQueue, ToolRegistry};
use pincer_store::redact::Redactor;
use pincer_store::{build_context, Appended, NewEntry, Session, Store, StoreError, StoreOptions};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;

/// Sessions whose context is kept in memory.
const CONTEXT_CACHE_SESSIONS: usize = 256;

/// A session's context as of `leaf`. Messages are shared with the runs that use them: a turn
/// copies pointers, never the history.
struct CachedContext {
    leaf: String,
    messages: Messages,
}

/// `chat.send` dedupe window (OpenClaw: 5 min, 1000 entries).
const DEDUPE_TTL: Duration = Duration::from_secs(300);
const DEDUPE_MAX: usize = 1000;

/// One run, active or waiting in its session's queue.
pub struct RunHandle {
    pub run_id: String,
    pub session_key: String,
    pub cancel: CancellationToken,
    pub owner_conn: u64,
    /// Set by whoever aborts: `rpc`, `stop-command` or `shutdown`.
    pub abort_origin: Mutex<Option<&'static str>>,
    /// Per-run `seq` of `chat` events.
    pub seq: AtomicU64,
}

impl RunHandle {
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Cancels the run, remembering why (the first reason wins).
    pub fn abort(&self, origin: &'static str) {
        if let Ok(mut o) = self.abort_origin.lock() {
            o.get_or_insert(origin);
        }
        self.cancel.cancel();
    }

    pub fn origin(&self) -> &'static str {
        self.abort_origin.lock().ok().and_then(|o| *o).unwrap_or("rpc")
    }
}

/// The dedupe window: keys with when they were last set, and the order they were set in, so
/// expiring and evicting the oldest cost O(1) per call rather than a scan of the window.
#[derive(Default)]
struct DedupeWindow {
    keys: HashMap<String, (Instant, Dedupe)>,
    order: std::collections::VecDeque<(Instant, String)>,
}

impl DedupeWindow {
    fn set(&mut self, key: &str, now: Instant, state: Dedupe) {
        self.keys.insert(key.to_owned(), (now, state));
        self.order.push_back((now, key.to_owned()));
        // Stale order entries (keys set again, or forgotten) count too, so `order` stays bounded.
        while self.keys.len() > DEDUPE_MAX || self.order.len() > 4 * DEDUPE_MAX {
            self.pop_oldest();
        }
    }

    /// Forgets keys older than the window.
    fn expire(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(t, _)| now.duration_since(*t) >= DEDUPE_TTL) {
            self.pop_oldest();
        }
    }

    /// Drops the oldest entry of `order`, and its key unless it was set again since.
    fn pop_oldest(&mut self) {
        if let Some((t, key)) = self.order.pop_front() {
            if self.keys.get(&key).is_some_and(|(set, _)| *set == t) {
                self.keys.remove(&key);
            }
        }
    }
}

/// What the dedupe window knows about an idempotency key.
#[derive(Clone)]
pub enum Dedupe {
    InFlight,
    Done(Result<Value, RpcError>),
}

pub struct Gateway {
    pub settings: Settings,
    pub store: Store,
    pub sessions: Sessions,
    pub hub: Arc<Hub>,
    pub queue: SessionQueue,
    pub tools: Arc<ToolRegistry>,
    pub redactor: Arc<dyn Redactor>,
    pub started: Instant,
    /// Fired on SIGINT/SIGTERM once runs have ended: connections say goodbye.
    pub shutdown: CancellationToken,
    /// Fired first on SIGINT/SIGTERM: every run (and every run that would start) is aborted.
    stopping_runs: CancellationToken,
    /// Run tasks, awaited on shutdown so partials are persisted.
    pub tasks: TaskTracker,
    /// WebSocket connection tasks, awaited on shutdown so clients get their close frames.
    pub sockets: TaskTracker,
    runs: Mutex<HashMap<String, Arc<RunHandle>>>,
    dedupe: Mutex<DedupeWindow>,
    contexts: Mutex<HashMap<std::path::PathBuf, CachedContext>>,
    next_conn: AtomicU64,
}

impl Gateway {
    pub fn new(settings: Settings) -> Result<Gateway, String> {
        let redactor = settings.redactor()?;
        let store = Store::new(StoreOptions { redactor: redactor.clone(), ..StoreOptions::default() });
        let tools = Arc::new(ToolRegistry::with_builtins(settings.workspace.clone()));
        Ok(Gateway {
            sessions: Sessions::new(&settings.state_dir, store.clone()),
            settings,
            store,
            hub: Arc::new(Hub::default()),
            queue: SessionQueue::new(),
            tools,
            redactor,
            started: Instant::now(),
            shutdown: CancellationToken::new(),
            stopping_runs: CancellationToken::new(),
            tasks: TaskTracker::new(),
            sockets: TaskTracker::new(),
            runs: Mutex::new(HashMap::new()),
            dedupe: Mutex::new(DedupeWindow::default()),
            contexts: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
        })
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub fn uptime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    // ---- runs ----

    /// Registers a run unless its session already has `max` runs active or waiting.
    pub fn register_run_bounded(
        &self,
        run_id: &str,
        session_key: &str,
        owner_conn: u64,
        max: usize,
    ) -> Option<Arc<RunHandle>> {
        let mut runs = lock(&self.runs);
        if runs.values().filter(|r| r.session_key == session_key).count() >= max {
            return None;
        }
        let h = self.new_run(run_id, session_key, owner_conn);
        runs.insert(run_id.to_owned(), h.clone());
        Some(h)
    }

    fn new_run(&self, run_id: &str, session_key: &str, owner_conn: u64) -> Arc<RunHandle> {
        Arc::new(RunHandle {
            run_id: run_id.to_owned(),
            session_key: session_key.to_owned(),
            cancel: self.stopping_runs.child_token(),
            owner_conn,
            abort_origin: Mutex::new(None),
            seq: AtomicU64::new(0),
        })
    }

    pub fn finish_run(&self, run_id: &str) {
        lock(&self.runs).remove(run_id);
    }

    pub fn run(&self, run_id: &str) -> Option<Arc<RunHandle>> {
        lock(&self.runs).get(run_id).cloned()
    }

    /// Runs of a session (active or queued), oldest first.
    pub fn runs_of(&self, session_key: &str) -> Vec<Arc<RunHandle>> {
        lock(&self.runs).values().filter(|r| r.session_key == session_key).cloned().collect()
    }

    pub fn all_runs(&self) -> Vec<Arc<RunHandle>> {
        lock(&self.runs).values().cloned().collect()
    }

    /// Aborts every run (origin `shutdown`) and every run registered from now on.
    pub fn stop_runs(&self) {
        for r in self.all_runs() {
            r.abort("shutdown");
        }
        self.stopping_runs.cancel();
    }

    /// A token cancelled when the gateway stops (for work that is not a run, like compaction).
    pub fn stopping(&self) -> CancellationToken {
        self.stopping_runs.child_token()
    }

    // ---- dedupe ----

    /// Claims an idempotency key; returns what is known if it was already used.
    pub fn dedupe_begin(&self, key: &str) -> Option<Dedupe> {
        let mut d = lock(&self.dedupe);
        let now = Instant::now();
        d.expire(now);
        if let Some((_, state)) = d.keys.get(key) {
            return Some(state.clone());
        }
        d.set(key, now, Dedupe::InFlight);
        None
    }

    /// Releases a claimed key that led nowhere (the send was refused before anything was written).
    pub fn dedupe_forget(&self, key: &str) {
        lock(&self.dedupe).keys.remove(key);
    }

    pub fn dedupe_finish(&self, key: &str, result: Result<Value, RpcError>) {
        lock(&self.dedupe).set(key, Instant::now(), Dedupe::Done(result));
    }

    // ---- store work, off the async threads ----

    /// Runs `f` on the session index on a blocking thread (it reads, locks and writes files).
    pub async fn index<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Sessions) -> Result<T, RpcError> + Send + 'static,
    ) -> Result<T, RpcError> {
        let gw = self.clone();
        tokio::task::spawn_blocking(move || f(&gw.sessions))
            .await
            .map_err(|e| RpcError::unavailable(format!("session index task failed: {e}")))?
    }

    /// Appends one entry to a session's transcript; returns it as written.
    pub async fn append(&self, session: &SessionRef, entry: NewEntry) -> Result<Appended, StoreError> {
        let store = self.store.clone();
        let path = session.path.clone();
        let sid = session.session_id.clone();
        let r = tokio::task::spawn_blocking(move || store.append_with(&path, entry, Some(&sid)))
            .await
            .unwrap_or_else(|e| Err(StoreError::Internal(format!("append task failed: {e}"))));
        // Keep the cached context in step with what was written.
        let mut cache = lock(&self.contexts);
        match &r {
            Ok(a) if a.appended => {
                let extends = cache.get(&session.path).is_some_and(|c| {
                    Some(c.leaf.as_str()) == a.entry.get("parentId").and_then(Value::as_str)
                        && a.entry.get("type").and_then(Value::as_str) == Some("message")
                });
                match (extends, cache.get_mut(&session.path), a.id()) {
                    (true, Some(c), Some(id)) => {
                        c.leaf = id.to_owned();
                        c.messages.push(ContextMessage::shared(a.entry.get("message").cloned().unwrap_or(Value::Null)));
                    }
                    _ => {
                        cache.remove(&session.path);
                    }
                }
            }
            Ok(_) => {}
            Err(_) => {
                cache.remove(&session.path);
            }
        }
        r
    }

    /// The LLM context of a session's active branch (empty for a missing file). Served from memory
    /// while the file's leaf is the one the cache was built at (every append of this gateway keeps
    /// the cache in step), so a turn does not re-read a long transcript; rebuilt from the file when
    /// anything else moved the leaf (another process, a compaction, a branch).
    pub async fn context(&self, session: &SessionRef) -> Result<Messages, String> {
        let path = session.path.clone();
        let store = self.store.clone();
        let leaf = {
            let (store, path) = (store.clone(), path.clone());
            tokio::task::spawn_blocking(move || store.leaf(&path))
                .await
                .map_err(|e| format!("context task failed: {e}"))?
                .map_err(|e| e.to_string())?
        };
        if let (Some(leaf), Some(c)) = (&leaf, lock(&self.contexts).get(&path)) {
            if &c.leaf == leaf {
                return Ok(c.messages.clone());
            }
        }
        let messages = tokio::task::spawn_blocking(move || match std::fs::read(&path) {
            Ok(bytes) => {
                let s = Session::parse(bytes);
                Ok(build_context(&s, &s.leaf)
                    .message_values()
                    .into_iter()
                    .map(ContextMessage::shared)
                    .collect::<Messages>())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Messages::new()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        })
        .await
        .unwrap_or_else(|e| Err(format!("context task failed: {e}")))?;
        if let Some(leaf) = leaf {
            let mut cache = lock(&self.contexts);
            if cache.len() >= CONTEXT_CACHE_SESSIONS {
                cache.clear();
            }
            cache.insert(session.path.clone(), CachedContext { leaf, messages: messages.clone() });
        }
        Ok(messages)
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Pi usage with every count zero.
pub fn zero_usage() -> Value {
    json!({"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"totalTokens":0,
        "cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}})
}

/// A gateway-injected assistant message (OpenClaw's shape: `provider: "openclaw"`,
/// `model: "gateway-injected"`, zero usage, `stopReason: "stop"`).
pub fn injected_message(text: &str, idempotency_key: Option<&str>, abort: Option<Value>) -> Value {
    let mut m = json!({
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "timestamp": pincer_store::ids::now_ms(),
        "stopReason": "stop",
        "usage": zero_usage(),
        "api": "openai-responses",
        "provider": "openclaw",
        "model": "gateway-injected",
    });
    if let Some(k) = idempotency_key {
        m["idempotencyKey"] = json!(k);
    }
    if let Some(a) = abort {
        m["openclawAbort"] = a;
    }
    m
}
