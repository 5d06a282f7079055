//! Pincer's transcript store: Pi v3 session files as a `parentId` tree.
//!
//! This crate is the only code in Pincer that writes a transcript. Everything else asks it to append
//! an entry and gets back the entry as written (id, parentId, timestamp), so disk and live events can
//! never disagree.
//!
//! Layout:
//! - [`parse`]: line scanning and the light per-line parse (type/id/parentId) used for indexing.
//! - [`session`]: a whole file read and indexed as Pi reads it, with in-memory v1/v2 migration and a
//!   list of the problems found; never modifies the file.
//! - [`mapped`]: a session's bytes, owned or (for the CLI's read-only commands) a read-only map.
//! - [`context`]: Pi's `buildSessionContext` over the active branch.
//! - [`ids`]: ids and timestamps.
//! - [`history`]: `chat.history` from a bounded tail read.
//! - [`store`]: the append path (FIFO per file, group commit, lock file, O(1) in the file size).
//! - `lock` (private): OpenClaw's lock-file protocol with proof-of-death recovery.
//! - `rewrite` (private): atomic replacement with backup, and cutting a torn tail.
//! - [`verify`]: `verify` (and `repair`, offered as [`Store::repair`]).
//! - [`trim`]: `sessions.compact {maxLines}` (offered as [`Store::trim`]): keep the last lines.
//! - [`files`]: the typed file operations offered to other crates (state dir, session index,
//!   token file, archives), over the private `fsutil`.
//! - [`redact`]: secret redaction before anything is written.
//! - [`backend`]: the store seam, [`Transcripts`], that other crates use (this JSONL store is one
//!   implementation of it).

// The modules that write files are private: other crates write only through `Store` and
// `files` (and clippy forbids them the std writers, see the workspace's clippy.toml).
pub mod backend;
pub mod context;
pub mod files;
mod fsutil;
pub mod history;
pub mod ids;
pub mod lanes;
mod lock;
pub mod mapped;
pub mod parse;
pub mod redact;
mod rewrite;
pub mod session;
pub mod store;
pub mod trim;
pub mod verify;

pub use backend::{AfterCommit, Held, IndexStamp, Pos, StoreFuture, Transcripts, TranscriptsExt};
pub use lock::{LockError, LockGuard, LockOptions};
pub use store::{redact_entry, valid_session_id, Appended, NewEntry, ParentChoice, Store, StoreOptions};

pub use context::{build_context, Context};
pub use session::{Kind, Leaf, Problem, Session};

use serde_json::Value;

/// Which leaf to build a context at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeafArg {
    /// The file's own leaf.
    Default,
    /// Before the first entry (`resetLeaf`).
    Null,
    /// A given entry id (`branch(id)`).
    Id(String),
}

impl LeafArg {
    /// `"null"` → [`LeafArg::Null`], anything else an id.
    pub fn parse(s: &str) -> LeafArg {
        if s == "null" {
            LeafArg::Null
        } else {
            LeafArg::Id(s.to_owned())
        }
    }
}

/// `pincer transcript context` output: `{sessionId, leafId, entries, context}` (the same values as
/// Pi's oracle prints), plus `warnings` when Pincer had to work around something Pi cannot read.
pub struct ContextReport<'a> {
    pub session_id: Option<String>,
    pub leaf_id: Value,
    pub entries: usize,
    pub context: Context<'a>,
    pub warnings: Vec<String>,
}

impl ContextReport<'_> {
    /// As a `Value` (decodes every message: for tests and small files).
    pub fn to_value(&self) -> Value {
        let mut v = serde_json::json!({
            "sessionId": self.session_id,
            "leafId": self.leaf_id,
            "entries": self.entries,
            "context": self.context.to_json(),
        });
        if !self.warnings.is_empty() {
            v["warnings"] = serde_json::json!(self.warnings);
        }
        v
    }

    /// Writes the report as one line of JSON, messages exactly as they are in the file.
    pub fn write_json(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        write!(
            out,
            "{{\"sessionId\":{},\"leafId\":{},\"entries\":{},\"context\":",
            serde_json::json!(self.session_id),
            self.leaf_id,
            self.entries
        )?;
        self.context.write_json(out)?;
        if !self.warnings.is_empty() {
            write!(out, ",\"warnings\":{}", serde_json::json!(self.warnings))?;
        }
        out.write_all(b"}\n")
    }
}

/// Builds the [`ContextReport`] of a session at a leaf.
pub fn context_report<'a>(s: &'a Session, leaf: &LeafArg) -> Result<ContextReport<'a>, StoreError> {
    let leaf = match leaf {
        LeafArg::Default => s.leaf.clone(),
        LeafArg::Null => Leaf::Null,
        LeafArg::Id(id) => match s.by_id.get(id.as_str()) {
            Some(&i) => Leaf::Entry(i),
            None => return Err(StoreError::UnknownEntry(id.clone())),
        },
    };
    let ctx = build_context(s, &leaf);
    let leaf_id = match &leaf {
        Leaf::Entry(i) => s.entries[*i].id.as_deref().map(parse::key_to_value).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let mut warnings = Vec::new();
    if ctx.cycle {
        warnings.push("a parent cycle is reachable from the leaf; the path was cut where it repeats".to_string());
    }
    for p in &s.problems {
        match p {
            Problem::NoHeader { reason, .. } => warnings.push(format!(
                "no valid session header ({reason}): read as an empty session, as Pi does; `pincer transcript repair` can add one"
            )),
            Problem::NullLine { offset } => {
                warnings.push(format!("a `null` line at byte {offset} was skipped (Pi cannot open this file)"))
            }
            _ => {}
        }
    }
    Ok(ContextReport {
        session_id: s.session_id().map(str::to_owned),
        leaf_id,
        entries: s.entries.len(),
        context: ctx,
        warnings,
    })
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("Entry {0} not found")]
    UnknownEntry(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(transparent)]
    Lock(lock::LockError),
    #[error("{0}: the file has entries but no valid session header; run `pincer transcript repair` on it first")]
    NoHeader(String),
    #[error("invalid entry: {0}")]
    InvalidEntry(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The transcript was moved aside (its session reset or deleted) before the write could be
    /// made: nothing was written, and no file was created under its old name.
    #[error("{0} was moved aside (its session was reset or deleted); nothing was written")]
    MovedAside(String),
    /// An append made only at a given leaf found the transcript's leaf elsewhere: nothing was
    /// written.
    #[error("the transcript's leaf moved ({expected:?} → {now:?}); nothing was written")]
    LeafMoved { expected: Option<String>, now: Option<String> },
}

/// A lock file that cannot be created is an I/O error like any other (a full disk, no write
/// permission on the directory): it keeps its kind.
impl From<lock::LockError> for StoreError {
    fn from(e: lock::LockError) -> StoreError {
        match e {
            lock::LockError::Io { path, source } => StoreError::Io { path, source },
            e => StoreError::Lock(e),
        }
    }
}

impl StoreError {
    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> StoreError {
        StoreError::Io { path: path.display().to_string(), source }
    }

    /// A copy for each waiter of a failed group commit (io errors keep their kind and message).
    pub fn duplicate(&self) -> StoreError {
        match self {
            StoreError::UnknownEntry(s) => StoreError::UnknownEntry(s.clone()),
            StoreError::Io { path, source } | StoreError::Lock(lock::LockError::Io { path, source }) => {
                StoreError::Io { path: path.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
            StoreError::Lock(lock::LockError::Timeout { timeout_ms, pid, alive, age_ms, path }) => {
                StoreError::Lock(lock::LockError::Timeout {
                    timeout_ms: *timeout_ms,
                    pid: pid.clone(),
                    alive: *alive,
                    age_ms: *age_ms,
                    path: path.clone(),
                })
            }
            StoreError::NoHeader(s) => StoreError::NoHeader(s.clone()),
            StoreError::InvalidEntry(s) => StoreError::InvalidEntry(s.clone()),
            StoreError::Internal(s) => StoreError::Internal(s.clone()),
            StoreError::MovedAside(s) => StoreError::MovedAside(s.clone()),
            StoreError::LeafMoved { expected, now } => {
                StoreError::LeafMoved { expected: expected.clone(), now: now.clone() }
            }
        }
    }
}
