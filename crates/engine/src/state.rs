//! The engine ([`Engine`]): settings, the store, the session index, the event hub, active runs, the
//! `chat.send` dedupe window and the sessions' owners ([`crate::owner`]: each session's turn order,
//! appends and context), plus small helpers that move store work off the async threads. Every adapter (the WebSocket protocol, the OpenAI endpoint, SSE, the
//! channels) holds an `Arc<Engine>`.

use crate::config::{Settings, StoreSettings};
use crate::error::{EngineError, GatewayError};
use crate::hub::Hub;
pub use crate::owner::TranscriptObserver;
use crate::protocol::RunAnswer;
use crate::sessions::{SessionRef, Sessions};
use pincer_agent::{CancellationToken, Messages, ToolRegistry};
use pincer_store::redact::Redactor;
use pincer_store::{Appended, NewEntry, Pos, Store, StoreError, StoreOptions, Transcripts};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;

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
    /// Aborted because its session's transcript is about to be moved aside (a reset or delete,
    /// [`crate::abort::abort_to_move`]): nothing is to be marked there that only a restart reads.
    pub moving_aside: std::sync::atomic::AtomicBool,
    /// Per-run `seq` of `chat` events.
    pub seq: AtomicU64,
    /// Per-run `seq` of `agent` events.
    pub agent_seq: AtomicU64,
    /// Cancelled when the run has finished (its result is in the dedupe window by then).
    pub done: CancellationToken,
    /// When the run was registered (ms since the epoch).
    pub started_at: u64,
    /// What the run's own client follows without the event bus (the OpenAI endpoint): the text
    /// it streams now and, once over, how it ended.
    pub progress: tokio::sync::watch::Sender<Progress>,
}

/// A run as its own client follows it ([`RunHandle::progress`]).
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The text of the message the run streams now, as its last `chat` delta carried it (empty
    /// before the first and after each persisted row): `chat.history`'s `inFlightRun`.
    pub text: String,
    /// How the run ended, once it has.
    pub end: Option<TurnOutcome>,
}

/// Turns of one session running or waiting; beyond this `chat.send` answers "session busy".
pub const MAX_QUEUED_PER_SESSION: usize = 32;

/// How a run ended (set before it is let go of: a client holding its handle always sees it).
#[derive(Debug, Clone)]
pub enum TurnOutcome {
    /// Its reply, as written (the row's message, with `__openclaw`).
    Replied(Value),
    /// Its key was answered before (a resent key that waited in the queue): the reply is in the
    /// transcript.
    AnsweredBefore,
    /// Stopped; its partial as written, when it had one.
    Aborted(Option<Value>),
    /// Failed: what was wrong, and its `errorKind`.
    Failed { message: String, kind: String },
}

impl RunHandle {
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The `seq` of the last `chat` event sent (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    pub fn next_agent_seq(&self) -> u64 {
        self.agent_seq.fetch_add(1, Ordering::Relaxed) + 1
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

    /// Whether the run has ended (its end is announced, or about to be): [`Progress::end`].
    pub fn ended(&self) -> bool {
        self.progress.borrow().end.is_some()
    }

    /// The text of the message the run streams now ([`Progress::text`]).
    pub fn streamed(&self) -> String {
        self.progress.borrow().text.clone()
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
    /// The answer, and when its run started (ms since the epoch) if one ran here.
    Done(Result<RunAnswer, EngineError>, Option<u64>),
}

pub struct Engine {
    pub settings: Settings,
    /// The transcript store (JSONL files, or PostgreSQL): the only writer of transcripts.
    pub store: Arc<dyn Transcripts>,
    pub sessions: Arc<Sessions>,
    pub hub: Arc<Hub>,
    /// The owner of each session in use: its turn order, its appends, its context ([`crate::owner`]).
    pub owners: Arc<crate::owner::Owners>,
    /// The tools of `main` and of each configured agent ([`Engine::tools`]).
    tools: std::collections::BTreeMap<crate::sessions::AgentId, Arc<ToolRegistry>>,
    /// The MCP servers (started by the gateway's `serve`, stopped with it).
    pub mcp: Arc<pincer_agent::mcp::Manager>,
    /// Per agent: its built-ins with its MCP servers' tools, as of [`pincer_agent::mcp::Manager::version`].
    mcp_tools: Mutex<HashMap<String, (u64, Arc<ToolRegistry>)>>,
    /// Held (written) by the startup recovery while it takes up the turns the last stop cut, so
    /// that no new turn of a session comes before its resumed one ([`Engine::recovered`]).
    pub recovering: Arc<tokio::sync::RwLock<()>>,
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
    next_conn: AtomicU64,
    /// The search index kept up to date from the store's commits (`None`: it could not be opened).
    pub indexer: Option<Arc<pincer_search::Indexer>>,
    /// The connections `sessions.search` reads the index with, one per running search (`None`
    /// without the index); closed at shutdown, which stops the searches still running.
    pub search_readers: Option<pincer_search::Readers>,
    /// The PostgreSQL store when `[store] backend = "postgres"` (also in `store`): replicas.
    pub pg: Option<pincer_pg::PgStore>,
    /// Sessions the relay should follow from an earlier seq than their end when it starts
    /// watching them (a catch-up read the store up to there): key → (seq, when asked).
    relay_from: Mutex<HashMap<String, (Pos, Instant)>>,
    /// Memory that answers built whole may hold at once ([`crate::budget`]).
    pub answers: crate::budget::Budget,
    /// Tool calls waiting for a human, and the allow-always list ([`crate::approvals`]).
    pub approvals: crate::pending::Approvals,
    /// What each messaging channel reports ([`crate::board`]); the adapters write it.
    pub channels: crate::board::Board,
}

/// How long a [`Engine::relay_from`] hint waits for the relay to start watching its session.
const RELAY_HINT_TTL: Duration = Duration::from_secs(5);

/// The store the settings name, for one-off commands (`pincer transcript export --session`).
pub fn open_transcripts(settings: &Settings) -> Result<Arc<dyn Transcripts>, GatewayError> {
    Ok(open_configured(settings)?.0)
}

/// [`open_transcripts`], with the PostgreSQL store itself when it is the one configured (for
/// `pincer sessions search --config`).
pub fn open_configured(
    settings: &Settings,
) -> Result<(Arc<dyn Transcripts>, Option<pincer_pg::PgStore>), GatewayError> {
    let redactor = settings.redactor().map_err(GatewayError::Config)?;
    match &settings.store {
        StoreSettings::Jsonl => Ok((Arc::new(Store::new(StoreOptions { redactor, ..StoreOptions::default() })), None)),
        StoreSettings::Postgres { .. } => {
            let (store, pg, _) = open_store(settings, &redactor)?;
            Ok((store, pg))
        }
    }
}

/// Why [`Engine::turn_slot`] gave no slot.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// Cancelled while waiting (an abort, or the gateway stopping).
    #[error("shutting down")]
    Cancelled,
    /// The store could not be asked (the database is unreachable).
    #[error("{0}")]
    Unavailable(String),
}

/// A session's turn, held (see [`Engine::turn_slot`]).
pub struct TurnSlot {
    _local: crate::owner::Permit,
    _shared: Option<pincer_store::Held>,
    /// On PostgreSQL: the session id the key's index row named when the slot was taken (`None`:
    /// no row), as every replica sees it.
    row: Option<Option<String>>,
}

impl TurnSlot {
    /// True when `session` (read before the slot was waited for) was reset or deleted since:
    /// by another replica (the index row read with the slot names another session, or none), or
    /// by this process (its key now names another transcript, or none; looked up only when the
    /// [`crate::sessions::Sessions::moved`] counter says some transcript was moved aside since).
    /// Its transcript may be archived then: nothing is to be written under its old name.
    /// (The future holds no borrow of the slot, which is not `Sync`.)
    pub fn moved(&self, gw: &Arc<Engine>, session: &SessionRef) -> impl std::future::Future<Output = bool> + Send {
        let by_replica = self.row.as_ref().is_some_and(|now| now.as_deref() != Some(session.session_id.as_str()));
        let (sessions, session) = (gw.sessions.clone(), session.clone());
        async move { by_replica || sessions.moved_aside(&session).await }
    }
}

/// What [`open_store`] opens.
type Opened = (Arc<dyn Transcripts>, Option<pincer_pg::PgStore>, Option<Arc<pincer_search::Indexer>>);

/// The configured store (with the search index kept from its commits, for files).
fn open_store(settings: &Settings, redactor: &Arc<dyn Redactor>) -> Result<Opened, GatewayError> {
    match &settings.store {
        StoreSettings::Jsonl => {
            let indexer = match pincer_search::Indexer::start(&settings.state_dir) {
                Ok(i) => Some(i),
                Err(e) => {
                    tracing::warn!("search is off: {e}");
                    None
                }
            };
            let on_append = indexer.as_ref().map(pincer_search::Indexer::observer);
            let store = Store::new(StoreOptions { redactor: redactor.clone(), on_append, ..StoreOptions::default() });
            Ok((Arc::new(store), None, indexer))
        }
        StoreSettings::Postgres { url, pool_size, replica_id } => {
            let pg = pincer_pg::PgStore::connect(pincer_pg::PgOptions {
                url: url.clone(),
                pool_size: *pool_size,
                state_dir: settings.state_dir.clone(),
                redactor: redactor.clone(),
                cwd: StoreOptions::default().cwd,
            })
            .map_err(|e| GatewayError::Config(format!("the PostgreSQL store: {e}")))?;
            tracing::info!(
                "store: PostgreSQL at {} (replica {replica_id}, up to {pool_size} connections)",
                pincer_pg::redact_url(url)
            );
            Ok((Arc::new(pg.clone()), Some(pg), None))
        }
    }
}

/// Agent `a`'s tools, with `bash`'s sandbox found and checked to work over its workspace when
/// `bash` is enabled: a sandbox that cannot run stops the startup, unless `sandbox = "off"` (a
/// warning).
fn agent_tools(a: &crate::config::AgentSettings) -> Result<Arc<ToolRegistry>, GatewayError> {
    use pincer_agent::tools::bash::{BashConfig, Sandbox};
    let registry = |bash: &Arc<BashConfig>| {
        Ok(Arc::new(ToolRegistry::from_policy(&a.tools, a.workspace.clone(), bash, &a.web_fetch)))
    };
    if !a.tools.tools.iter().any(|t| t == "bash") {
        return registry(&a.bash);
    }
    let mut bash = (*a.bash).clone();
    if bash.sandbox == Sandbox::Off {
        tracing::warn!("agent {}: sandbox = \"off\": bash commands run unconfined, as the gateway's user", a.id);
        return registry(&Arc::new(bash));
    }
    let fail = |e: String| {
        GatewayError::Config(format!(
            "agent {}: the bash tool needs its sandbox: {e} (or deny the tool: [agents.defaults.tools] deny = [\"bash\"], or run it unconfined: sandbox = \"off\")",
            a.id
        ))
    };
    bash.sandbox = Sandbox::Bwrap(BashConfig::find_bwrap().map_err(fail)?);
    bash.probe(&a.workspace).map_err(fail)?;
    tracing::info!(
        "agent {}: bash sandboxed by bubblewrap (network {})",
        a.id,
        if bash.network { "on" } else { "off" }
    );
    registry(&Arc::new(bash))
}

impl Engine {
    /// Agent `agent`'s tools; an agent known only from its sessions on disk gets the defaults'
    /// tools over its own workspace.
    /// Waits until the turns cut by the last stop have been taken up ([`Engine::recovering`]).
    pub async fn recovered(&self) {
        drop(self.recovering.read().await);
    }

    pub fn tools(&self, agent: &str) -> Arc<ToolRegistry> {
        let builtins = || {
            self.tools.get(agent).cloned().unwrap_or_else(|| {
                let a = self.settings.agents.get(agent);
                Arc::new(ToolRegistry::from_policy(&a.tools, a.workspace.clone(), &a.bash, &a.web_fetch))
            })
        };
        let a = self.settings.agents.get(agent);
        if a.mcp_servers.is_empty() {
            return builtins();
        }
        // The MCP servers' tools as they are now (a failed server's are left out), rebuilt only
        // when some server's state or tools changed.
        let version = self.mcp.version();
        if let Some((v, tools)) = lock(&self.mcp_tools).get(agent) {
            if *v == version {
                return tools.clone();
            }
        }
        let tools = Arc::new(builtins().with_tools(self.mcp.tools(&a.mcp_servers)));
        lock(&self.mcp_tools).insert(agent.to_owned(), (version, tools.clone()));
        tools
    }

    /// The MCP servers and each agent's tools from them: `{servers: [...], agents: {id: [names]}}`
    /// (`status`, `GET /api/mcp`, `pincer mcp list`).
    pub fn mcp_status(&self) -> Value {
        let servers: Vec<Value> = self.mcp.servers().map(|s| s.status()).collect();
        let mut agents = Vec::new();
        for a in self.settings.agents.configured() {
            let tools: Vec<String> = self
                .tools(a.id.as_str())
                .names()
                .into_iter()
                .filter(|n| n.starts_with(pincer_agent::mcp::PREFIX))
                .collect();
            agents.push((a.id.as_str(), crate::protocol::AgentMcp { servers: &a.mcp_servers, tools }));
        }
        serde_json::to_value(crate::protocol::McpStatus { servers, agents }).unwrap_or_default()
    }

    /// A session's model: the one it chose, else its agent's.
    pub fn session_model(&self, s: &SessionRef) -> String {
        s.model().unwrap_or_else(|| self.settings.agents.get(&s.agent_id).model.clone())
    }

    pub fn new(settings: Settings) -> Result<Engine, GatewayError> {
        let redactor = settings.redactor().map_err(GatewayError::Config)?;
        crate::logs::set_redactor(redactor.clone());
        let (store, pg, indexer) = open_store(&settings, &redactor)?;
        let tools = settings
            .agents
            .configured()
            .map(|a| Ok((a.id.clone(), agent_tools(a)?)))
            .collect::<Result<_, GatewayError>>()?;
        let context_budget = settings.context_cache_bytes;
        let approvals = crate::pending::Approvals::load(&settings.state_dir).map_err(GatewayError::Config)?;
        let mcp = Arc::new(pincer_agent::mcp::Manager::new(settings.mcp_servers.clone()));
        let search_readers = indexer.as_ref().and_then(|_| match pincer_search::Readers::new(&settings.state_dir) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("search is off: {e}");
                None
            }
        });
        let sessions = Arc::new(
            Sessions::new(&settings.state_dir, store.clone())
                .with_agents(settings.agents.configured().map(|a| a.id.clone())),
        );
        Ok(Engine {
            owners: Arc::new(crate::owner::Owners::new(store.clone(), sessions.clone(), context_budget)),
            sessions,
            settings,
            store,
            hub: Arc::new(Hub::default()),
            tools,
            mcp,
            mcp_tools: Mutex::default(),
            redactor,
            started: Instant::now(),
            shutdown: CancellationToken::new(),
            stopping_runs: CancellationToken::new(),
            recovering: Arc::default(),
            tasks: TaskTracker::new(),
            sockets: TaskTracker::new(),
            runs: Mutex::new(HashMap::new()),
            dedupe: Mutex::new(DedupeWindow::default()),
            next_conn: AtomicU64::new(1),
            search_readers,
            indexer,
            pg,
            relay_from: Mutex::default(),
            answers: crate::budget::Budget::default(),
            approvals,
            channels: crate::board::Board::default(),
        })
    }

    /// Tells `observer` of every append and replaced transcript from now on.
    pub fn observe(&self, observer: Arc<dyn TranscriptObserver>) {
        self.owners.observe(observer);
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub fn uptime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    // ---- runs ----

    /// Registers a run unless its session already has `max` runs active or waiting; with the
    /// number of the session's runs registered before it (the ones it will wait for).
    pub fn register_run_bounded(
        &self,
        run_id: &str,
        session_key: &str,
        owner_conn: u64,
        max: usize,
    ) -> Option<(Arc<RunHandle>, usize)> {
        let mut runs = lock(&self.runs);
        let ahead = runs.values().filter(|r| r.session_key == session_key).count();
        if ahead >= max {
            return None;
        }
        let h = self.new_run(run_id, session_key, owner_conn);
        runs.insert(run_id.to_owned(), h.clone());
        if let (Some(pg), Some(replica)) = (&self.pg, self.replica_id()) {
            // Seen by the other replicas (abort, takeover); the heartbeat re-adds it if this fails.
            let (pg2, run, key, replica) = (pg.clone(), run_id.to_owned(), session_key.to_owned(), replica.to_owned());
            pg.handle().spawn(async move {
                if let Err(e) = pg2.run_started(run, key, replica).await {
                    tracing::debug!("cannot record the run: {e}");
                }
            });
        }
        Some((h, ahead))
    }

    /// This replica's id (the PostgreSQL store only).
    pub fn replica_id(&self) -> Option<&str> {
        match &self.settings.store {
            StoreSettings::Postgres { replica_id, .. } => Some(replica_id),
            StoreSettings::Jsonl => None,
        }
    }

    fn new_run(&self, run_id: &str, session_key: &str, owner_conn: u64) -> Arc<RunHandle> {
        Arc::new(RunHandle {
            run_id: run_id.to_owned(),
            session_key: session_key.to_owned(),
            cancel: self.stopping_runs.child_token(),
            owner_conn,
            abort_origin: Mutex::new(None),
            moving_aside: Default::default(),
            seq: AtomicU64::new(0),
            agent_seq: AtomicU64::new(0),
            done: CancellationToken::new(),
            started_at: pincer_pi::now_ms(),
            progress: tokio::sync::watch::Sender::new(Progress::default()),
        })
    }

    pub fn finish_run(&self, run_id: &str) {
        if let Some(run) = lock(&self.runs).remove(run_id) {
            run.done.cancel();
            if let Some(pg) = &self.pg {
                let (pg2, run) = (pg.clone(), run_id.to_owned());
                pg.handle().spawn(async move {
                    let _ = pg2.run_finished(run).await;
                });
            }
        }
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
        if let Some(readers) = &self.search_readers {
            readers.close();
        }
        self.stopping_runs.cancel();
    }

    /// A token cancelled when the gateway stops (for work that is not a run, like compaction).
    pub fn stopping(&self) -> CancellationToken {
        self.stopping_runs.child_token()
    }

    /// Waits for the session's turn (`session_key`: canonical): its turn from the session's owner
    /// and, on the PostgreSQL store, the session's turn lock shared by every replica (so turns of
    /// one session run one at a time whichever replica runs them, as they do in one process).
    /// Fails when `cancel` fires first, or when the database cannot be asked. A caller holding a
    /// [`SessionRef`] read before asks [`TurnSlot::moved`] (or takes [`Engine::slot_for`]).
    pub async fn turn_slot(
        self: &Arc<Self>,
        session_key: &str,
        cancel: &CancellationToken,
    ) -> Result<TurnSlot, SlotError> {
        let local = self.owners.turn(session_key, cancel).await.map_err(|e| match e {
            crate::owner::TurnError::Cancelled => SlotError::Cancelled,
            crate::owner::TurnError::Gone => SlotError::Unavailable(e.to_string()),
        })?;
        let Some(pg) = &self.pg else { return Ok(TurnSlot { _local: local, _shared: None, row: None }) };
        let agent = crate::sessions::agent_of(session_key);
        loop {
            match pg.try_lock_turns(agent, session_key).await {
                Ok(Some((held, row))) => return Ok(TurnSlot { _local: local, _shared: Some(held), row: Some(row) }),
                Ok(None) => {}
                Err(e) => return Err(SlotError::Unavailable(format!("cannot take the session's turn: {e}"))),
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(SlotError::Cancelled),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    }

    /// [`Engine::turn_slot`] for work on `session` that must not follow it elsewhere (a branch
    /// move, a label, a compaction): an error naming the session when it was reset or deleted
    /// while this waited (nothing is written then).
    pub async fn slot_for(
        self: &Arc<Self>,
        session: &SessionRef,
        cancel: &CancellationToken,
    ) -> Result<TurnSlot, EngineError> {
        let slot = self.turn_slot(&session.key, cancel).await.map_err(|e| EngineError::Unavailable(e.to_string()))?;
        if slot.moved(self, session).await {
            return Err(EngineError::Conflict(format!(
                "session {} was reset or deleted meanwhile; nothing was written (reload it)",
                session.key
            )));
        }
        Ok(slot)
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

    /// The result recorded for an idempotency key, if its run has finished.
    pub fn dedupe_result(&self, key: &str) -> Option<Result<RunAnswer, EngineError>> {
        self.dedupe_done(key).map(|(r, _)| r)
    }

    /// The answer of a finished key, with when its run started (if one ran here).
    pub fn dedupe_done(&self, key: &str) -> Option<(Result<RunAnswer, EngineError>, Option<u64>)> {
        match lock(&self.dedupe).keys.get(key) {
            Some((_, Dedupe::Done(r, started))) => Some((r.clone(), *started)),
            _ => None,
        }
    }

    pub fn dedupe_finish(&self, key: &str, result: Result<RunAnswer, EngineError>) {
        self.dedupe_finish_run(key, result, None);
    }

    /// [`Engine::dedupe_finish`] for a run that started at `started_at`.
    pub fn dedupe_finish_run(&self, key: &str, result: Result<RunAnswer, EngineError>, started_at: Option<u64>) {
        lock(&self.dedupe).set(key, Instant::now(), Dedupe::Done(result, started_at));
    }

    // ---- store work, off the async threads ----

    /// Runs `f` on a blocking thread (it reads, locks or writes files).
    pub async fn blocking<T: Send + 'static, E: From<EngineError> + Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let gw = self.clone();
        tokio::task::spawn_blocking(move || f(&gw)).await.map_err(|e| E::from(EngineError::task(e)))?
    }

    /// The session of a key (created in the index when `create` and missing): from memory when it
    /// can be answered there ([`Sessions::resolve_cached`]), else on a blocking thread.
    pub async fn session(self: &Arc<Self>, key: &str, create: bool) -> Result<Option<SessionRef>, EngineError> {
        self.sessions.clone().session(key, create).await
    }

    /// Creates the session's transcript file (its header) if it is not there yet.
    /// (In the session's owner's order, as every write of its transcript.)
    pub async fn ensure_transcript(self: &Arc<Self>, session: &SessionRef) -> Result<(), EngineError> {
        let (path, sid, gw) = (session.path.clone(), session.session_id.clone(), self.clone());
        let create = async move {
            gw.blocking(move |gw| {
                gw.store
                    .ensure_created(&path, Some(&sid))
                    .map_err(|e| EngineError::Persistence(format!("cannot create the transcript: {e}")))
            })
            .await
        };
        self.with_transcript(&session.key, create).await?
    }

    /// Reserves room in the answer budget for an answer over `path`'s transcript ([`crate::budget`]).
    pub async fn reserve_answer(
        self: &Arc<Self>,
        path: &std::path::Path,
        answer: crate::budget::Answer,
        what: &str,
    ) -> Result<crate::budget::Held, EngineError> {
        let bytes = self.transcript_bytes(path).await;
        self.answers.reserve(answer, bytes, what).await
    }

    /// [`Engine::reserve_answer`] from a blocking thread (one that runs store work).
    pub fn reserve_answer_blocking(
        &self,
        path: &std::path::Path,
        answer: crate::budget::Answer,
        what: &str,
    ) -> Result<crate::budget::Held, EngineError> {
        // (A size the store cannot tell now reserves nothing beyond the answer.)
        let bytes = self.store.bytes(path).ok().flatten().unwrap_or(0);
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| EngineError::Internal("the answer budget is asked outside the gateway's runtime".into()))?;
        handle.block_on(self.answers.reserve(answer, bytes, what))
    }

    /// The size of `path`'s transcript in bytes (0 when it has none).
    pub async fn transcript_bytes(self: &Arc<Self>, path: &std::path::Path) -> u64 {
        let (store, p) = (self.store.clone(), path.to_owned());
        let read = tokio::task::spawn_blocking(move || store.bytes(&p)).await;
        read.ok().and_then(Result::ok).flatten().unwrap_or(0)
    }

    /// Runs `f` on the session index on a blocking thread.
    pub async fn index<T: Send + 'static, E: From<EngineError> + Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Sessions) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        self.blocking(move |gw| f(&gw.sessions)).await
    }

    /// Appends one entry to a session's transcript; returns it as written.
    pub async fn append(self: &Arc<Self>, session: &SessionRef, entry: NewEntry) -> Result<Appended, StoreError> {
        let mut r = self.append_all(session, vec![entry]).await?;
        r.pop().ok_or_else(|| StoreError::Internal("the append returned nothing".into()))
    }

    /// Appends entries to a session's transcript in order, in one durable commit; returns them as
    /// written.
    /// Fails with [`StoreError::MovedAside`] when the session's transcript was moved aside (a
    /// reset, a delete) before the write: nothing is ever written under an archived name.
    pub async fn append_all(
        self: &Arc<Self>,
        session: &SessionRef,
        entries: Vec<NewEntry>,
    ) -> Result<Vec<Appended>, StoreError> {
        self.owners.append(session, entries).await
    }

    /// Runs `work` in the order of session `key`'s appends, none overlapping it: work that moves
    /// the transcript aside or rewrites it (a reset, a delete, a trim). `work` must not wait for
    /// the session's own appends, context or turn (it would wait for itself).
    pub async fn with_transcript<T: Send + 'static>(
        self: &Arc<Self>,
        key: &str,
        work: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, EngineError> {
        self.owners.exclusive(key, work).await
    }

    /// The durable id of an event announcing entry `id` (`part` 0: its `session.message`, 1: the
    /// `chat` event carrying it), when this process appended it lately (the owners keep where).
    pub fn event_id(&self, session: &SessionRef, id: &str, part: u8) -> Option<crate::hub::EventId> {
        let pos = self.owners.position(&session.path, id)?;
        Some(crate::hub::EventId { session_id: session.session_id.clone(), pos, part })
    }

    /// Asks the relay to announce session `key`'s rows after `seq` when it starts watching it.
    pub fn relay_from(&self, key: &str, seq: Pos) {
        let mut hints = lock(&self.relay_from);
        hints.retain(|_, (_, at)| at.elapsed() < RELAY_HINT_TTL);
        let e = hints.entry(key.to_owned()).or_insert((seq, Instant::now()));
        *e = (e.0.min(seq), Instant::now());
    }

    /// The seq the relay should follow `key` from (see [`Engine::relay_from`]), once.
    pub fn take_relay_from(&self, key: &str) -> Option<Pos> {
        lock(&self.relay_from).remove(key).filter(|(_, at)| at.elapsed() < RELAY_HINT_TTL).map(|(seq, _)| seq)
    }

    /// Drops what is kept about a session whose transcript was replaced in place (trimmed by
    /// `sessions.compact {maxLines}`): the next turn and the OpenAI index read it anew.
    pub fn replaced(&self, session: &SessionRef) {
        self.owners.replaced(session);
    }

    /// The LLM context of a session's active branch (empty for a missing file), from its owner
    /// (served from memory while its leaf is where the owner's last append left it).
    pub async fn context(self: &Arc<Self>, session: &SessionRef) -> Result<Messages, GatewayError> {
        self.owners.context(session).await
    }
}

use pincer_pi::lock;

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
        "timestamp": pincer_pi::now_ms(),
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

/// Whether `m` is one of [`injected_message`]'s: written by the gateway, not a provider's reply, so
/// its (zero) usage says nothing about the context.
pub fn is_injected(m: &Value) -> bool {
    m["provider"] == "openclaw" && m["model"] == "gateway-injected"
}
