//! The append path: the only code in Pincer that writes a transcript.
//!
//! One [`FileWriter`] per file serializes appends in FIFO order and commits them in groups: appends
//! that queue up while a commit is under way are written together with one `write` and share one
//! `fdatasync`. Each commit holds the cross-process lock file ([`crate::lock`]), checks with one
//! `stat` whether another process changed the file (and reads only the new bytes if it grew),
//! chains each entry's `parentId` to the cached leaf, and acknowledges only after the data is on
//! disk. Nothing here reads the whole file on the append path: the leaf comes from a backwards
//! scan of the tail when a file is first opened; the idempotency index is built once, on the first
//! append that carries a key, and kept up to date from then on.
//!
//! Bounded resources: at most [`StoreOptions::max_open_files`] transcripts are open at once (the
//! least recently used idle writer's handle is closed; its cached leaf, length and index stay and
//! are revalidated by `(dev, ino, len)` when it is reopened), and at most
//! [`StoreOptions::max_writers`] writers are cached (idle ones are dropped entirely beyond that).
//! Files are opened read-only to be read; a writable handle is opened only to write, so a
//! read-only transcript can still be read.

use crate::ids::{new_entry_id, new_session_id, now_iso};
use crate::lock::{LockGuard, LockOptions, LockRegistry};
use crate::parse::{self, LineValue};
use crate::redact::{Redactor, SecretRedactor};
use crate::session::Session;
use crate::{Pos, StoreError};
use pincer_pi::lock;
use serde_json::{json, Map, Value};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError, Weak};

/// Settings of a [`Store`].
#[derive(Clone)]
pub struct StoreOptions {
    pub lock: LockOptions,
    /// Applied to every message (and summary) before it is written.
    pub redactor: Arc<dyn Redactor>,
    /// `cwd` written into new headers.
    pub cwd: String,
    /// Most transcript files kept open at once (at least 1; never more than a quarter of the
    /// process's open-file limit). Beyond it the least recently used idle file is closed.
    pub max_open_files: usize,
    /// Most files whose writer (cached leaf, length, index) is kept; idle writers beyond it are
    /// dropped and rebuilt from the file when it is used again.
    pub max_writers: usize,
    /// Told the path of a transcript after each durable commit (and repair) to it, on the
    /// committing thread: it must only queue work (the search index is updated from it).
    pub on_append: Option<AppendObserver>,
}

/// See [`StoreOptions::on_append`].
pub type AppendObserver = Arc<dyn Fn(&Path) + Send + Sync>;

/// Default of [`StoreOptions::max_open_files`].
pub const DEFAULT_MAX_OPEN_FILES: usize = 256;
/// Default of [`StoreOptions::max_writers`].
pub const DEFAULT_MAX_WRITERS: usize = 4096;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            lock: LockOptions::default(),
            redactor: Arc::new(SecretRedactor::default()),
            cwd: std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_else(|_| "/".into()),
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            max_writers: DEFAULT_MAX_WRITERS,
            on_append: None,
        }
    }
}

/// Where a new entry hangs in the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParentChoice {
    /// The current leaf (the normal case).
    Leaf,
    /// A new root (`parentId: null`).
    Root,
    /// A given entry (branching); it must exist.
    Entry(String),
}

/// An entry to append; the store adds `id`, `parentId` and `timestamp`.
#[derive(Clone, Debug)]
pub struct NewEntry {
    /// The entry `type` (`message`, `custom`, `compaction`, `leaf`, …).
    pub kind: String,
    /// The fields after the base ones, in the order they should be written.
    pub payload: Map<String, Value>,
    pub parent: ParentChoice,
}

impl NewEntry {
    /// A `message` entry chained to the leaf.
    pub fn message(message: Value) -> NewEntry {
        let mut payload = Map::new();
        payload.insert("message".into(), message);
        NewEntry { kind: "message".into(), payload, parent: ParentChoice::Leaf }
    }

    /// Any entry type chained to the leaf.
    pub fn of(kind: &str, payload: Map<String, Value>) -> NewEntry {
        NewEntry { kind: kind.into(), payload, parent: ParentChoice::Leaf }
    }

    /// OpenClaw's `leaf` control entry: moves the active leaf to `target` (`None`: before the first
    /// entry). Its `parentId` is the target too: OpenClaw reads `targetId`, and Pi (whose leaf is the
    /// file's last entry) walks from this entry through the target, so both build the same context.
    pub fn move_leaf(target: Option<&str>) -> NewEntry {
        let mut payload = Map::new();
        payload.insert("targetId".into(), target.map(Value::from).unwrap_or(Value::Null));
        let parent = match target {
            Some(t) => ParentChoice::Entry(t.to_owned()),
            None => ParentChoice::Root,
        };
        NewEntry { kind: "leaf".into(), payload, parent }
    }

    /// The entry as it is written, chained to `parent`: a new id and timestamp, the payload in its
    /// order with messages, summaries and contents redacted. Every store backend renders here.
    pub fn render(&self, parent: Option<String>, redactor: &dyn Redactor) -> Result<Rendered, StoreError> {
        render_parts(&self.kind, self.payload.clone(), parent, redactor)
    }

    /// [`NewEntry::render`] that takes the payload out instead of copying it (the append path,
    /// which writes an entry once).
    fn render_once(&mut self, parent: Option<String>, redactor: &dyn Redactor) -> Result<Rendered, StoreError> {
        render_parts(&self.kind, std::mem::take(&mut self.payload), parent, redactor)
    }

    /// Checks what can be checked without the file.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.kind.is_empty() || self.kind == "session" {
            return Err(StoreError::InvalidEntry(format!("entry type {:?} cannot be appended", self.kind)));
        }
        for k in ["type", "id", "parentId", "timestamp"] {
            if self.payload.contains_key(k) {
                return Err(StoreError::InvalidEntry(format!("`{k}` is set by the store, not the caller")));
            }
        }
        if self.kind == "message" && !self.payload.get("message").is_some_and(Value::is_object) {
            return Err(StoreError::InvalidEntry("a message entry needs a `message` object".into()));
        }
        if let Some(k) = self.payload.get("message").and_then(|m| m.get("idempotencyKey")) {
            if k.as_str().is_none_or(|k| k.trim().is_empty()) {
                return Err(StoreError::InvalidEntry("`idempotencyKey` must be a non-empty string".into()));
            }
        }
        Ok(())
    }

    /// `message.idempotencyKey`, if the entry carries one.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.payload.get("message")?.get("idempotencyKey")?.as_str()
    }
}

/// The rendering of [`NewEntry::render`], from the entry's parts.
fn render_parts(
    kind: &str,
    payload: Map<String, Value>,
    parent: Option<String>,
    redactor: &dyn Redactor,
) -> Result<Rendered, StoreError> {
    let id = new_entry_id();
    let leaf = if kind == "leaf" {
        payload.get("targetId").and_then(Value::as_str).map(str::to_owned)
    } else {
        Some(id.clone())
    };
    let mut obj = Map::new();
    obj.insert("type".into(), Value::String(kind.to_owned()));
    obj.insert("id".into(), Value::String(id.clone()));
    obj.insert("parentId".into(), parent.map(Value::String).unwrap_or(Value::Null));
    obj.insert("timestamp".into(), Value::String(now_iso()));
    for (k, v) in payload {
        obj.insert(k, v);
    }
    redact_entry(&mut obj, redactor);
    let value = Value::Object(obj);
    let line = serde_json::to_vec(&value).map_err(|e| StoreError::Internal(e.to_string()))?;
    Ok(Rendered { value, line, id, leaf })
}

/// Redacts what the store redacts in an entry before it reaches disk: its `message`, `summary`
/// and `content` (an entry written by the store, or one brought in from elsewhere).
pub fn redact_entry(entry: &mut Map<String, Value>, redactor: &dyn Redactor) {
    for (k, v) in entry.iter_mut() {
        if matches!(k.as_str(), "message" | "summary" | "content") {
            redactor.redact_value(v);
        }
    }
}

/// An entry rendered by [`NewEntry::render`].
pub struct Rendered {
    /// The entry as written.
    pub value: Value,
    /// Its line, without the newline.
    pub line: Vec<u8>,
    pub id: String,
    /// The leaf after it: its id, or a `leaf` entry's target.
    pub leaf: Option<String>,
}

/// The result of one append.
#[derive(Clone, Debug, PartialEq)]
pub struct Appended {
    /// The entry exactly as it is on disk.
    pub entry: Value,
    /// False when the idempotency key was already in the file (the existing entry is returned).
    pub appended: bool,
    /// The entry's durable position in its transcript.
    pub pos: Pos,
}

impl Appended {
    pub fn id(&self) -> Option<&str> {
        self.entry.get("id").and_then(Value::as_str)
    }
}

/// Which lines [`Store::read_entries`] reads.
#[derive(Clone, Copy)]
enum Window {
    /// From this offset (a line start) on.
    From(u64),
    /// The last ones before this offset.
    Before(u64),
}

/// The transcript store. Cheap to clone; all clones share writers and locks.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    opts: StoreOptions,
    locks: LockRegistry,
    /// Writers by normalized path. Lock order: `aliases`, then `files`, then `handles`; a writer's
    /// `state` may be held while taking `handles`, and is only ever `try_lock`ed under `handles`.
    files: Mutex<foldhash::HashMap<PathBuf, Arc<FileWriter>>>,
    /// Writers by the path as callers spelled it (a cache in front of `files`).
    aliases: Mutex<foldhash::HashMap<PathBuf, Arc<FileWriter>>>,
    handles: Mutex<Handles>,
    /// `opts.max_open_files`, limited by the process's open-file limit.
    max_open: usize,
    /// The threads async appends are written on (started on first use).
    lanes: crate::lanes::Lanes,
}

/// Writers whose file is open, least recently used first.
#[derive(Default)]
struct Handles {
    tick: u64,
    /// Use tick → writer; a writer's current tick is in [`FileWriter::lru_tick`].
    order: BTreeMap<u64, Weak<FileWriter>>,
}

/// The soft `RLIMIT_NOFILE` of this process (`None`: unlimited).
fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

impl Store {
    pub fn new(mut opts: StoreOptions) -> Store {
        // A quarter of the descriptors for open transcripts, an eighth for lingering lock files.
        let share =
            |d: u64| open_file_limit().map(|l| usize::try_from(l / d).unwrap_or(usize::MAX)).unwrap_or(usize::MAX);
        let max_open = opts.max_open_files.min(share(4)).max(1);
        opts.lock.max_lingering = opts.lock.max_lingering.min(share(8));
        Store {
            inner: Arc::new(Inner {
                opts,
                locks: LockRegistry::default(),
                files: Mutex::default(),
                aliases: Mutex::default(),
                handles: Mutex::new(Handles::default()),
                max_open,
                lanes: crate::lanes::Lanes::default(),
            }),
        }
    }

    /// Transcript files this store has open now.
    pub fn open_files(&self) -> usize {
        lock(&self.inner.handles).order.values().filter(|w| w.strong_count() > 0).count()
    }

    /// Files whose writer is cached now.
    pub fn cached_writers(&self) -> usize {
        lock(&self.inner.files).len()
    }

    /// Lock files this store holds or keeps lingering now.
    pub fn held_locks(&self) -> usize {
        self.inner.locks.held_count()
    }

    /// Marks `w` as just used (call with its state locked); closes the least recently used idle
    /// handles while more than `max_open` are open.
    fn used(&self, w: &Arc<FileWriter>, st: &FileState) {
        if st.file.is_none() {
            return;
        }
        let mut h = lock(&self.inner.handles);
        let old = w.lru_tick.load(Ordering::Relaxed);
        if old != 0 {
            h.order.remove(&old);
        }
        h.tick += 1;
        let now = h.tick;
        h.order.insert(now, Arc::downgrade(w));
        w.lru_tick.store(now, Ordering::Relaxed);
        let mut excess = h.order.len().saturating_sub(self.inner.max_open);
        if excess == 0 {
            return;
        }
        let mut closed = Vec::new();
        for (&tick, weak) in &h.order {
            if excess == 0 {
                break;
            }
            if tick == now {
                continue;
            }
            let done = match weak.upgrade() {
                // Dropped writer: its file is closed already.
                None => true,
                Some(v) => {
                    let idle = match v.state.try_lock() {
                        Ok(vst) => Some(vst),
                        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                        // In use right now: not idle, try the next one.
                        Err(TryLockError::WouldBlock) => None,
                    };
                    match idle {
                        Some(mut vst) => {
                            vst.close_handle();
                            v.lru_tick.store(0, Ordering::Relaxed);
                            true
                        }
                        None => false,
                    }
                }
            };
            if done {
                closed.push(tick);
                excess -= 1;
            }
        }
        for tick in closed {
            h.order.remove(&tick);
        }
    }

    /// Drops idle writers (no caller holds them) while more than `max_writers` are cached, down to
    /// three quarters of it, least recently used first, so the cost is spread over many calls.
    fn evict_writers(&self) {
        let max = self.inner.opts.max_writers.max(1);
        let mut aliases = lock(&self.inner.aliases);
        let mut files = lock(&self.inner.files);
        if files.len() <= max {
            return;
        }
        let mut map_refs: HashMap<*const FileWriter, usize> = HashMap::new();
        for w in files.values().chain(aliases.values()) {
            *map_refs.entry(Arc::as_ptr(w)).or_default() += 1;
        }
        // Idle: only the maps hold it (every operation holds its own `Arc` while it runs, and new
        // ones are taken only under the map locks held here).
        let mut idle: Vec<(u64, PathBuf)> = files
            .iter()
            .filter(|(_, w)| Arc::strong_count(w) == map_refs.get(&Arc::as_ptr(w)).copied().unwrap_or(0))
            .map(|(k, w)| (w.lru_tick.load(Ordering::Relaxed), k.clone()))
            .collect();
        idle.sort();
        let excess = files.len().saturating_sub(max - max / 4);
        let mut gone: HashSet<*const FileWriter> = HashSet::new();
        let mut ticks = Vec::new();
        for (tick, key) in idle.into_iter().take(excess) {
            if let Some(w) = files.remove(&key) {
                gone.insert(Arc::as_ptr(&w));
                ticks.push(tick);
            }
        }
        aliases.retain(|_, w| !gone.contains(&Arc::as_ptr(w)));
        if aliases.len() > 2 * max {
            // Many spellings of few files: the aliases are only a cache.
            aliases.clear();
        }
        drop(files);
        drop(aliases);
        let mut h = lock(&self.inner.handles);
        for tick in ticks.into_iter().filter(|&t| t != 0) {
            h.order.remove(&tick);
        }
    }

    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }

    /// The writer of a file. Looked up by the path as given first, so the hot path costs no
    /// `realpath`; writers are shared by every spelling of the same file.
    fn writer(&self, path: &Path) -> Arc<FileWriter> {
        if let Some(w) = lock(&self.inner.aliases).get(path) {
            return w.clone();
        }
        let key = normalize(path);
        let (w, cached) = {
            let mut files = lock(&self.inner.files);
            let w = files
                .entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(FileWriter {
                        path: key,
                        queue: Mutex::new(Vec::new()),
                        state: Mutex::new(FileState::default()),
                        lru_tick: AtomicU64::new(0),
                    })
                })
                .clone();
            (w, files.len())
        };
        lock(&self.inner.aliases).insert(path.to_path_buf(), w.clone());
        if cached > self.inner.opts.max_writers {
            self.evict_writers();
        }
        w
    }

    /// `path` normalized: its writer's path when this store has one (taking a file's lock costs no
    /// `realpath`, as in [`Store::writer`]).
    fn normalized(&self, path: &Path) -> PathBuf {
        match lock(&self.inner.aliases).get(path) {
            Some(w) => w.path.clone(),
            None => normalize(path),
        }
    }

    /// Appends one entry; returns it as written once it is durable.
    pub fn append(&self, path: &Path, entry: NewEntry) -> Result<Appended, StoreError> {
        self.append_with(path, entry, None)
    }

    /// Like [`Store::append`]; `session_id` names the header if the file has to be created
    /// (default: the file stem when it is a valid session id, else a new uuid v7).
    pub fn append_with(&self, path: &Path, entry: NewEntry, session_id: Option<&str>) -> Result<Appended, StoreError> {
        let started = std::time::Instant::now();
        let r = self.append_queued(path, entry, session_id);
        metrics::histogram!("pincer_store_append_seconds").record(started.elapsed().as_secs_f64());
        r
    }

    /// Appends entries in order, each chained to the one before unless it names its parent, in
    /// one commit (one write, one fdatasync): all are durable when this returns `Ok`.
    pub fn append_all(
        &self,
        path: &Path,
        entries: Vec<NewEntry>,
        session_id: Option<&str>,
    ) -> Result<Vec<Appended>, StoreError> {
        let started = std::time::Instant::now();
        let r = self.append_queued_all(path, entries, session_id);
        metrics::histogram!("pincer_store_append_seconds").record(started.elapsed().as_secs_f64());
        r
    }

    /// Queues the entry and commits the queue (its own and whatever others queued meanwhile).
    fn append_queued(&self, path: &Path, entry: NewEntry, session_id: Option<&str>) -> Result<Appended, StoreError> {
        let mut r = self.append_queued_all(path, vec![entry], session_id)?;
        r.pop().ok_or_else(|| StoreError::Internal("append was not committed".into()))
    }

    /// Queues the entries together (so they are committed together, in order) and commits the
    /// queue: its own and whatever others queued meanwhile.
    fn append_queued_all(
        &self,
        path: &Path,
        entries: Vec<NewEntry>,
        session_id: Option<&str>,
    ) -> Result<Vec<Appended>, StoreError> {
        for e in &entries {
            e.validate()?;
        }
        let w = self.writer(path);
        // The cross-process lock first, without the file's state: while another process holds it,
        // this file's readers here are not held up (the commit takes it again, re-entrantly).
        let _held = self.hold(&w.path)?;
        let slots: Vec<Slot> = entries.iter().map(|_| Arc::new(Mutex::new(None))).collect();
        {
            let mut queue = lock(&w.queue);
            for (entry, slot) in entries.into_iter().zip(&slots) {
                queue.push(Pending { entry, session_id: session_id.map(str::to_owned), slot: slot.clone() });
            }
        }
        let mut st = lock(&w.state);
        // Queued as one run: another thread's commit took all of them, or none.
        if slots.last().is_some_and(|s| lock(s).is_none()) {
            let batch: Vec<Pending> = std::mem::take(&mut *lock(&w.queue));
            w.commit(&mut st, batch, &self.inner);
            self.used(&w, &st);
            drop(st);
            if let Some(observe) = &self.inner.opts.on_append {
                observe(&w.path);
            }
        }
        slots
            .iter()
            .map(|s| lock(s).take().unwrap_or_else(|| Err(StoreError::Internal("append was not committed".into()))))
            .collect()
    }

    /// Creates the file with its header if it does not exist yet (nothing else is written).
    pub fn ensure_created(&self, path: &Path, session_id: Option<&str>) -> Result<(), StoreError> {
        create_dir(path)?;
        let w = self.writer(path);
        let _guard = self.hold(&w.path)?; // before the state, as in `append_queued`
        let mut st = lock(&w.state);
        st.refresh(&w.path)?;
        if st.header == HeaderState::Missing {
            let mut out = Vec::new();
            let header = new_header(&w.path, session_id, &self.inner.opts.cwd);
            out.extend_from_slice(&serde_json::to_vec(&header).map_err(|e| StoreError::Internal(e.to_string()))?);
            out.push(b'\n');
            st.write_durably(&w.path, &out)?;
            st.header = HeaderState::Valid;
        }
        self.used(&w, &st);
        Ok(())
    }

    /// The id new entries would be chained to (`None`: they would be roots).
    pub fn leaf(&self, path: &Path) -> Result<Option<String>, StoreError> {
        let w = self.writer(path);
        let mut st = lock(&w.state);
        st.refresh(&w.path)?;
        self.used(&w, &st);
        Ok(st.leaf.clone())
    }

    /// Releases lock files kept for the next commit (call before a process exits; otherwise they
    /// are released a few milliseconds after the last commit).
    pub fn close(&self) {
        self.inner.locks.release_idle();
    }

    /// Holds the cross-process lock of `path` (re-entrant: appends in this process still go through).
    pub fn lock(&self, path: &Path) -> Result<LockGuard, StoreError> {
        Ok(self.inner.locks.acquire(&self.normalized(path), &self.inner.opts.lock)?)
    }

    /// [`Store::lock`] if no other process holds it now, else `None` (an error once `waiting_since`
    /// is older than the lock timeout): for a caller that waits without blocking a thread.
    pub fn try_lock(&self, path: &Path, waiting_since: std::time::Instant) -> Result<Option<LockGuard>, StoreError> {
        let key = self.normalized(path);
        in_dir(&key, || self.inner.locks.try_acquire(&key, &self.inner.opts.lock, waiting_since))
    }

    /// [`Store::try_lock`] waited for on the caller's task: while another process holds the lock,
    /// the task sleeps (1 ms, doubling up to 50 ms) instead of a thread blocking; an error once the
    /// lock timeout has passed.
    pub async fn lock_async(&self, path: &Path) -> Result<LockGuard, StoreError> {
        let since = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            if let Some(held) = self.try_lock(path, since)? {
                return Ok(held);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(50));
        }
    }

    /// [`Store::append_all`] on the transcript's writer lane ([`crate::lanes`]), awaited without
    /// blocking the caller's thread; `held` is released and `after` called on the lane once the
    /// entries are written.
    pub async fn append_on_lane(
        &self,
        held: crate::Held,
        path: PathBuf,
        entries: Vec<NewEntry>,
        session_id: Option<String>,
        after: crate::AfterCommit,
    ) -> Result<Vec<Appended>, StoreError> {
        let store = self.clone();
        let lane = path.clone();
        self.inner
            .lanes
            .run(&lane, move || {
                let r = store.append_all(&path, entries, session_id.as_deref());
                drop(held);
                if let Ok(all) = &r {
                    after(all);
                }
                r
            })
            .await
            .unwrap_or_else(|_| Err(StoreError::Internal("the append failed (its writer thread panicked)".into())))
    }

    /// [`Store::lock`] for an append of the writer at `path` (normalized).
    fn hold(&self, path: &Path) -> Result<LockGuard, StoreError> {
        in_dir(path, || self.inner.locks.acquire(path, &self.inner.opts.lock))
    }

    /// `repair` under this store's locks; cached state of the file is dropped afterwards.
    pub fn repair(&self, path: &Path) -> Result<crate::verify::Repaired, StoreError> {
        let key = normalize(path);
        let w = self.writer(&key);
        let mut st = lock(&w.state);
        let r = crate::verify::repair(&key, &self.inner.opts, &self.inner.locks);
        st.loaded = false;
        drop(st);
        if let Some(observe) = &self.inner.opts.on_append {
            observe(&w.path);
        }
        r
    }

    /// [`crate::trim`] under this store's locks (`max_lines` counts the header); cached state of
    /// the file is dropped afterwards.
    pub fn trim(&self, path: &Path, max_lines: usize) -> Result<crate::trim::Trimmed, StoreError> {
        let key = normalize(path);
        let w = self.writer(&key);
        let mut st = lock(&w.state);
        let r = crate::trim::trim(&key, &self.inner.opts, &self.inner.locks, max_lines);
        st.loaded = false;
        r
    }

    /// Forgets cached state of `path` (after it was replaced, e.g. archived by a reset).
    pub fn forget(&self, path: &Path) {
        let key = normalize(path);
        lock(&self.inner.aliases).retain(|_, w| w.path != key);
        lock(&self.inner.files).remove(&key);
    }
}

/// Answers from the cached state alone, for async threads (a turn's checks cost no hand-off to a
/// blocking thread): `None` unless this store has looked at the file before, nothing holds its
/// state right now (an append or a read in progress: no waiting), and the file is still the one
/// cached (one `stat`: same identity and length). Callers then ask the blocking way.
impl Store {
    fn peek<T>(&self, path: &Path, f: impl FnOnce(&FileState) -> Option<T>) -> Option<T> {
        let w = lock(&self.inner.aliases).get(path).cloned()?;
        let st = w.state.try_lock().ok()?;
        if !st.loaded {
            return None;
        }
        let meta = std::fs::metadata(&w.path).ok()?;
        ((meta.dev(), meta.ino()) == st.ident && meta.len() == st.len).then(|| f(&st)).flatten()
    }

    /// [`Store::leaf`] from the cached state, without blocking (`None`: ask [`Store::leaf`]).
    pub fn peek_leaf(&self, path: &Path) -> Option<Option<String>> {
        self.peek(path, |st| Some(st.leaf.clone()))
    }

    /// True when the cached state shows that no entry carries any of idempotency keys `keys`
    /// (false: ask [`Store::find_keyed`]).
    pub fn known_unkeyed(&self, path: &Path, keys: &[&str]) -> bool {
        self.peek(path, |st| st.index.as_ref().map(|i| keys.iter().all(|k| !i.idem.contains_key(&hash_str(k)))))
            == Some(true)
    }
}

/// Reading entries back by idempotency key and by position (durable dedupe of turns).
impl Store {
    /// The entry whose message carries idempotency key `key`, and the byte offset of its line.
    pub fn find_keyed(&self, path: &Path, key: &str) -> Result<Option<(Value, Pos)>, StoreError> {
        let w = self.writer(path);
        let mut st = lock(&w.state);
        st.refresh(&w.path)?;
        self.used(&w, &st);
        if st.header == HeaderState::Missing {
            return Ok(None);
        }
        st.ensure_index(&w.path)?;
        let Some(off) = st.index.as_ref().and_then(|i| i.idem.get(&hash_str(key)).copied()) else { return Ok(None) };
        let entry = st.entry_at(&w.path, off)?;
        let same = entry.get("message").and_then(|m| m.get("idempotencyKey")).and_then(Value::as_str) == Some(key);
        Ok(same.then_some((entry, Pos(off))))
    }

    /// The entries whose lines start at or after `offset`, each with its position (its line's
    /// byte offset), at most `max_bytes` of the file read (lines that do not parse are skipped; a
    /// line cut by the limit is dropped), and whether
    /// the read reached the end of the file (false: `max_bytes` cut it).
    pub fn entries_at(
        &self,
        path: &Path,
        offset: Pos,
        max_bytes: u64,
    ) -> Result<(Vec<(Pos, Value)>, bool), StoreError> {
        self.read_entries(path, Window::From(offset.0), max_bytes)
    }

    /// The last entries whose lines end before `offset`, from at most `max_bytes` before it.
    pub fn entries_before(&self, path: &Path, offset: Pos, max_bytes: u64) -> Result<Vec<(Pos, Value)>, StoreError> {
        Ok(self.read_entries(path, Window::Before(offset.0), max_bytes)?.0)
    }

    /// The entries of a window with their offsets, and whether it reached the end of the file.
    fn read_entries(
        &self,
        path: &Path,
        window: Window,
        max_bytes: u64,
    ) -> Result<(Vec<(Pos, Value)>, bool), StoreError> {
        let w = self.writer(path);
        let mut st = lock(&w.state);
        st.refresh(&w.path)?;
        self.used(&w, &st);
        let Some(file) = st.file.as_ref() else { return Ok((vec![], true)) };
        let (start, end) = match window {
            Window::From(from) => (from, st.len.min(from.saturating_add(max_bytes))),
            Window::Before(before) => {
                let end = st.len.min(before);
                (end.saturating_sub(max_bytes), end)
            }
        };
        if start >= end {
            return Ok((vec![], true));
        }
        let bytes = read_at(file, start, (end - start) as usize).map_err(io_err(&w.path))?;
        // A window that starts inside a line begins after it; one that ends inside a line ends
        // before it (the last line of the file ends at the file's end).
        let begin = match window {
            Window::Before(_) if start > 0 => memchr::memchr(b'\n', &bytes).map_or(bytes.len(), |p| p + 1),
            _ => 0,
        };
        let whole = end == st.len;
        let stop = if whole { bytes.len() } else { memchr::memrchr(b'\n', &bytes).unwrap_or(0) };
        let body = &bytes[begin.min(stop)..stop];
        let at = start + begin.min(stop) as u64;
        let entries = parse::line_ranges(body)
            .into_iter()
            .filter_map(|(s, e)| Some((Pos(at + s as u64), serde_json::from_slice::<Value>(&body[s..e]).ok()?)))
            .filter(|(_, v)| v.is_object())
            .collect();
        Ok((entries, whole || matches!(window, Window::Before(_))))
    }
}

/// Runs a lock attempt for transcript `path`, making its directory first when there is none yet
/// (a new transcript's lock file goes beside it).
fn in_dir<T>(path: &Path, attempt: impl Fn() -> Result<T, crate::lock::LockError>) -> Result<T, StoreError> {
    match attempt() {
        Err(crate::lock::LockError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            create_dir(path)?;
            Ok(attempt()?)
        }
        r => Ok(r?),
    }
}

/// Creates the transcript's directory (0700) if needed.
fn create_dir(path: &Path) -> Result<(), StoreError> {
    crate::fsutil::create_parent_dir(path).map_err(io_err(path))
}

/// Absolute, with the directory's symlinks resolved (the file itself may not exist yet). When the
/// directory is not there yet either, its nearest existing ancestor is resolved and the rest applied
/// as text (nothing in it can be a symlink yet, and `..` there undoes the step before it, as when the
/// directory is made): a path has the same key before and after its directory exists.
fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf())
    };
    let (Some(dir), Some(name)) = (abs.parent(), abs.file_name()) else { return abs };
    let resolved = dir.ancestors().find_map(|a| Some((a.canonicalize().ok()?, dir.strip_prefix(a).ok()?)));
    let Some((mut out, rest)) = resolved else { return abs };
    for c in rest.components() {
        match c {
            std::path::Component::Normal(part) => out.push(part),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out.join(name)
}

type Slot = Arc<Mutex<Option<Result<Appended, StoreError>>>>;

struct Pending {
    entry: NewEntry,
    session_id: Option<String>,
    slot: Slot,
}

struct FileWriter {
    path: PathBuf,
    queue: Mutex<Vec<Pending>>,
    state: Mutex<FileState>,
    /// Its key in [`Handles::order`] (0: not there); changed only under the `handles` lock.
    lru_tick: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum HeaderState {
    /// Not looked at yet.
    #[default]
    Unknown,
    /// No file, or an empty one: the next append writes the header first.
    Missing,
    Valid,
    /// Entries but no valid header: appending is refused until `repair`.
    Invalid,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Tail {
    /// Empty, or ends with a newline.
    #[default]
    Clean,
    /// The last line is complete JSON without its newline.
    NeedsNewline,
    /// The last line was cut off mid-write, starting at this offset.
    Torn(u64),
}

/// What a writer knows about its file. Valid only while `(dev, ino, len)` match the file.
#[derive(Default)]
struct FileState {
    loaded: bool,
    /// Open read-only, or for appending when `writable`; `None` before the first look, when the
    /// file does not exist, or after the handle was closed to stay within `max_open_files`.
    file: Option<File>,
    writable: bool,
    ident: (u64, u64),
    len: u64,
    /// Offset where the last line starts (for resuming a scan when the file grows).
    last_line_start: u64,
    header: HeaderState,
    /// The parent for the next append.
    leaf: Option<String>,
    tail: Tail,
    /// The file must be migrated (v1/v2) or linked (linear) before it can be appended to.
    needs_rewrite: bool,
    index: Option<FullIndex>,
}

/// Built on demand: idempotency keys and ids present in the file, as 64-bit hashes.
#[derive(Default)]
struct FullIndex {
    /// Hash of `message.idempotencyKey` → offset of its line.
    idem: HashMap<u64, u64>,
    ids: HashSet<u64>,
}

fn hash_str(s: &str) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.display().to_string(), source }
}

/// Reads `len` bytes at `offset`.
fn read_at(file: &File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

const CHUNK: u64 = 256 * 1024;
/// The first read at either end of a file: a header line or a last line fits in it as a rule, and a
/// read of [`CHUNK`] bytes costs a fresh 256 KiB buffer (~0.3 ms). Later reads grow ×4 up to CHUNK.
const FIRST_CHUNK: u64 = 8 * 1024;

impl FileState {
    /// Brings the cached state up to date with the file, reading only what changed.
    fn refresh(&mut self, path: &Path) -> Result<(), StoreError> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *self = FileState { loaded: true, header: HeaderState::Missing, ..FileState::default() };
                return Ok(());
            }
            Err(e) => return Err(io_err(path)(e)),
        };
        let ident = (meta.dev(), meta.ino());
        if !self.loaded || ident != self.ident || meta.len() < self.len {
            return self.load(path);
        }
        if self.file.is_none() {
            // Closed to stay within `max_open_files`: reopen, and keep the cache if it is still
            // the same file (a replacement in between is caught by the identity check).
            let file = File::open(path).map_err(io_err(path))?;
            let m = file.metadata().map_err(io_err(path))?;
            if (m.dev(), m.ino()) != self.ident || m.len() < self.len {
                return self.load(path);
            }
            self.file = Some(file);
            self.writable = false;
        }
        if meta.len() > self.len {
            let file = self.file.as_ref().ok_or_else(|| StoreError::Internal("no file handle".into()))?;
            let from = self.last_line_start;
            let bytes = read_at(file, from, (meta.len() - from) as usize).map_err(io_err(path))?;
            self.scan_forward(&bytes, from, meta.len());
            self.len = meta.len();
        }
        Ok(())
    }

    /// First look at a file: header from the head, leaf and tail state from a backwards scan.
    fn load(&mut self, path: &Path) -> Result<(), StoreError> {
        // Read-only: reading never needs write access (see `writable_file`).
        let file = File::open(path).map_err(io_err(path))?;
        let meta = file.metadata().map_err(io_err(path))?;
        *self = FileState {
            loaded: true,
            ident: (meta.dev(), meta.ino()),
            len: meta.len(),
            last_line_start: meta.len(),
            ..FileState::default()
        };
        let (header, version) = read_header(&file, self.len).map_err(io_err(path))?;
        self.header = header;
        self.needs_rewrite = version.is_some_and(|v| v < 3);
        let TailScan { tail, last_line_start, leaf, suspicious_linear } =
            scan_tail(&file, self.len).map_err(io_err(path))?;
        self.tail = tail;
        self.last_line_start = last_line_start;
        self.leaf = leaf;
        if self.header == HeaderState::Valid && suspicious_linear && !self.needs_rewrite {
            // The leaf has no parentId key: check whether the whole file is linear (rare, full read).
            self.needs_rewrite = Session::read(path)?.is_some_and(|s| s.is_linear());
        }
        if self.header == HeaderState::Missing && self.len > 0 {
            // Only blank lines: treat as empty.
            self.tail = Tail::Clean;
        }
        self.file = Some(file);
        Ok(())
    }

    /// Applies lines appended by someone else: bytes `[from, new_len)`, `from` at a line start.
    fn scan_forward(&mut self, bytes: &[u8], from: u64, new_len: u64) {
        let ranges = parse::line_ranges(bytes);
        let last = ranges.last().copied();
        self.tail = Tail::Clean;
        self.last_line_start = new_len;
        for (s, e) in ranges {
            let line = &bytes[s..e];
            let abs = from + s as u64;
            let parsed = parse::parse_line(line);
            if Some((s, e)) == last && e == bytes.len() {
                // The file does not end with a newline.
                self.last_line_start = abs;
                self.tail = if parsed.is_some() { Tail::NeedsNewline } else { Tail::Torn(abs) };
            }
            let Some(LineValue::Object(h)) = parsed else {
                continue;
            };
            if h.ty.as_deref() == Some("session") {
                if self.header == HeaderState::Missing {
                    self.header = HeaderState::Valid;
                }
                continue;
            }
            if let Some(index) = self.index.as_mut() {
                index_line(index, &h, line, abs);
            }
            if let Some(leaf) = leaf_of(&h, line) {
                self.leaf = leaf;
            }
        }
    }

    /// Builds the idempotency/id index with one forward pass over the file.
    fn ensure_index(&mut self, path: &Path) -> Result<(), StoreError> {
        if self.index.is_some() {
            return Ok(());
        }
        let mut index = FullIndex::default();
        let Some(file) = self.file.as_ref() else {
            // No file yet: nothing to index.
            self.index = Some(index);
            return Ok(());
        };
        let mut pos = 0u64;
        let mut carry: Vec<u8> = Vec::new();
        let mut carry_start = 0u64;
        while pos < self.len {
            let n = CHUNK.min(self.len - pos) as usize;
            carry.extend_from_slice(&read_at(file, pos, n).map_err(io_err(path))?);
            pos += n as u64;
            let complete =
                if pos == self.len { carry.len() } else { memchr::memrchr(b'\n', &carry).map(|p| p + 1).unwrap_or(0) };
            for (s, e) in parse::line_ranges(&carry[..complete]) {
                if let Some(LineValue::Object(h)) = parse::parse_line(&carry[s..e]) {
                    index_line(&mut index, &h, &carry[s..e], carry_start + s as u64);
                }
            }
            carry.drain(..complete);
            carry_start += complete as u64;
        }
        self.index = Some(index);
        Ok(())
    }

    /// Reads the entry whose line starts at `offset`.
    fn entry_at(&self, path: &Path, offset: u64) -> Result<Value, StoreError> {
        let file = self.file.as_ref().ok_or_else(|| StoreError::Internal("no file handle".into()))?;
        let mut line = Vec::new();
        let mut pos = offset;
        while pos < self.len {
            let n = (64 * 1024).min(self.len - pos) as usize;
            let chunk = read_at(file, pos, n).map_err(io_err(path))?;
            if let Some(nl) = memchr::memchr(b'\n', &chunk) {
                line.extend_from_slice(&chunk[..nl]);
                break;
            }
            line.extend_from_slice(&chunk);
            pos += n as u64;
        }
        serde_json::from_slice(&line).map_err(|e| StoreError::Internal(format!("entry at byte {offset}: {e}")))
    }

    /// Closes the file (the cache stays, revalidated by `refresh` when the file is reopened).
    fn close_handle(&mut self) {
        self.file = None;
        self.writable = false;
    }

    /// The handle opened for appending (replacing a read-only one); call after `refresh`, under the
    /// lock. A transcript without write permission fails here, naming the file and the reason.
    fn writable_file(&mut self, path: &Path) -> Result<&File, StoreError> {
        if !(self.writable && self.file.is_some()) {
            let f = OpenOptions::new().read(true).append(true).open(path).map_err(io_err(path))?;
            let m = f.metadata().map_err(io_err(path))?;
            if (m.dev(), m.ino()) != self.ident {
                self.loaded = false;
                return Err(StoreError::Internal(format!("{} was replaced while it was locked", path.display())));
            }
            self.file = Some(f);
            self.writable = true;
        }
        self.file.as_ref().ok_or_else(|| StoreError::Internal("no file handle".into()))
    }

    /// Writes `bytes` at the end with one write call and makes them durable. If that fails (a full
    /// disk, an I/O error), whatever part of `bytes` reached the file is cut off again: none of it
    /// was acknowledged, and the caller still has all of it. Only if even that fails is the file
    /// left with a torn tail, which the next append saves aside and cuts (see [`crate::rewrite`]).
    fn write_durably(&mut self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let created = self.file.is_none();
        if created {
            let f =
                OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path).map_err(io_err(path))?;
            let meta = f.metadata().map_err(io_err(path))?;
            self.ident = (meta.dev(), meta.ino());
            self.len = meta.len();
            self.file = Some(f);
            self.writable = true;
        }
        let before = self.len;
        let file = self.writable_file(path)?;
        let mut written = 0u64;
        let res = write_counting(file, bytes, &mut written).and_then(|_| {
            let synced = std::time::Instant::now();
            let r = if created { file.sync_all() } else { file.sync_data() };
            metrics::histogram!("pincer_store_fdatasync_seconds").record(synced.elapsed().as_secs_f64());
            r
        });
        if let Err(e) = res {
            // Cut only what this write added: if the file is not exactly `before + written` long,
            // someone else wrote too (ignoring the lock), and their bytes are not ours to cut.
            let ours = file.metadata().is_ok_and(|m| m.len() == before + written);
            let rolled_back = ours && file.set_len(before).and_then(|_| file.sync_data()).is_ok();
            if !rolled_back {
                // What reached the file is unknown now: start over from the file next time.
                self.loaded = false;
            }
            return Err(io_err(path)(e));
        }
        if created {
            crate::fsutil::sync_parent_dir(path).map_err(io_err(path))?;
        }
        // Every write ends with a newline.
        self.len += bytes.len() as u64;
        self.last_line_start = self.len;
        self.tail = Tail::Clean;
        Ok(())
    }
}

/// The header of a transcript: the first line that parses decides (a `session` object with a
/// string id is valid), and its `version` (1 when absent).
fn read_header(file: &File, len: u64) -> std::io::Result<(HeaderState, Option<u64>)> {
    let mut pos = 0u64;
    let mut carry = Vec::new();
    let mut step = FIRST_CHUNK;
    while pos < len {
        let n = step.min(len - pos) as usize;
        step = (step * 4).min(CHUNK);
        carry.extend_from_slice(&read_at(file, pos, n)?);
        pos += n as u64;
        let complete = if pos == len { carry.len() } else { memchr::memrchr(b'\n', &carry).unwrap_or(0) };
        for (s, e) in parse::line_ranges(&carry[..complete]) {
            match parse::parse_line(&carry[s..e]) {
                None => continue,
                Some(LineValue::Object(h)) if h.ty.as_deref() == Some("session") => {
                    return Ok(match serde_json::from_slice::<Map<String, Value>>(&carry[s..e]) {
                        Ok(obj) if obj.get("id").is_some_and(Value::is_string) => {
                            (HeaderState::Valid, Some(obj.get("version").and_then(Value::as_u64).unwrap_or(1)))
                        }
                        _ => (HeaderState::Invalid, None),
                    });
                }
                Some(_) => return Ok((HeaderState::Invalid, None)),
            }
        }
        if complete > 0 {
            carry.drain(..complete);
        }
    }
    Ok((HeaderState::Missing, None))
}

/// What the end of a transcript says: the state of its last line, where that line starts, the
/// leaf, and whether an entry without a `parentId` key was met on the way (a linear file, maybe).
struct TailScan {
    tail: Tail,
    last_line_start: u64,
    leaf: Option<String>,
    suspicious_linear: bool,
}

/// Walks lines backwards from the end until one decides the leaf (or the header is reached).
fn scan_tail(file: &File, len: u64) -> std::io::Result<TailScan> {
    let mut first = true;
    let mut t = TailScan { tail: Tail::Clean, last_line_start: len, leaf: None, suspicious_linear: false };
    scan_back(file, len, |offset, line| {
        let at_end = std::mem::take(&mut first);
        if parse::is_blank(line) {
            return false;
        }
        let parsed = parse::parse_line(line);
        if at_end {
            t.last_line_start = offset;
            t.tail = if parsed.is_some() { Tail::NeedsNewline } else { Tail::Torn(offset) };
        }
        match parsed {
            // Reached the header: nothing above it decides the leaf.
            Some(LineValue::Object(h)) if h.ty.as_deref() == Some("session") => true,
            Some(LineValue::Object(h)) => {
                t.suspicious_linear |= h.parent.is_none();
                match leaf_of(&h, line) {
                    Some(l) => {
                        t.leaf = l;
                        true
                    }
                    None => false,
                }
            }
            _ => false,
        }
    })?;
    Ok(t)
}

/// `write_all` that counts the bytes that reached the file, also when it fails part-way.
fn write_counting(mut file: &File, mut bytes: &[u8], written: &mut u64) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match file.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n as u64;
                bytes = &bytes[n..];
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Visits the file's lines from last to first (`offset`, bytes without the newline; the first
/// visit is whatever follows the final newline, often empty) until `visit` returns true.
fn scan_back(file: &File, len: u64, mut visit: impl FnMut(u64, &[u8]) -> bool) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_start = len;
    let mut step = FIRST_CHUNK;
    loop {
        match memchr::memrchr(b'\n', &buf) {
            Some(p) => {
                if visit(buf_start + p as u64 + 1, &buf[p + 1..]) {
                    return Ok(());
                }
                buf.truncate(p);
            }
            None if buf_start == 0 => {
                visit(0, &buf);
                return Ok(());
            }
            None => {
                let from = buf_start.saturating_sub(step);
                step = (step * 4).min(CHUNK);
                let mut chunk = read_at(file, from, (buf_start - from) as usize)?;
                chunk.extend_from_slice(&buf);
                buf = chunk;
                buf_start = from;
            }
        }
    }
}

/// The leaf an entry line sets, if it decides one: its id, or a `leaf` control's target, or (for an
/// entry without an id) its parent. `Some(None)` means "before the first entry".
fn leaf_of(h: &parse::Head<'_>, line: &[u8]) -> Option<Option<String>> {
    if h.ty.as_deref() == Some("leaf") {
        let v: Value = serde_json::from_slice(line).ok()?;
        return match v.get("targetId") {
            Some(Value::String(t)) => Some(Some(t.clone())),
            Some(Value::Null) => Some(None),
            _ => h.id.as_deref().map(|id| Some(id.to_string())),
        };
    }
    if let Some(id) = &h.id {
        return Some(Some(id.to_string()));
    }
    match &h.parent {
        Some(parse::ParentText::Id(p)) => Some(Some(p.to_string())),
        _ => None,
    }
}

fn index_line(index: &mut FullIndex, h: &parse::Head<'_>, line: &[u8], offset: u64) {
    if let Some(id) = &h.id {
        index.ids.insert(hash_str(id));
    }
    if memchr::memmem::find(line, b"\"idempotencyKey\"").is_some() {
        if let Ok(v) = serde_json::from_slice::<Value>(line) {
            if let Some(k) = v.get("message").and_then(|m| m.get("idempotencyKey")).and_then(Value::as_str) {
                index.idem.insert(hash_str(k), offset);
            }
        }
    }
}

/// A session id is valid when it matches `^[a-z0-9][a-z0-9._-]{0,127}$`.
pub fn valid_session_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-'))
}

/// A v3 header for a new file.
pub fn new_header(path: &Path, session_id: Option<&str>, cwd: &str) -> Value {
    let id = session_id.map(str::to_owned).unwrap_or_else(|| {
        path.file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| valid_session_id(s))
            .map(str::to_owned)
            .unwrap_or_else(new_session_id)
    });
    json!({"type": "session", "version": 3, "id": id, "timestamp": now_iso(), "cwd": cwd})
}

impl FileWriter {
    /// Commits one batch under the cross-process lock; fills every pending slot.
    fn commit(&self, st: &mut FileState, mut batch: Vec<Pending>, inner: &Inner) {
        let fail_all = |batch: &[Pending], e: &StoreError| {
            for p in batch {
                *lock(&p.slot) = Some(Err(e.duplicate()));
            }
        };
        if st.file.is_none() {
            if let Err(e) = create_dir(&self.path) {
                return fail_all(&batch, &e);
            }
        }
        let guard = match inner.locks.acquire(&self.path, &inner.opts.lock) {
            Ok(g) => g,
            Err(e) => return fail_all(&batch, &StoreError::from(e)),
        };
        if let Err(e) = self.prepare(st, inner) {
            return fail_all(&batch, &e);
        }
        let mut out = Vec::new();
        if st.tail == Tail::NeedsNewline {
            out.push(b'\n');
        }
        if st.header == HeaderState::Missing {
            let sid = batch.iter().find_map(|p| p.session_id.as_deref());
            let header = new_header(&self.path, sid, &inner.opts.cwd);
            match serde_json::to_vec(&header) {
                Ok(b) => out.extend_from_slice(&b),
                Err(e) => return fail_all(&batch, &StoreError::Internal(e.to_string())),
            }
            out.push(b'\n');
        }
        let leaf_before = st.leaf.clone();
        let mut results: Vec<Result<Appended, StoreError>> = Vec::with_capacity(batch.len());
        // Keys appended by this batch (by their hash), with where their result is.
        let mut batch_keys: HashMap<u64, usize> = HashMap::new();
        let mut batch_ids: HashSet<String> = HashSet::new();
        let mut new_keys: Vec<(u64, u64)> = Vec::new();
        for p in &mut batch {
            let key = p.entry.idempotency_key();
            let hash = key.map(hash_str);
            let earlier = hash.and_then(|h| batch_keys.get(&h)).and_then(|&i| results.get(i));
            if let (Some(Ok(a)), Some(key)) = (earlier, key) {
                if a.entry.get("message").and_then(|m| m.get("idempotencyKey")).and_then(Value::as_str) == Some(key) {
                    results.push(Ok(Appended { entry: a.entry.clone(), appended: false, pos: a.pos }));
                    continue;
                }
            }
            let r = self.build_one(st, &mut p.entry, inner, &mut out, &mut batch_ids, &mut new_keys);
            if let (Some(h), Ok(a)) = (hash, &r) {
                if a.appended {
                    batch_keys.insert(h, results.len());
                }
            }
            results.push(r);
        }
        let wrote_entries = results.iter().any(|r| matches!(r, Ok(a) if a.appended));
        if wrote_entries {
            if let Err(e) = st.write_durably(&self.path, &out) {
                st.leaf = leaf_before;
                st.loaded = false;
                return fail_all(&batch, &e);
            }
            st.header = HeaderState::Valid;
            if let Some(index) = st.index.as_mut() {
                for (k, off) in new_keys {
                    index.idem.insert(k, off);
                }
                for id in &batch_ids {
                    index.ids.insert(hash_str(id));
                }
            }
        }
        drop(guard);
        for (p, r) in batch.into_iter().zip(results) {
            *lock(&p.slot) = Some(r);
        }
    }

    /// Under the lock: refresh, refuse header-less files, migrate/link, cut a torn tail.
    fn prepare(&self, st: &mut FileState, inner: &Inner) -> Result<(), StoreError> {
        st.refresh(&self.path)?;
        if st.header == HeaderState::Invalid {
            return Err(StoreError::NoHeader(self.path.display().to_string()));
        }
        if st.needs_rewrite {
            let data = std::fs::read(&self.path).map_err(io_err(&self.path))?;
            let mut s = Session::parse(data);
            if s.is_linear() {
                s.link_linear();
            }
            crate::rewrite::replace_atomically(&self.path, &s.render(false))?;
            st.loaded = false;
            st.refresh(&self.path)?;
        }
        if let Tail::Torn(at) = st.tail {
            let len = st.len;
            crate::rewrite::cut_torn_tail(&self.path, st.writable_file(&self.path)?, at, len)?;
            st.len = at;
            st.tail = Tail::Clean;
            st.last_line_start = at;
            // The torn bytes may have been noticed as a "line" by nobody: the leaf is unaffected.
        }
        let _ = inner;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn build_one(
        &self,
        st: &mut FileState,
        entry: &mut NewEntry,
        inner: &Inner,
        out: &mut Vec<u8>,
        batch_ids: &mut HashSet<String>,
        new_keys: &mut Vec<(u64, u64)>,
    ) -> Result<Appended, StoreError> {
        if let Some(key) = entry.idempotency_key() {
            st.ensure_index(&self.path)?;
            let hit = st.index.as_ref().and_then(|i| i.idem.get(&hash_str(key)).copied());
            if let Some(off) = hit {
                let existing = st.entry_at(&self.path, off)?;
                if existing.get("message").and_then(|m| m.get("idempotencyKey")).and_then(Value::as_str) == Some(key) {
                    return Ok(Appended { entry: existing, appended: false, pos: Pos(off) });
                }
            }
        }
        let parent = match &entry.parent {
            ParentChoice::Leaf => st.leaf.clone(),
            ParentChoice::Root => None,
            ParentChoice::Entry(id) => {
                if !batch_ids.contains(id) {
                    st.ensure_index(&self.path)?;
                    if !st.index.as_ref().is_some_and(|i| i.ids.contains(&hash_str(id))) {
                        return Err(StoreError::UnknownEntry(id.clone()));
                    }
                }
                Some(id.clone())
            }
        };
        if entry.kind == "leaf" {
            if let Some(Value::String(t)) = entry.payload.get("targetId") {
                if !batch_ids.contains(t) {
                    st.ensure_index(&self.path)?;
                    if !st.index.as_ref().is_some_and(|i| i.ids.contains(&hash_str(t))) {
                        return Err(StoreError::UnknownEntry(t.clone()));
                    }
                }
            }
        }
        let key = entry.idempotency_key().map(hash_str);
        let Rendered { value, line, id, leaf } = entry.render_once(parent, inner.opts.redactor.as_ref())?;
        let offset = st.len + out.len() as u64;
        out.extend_from_slice(&line);
        out.push(b'\n');
        if let Some(key) = key {
            new_keys.push((key, offset));
        }
        batch_ids.insert(id);
        st.leaf = leaf;
        Ok(Appended { entry: value, appended: true, pos: Pos(offset) })
    }
}
