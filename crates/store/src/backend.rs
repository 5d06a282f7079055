//! The transcript store seam: everything the gateway, compaction and the CLI ask of a store of
//! transcripts and session indexes, as one trait, [`Transcripts`]. The JSONL state directory
//! ([`Store`], this crate) is one implementation; PostgreSQL (`pincer-pg`) is another.
//!
//! Transcripts and indexes are named by the paths the JSONL layout gives them
//! (`<state>/agents/<agent>/sessions/<sessionId>.jsonl`, `.../sessions.json`), whatever the backend:
//! a backend that keeps no files maps the path to its own key, so the session index, its rules
//! and every caller stay one piece of code. Entries are found again by their [`Pos`].

use crate::history::{History, HistoryOptions};
use crate::store::{Appended, NewEntry, Store};
use crate::trim::Trimmed;
use crate::{Session, StoreError};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where an entry sits in its transcript, durably: the same in every process, after a restart and
/// (PostgreSQL) on every replica, and growing with each append. Callers read from a position and
/// get each entry's own; beyond order and equality it is opaque to them: for files the byte offset of
/// the entry's line (known on the append path without counting lines; only a rewrite of the
/// file — `sessions.compact {maxLines}`, the one-time migration of a legacy file — moves it),
/// for a database the `seq` column. On the wire it is a plain number (`messageSeq`, `afterSeq`, and
/// the middle of an event id: `<sessionId>:<pos>`, `<sessionId>:<pos>.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Pos(pub u64);

impl Pos {
    /// Before every entry: reading from here reads the transcript from its start.
    pub const START: Pos = Pos(0);
    /// After every entry: reading before here reads the transcript's end.
    pub const END: Pos = Pos(u64::MAX);
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A held lock (see [`Transcripts::lock`]); released when dropped.
pub type Held = Box<dyn Send>;

/// The future of an async store call ([`Transcripts::lock_for_append`],
/// [`Transcripts::append_held`]): polled on the caller's runtime, never blocking its thread.
pub type StoreFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StoreError>> + Send>>;

/// Run by the writer right after an append commits, before its caller hears of it (the entries as
/// written, `appended: false` for a key already there); on the file store, in the order the
/// transcript's appends commit.
pub type AfterCommit = Box<dyn FnOnce(&[Appended]) + Send>;

/// What identifies one version of a session index: for files `(dev, ino, len, mtime ns)`; a
/// backend without files uses what changes on every write.
pub type IndexStamp = (u64, u64, u64, i64);

/// A store of transcripts (Pi v3 entries chained by `parentId`) and session indexes. The async
/// append ([`Transcripts::lock_for_append`], [`Transcripts::append_held`]) never blocks the thread
/// polling it; every other method may block on I/O: call them off the async threads.
pub trait Transcripts: Send + Sync {
    /// Appends entries in order (each chained to the one before, unless it names its parent) in one
    /// durable commit: all of them are written, or none is acknowledged. Returns them as written.
    fn append_all(
        &self,
        path: &Path,
        entries: Vec<NewEntry>,
        session_id: Option<&str>,
    ) -> Result<Vec<Appended>, StoreError>;

    /// Creates the transcript with its header if it does not exist yet.
    fn ensure_created(&self, path: &Path, session_id: Option<&str>) -> Result<(), StoreError>;

    /// The id new entries would be chained to (`None`: they would be roots), and how many times the
    /// transcript was rewritten in place (cut by `sessions.compact {maxLines}`) on a store several
    /// processes share: what another process cached of it is stale when this count moved, though the
    /// leaf is the same. The file store answers 0 (its rewrites tell the gateway directly).
    fn leaf_version(&self, path: &Path) -> Result<(Option<String>, u64), StoreError>;

    /// [`Transcripts::leaf_version`] when the store knows it without blocking (from memory and
    /// at most a `stat`), so async threads can ask; `None`: ask the blocking way.
    fn peek_leaf_version(&self, _path: &Path) -> Option<(Option<String>, u64)> {
        None
    }

    /// True when the store knows without blocking that no entry of the transcript carries any of
    /// idempotency keys `keys`; false: ask [`Transcripts::find_keyed`].
    fn known_unkeyed(&self, _path: &Path, _keys: &[&str]) -> bool {
        false
    }

    /// [`Transcripts::index_stamp`] when the store knows it without blocking (a `stat`), so async
    /// threads can ask; `None`: ask the blocking way.
    fn peek_index_stamp(&self, _path: &Path) -> Option<Option<IndexStamp>> {
        None
    }

    /// The transcript's size in bytes as a file (the lines' length), `None` when it does not exist:
    /// what reading it whole costs.
    fn bytes(&self, path: &Path) -> Result<Option<u64>, StoreError>;

    /// The position after the transcript's last entry (`None`: it does not exist): where
    /// [`Transcripts::entries_at`] finds the next entry appended; it grows with every append.
    fn end(&self, path: &Path) -> Result<Option<Pos>, StoreError>;

    /// The whole transcript, read and indexed as Pi reads it (`None`: it does not exist).
    fn read_session(&self, path: &Path) -> Result<Option<Session>, StoreError>;

    /// The whole transcript as the bytes of its JSONL file, when it has at most `max_bytes`
    /// (`None`: missing or larger).
    fn read_bytes(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError>;

    /// The transcript's last whole lines, about `max_bytes` of them at most (`None`: missing).
    fn read_tail(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError>;

    /// `chat.history` of the transcript, from a bounded tail.
    fn history(&self, path: &Path, opts: HistoryOptions) -> Result<History, StoreError>;

    /// The entry whose message carries idempotency key `key`, and its position.
    fn find_keyed(&self, path: &Path, key: &str) -> Result<Option<(Value, Pos)>, StoreError>;

    /// The entries from position `pos` on (that one included), about `max_bytes` of them at most,
    /// each with its position ([`Appended::pos`]), and whether they reach the transcript's end
    /// (false: the limit cut them). Positions are durable: the same in every process, after a
    /// restart and (PostgreSQL) on every replica, and they grow with each append.
    fn entries_at(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<(Vec<(Pos, Value)>, bool), StoreError>;

    /// The last entries before position `pos`, about `max_bytes` of them at most, with positions.
    fn entries_before(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<Vec<(Pos, Value)>, StoreError>;

    /// Holds the transcript's (or index's) cross-process lock; appends of this process still go
    /// through while it is held, those of other processes wait.
    fn lock(&self, path: &Path) -> Result<Held, StoreError>;

    /// Waits, without blocking the thread, for the transcript's cross-process lock for an append
    /// ([`Transcripts::append_held`]): while another process (OpenClaw, Pi, a second gateway)
    /// holds it, the caller's task waits, not a writer thread other transcripts share; an error
    /// once the lock timeout has passed. A backend whose appends never wait for another process's
    /// file lock holds nothing (the default).
    fn lock_for_append(self: std::sync::Arc<Self>, _path: PathBuf) -> StoreFuture<Held> {
        Box::pin(std::future::ready(Ok(Box::new(()) as Held)))
    }

    /// [`Transcripts::append_all`] without blocking the caller's thread: the file store writes on
    /// its writer lanes (a transcript always on the same thread, [`crate::lanes`]), PostgreSQL
    /// on its connection pool. `held` ([`Transcripts::lock_for_append`]) is released once the
    /// entries are written; `after` runs then, before the caller hears of it.
    fn append_held(
        self: std::sync::Arc<Self>,
        held: Held,
        path: PathBuf,
        entries: Vec<NewEntry>,
        session_id: Option<String>,
        after: AfterCommit,
    ) -> StoreFuture<Vec<Appended>>;

    /// `sessions.compact {maxLines}`: the transcript keeps its last lines.
    fn trim(&self, path: &Path, max_lines: usize) -> Result<Trimmed, StoreError>;

    /// Forgets cached state of a transcript (after it was replaced or archived).
    fn forget(&self, path: &Path);

    /// Releases what is kept for the next commit (before the process exits).
    fn close(&self);

    /// The version of the session index at `path` now (`None`: there is none).
    fn index_stamp(&self, path: &Path) -> Option<IndexStamp>;

    /// The session index at `path` as JSON bytes (`None`: there is none).
    fn read_index(&self, path: &Path) -> Result<Option<Vec<u8>>, StoreError>;

    /// Replaces the session index at `path` with `bytes` (a JSON object), atomically.
    fn write_index(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError>;

    /// The agents under `<state>/agents` that may have an index.
    fn agents(&self, state_dir: &Path) -> Vec<String>;

    /// Moves a transcript aside as `<path>.<reason>.<timestamp>`; `None` when there was none.
    fn archive_transcript(&self, path: &Path, reason: &str) -> Result<Option<PathBuf>, StoreError>;

    /// Stores an imported transcript (`bytes`: a whole Pi v3 file) at `path`, which must not exist.
    fn import_transcript(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError>;

    /// The transcripts moved aside in the sessions directory `dir` (names `<file>.jsonl.<suffix>`:
    /// archived, trimmed backups, …), each with when it was last written (ms since the epoch).
    fn set_aside(&self, dir: &Path) -> Vec<(PathBuf, Option<u64>)>;
}

/// What every store answers through [`Transcripts`], said shorter: not part of the seam (a backend
/// implements none of it), in scope with `use pincer_store::TranscriptsExt`.
pub trait TranscriptsExt: Transcripts {
    /// Appends one entry (chained to the leaf, a root or a chosen parent); returns it as written
    /// once it is durable. An entry whose idempotency key is already in the transcript is not
    /// written again: the existing one is returned with `appended: false`. `session_id` names the
    /// header if the transcript has to be created.
    fn append_with(&self, path: &Path, entry: NewEntry, session_id: Option<&str>) -> Result<Appended, StoreError> {
        let mut all = self.append_all(path, vec![entry], session_id)?;
        all.pop().ok_or_else(|| StoreError::Internal("the append returned nothing".into()))
    }

    /// [`TranscriptsExt::append_with`] without a session id.
    fn append(&self, path: &Path, entry: NewEntry) -> Result<Appended, StoreError> {
        self.append_with(path, entry, None)
    }

    /// The id new entries would be chained to (`None`: they would be roots).
    fn leaf(&self, path: &Path) -> Result<Option<String>, StoreError> {
        Ok(self.leaf_version(path)?.0)
    }

    /// Whether the transcript exists.
    fn exists(&self, path: &Path) -> Result<bool, StoreError> {
        Ok(self.end(path)?.is_some())
    }

    /// The entries from position `pos` on (that one included), about `max_bytes` of them at most.
    fn entries_from(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<Vec<Value>, StoreError> {
        Ok(self.entries_at(path, pos, max_bytes)?.0.into_iter().map(|(_, e)| e).collect())
    }

    /// The last entries, about `max_bytes` of them at most.
    fn tail_entries(&self, path: &Path, max_bytes: u64) -> Result<Vec<Value>, StoreError> {
        Ok(self.entries_before(path, Pos::END, max_bytes)?.into_iter().map(|(_, e)| e).collect())
    }
}

impl<T: Transcripts + ?Sized> TranscriptsExt for T {}

/// `r`, with a file that is not there as `None` (any other failure an error naming `path`).
fn unless_missing<T>(path: &Path, r: std::io::Result<T>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io(path, e)),
    }
}

impl Transcripts for Store {
    fn bytes(&self, path: &Path) -> Result<Option<u64>, StoreError> {
        Ok(unless_missing(path, std::fs::metadata(path))?.filter(|m| m.is_file()).map(|m| m.len()))
    }

    fn append_all(
        &self,
        path: &Path,
        entries: Vec<NewEntry>,
        session_id: Option<&str>,
    ) -> Result<Vec<Appended>, StoreError> {
        Store::append_all(self, path, entries, session_id)
    }

    fn ensure_created(&self, path: &Path, session_id: Option<&str>) -> Result<(), StoreError> {
        Store::ensure_created(self, path, session_id)
    }

    fn leaf_version(&self, path: &Path) -> Result<(Option<String>, u64), StoreError> {
        Ok((Store::leaf(self, path)?, 0))
    }

    fn peek_leaf_version(&self, path: &Path) -> Option<(Option<String>, u64)> {
        Some((Store::peek_leaf(self, path)?, 0))
    }

    fn known_unkeyed(&self, path: &Path, keys: &[&str]) -> bool {
        Store::known_unkeyed(self, path, keys)
    }

    fn peek_index_stamp(&self, path: &Path) -> Option<Option<IndexStamp>> {
        Some(Transcripts::index_stamp(self, path))
    }

    fn end(&self, path: &Path) -> Result<Option<Pos>, StoreError> {
        Ok(Transcripts::bytes(self, path)?.map(Pos))
    }

    fn read_session(&self, path: &Path) -> Result<Option<Session>, StoreError> {
        Session::read(path)
    }

    fn read_bytes(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        match Transcripts::bytes(self, path)? {
            Some(len) if len <= max_bytes => unless_missing(path, std::fs::read(path)),
            _ => Ok(None),
        }
    }

    fn read_tail(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        use std::io::{Read, Seek, SeekFrom};
        let Some(mut f) = unless_missing(path, std::fs::File::open(path))? else { return Ok(None) };
        let io = |e| StoreError::io(path, e);
        let len = f.metadata().map_err(io)?.len();
        let from = len.saturating_sub(max_bytes);
        let mut bytes = Vec::new();
        f.seek(SeekFrom::Start(from)).map_err(io)?;
        f.take(max_bytes).read_to_end(&mut bytes).map_err(io)?;
        if from > 0 {
            // The first line is cut: it starts before the tail.
            let cut = bytes.iter().position(|b| *b == b'\n').map_or(bytes.len(), |i| i + 1);
            bytes.drain(..cut);
        }
        Ok(Some(bytes))
    }

    fn history(&self, path: &Path, opts: HistoryOptions) -> Result<History, StoreError> {
        crate::history::read_history(path, opts).map_err(|e| StoreError::io(path, e))
    }

    fn find_keyed(&self, path: &Path, key: &str) -> Result<Option<(Value, Pos)>, StoreError> {
        Store::find_keyed(self, path, key)
    }

    fn entries_at(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<(Vec<(Pos, Value)>, bool), StoreError> {
        Store::entries_at(self, path, pos, max_bytes)
    }

    fn entries_before(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<Vec<(Pos, Value)>, StoreError> {
        Store::entries_before(self, path, pos, max_bytes)
    }

    fn lock(&self, path: &Path) -> Result<Held, StoreError> {
        Ok(Box::new(Store::lock(self, path)?))
    }

    fn lock_for_append(self: std::sync::Arc<Self>, path: PathBuf) -> StoreFuture<Held> {
        Box::pin(async move { Ok(Box::new(self.lock_async(&path).await?) as Held) })
    }

    fn append_held(
        self: std::sync::Arc<Self>,
        held: Held,
        path: PathBuf,
        entries: Vec<NewEntry>,
        session_id: Option<String>,
        after: AfterCommit,
    ) -> StoreFuture<Vec<Appended>> {
        Box::pin(async move { self.append_on_lane(held, path, entries, session_id, after).await })
    }

    fn trim(&self, path: &Path, max_lines: usize) -> Result<Trimmed, StoreError> {
        Store::trim(self, path, max_lines)
    }

    fn forget(&self, path: &Path) {
        Store::forget(self, path)
    }

    fn close(&self) {
        Store::close(self)
    }

    fn index_stamp(&self, path: &Path) -> Option<IndexStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some((m.dev(), m.ino(), m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
    }

    fn read_index(&self, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        unless_missing(path, std::fs::read(path))
    }

    fn write_index(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        crate::files::write_session_index(path, bytes).map_err(|e| StoreError::io(path, e))
    }

    fn agents(&self, state_dir: &Path) -> Vec<String> {
        std::fs::read_dir(state_dir.join("agents"))
            .map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    }

    fn archive_transcript(&self, path: &Path, reason: &str) -> Result<Option<PathBuf>, StoreError> {
        crate::files::archive_transcript(path, reason).map_err(|e| StoreError::io(path, e))
    }

    fn import_transcript(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        crate::files::import_transcript(path, bytes).map_err(|e| StoreError::io(path, e))
    }

    fn set_aside(&self, dir: &Path) -> Vec<(PathBuf, Option<u64>)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // Not transcripts: a transcript's lock file, and a write's temp file.
            let other = name.ends_with(".jsonl.lock") || crate::fsutil::temp_name_parts(&name).is_some();
            if !name.contains(".jsonl.") || other || !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let modified = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64);
            out.push((e.path(), modified));
        }
        out
    }
}

/// A shared store is a store (so `Arc<dyn Transcripts>` goes wherever a store is asked for).
impl<T: Transcripts + ?Sized> Transcripts for std::sync::Arc<T> {
    fn bytes(&self, path: &Path) -> Result<Option<u64>, StoreError> {
        (**self).bytes(path)
    }
    fn append_all(
        &self,
        path: &Path,
        entries: Vec<NewEntry>,
        session_id: Option<&str>,
    ) -> Result<Vec<Appended>, StoreError> {
        (**self).append_all(path, entries, session_id)
    }
    fn ensure_created(&self, path: &Path, session_id: Option<&str>) -> Result<(), StoreError> {
        (**self).ensure_created(path, session_id)
    }
    fn leaf_version(&self, path: &Path) -> Result<(Option<String>, u64), StoreError> {
        (**self).leaf_version(path)
    }
    fn peek_leaf_version(&self, path: &Path) -> Option<(Option<String>, u64)> {
        (**self).peek_leaf_version(path)
    }
    fn known_unkeyed(&self, path: &Path, keys: &[&str]) -> bool {
        (**self).known_unkeyed(path, keys)
    }
    fn peek_index_stamp(&self, path: &Path) -> Option<Option<IndexStamp>> {
        (**self).peek_index_stamp(path)
    }
    fn end(&self, path: &Path) -> Result<Option<Pos>, StoreError> {
        (**self).end(path)
    }
    fn read_session(&self, path: &Path) -> Result<Option<Session>, StoreError> {
        (**self).read_session(path)
    }
    fn read_bytes(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).read_bytes(path, max_bytes)
    }
    fn read_tail(&self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).read_tail(path, max_bytes)
    }
    fn history(&self, path: &Path, opts: HistoryOptions) -> Result<History, StoreError> {
        (**self).history(path, opts)
    }
    fn find_keyed(&self, path: &Path, key: &str) -> Result<Option<(Value, Pos)>, StoreError> {
        (**self).find_keyed(path, key)
    }
    fn entries_at(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<(Vec<(Pos, Value)>, bool), StoreError> {
        (**self).entries_at(path, pos, max_bytes)
    }
    fn entries_before(&self, path: &Path, pos: Pos, max_bytes: u64) -> Result<Vec<(Pos, Value)>, StoreError> {
        (**self).entries_before(path, pos, max_bytes)
    }
    fn lock(&self, path: &Path) -> Result<Held, StoreError> {
        (**self).lock(path)
    }
    fn lock_for_append(self: std::sync::Arc<Self>, path: PathBuf) -> StoreFuture<Held> {
        T::lock_for_append(std::sync::Arc::clone(&*self), path)
    }

    fn append_held(
        self: std::sync::Arc<Self>,
        held: Held,
        path: PathBuf,
        entries: Vec<NewEntry>,
        session_id: Option<String>,
        after: AfterCommit,
    ) -> StoreFuture<Vec<Appended>> {
        T::append_held(std::sync::Arc::clone(&*self), held, path, entries, session_id, after)
    }
    fn trim(&self, path: &Path, max_lines: usize) -> Result<Trimmed, StoreError> {
        (**self).trim(path, max_lines)
    }
    fn forget(&self, path: &Path) {
        (**self).forget(path)
    }
    fn close(&self) {
        (**self).close()
    }
    fn index_stamp(&self, path: &Path) -> Option<IndexStamp> {
        (**self).index_stamp(path)
    }
    fn read_index(&self, path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).read_index(path)
    }
    fn write_index(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        (**self).write_index(path, bytes)
    }
    fn agents(&self, state_dir: &Path) -> Vec<String> {
        (**self).agents(state_dir)
    }
    fn archive_transcript(&self, path: &Path, reason: &str) -> Result<Option<PathBuf>, StoreError> {
        (**self).archive_transcript(path, reason)
    }
    fn import_transcript(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        (**self).import_transcript(path, bytes)
    }
    fn set_aside(&self, dir: &Path) -> Vec<(PathBuf, Option<u64>)> {
        (**self).set_aside(dir)
    }
}
