//! Pincer's PostgreSQL store: the [`Transcripts`] seam over one database that several gateway
//! replicas share. The only SQL in Pincer is in this crate.
//!
//! Layout:
//! - [`schema`]: the migrations, applied on start.
//! - this file: [`PgStore`], its options, and the `Transcripts` implementation:
//!   - an append locks its transcript (`pg_advisory_xact_lock` on the name, then the transcript row
//!     `SELECT … FOR UPDATE`), looks its idempotency key up (unique per transcript in the schema),
//!     chains `parentId` to the leaf read under that lock (or the chosen parent), renders the entry
//!     with the store's one renderer ([`NewEntry::render`]), inserts it at `seq = last_seq + 1`,
//!     moves the leaf, and commits with a `pg_notify` of `<file>:<seq>` (a wake-up, never the
//!     payload), delivered only if the commit succeeds;
//!   - reads build the very bytes a JSONL file of the same transcript has (the verbatim header and
//!     entry lines), so `Session`, context and `chat.history` come from the same code as files;
//!   - the session index is one row per key (`sessions`), read and written whole per agent like
//!     `sessions.json`, its stamp a version per agent.
//! - [`watch`]: `LISTEN` for appends of other replicas and run control, with reconnects.
//! - [`runs`]: the runs of every replica (heartbeats, cross-replica abort, takeover of a dead one's).
//! - [`search`]: full-text search of the messages, indexed in the appending transaction.
//!
//! Names: transcripts keep the names the JSONL layout gives them, relative to the state directory
//! (`agents/<agent>/sessions/<sessionId>.jsonl`), so callers pass paths either way.
//!
//! The work runs on a small runtime owned by the store; the blocking [`Transcripts`] methods wait
//! for it (they are called off the async threads, as the file store's are).

pub mod runs;
pub mod schema;
pub mod search;
pub mod watch;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Timeouts};
use pincer_store::history::{history_of_window, History, HistoryOptions, MAX_WINDOW};
use pincer_store::redact::Redactor;
use pincer_store::store::new_header;
use pincer_store::trim::Trimmed;
use pincer_store::{Appended, Held, IndexStamp, NewEntry, ParentChoice, Pos, Session, StoreError, Transcripts};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::NoTls;

/// A parsed connection URL (to validate one, or read its parts, without connecting).
pub use tokio_postgres::Config as PgConfig;

/// A transcript [`PgStore::changed_since`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    pub path: PathBuf,
    /// Its [`Transcripts::end`] now.
    pub end: Pos,
    /// Its rewrite count now ([`Transcripts::leaf_version`]).
    pub rewrites: u64,
}

/// The position of the entry whose `seq` is `seq` (seqs start at 1 and grow with each append).
pub fn pos(seq: i64) -> Pos {
    Pos(u64::try_from(seq).unwrap_or(0))
}

/// The `seq` a position names (past every row when it is beyond the column's range).
pub fn seq(pos: Pos) -> i64 {
    i64::try_from(pos.0).unwrap_or(i64::MAX)
}

/// The channel appends are announced on.
pub const CHANNEL: &str = "pincer_entries";

/// Settings of a [`PgStore`].
#[derive(Clone)]
pub struct PgOptions {
    /// `postgres://user:password@host:port/db` (never logged as it is: see [`redact_url`]).
    pub url: String,
    /// Most connections this process opens (the listener's is one more).
    pub pool_size: usize,
    /// The state directory transcript paths are relative to.
    pub state_dir: PathBuf,
    /// Applied to every message (and summary) before it is written.
    pub redactor: Arc<dyn Redactor>,
    /// `cwd` written into new headers.
    pub cwd: String,
}

/// A connection URL with its password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "<a PostgreSQL URL>".into() };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => format!("{user}@{host}"),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) if query.contains("password") => format!("{path}?***"),
        _ => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Errors of the PostgreSQL store as the store seam reports them.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("PostgreSQL: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("PostgreSQL connection pool: {0}")]
    Pool(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Other(String),
}

impl From<deadpool_postgres::PoolError> for PgError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PgError::Pool(e.to_string())
    }
}

impl PgError {
    fn into_store(self, file: &str) -> StoreError {
        match self {
            PgError::Store(e) => e,
            other => StoreError::Io { path: file.to_owned(), source: std::io::Error::other(other.to_string()) },
        }
    }
}

/// The PostgreSQL store. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
    handle: tokio::runtime::Handle,
    _runtime: Arc<OwnedRuntime>,
}

/// The store's runtime, stopped without waiting when the last clone goes (also from async code).
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) config: tokio_postgres::Config,
    opts: PgOptions,
    /// Transcripts (and indexes) whose cross-process lock this process holds, with a count.
    held: Mutex<HashMap<String, usize>>,
    /// Rows this process appended, so its watcher does not announce them a second time.
    own: Mutex<OwnRows>,
    /// The connection turn locks are held on ([`PgStore::try_lock_turns`]).
    lock_conn: Mutex<Option<Arc<tokio_postgres::Client>>>,
}

/// The most recent `(file, seq)` rows this process wrote (bounded: the oldest are forgotten).
#[derive(Default)]
struct OwnRows {
    set: std::collections::HashSet<(String, i64)>,
    order: std::collections::VecDeque<(String, i64)>,
}

/// Rows remembered in [`OwnRows`].
const OWN_ROWS: usize = 65_536;

impl OwnRows {
    fn insert(&mut self, file: &str, seq: i64) {
        if self.set.insert((file.to_owned(), seq)) {
            self.order.push_back((file.to_owned(), seq));
        }
        while self.order.len() > OWN_ROWS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

/// The advisory lock a session's turns are serialized on across replicas (see
/// [`PgStore::try_lock_turns`]).
pub fn turn_lock_key(session_key: &str) -> i64 {
    lock_key(&format!("turns:{session_key}"))
}

/// A stable 64-bit key for an advisory lock on a name (FNV-1a: the same in every replica's build):
/// the lock of a transcript's appends, and the one [`Transcripts::lock`] takes (a session index's
/// writers), of the name the JSONL layout gives the file (`agents/main/sessions/sessions.json`).
pub fn lock_key(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// `message.idempotencyKey` of an entry line.
fn key_of(v: &Value) -> Option<&str> {
    v.get("message")?.get("idempotencyKey")?.as_str()
}

impl PgStore {
    /// Connects, checks the database answers, and applies the migrations. Errors never contain the
    /// password.
    pub fn connect(opts: PgOptions) -> Result<PgStore, PgError> {
        let config: tokio_postgres::Config = opts
            .url
            .parse()
            .map_err(|e| PgError::Other(format!("{} is not a valid PostgreSQL URL: {e}", redact_url(&opts.url))))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("pincer-pg")
            .enable_all()
            .build()
            .map_err(|e| PgError::Other(format!("cannot start the database runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let mut cfg = config.clone();
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(Duration::from_secs(5));
        }
        cfg.keepalives_idle(Duration::from_secs(30));
        let manager =
            Manager::from_config(cfg.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let timeouts = Timeouts {
            wait: Some(Duration::from_secs(10)),
            create: Some(Duration::from_secs(5)),
            recycle: Some(Duration::from_secs(5)),
        };
        let pool = {
            let _enter = handle.enter();
            Pool::builder(manager)
                .max_size(opts.pool_size.max(1))
                .timeouts(timeouts)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| PgError::Pool(e.to_string()))?
        };
        let store = PgStore {
            inner: Arc::new(Inner {
                pool,
                config: cfg,
                opts,
                held: Mutex::new(HashMap::new()),
                own: Mutex::new(OwnRows::default()),
                lock_conn: Mutex::new(None),
            }),
            handle,
            _runtime: Arc::new(OwnedRuntime(Some(runtime))),
        };
        let where_ = redact_url(&store.inner.opts.url);
        store
            .block(|inner| async move {
                let mut client = inner.pool.get().await?;
                let applied = schema::migrate(&mut client).await?;
                Ok(applied)
            })
            .map_err(|e| PgError::Other(format!("{where_}: {e}")))?;
        // Transcripts written before search existed are indexed in the background.
        let this = store.clone();
        store.handle.spawn(async move {
            match this.index_backlog().await {
                Ok(0) => {}
                Ok(n) => tracing::info!("search: indexed the messages of {n} transcripts written before it existed"),
                Err(e) => tracing::warn!("search: cannot index older transcripts: {e}"),
            }
        });
        Ok(store)
    }

    /// Runs `f` on the store's runtime and waits for it.
    fn block<T, Fut>(&self, f: impl FnOnce(Arc<Inner>) -> Fut) -> Result<T, PgError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, PgError>> + Send + 'static,
    {
        let fut = f(self.inner.clone());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| PgError::Other("the database task stopped".into()))?
    }

    /// Runs `f` on the store's runtime (for async callers).
    pub(crate) async fn run<T, Fut>(&self, f: impl FnOnce(Arc<Inner>) -> Fut) -> Result<T, PgError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, PgError>> + Send + 'static,
    {
        self.handle.spawn(f(self.inner.clone())).await.map_err(|e| PgError::Other(format!("database task: {e}")))?
    }

    /// The name of a transcript or index: its path relative to the state directory.
    pub fn name(&self, path: &Path) -> String {
        name_in(&self.inner.opts.state_dir, path)
    }

    /// The path of a name.
    pub fn path(&self, name: &str) -> PathBuf {
        self.inner.opts.state_dir.join(name)
    }

    /// The runtime the store's tasks run on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Entries appended after `seq` (`(seq, entry)`, oldest first, at most `limit`).
    pub fn entries_after(&self, path: &Path, seq: i64, limit: i64) -> Result<Vec<(i64, Value)>, StoreError> {
        let file = self.name(path);
        let this = self.clone();
        let f = file.clone();
        self.block(move |_| async move { this.entries_after_async(f, seq, limit).await })
            .map_err(|e| e.into_store(&file))
    }

    /// Whether this process appended row `seq` of `file` (asked once per row: the answer is
    /// forgotten).
    pub fn take_own(&self, file: &str, seq: i64) -> bool {
        pincer_pi::lock(&self.inner.own).set.remove(&(file.to_owned(), seq))
    }

    /// [`PgStore::entries_after`] for async callers.
    pub async fn entries_after_async(&self, file: String, seq: i64, limit: i64) -> Result<Vec<(i64, Value)>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            let rows = c
                .query(
                    "SELECT e.seq, e.line FROM entries e JOIN transcripts t ON t.id = e.transcript \
                     WHERE t.file = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3",
                    &[&file, &seq, &limit],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    serde_json::from_str::<Value>(r.get::<_, &str>(1)).ok().map(|v| (r.get::<_, i64>(0), v))
                })
                .collect())
        })
        .await
    }

    /// The `custom` rows whose line contains one of `needles` (e.g. a `customType`), of every
    /// transcript, each transcript's in order: `(file, entry)`.
    pub async fn custom_rows(&self, needles: Vec<String>) -> Result<Vec<(String, Value)>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            let patterns: Vec<String> = needles.iter().map(|n| format!("%{n}%")).collect();
            let rows = c
                .query(
                    "SELECT t.file, e.line FROM entries e JOIN transcripts t ON t.id = e.transcript \
                     WHERE e.type = 'custom' AND e.line LIKE ANY($1) ORDER BY t.file, e.seq",
                    &[&patterns],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let line = serde_json::from_str::<Value>(r.get::<_, &str>(1)).ok()?;
                    Some((r.get::<_, String>(0), line))
                })
                .collect())
        })
        .await
    }

    /// The stored read position of messaging channel account `name` (`channel_cursors`).
    pub async fn channel_cursor(&self, name: String) -> Result<Option<String>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            let row = c.query_opt("SELECT cursor FROM channel_cursors WHERE name = $1", &[&name]).await?;
            Ok(row.map(|r| r.get(0)))
        })
        .await
    }

    /// Saves the read position of messaging channel account `name` (committed when it returns).
    pub async fn set_channel_cursor(&self, name: String, cursor: String) -> Result<(), PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            c.execute(
                "INSERT INTO channel_cursors (name, cursor) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET cursor = EXCLUDED.cursor, updated_at = now()",
                &[&name, &cursor],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// The last seq of each named transcript that exists.
    pub async fn last_seqs(&self, files: Vec<String>) -> Result<HashMap<String, i64>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            let rows = c.query("SELECT file, last_seq FROM transcripts WHERE file = ANY($1)", &[&files]).await?;
            Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))).collect())
        })
        .await
    }

    /// The live transcripts changed since `since` (µs since the epoch, the database's clock;
    /// `None`: none are listed), and the database's time now.
    pub fn changed_since(&self, since: Option<i64>) -> Result<(Vec<Changed>, i64), PgError> {
        let (rows, now) = self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let now: i64 =
                c.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint", &[]).await?.get(0);
            let Some(since) = since else { return Ok((Vec::new(), now)) };
            let rows = c
                .query(
                    "SELECT file, last_seq + 1, rewrites FROM transcripts \
                     WHERE updated_at >= to_timestamp($1::bigint / 1000000.0) AND file LIKE '%.jsonl'",
                    &[&since],
                )
                .await?;
            let rows: Vec<(String, i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
            Ok((rows, now))
        })?;
        let changed =
            rows.into_iter().map(|(f, end, rw)| Changed { path: self.path(&f), end: pos(end), rewrites: rw as u64 });
        Ok((changed.collect(), now))
    }

    /// Takes the cross-replica turn lock of session `session_key` (of agent `agent`) if it is free
    /// (`None`: a run of another replica holds it), with the session id the key's index row names
    /// once it is held (`None`: no row): a caller that read the session before it waited learns
    /// whether another replica reset or deleted it meanwhile (a reset commits its row before it
    /// lets the lock go; the row is read by a statement of its own once the lock is held, so its
    /// snapshot is taken after). Turn locks are held on one connection of their own, shared by
    /// every run of this process (a run holds its lock for the whole turn: from the pool, the runs
    /// would take the connections their appends need); the server releases them when the replica
    /// dies.
    pub async fn try_lock_turns(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<Option<(Held, Option<String>)>, PgError> {
        let lock = turn_lock_key(session_key);
        let (agent, key) = (agent.to_owned(), session_key.to_owned());
        let this = self.clone();
        self.run(move |_| async move {
            let client = this.lock_client().await?;
            let got: bool = client.query_one("SELECT pg_try_advisory_lock($1)", &[&lock]).await?.get(0);
            if !got {
                return Ok(None);
            }
            let held = Box::new(TurnLock { client: client.clone(), key: lock, handle: this.handle.clone() }) as Held;
            let row = "SELECT session_id FROM sessions WHERE agent = $1 AND key = $2";
            let session_id = client.query_opt(row, &[&agent, &key]).await?.map(|r| r.get(0));
            Ok(Some((held, session_id)))
        })
        .await
    }

    /// Takes the lease `name` if no other replica holds it (`None`): an advisory lock on the
    /// connection turn locks are held on, released when the [`Held`] is dropped or the replica dies
    /// (a messaging channel account is polled by one replica at a time).
    pub async fn try_lease(&self, name: &str) -> Result<Option<Held>, PgError> {
        let lock = lock_key(&format!("lease:{name}"));
        let this = self.clone();
        self.run(move |_| async move {
            let client = this.lock_client().await?;
            let got: bool = client.query_one("SELECT pg_try_advisory_lock($1)", &[&lock]).await?.get(0);
            if !got {
                return Ok(None);
            }
            Ok(Some(Box::new(TurnLock { client: client.clone(), key: lock, handle: this.handle.clone() }) as Held))
        })
        .await
    }

    /// The connection turn locks are held on (opened again when it was lost).
    async fn lock_client(&self) -> Result<Arc<tokio_postgres::Client>, PgError> {
        if let Some(c) = pincer_pi::lock(&self.inner.lock_conn).as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let (client, conn) = self.inner.config.connect(NoTls).await?;
        self.handle.spawn(async move {
            let _ = conn.await;
        });
        let client = Arc::new(client);
        *pincer_pi::lock(&self.inner.lock_conn) = Some(client.clone());
        Ok(client)
    }

    /// The whole transcript as a Pi v3 file: the header line and every entry line as stored.
    pub fn export(&self, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        let file = self.name(path);
        let f = file.clone();
        self.block(move |inner| async move { inner.bytes(&f).await }).map_err(|e| e.into_store(&file))
    }

    /// Stores a transcript's bytes under a name (for `pincer store import`): the lines kept verbatim,
    /// an old or linear file migrated first as the file store would before its first append. False
    /// when the name exists already (nothing is written).
    pub fn import_bytes(&self, path: &Path, bytes: &[u8]) -> Result<bool, StoreError> {
        let file = self.name(path);
        let f = file.clone();
        let bytes = bytes.to_vec();
        self.block(move |inner| async move { inner.import(&f, bytes).await }).map_err(|e| e.into_store(&file))
    }
}

/// `path` relative to `state_dir` (as given when it is outside).
fn name_in(state_dir: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(state_dir).unwrap_or(path);
    rel.to_string_lossy().into_owned()
}

/// The agent of an index name `agents/<agent>/sessions/sessions.json`.
fn agent_of(index: &str) -> Option<&str> {
    let mut parts = index.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("agents"), Some(agent), Some("sessions"), Some("sessions.json"), None) => Some(agent),
        _ => None,
    }
}

/// The model an index entry names (the columns are for queries; `entry` stays the truth).
fn entry_model(e: &Map<String, Value>) -> Option<String> {
    ["modelOverride", "model"].iter().find_map(|k| e.get(*k).and_then(Value::as_str).map(str::to_owned))
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

/// The row of a transcript, locked: id, leaf, last seq.
struct Locked {
    id: i64,
    leaf: Option<String>,
    last_seq: i64,
}

impl Inner {
    fn is_held(&self, file: &str) -> bool {
        pincer_pi::lock(&self.held).get(file).is_some_and(|n| *n > 0)
    }

    /// Locks the transcript `file` (creating its row with a header when missing and `create`).
    async fn lock_row(
        &self,
        tx: &Tx<'_>,
        file: &str,
        sid: Option<&str>,
        create: bool,
    ) -> Result<Option<Locked>, PgError> {
        if !self.is_held(file) {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(file)]).await?;
        }
        let select = "SELECT id, leaf, last_seq FROM transcripts WHERE file = $1 FOR UPDATE";
        if let Some(r) = tx.query_opt(select, &[&file]).await? {
            return Ok(Some(Locked { id: r.get(0), leaf: r.get(1), last_seq: r.get(2) }));
        }
        if !create {
            return Ok(None);
        }
        let header = new_header(Path::new(file), sid, &self.opts.cwd);
        let line = serde_json::to_string(&header).map_err(|e| PgError::Other(e.to_string()))?;
        let session_id = header.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        tx.execute(
            "INSERT INTO transcripts (file, session_id, header) VALUES ($1, $2, $3) ON CONFLICT (file) DO NOTHING",
            &[&file, &session_id, &line],
        )
        .await?;
        let r = tx.query_one(select, &[&file]).await?;
        Ok(Some(Locked { id: r.get(0), leaf: r.get(1), last_seq: r.get(2) }))
    }

    async fn has_entry(tx: &Tx<'_>, transcript: i64, id: &str) -> Result<bool, PgError> {
        Ok(tx
            .query_opt("SELECT 1 FROM entries WHERE transcript = $1 AND id = $2", &[&transcript, &id])
            .await?
            .is_some())
    }

    /// Appends entries in order, each chained to the one before (or as it says), in one
    /// transaction: all of them are durable, or none.
    async fn append_all(
        &self,
        file: &str,
        entries: Vec<NewEntry>,
        sid: Option<String>,
    ) -> Result<Vec<Appended>, PgError> {
        for e in &entries {
            e.validate()?;
        }
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let Some(mut row) = self.lock_row(&tx, file, sid.as_deref(), true).await? else {
            return Err(PgError::Other(format!("{file}: the transcript row is missing")));
        };
        let mut out = Vec::with_capacity(entries.len());
        let mut written = Vec::new();
        for entry in entries {
            let a = self.append_in(&tx, file, &mut row, entry).await?;
            if a.appended {
                written.push(seq(a.pos));
            }
            out.push(a);
        }
        // Known as ours before the commit makes them visible to this process's watcher.
        {
            let mut own = pincer_pi::lock(&self.own);
            for seq in &written {
                own.insert(file, *seq);
            }
        }
        if let Err(e) = tx.commit().await {
            let mut own = pincer_pi::lock(&self.own);
            for seq in &written {
                own.set.remove(&(file.to_owned(), *seq));
            }
            return Err(e.into());
        }
        Ok(out)
    }

    /// One entry of [`Inner::append_all`], in its transaction, on the locked row (kept in step).
    async fn append_in(&self, tx: &Tx<'_>, file: &str, row: &mut Locked, entry: NewEntry) -> Result<Appended, PgError> {
        if let Some(key) = entry.idempotency_key() {
            let found = tx
                .query_opt(
                    "SELECT line, seq FROM entries WHERE transcript = $1 AND idempotency_key = $2",
                    &[&row.id, &key],
                )
                .await?;
            if let Some(r) = found {
                let existing: Value = serde_json::from_str(r.get::<_, &str>(0))
                    .map_err(|e| PgError::Other(format!("{file}: a stored entry is not JSON: {e}")))?;
                return Ok(Appended { entry: existing, appended: false, pos: pos(r.get::<_, i64>(1)) });
            }
        }
        let parent = match &entry.parent {
            ParentChoice::Leaf => row.leaf.clone(),
            ParentChoice::Root => None,
            ParentChoice::Entry(id) => {
                if !Self::has_entry(tx, row.id, id).await? {
                    return Err(StoreError::UnknownEntry(id.clone()).into());
                }
                Some(id.clone())
            }
        };
        if entry.kind == "leaf" {
            if let Some(Value::String(t)) = entry.payload.get("targetId") {
                if !Self::has_entry(tx, row.id, t).await? {
                    return Err(StoreError::UnknownEntry(t.clone()).into());
                }
            }
        }
        let r = entry.render(parent.clone(), self.opts.redactor.as_ref())?;
        let line = String::from_utf8(r.line).map_err(|e| PgError::Other(e.to_string()))?;
        let seq = row.last_seq + 1;
        tx.execute(
            "WITH ins AS (INSERT INTO entries (transcript, seq, id, parent_id, type, idempotency_key, line) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)) \
             UPDATE transcripts SET leaf = $8, last_seq = $2, indexed_seq = $2, updated_at = now() WHERE id = $1",
            &[&row.id, &seq, &r.id, &parent, &entry.kind, &entry.idempotency_key(), &line, &r.leaf],
        )
        .await?;
        search::index_line(tx, row.id, seq, &line).await?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &format!("{file}:{seq}")]).await?;
        row.last_seq = seq;
        row.leaf = r.leaf.clone();
        Ok(Appended { entry: r.value, appended: true, pos: pos(seq) })
    }

    async fn transcript_id(&self, c: &deadpool_postgres::Client, file: &str) -> Result<Option<(i64, String)>, PgError> {
        Ok(c.query_opt("SELECT id, header FROM transcripts WHERE file = $1", &[&file])
            .await?
            .map(|r| (r.get(0), r.get(1))))
    }

    /// The length of the transcript's JSONL file, without reading its lines out.
    async fn size(&self, file: &str) -> Result<Option<u64>, PgError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                "SELECT octet_length(t.header) + 1 + coalesce((SELECT sum(octet_length(e.line) + 1) FROM entries e \
                 WHERE e.transcript = t.id), 0)::bigint FROM transcripts t WHERE t.file = $1",
                &[&file],
            )
            .await?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    /// The transcript as the bytes of its JSONL file.
    async fn bytes(&self, file: &str) -> Result<Option<Vec<u8>>, PgError> {
        let c = self.pool.get().await?;
        let Some((id, header)) = self.transcript_id(&c, file).await? else { return Ok(None) };
        let rows = c.query("SELECT line FROM entries WHERE transcript = $1 ORDER BY seq", &[&id]).await?;
        let mut buf = Vec::with_capacity(header.len() + 1 + rows.len() * 256);
        buf.extend_from_slice(header.as_bytes());
        buf.push(b'\n');
        for r in &rows {
            buf.extend_from_slice(r.get::<_, &str>(0).as_bytes());
            buf.push(b'\n');
        }
        Ok(Some(buf))
    }

    async fn history(&self, file: &str, opts: HistoryOptions) -> Result<History, PgError> {
        let c = self.pool.get().await?;
        let Some((id, header)) = self.transcript_id(&c, file).await? else {
            return Ok(History { session_id: None, messages: vec![], thinking_level: None, has_older: false });
        };
        let session_id = serde_json::from_str::<Value>(&header)
            .ok()
            .and_then(|h| h.get("id").and_then(Value::as_str).map(str::to_owned));
        let mut rows_wanted: i64 = 256;
        loop {
            let rows = c
                .query(
                    "SELECT line FROM (SELECT seq, line FROM entries WHERE transcript = $1 ORDER BY seq DESC LIMIT $2) t \
                     ORDER BY seq",
                    &[&id, &rows_wanted],
                )
                .await?;
            let whole = (rows.len() as i64) < rows_wanted;
            let mut buf = Vec::new();
            if whole {
                buf.extend_from_slice(header.as_bytes());
                buf.push(b'\n');
            }
            for r in &rows {
                buf.extend_from_slice(r.get::<_, &str>(0).as_bytes());
                buf.push(b'\n');
            }
            let last = whole || buf.len() as u64 >= MAX_WINDOW;
            if let Some(h) = history_of_window(session_id.clone(), &buf, last, &opts) {
                return Ok(h);
            }
            rows_wanted = rows_wanted.saturating_mul(4);
        }
    }

    /// Entries of a window with their seqs, and whether they reach the last row.
    async fn positioned(
        &self,
        file: &str,
        window: Window,
        max_bytes: u64,
    ) -> Result<(Vec<(Pos, Value)>, bool), PgError> {
        let (rows, whole) = self.window_rows(file, window, max_bytes).await?;
        let entries = rows
            .into_iter()
            .filter_map(|(seq, l)| Some((pos(seq), serde_json::from_str::<Value>(&l).ok()?)))
            .filter(|(_, v)| v.is_object())
            .collect();
        Ok((entries, whole))
    }

    /// The lines of a window ([`Inner::window_rows`]), oldest first.
    async fn window_lines(&self, file: &str, window: Window, max_bytes: u64) -> Result<Vec<String>, PgError> {
        Ok(self.window_rows(file, window, max_bytes).await?.0.into_iter().map(|(_, l)| l).collect())
    }

    /// `(seq, line)` of a window, oldest first, and whether the limit left rows out after them
    /// (false) or not (true; always true for a window before a seq).
    async fn window_rows(
        &self,
        file: &str,
        window: Window,
        max_bytes: u64,
    ) -> Result<(Vec<(i64, String)>, bool), PgError> {
        let c = self.pool.get().await?;
        let Some((id, _)) = self.transcript_id(&c, file).await? else { return Ok((vec![], true)) };
        let mut out = Vec::new();
        let mut total = 0u64;
        let (from, mut cursor) = match window {
            Window::From(f) => (Some(f), f),
            Window::Before(b) => (None, b),
        };
        loop {
            let rows = match from {
                Some(_) => {
                    c.query(
                        "SELECT seq, line FROM entries WHERE transcript = $1 AND seq >= $2 ORDER BY seq LIMIT 256",
                        &[&id, &cursor],
                    )
                    .await?
                }
                None => {
                    c.query(
                        "SELECT seq, line FROM entries WHERE transcript = $1 AND seq < $2 ORDER BY seq DESC LIMIT 256",
                        &[&id, &cursor],
                    )
                    .await?
                }
            };
            if rows.is_empty() {
                break;
            }
            for r in &rows {
                let line: String = r.get(1);
                total += line.len() as u64 + 1;
                if total > max_bytes {
                    return Ok((finish(out, from.is_none()), from.is_none()));
                }
                let seq: i64 = r.get(0);
                cursor = if from.is_some() { seq + 1 } else { seq };
                out.push((seq, line));
            }
        }
        Ok((finish(out, from.is_none()), true))
    }

    async fn import(&self, file: &str, bytes: Vec<u8>) -> Result<bool, PgError> {
        let mut s = Session::parse(bytes);
        let Some(header) = s.header.clone() else {
            return Err(PgError::Other(format!(
                "{file}: no valid session header; run `pincer transcript repair` on it first"
            )));
        };
        if s.source_version.is_some_and(|v| v < 3) || s.is_linear() {
            if s.is_linear() {
                s.link_linear();
            }
            s = Session::parse(s.render(false));
        }
        let session_id = header.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        let leaf = s.leaf_id().map(str::to_owned);
        let bytes = s.bytes().to_vec();
        let mut lines: Vec<&[u8]> =
            bytes.split(|b| *b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).collect();
        let header_line = if lines.is_empty() { Vec::new() } else { lines.remove(0).to_vec() };
        let header_line = String::from_utf8(header_line).map_err(|e| PgError::Other(format!("{file}: {e}")))?;
        // The file store's dedupe answers the last entry with a key: that one keeps it here.
        let parsed: Vec<Option<Value>> = lines.iter().map(|l| serde_json::from_slice::<Value>(l).ok()).collect();
        let mut last_with_key: HashMap<String, usize> = HashMap::new();
        for (i, v) in parsed.iter().enumerate() {
            if let Some(k) = v.as_ref().and_then(key_of) {
                last_with_key.insert(k.to_owned(), i);
            }
        }
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(file)]).await?;
        let inserted = tx
            .query_opt(
                "INSERT INTO transcripts (file, session_id, header, leaf, last_seq, indexed_seq) \
                 VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (file) DO NOTHING RETURNING id",
                &[&file, &session_id, &header_line, &leaf, &(lines.len() as i64)],
            )
            .await?;
        let Some(row) = inserted else { return Ok(false) };
        let id: i64 = row.get(0);
        let stmt = tx
            .prepare(
                "INSERT INTO entries (transcript, seq, id, parent_id, type, idempotency_key, line) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .await?;
        for (i, (line, v)) in lines.iter().zip(&parsed).enumerate() {
            let text = std::str::from_utf8(line).map_err(|e| PgError::Other(format!("{file}: line {}: {e}", i + 2)))?;
            let get = |k: &str| v.as_ref().and_then(|v| v.get(k)).and_then(Value::as_str).map(str::to_owned);
            let key = v.as_ref().and_then(key_of).filter(|k| last_with_key.get(*k) == Some(&i)).map(str::to_owned);
            let ty = get("type").unwrap_or_else(|| "?".into());
            tx.execute(&stmt, &[&id, &(i as i64 + 1), &get("id"), &get("parentId"), &ty, &key, &text]).await?;
            search::index_line(&tx, id, i as i64 + 1, text).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// `sessions.compact {maxLines}`: the transcript keeps its header and last lines by the file
    /// store's rule ([`pincer_store::trim::trim_lines`]), in one transaction under its lock; the
    /// whole old transcript is kept as the archived transcript `backup`. Kept entries keep their
    /// seq (what other replicas have seen stays seen), re-rooted ones get their new line.
    /// Returns (trimmed, lines it has now).
    async fn trim(&self, file: &str, backup: &str, max_lines: usize) -> Result<(bool, usize), PgError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let Some(row) = self.lock_row(&tx, file, None, false).await? else {
            return Err(PgError::Store(StoreError::Io {
                path: file.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such transcript"),
            }));
        };
        let header: String = tx.query_one("SELECT header FROM transcripts WHERE id = $1", &[&row.id]).await?.get(0);
        let rows = tx.query("SELECT seq, line FROM entries WHERE transcript = $1 ORDER BY seq", &[&row.id]).await?;
        let entries: Vec<(i64, &str)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut lines: Vec<&[u8]> = vec![header.as_bytes()];
        lines.extend(entries.iter().map(|(_, l)| l.as_bytes()));
        let kept = match pincer_store::trim::trim_lines(&lines, max_lines) {
            Err(n) => {
                tx.commit().await?;
                return Ok((false, n));
            }
            Ok(k) => k,
        };
        // The whole old transcript, archived under the backup's name (as the file store's .bak).
        let copy: i64 = tx
            .query_one(
                "INSERT INTO transcripts (file, session_id, header, leaf, last_seq, indexed_seq) \
                 SELECT $2, session_id, header, leaf, last_seq, last_seq FROM transcripts WHERE id = $1 RETURNING id",
                &[&row.id, &backup],
            )
            .await?
            .get(0);
        tx.execute(
            "INSERT INTO entries (transcript, seq, id, parent_id, type, idempotency_key, created_at, line) \
             SELECT $2, seq, id, parent_id, type, idempotency_key, created_at, line FROM entries WHERE transcript = $1",
            &[&row.id, &copy],
        )
        .await?;
        let mut keep_seqs: Vec<i64> = Vec::new();
        let mut content = Vec::new();
        for k in &kept {
            let line: &[u8] = match &k.changed {
                Some(b) => b,
                None => lines[k.index],
            };
            content.extend_from_slice(line);
            content.push(b'\n');
            let Some((seq, _)) = k.index.checked_sub(1).and_then(|i| entries.get(i)) else { continue };
            keep_seqs.push(*seq);
            if let Some(changed) = &k.changed {
                let text = std::str::from_utf8(changed).map_err(|e| PgError::Other(e.to_string()))?;
                let parent = serde_json::from_slice::<Value>(changed)
                    .ok()
                    .and_then(|v| v.get("parentId").and_then(Value::as_str).map(str::to_owned));
                tx.execute(
                    "UPDATE entries SET line = $3, parent_id = $4 WHERE transcript = $1 AND seq = $2",
                    &[&row.id, seq, &text, &parent],
                )
                .await?;
            }
        }
        tx.execute("DELETE FROM entries WHERE transcript = $1 AND seq <> ALL($2)", &[&row.id, &keep_seqs]).await?;
        tx.execute("DELETE FROM search_messages WHERE transcript = $1 AND seq <> ALL($2)", &[&row.id, &keep_seqs])
            .await?;
        let leaf = Session::parse(content).leaf_id().map(str::to_owned);
        tx.execute(
            "UPDATE transcripts SET leaf = $2, rewrites = rewrites + 1, updated_at = now() WHERE id = $1",
            &[&row.id, &leaf],
        )
        .await?;
        tx.commit().await?;
        Ok((true, kept.len()))
    }

    async fn write_index(&self, agent: &str, bytes: &[u8]) -> Result<(), PgError> {
        let map: Map<String, Value> = serde_json::from_slice(bytes)
            .map_err(|e| PgError::Other(format!("the session index is not a JSON object: {e}")))?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO session_indexes (agent, version) VALUES ($1, 1) \
             ON CONFLICT (agent) DO UPDATE SET version = session_indexes.version + 1",
            &[&agent],
        )
        .await?;
        let old: HashMap<String, String> = tx
            .query("SELECT key, entry::text FROM sessions WHERE agent = $1", &[&agent])
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let gone: Vec<&String> = old.keys().filter(|k| !map.contains_key(k.as_str())).collect();
        if !gone.is_empty() {
            tx.execute("DELETE FROM sessions WHERE agent = $1 AND key = ANY($2)", &[&agent, &gone]).await?;
        }
        let upsert = tx
            .prepare(
                "INSERT INTO sessions (agent, key, session_id, label, archived, model, updated_at, entry) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::json) \
                 ON CONFLICT (agent, key) DO UPDATE SET session_id = $3, label = $4, archived = $5, model = $6, \
                 updated_at = $7, entry = $8::text::json",
            )
            .await?;
        for (key, v) in &map {
            let Value::Object(e) = v else { continue };
            let text = serde_json::to_string(v).map_err(|e| PgError::Other(e.to_string()))?;
            if old.get(key) == Some(&text) {
                continue;
            }
            let sid = e.get("sessionId").and_then(Value::as_str).unwrap_or_default();
            let label = e.get("label").and_then(Value::as_str);
            let archived = e.get("archivedAt").is_some_and(|a| !a.is_null());
            let updated = e.get("updatedAt").and_then(Value::as_i64);
            tx.execute(&upsert, &[&agent, key, &sid, &label, &archived, &entry_model(e), &updated, &text]).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// A descending window comes back oldest first.
/// Which rows [`Inner::window_rows`] reads.
#[derive(Clone, Copy)]
enum Window {
    /// From this seq on.
    From(i64),
    /// The last ones before this seq.
    Before(i64),
}

fn finish<T>(mut out: Vec<T>, descending: bool) -> Vec<T> {
    if descending {
        out.reverse();
    }
    out
}

/// A cross-process lock held on its own connection (a session-level advisory lock), released when
/// dropped.
struct PgLock {
    inner: Arc<Inner>,
    handle: tokio::runtime::Handle,
    name: String,
    conn: Option<deadpool_postgres::Object>,
}

impl Drop for PgLock {
    fn drop(&mut self) {
        if let Some(n) = pincer_pi::lock(&self.inner.held).get_mut(&self.name) {
            *n = n.saturating_sub(1);
        }
        if let Some(conn) = self.conn.take() {
            let key = lock_key(&self.name);
            self.handle.spawn(async move {
                // A connection that cannot unlock is closed, and the server drops its locks with it.
                if conn.execute("SELECT pg_advisory_unlock($1)", &[&key]).await.is_err() {
                    drop(deadpool_postgres::Object::take(conn));
                }
            });
        }
    }
}

/// A turn lock ([`PgStore::try_lock_turns`]), released when dropped (a lost connection has
/// released it already).
struct TurnLock {
    client: Arc<tokio_postgres::Client>,
    key: i64,
    handle: tokio::runtime::Handle,
}

impl Drop for TurnLock {
    fn drop(&mut self) {
        let (client, key) = (self.client.clone(), self.key);
        self.handle.spawn(async move {
            let _ = client.execute("SELECT pg_advisory_unlock($1)", &[&key]).await;
        });
    }
}

impl Transcripts for PgStore {
    fn bytes(&self, path: &Path) -> Result<Option<u64>, StoreError> {
        let file = self.name(path);
        let f = file.clone();
        self.block(move |inner| async move { inner.size(&f).await }).map_err(|e| e.into_store(&file))
    }

    fn append_all(
        &self,
        path: &Path,
        entries: Vec<NewEntry>,
        session_id: Option<&str>,
    ) -> Result<Vec<Appended>, StoreError> {
        let started = std::time::Instant::now();
        let file = self.name(path);
        let (f, sid) = (file.clone(), session_id.map(str::to_owned));
        let r = self
            .block(move |inner| async move { inner.append_all(&f, entries, sid).await })
            .map_err(|e| e.into_store(&file));
        metrics_record(started);
        r
    }

    fn append_held(
        self: Arc<Self>,
        held: Held,
        path: PathBuf,
        entries: Vec<NewEntry>,
        session_id: Option<String>,
        after: pincer_store::AfterCommit,
    ) -> pincer_store::StoreFuture<Vec<Appended>> {
        // On the pool's runtime, awaited here: no thread waits for the database.
        Box::pin(async move {
            let started = std::time::Instant::now();
            let file = self.name(&path);
            let f = file.clone();
            let r = self
                .run(move |inner| async move { inner.append_all(&f, entries, session_id).await })
                .await
                .map_err(|e| e.into_store(&file));
            metrics_record(started);
            drop(held);
            if let Ok(all) = &r {
                after(all);
            }
            r
        })
    }

    fn ensure_created(&self, path: &Path, session_id: Option<&str>) -> Result<(), StoreError> {
        let file = self.name(path);
        let (f, sid) = (file.clone(), session_id.map(str::to_owned));
        self.block(move |inner| async move {
            let mut client = inner.pool.get().await?;
            let tx = client.transaction().await?;
            inner.lock_row(&tx, &f, sid.as_deref(), true).await?;
            tx.commit().await?;
            Ok(())
        })
        .map_err(|e| e.into_store(&file))
    }

    fn leaf_version(&self, path: &Path) -> Result<(Option<String>, u64), StoreError> {
        let file = self.name(path);
        let f = file.clone();
        self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let row = c.query_opt("SELECT leaf, rewrites FROM transcripts WHERE file = $1", &[&f]).await?;
            Ok(row.map_or((None, 0), |r| (r.get(0), r.get::<_, i64>(1) as u64)))
        })
        .map_err(|e| e.into_store(&file))
    }

    fn end(&self, path: &Path) -> Result<Option<Pos>, StoreError> {
        // Positions are seqs (entries_at includes its own): the next entry's seq.
        let file = self.name(path);
        let f = file.clone();
        self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let row = c.query_opt("SELECT last_seq FROM transcripts WHERE file = $1", &[&f]).await?;
            Ok(row.map(|r| pos(r.get::<_, i64>(0) + 1)))
        })
        .map_err(|e| e.into_store(&file))
    }

    fn read_session(&self, path: &Path) -> Result<Option<Session>, StoreError> {
        Ok(self.export(path)?.map(Session::parse))
    }

    fn read_bytes(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        // As the file store checks the file's length first: a transcript too large is not read.
        let file = self.name(path);
        let f = file.clone();
        let size = self.block(move |inner| async move { inner.size(&f).await }).map_err(|e| e.into_store(&file))?;
        if size.is_none_or(|size| size > max_bytes) {
            return Ok(None);
        }
        Ok(self.export(path)?.filter(|b| b.len() as u64 <= max_bytes))
    }

    fn read_tail(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let file = self.name(path);
        let f = file.clone();
        self.block(move |inner| async move {
            let lines = inner.window_lines(&f, Window::Before(i64::MAX), max_bytes).await?;
            if lines.is_empty() && inner.size(&f).await?.is_none() {
                return Ok(None);
            }
            let mut out = Vec::new();
            for l in lines {
                out.extend_from_slice(l.as_bytes());
                out.push(b'\n');
            }
            Ok(Some(out))
        })
        .map_err(|e| e.into_store(&file))
    }

    fn history(&self, path: &Path, opts: HistoryOptions) -> Result<History, StoreError> {
        let f = self.name(path);
        let file = f.clone();
        self.block(move |inner| async move { inner.history(&f, opts).await }).map_err(|e| e.into_store(&file))
    }

    fn find_keyed(&self, path: &Path, key: &str) -> Result<Option<(Value, Pos)>, StoreError> {
        let file = self.name(path);
        let (f, key) = (file.clone(), key.to_owned());
        self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let row = c
                .query_opt(
                    "SELECT e.seq, e.line FROM entries e JOIN transcripts t ON t.id = e.transcript \
                     WHERE t.file = $1 AND e.idempotency_key = $2",
                    &[&f, &key],
                )
                .await?;
            Ok(match row {
                None => None,
                Some(r) => {
                    let v: Value = serde_json::from_str(r.get::<_, &str>(1))
                        .map_err(|e| PgError::Other(format!("{f}: a stored entry is not JSON: {e}")))?;
                    Some((v, pos(r.get::<_, i64>(0))))
                }
            })
        })
        .map_err(|e| e.into_store(&file))
    }

    fn entries_at(&self, path: &Path, from: Pos, max_bytes: u64) -> Result<(Vec<(Pos, Value)>, bool), StoreError> {
        let file = self.name(path);
        let f = file.clone();
        let from = Window::From(seq(from));
        self.block(move |inner| async move { inner.positioned(&f, from, max_bytes).await })
            .map_err(|e| e.into_store(&file))
    }

    fn entries_before(&self, path: &Path, before: Pos, max_bytes: u64) -> Result<Vec<(Pos, Value)>, StoreError> {
        let file = self.name(path);
        let f = file.clone();
        let before = Window::Before(seq(before));
        self.block(move |inner| async move { Ok(inner.positioned(&f, before, max_bytes).await?.0) })
            .map_err(|e| e.into_store(&file))
    }

    fn lock(&self, path: &Path) -> Result<Held, StoreError> {
        let name = self.name(path);
        let n = name.clone();
        let conn = self
            .block(move |inner| async move {
                let c = inner.pool.get().await?;
                c.execute("SELECT pg_advisory_lock($1)", &[&lock_key(&n)]).await?;
                Ok(c)
            })
            .map_err(|e| e.into_store(&name))?;
        *pincer_pi::lock(&self.inner.held).entry(name.clone()).or_default() += 1;
        Ok(Box::new(PgLock { inner: self.inner.clone(), handle: self.handle.clone(), name, conn: Some(conn) }))
    }

    fn trim(&self, path: &Path, max_lines: usize) -> Result<Trimmed, StoreError> {
        let file = self.name(path);
        let backup = pincer_store::files::archive_path(path, "bak");
        let (f, b) = (file.clone(), self.name(&backup));
        let r = self
            .block(move |inner| async move { inner.trim(&f, &b, max_lines).await })
            .map_err(|e| e.into_store(&file))?;
        Ok(Trimmed { compacted: r.0, kept: r.1, backup: r.0.then_some(backup) })
    }

    fn forget(&self, _path: &Path) {}

    fn close(&self) {}

    fn index_stamp(&self, path: &Path) -> Option<IndexStamp> {
        let name = self.name(path);
        let agent = agent_of(&name)?.to_owned();
        self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let row = c.query_opt("SELECT version FROM session_indexes WHERE agent = $1", &[&agent]).await?;
            Ok(row.map(|r| (0, 0, r.get::<_, i64>(0) as u64, 0)))
        })
        .ok()
        .flatten()
    }

    fn read_index(&self, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        let name = self.name(path);
        let Some(agent) = agent_of(&name).map(str::to_owned) else { return Ok(None) };
        let file = name.clone();
        self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            if c.query_opt("SELECT 1 FROM session_indexes WHERE agent = $1", &[&agent]).await?.is_none() {
                return Ok(None);
            }
            let rows =
                c.query("SELECT key, entry::text FROM sessions WHERE agent = $1 ORDER BY key", &[&agent]).await?;
            let mut map = Map::new();
            for r in &rows {
                let v: Value = serde_json::from_str(r.get::<_, &str>(1)).map_err(|e| PgError::Other(e.to_string()))?;
                map.insert(r.get::<_, String>(0), v);
            }
            Ok(Some(serde_json::to_vec(&map).map_err(|e| PgError::Other(e.to_string()))?))
        })
        .map_err(|e| e.into_store(&file))
    }

    fn write_index(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let name = self.name(path);
        let Some(agent) = agent_of(&name).map(str::to_owned) else {
            return Err(StoreError::Internal(format!("{name} is not a session index")));
        };
        let bytes = bytes.to_vec();
        self.block(move |inner| async move { inner.write_index(&agent, &bytes).await }).map_err(|e| e.into_store(&name))
    }

    fn agents(&self, _state_dir: &Path) -> Vec<String> {
        self.block(|inner| async move {
            let c = inner.pool.get().await?;
            Ok(c.query("SELECT agent FROM session_indexes ORDER BY agent", &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
        .unwrap_or_default()
    }

    fn archive_transcript(&self, path: &Path, reason: &str) -> Result<Option<PathBuf>, StoreError> {
        let target = pincer_store::files::archive_path(path, reason);
        let (from, to) = (self.name(path), self.name(&target));
        let file = from.clone();
        let moved = self
            .block(move |inner| async move {
                let c = inner.pool.get().await?;
                Ok(c.execute("UPDATE transcripts SET file = $2, updated_at = now() WHERE file = $1", &[&from, &to])
                    .await?)
            })
            .map_err(|e| e.into_store(&file))?;
        Ok((moved > 0).then_some(target))
    }

    fn set_aside(&self, dir: &Path) -> Vec<(PathBuf, Option<u64>)> {
        let prefix = format!("{}/", self.name(dir).trim_end_matches('/'));
        let found = self.block(move |inner| async move {
            let c = inner.pool.get().await?;
            let rows = c
                .query(
                    "SELECT file, (extract(epoch FROM updated_at) * 1000)::bigint FROM transcripts \
                     WHERE left(file, length($1)) = $1 AND strpos(substr(file, length($1) + 1), '/') = 0 \
                     AND strpos(file, '.jsonl.') > 0",
                    &[&prefix],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))).collect::<Vec<_>>())
        });
        match found {
            Ok(rows) => rows.into_iter().map(|(f, ms)| (self.path(&f), u64::try_from(ms).ok())).collect(),
            Err(e) => {
                tracing::warn!("cannot list archived transcripts: {e}");
                Vec::new()
            }
        }
    }

    fn import_transcript(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        match self.import_bytes(path, bytes) {
            Ok(true) => Ok(()),
            Ok(false) => Err(StoreError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{} exists", self.name(path))),
            )),
            Err(e) => Err(e),
        }
    }
}

/// The same histogram as the file store's appends.
fn metrics_record(started: std::time::Instant) {
    metrics::histogram!("pincer_store_append_seconds").record(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(redact_url("postgres://u:s3cret@db:5432/pincer"), "postgres://u:***@db:5432/pincer");
        assert_eq!(redact_url("postgres://u@db/pincer"), "postgres://u@db/pincer");
        assert_eq!(redact_url("postgresql://db/x?user=u&password=p"), "postgresql://db/x?***");
        assert_eq!(redact_url("host=db password=p"), "<a PostgreSQL URL>");
    }

    #[test]
    fn names_and_agents() {
        let dir = Path::new("/s");
        assert_eq!(name_in(dir, Path::new("/s/agents/main/sessions/a.jsonl")), "agents/main/sessions/a.jsonl");
        assert_eq!(agent_of("agents/ops/sessions/sessions.json"), Some("ops"));
        assert_eq!(agent_of("agents/ops/sessions/x.jsonl"), None);
        assert_ne!(lock_key("a"), lock_key("b"));
    }
}
