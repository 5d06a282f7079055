//! Pincer's full-text index of session messages: SQLite FTS5 in `<state>/search/messages.sqlite`
//! (0600, as are the journal files SQLite creates beside it), one row per user or assistant
//! message (its text blocks), keyed by transcript and entry id.
//!
//! The index is derived data, never a transcript: it follows the files. For each transcript it
//! records how many bytes were indexed and the file's identity; [`Index::sync_file`] reads only the
//! whole lines appended since (a replaced or shortened file is indexed again from the start), so
//! it can be called after every append ([`Indexer`] does it on its own thread, off the append
//! path), at start-up over every file ([`Index::sync_all`]: what a crash left out is indexed
//! then), or from scratch ([`Index::rebuild`], `pincer sessions reindex`).
//!
//! Queries ([`fts_query`], from [`text::parse_query`]: the same language as the PostgreSQL store's
//! search) are words (all must match, diacritics ignored), `"quoted phrases"`, and
//! `prefix*` on a word or a phrase; nothing a user types can reach FTS5's own syntax.
//!
//! What one query may cost is bounded: at most [`text::MAX_QUERY_WORDS`] words, a `prefix*` that
//! FTS5 expands word by word (not 2 or 3 letters long: those have a prefix index) may stand for at
//! most [`MAX_PREFIX_WORDS`] indexed words, and a query stops at its time limit
//! ([`QUERY_TIME_LIMIT`]) or when its [`Readers`] pool is closed. The gateway searches through
//! [`Readers`], one connection per running search, so no search waits for another.

mod indexer;
mod readers;
pub mod text;

pub use indexer::Indexer;
pub use readers::{Reader, Readers, MAX_OPEN};
pub use text::{parse_query, Term};

use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The error of a search stopped (or refused) because its [`Readers`] pool was closed.
pub const STOPPED: &str = "search stopped: the gateway is shutting down";
/// How long one query may run before it is stopped with an error.
pub const QUERY_TIME_LIMIT: Duration = Duration::from_secs(5);
/// Most indexed words one `prefix*` may stand for when FTS5 expands it word by word (a prefix of
/// 1 or of 4 and more letters): each is one more list to merge (8 × `m*` over 20,000 words took
/// 2.7 s).
pub const MAX_PREFIX_WORDS: usize = 500;
/// Prefix lengths (in characters) FTS5 keeps a prefix index for (`prefix = '2 3'` below): such a
/// prefix is one list, whatever it expands to.
const INDEXED_PREFIXES: [usize; 2] = [2, 3];
/// SQLite virtual machine steps between two looks at a query's deadline.
const PROGRESS_STEPS: i32 = 1000;

/// Files indexed in one transaction by [`Index::sync_all`].
const SYNC_BATCH: usize = 256;

/// The index database under a state directory.
pub fn db_path(state_dir: &Path) -> PathBuf {
    state_dir.join("search").join("messages.sqlite")
}

/// Errors of the index.
#[derive(Debug)]
pub struct SearchError(pub String);

impl std::fmt::Display for SearchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SearchError {}

/// What a query SQLite interrupted fails with, before [`Index::search`] says why it was stopped.
const INTERRUPTED: &str = "search index: interrupted";

impl From<rusqlite::Error> for SearchError {
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted) {
            return SearchError(INTERRUPTED.into());
        }
        SearchError(format!("search index: {e}"))
    }
}

type Result<T> = std::result::Result<T, SearchError>;

/// Bits of a row id that number the messages of one file (the rest is the file's id), so all
/// rows of a file are one rowid range and can be dropped without scanning the index.
const SEQ_BITS: u32 = 32;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files(
  id INTEGER PRIMARY KEY,
  path TEXT NOT NULL UNIQUE,
  dev INTEGER NOT NULL,
  ino INTEGER NOT NULL,
  indexed INTEGER NOT NULL,
  next_seq INTEGER NOT NULL,
  title TEXT
);
CREATE VIRTUAL TABLE IF NOT EXISTS messages USING fts5(
  text, entry UNINDEXED, role UNINDEXED, ts UNINDEXED,
  tokenize = 'unicode61 remove_diacritics 2', prefix = '2 3'
);
";

/// One hit.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    /// The transcript, relative to the state directory.
    pub file: String,
    pub entry_id: String,
    pub role: String,
    /// The message's time (ms since the epoch; 0 when unknown).
    pub timestamp: i64,
    /// The matching part of the text, words around it.
    pub snippet: String,
    /// BM25 relevance (higher is better).
    pub score: f64,
}

/// When the query running on a connection must stop: its deadline, and the flag of the pool it
/// belongs to (set when the pool closes). Looked at by SQLite's progress handler every
/// [`PROGRESS_STEPS`] steps; [`Readers`] also interrupts a connection whose query is past its
/// deadline while FTS5 works inside one step.
struct Guard {
    deadline: Mutex<Option<Instant>>,
    closed: Arc<AtomicBool>,
}

impl Guard {
    fn expired(&self) -> bool {
        self.closed.load(Ordering::Relaxed) || pincer_pi::lock(&self.deadline).is_some_and(|d| Instant::now() >= d)
    }
}

/// The index, open for reading and writing.
pub struct Index {
    conn: Connection,
    state_dir: PathBuf,
    guard: Arc<Guard>,
    time_limit: Duration,
    /// The pool whose watchdog interrupts this connection's queries at their deadline.
    pool: Option<Weak<readers::Shared>>,
}

/// What a sync did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub files: usize,
    pub messages: usize,
}

/// `path` relative to the state directory, when it is a transcript of it.
fn relative(state_dir: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(state_dir).ok()?;
    let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    match parts.as_slice() {
        ["agents", _, "sessions", name] if name.ends_with(".jsonl") => Some(parts.join("/")),
        _ => None,
    }
}

/// What was appended to the transcript `path` (`rel` in the index) since it was last indexed,
/// indexed inside `tx`.
fn index_file(tx: &Connection, path: &Path, rel: &str) -> Result<usize> {
    let row: Option<(i64, i64, i64, i64, i64)> = tx
        .query_row("SELECT id, dev, ino, indexed, next_seq FROM files WHERE path = ?1", [&rel], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?;
    let from = row.map_or(0, |r| r.3 as u64);
    let read =
        pincer_store::files::read_appended(path, from).map_err(|e| SearchError(format!("{}: {e}", path.display())))?;
    let Some(mut lines) = read else {
        if let Some((id, ..)) = row {
            drop_rows(tx, id)?;
            tx.execute("DELETE FROM files WHERE id = ?1", [id])?;
        }
        return Ok(0);
    };
    let ident = (lines.ident.0 as i64, lines.ident.1 as i64);
    let (id, mut seq) = match row {
        Some((id, dev, ino, indexed, seq)) if (dev, ino) == ident && lines.len >= indexed as u64 => {
            if lines.bytes.is_empty() {
                return Ok(0);
            }
            (id, seq)
        }
        Some((id, ..)) => {
            // Replaced (repair, a reset that reused the name) or cut: index it again.
            drop_rows(tx, id)?;
            tx.execute("UPDATE files SET indexed = 0, next_seq = 0, title = NULL WHERE id = ?1", [id])?;
            if from > 0 {
                lines = pincer_store::files::read_appended(path, 0)
                    .map_err(|e| SearchError(format!("{}: {e}", path.display())))?
                    .unwrap_or(lines);
            }
            (id, 0)
        }
        None => {
            tx.execute(
                "INSERT INTO files(path, dev, ino, indexed, next_seq) VALUES (?1, ?2, ?3, 0, 0)",
                params![rel, ident.0, ident.1],
            )?;
            (tx.last_insert_rowid(), 0)
        }
    };
    let mut title: Option<String> =
        tx.query_row("SELECT title FROM files WHERE id = ?1", [id], |r| r.get::<_, Option<String>>(0))?;
    let mut added = 0;
    {
        let mut insert =
            tx.prepare_cached("INSERT INTO messages(rowid, text, entry, role, ts) VALUES (?1, ?2, ?3, ?4, ?5)")?;
        for line in lines.bytes.split(|&b| b == b'\n') {
            let Some(found) = text::line_message(line) else { continue };
            if title.is_none() && found.role == "user" {
                title = Some(text::title_of(&found.text));
            }
            insert.execute(params![(id << SEQ_BITS) | seq, found.text, found.entry_id, found.role, found.timestamp])?;
            seq += 1;
            added += 1;
        }
    }
    tx.execute(
        "UPDATE files SET dev = ?2, ino = ?3, indexed = ?4, next_seq = ?5, title = ?6 WHERE id = ?1",
        params![id, ident.0, ident.1, lines.end as i64, seq, title],
    )?;
    Ok(added)
}

impl Index {
    /// Opens (creating it, 0600, if needed) the index of a state directory.
    pub fn open(state_dir: &Path) -> Result<Index> {
        Index::open_in(state_dir, Arc::new(AtomicBool::new(false)), None)
    }

    /// [`Index::open`] for a pool whose queries stop when `closed` is set, and whose watchdog
    /// interrupts them at their deadline.
    fn open_in(state_dir: &Path, closed: Arc<AtomicBool>, pool: Option<Weak<readers::Shared>>) -> Result<Index> {
        let path = db_path(state_dir);
        pincer_store::files::create_private_file(&path)
            .map_err(|e| SearchError(format!("{}: cannot create the search index: {e}", path.display())))?;
        let conn = Connection::open(&path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(SCHEMA)?;
        // The words of the index, for counting what a prefix expands to (this connection's own).
        conn.execute_batch("CREATE VIRTUAL TABLE IF NOT EXISTS temp.words USING fts5vocab(main, messages, row);")?;
        let guard = Arc::new(Guard { deadline: Mutex::new(None), closed });
        let watched = guard.clone();
        conn.progress_handler(PROGRESS_STEPS, Some(move || watched.expired()));
        let state_dir = state_dir.canonicalize().unwrap_or_else(|_| state_dir.to_path_buf());
        Ok(Index { conn, state_dir, guard, time_limit: QUERY_TIME_LIMIT, pool })
    }

    /// Sets how long a query may run ([`QUERY_TIME_LIMIT`] by default).
    pub fn set_time_limit(&mut self, limit: Duration) {
        self.time_limit = limit;
    }

    /// The transcripts of the state directory: `agents/<agent>/sessions/*.jsonl`.
    pub fn transcripts(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for agent in std::fs::read_dir(self.state_dir.join("agents")).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(agent.path().join("sessions")).into_iter().flatten().flatten() {
                let p = f.path();
                if p.extension().is_some_and(|e| e == "jsonl") && f.file_type().is_ok_and(|t| t.is_file()) {
                    out.push(p);
                }
            }
        }
        out.sort();
        out
    }

    /// Indexes what was appended to `path` since it was last indexed (everything, when the file is
    /// new to the index or was replaced); drops its rows when it is gone. Paths that are not
    /// transcripts of this state directory are ignored.
    pub fn sync_file(&mut self, path: &Path) -> Result<usize> {
        let (added, mut errors) = self.sync_files(std::slice::from_ref(&path.to_path_buf()))?;
        match errors.pop() {
            Some(e) => Err(e),
            None => Ok(added),
        }
    }

    /// [`Index::sync_file`] for several files in one transaction (one commit, however many files
    /// a busy gateway appended to). FTS5 writes a new segment at every savepoint, so the files go
    /// in together, without savepoints; only when one fails is the transaction rolled back and
    /// done again with each file in a savepoint of its own, so that the failing file (returned
    /// with the others' count) leaves the rest indexed.
    pub fn sync_files(&mut self, paths: &[PathBuf]) -> Result<(usize, Vec<SearchError>)> {
        let state_dir = self.state_dir.clone();
        let files: Vec<(&PathBuf, String)> =
            paths.iter().filter_map(|p| relative(&state_dir, p).map(|rel| (p, rel))).collect();
        {
            let tx = self.conn.transaction()?;
            let mut added = 0;
            let all = files.iter().try_for_each(|(path, rel)| index_file(&tx, path, rel).map(|n| added += n));
            if all.is_ok() {
                tx.commit()?;
                return Ok((added, Vec::new()));
            }
            // Dropping the transaction rolls it back.
        }
        let mut tx = self.conn.transaction()?;
        let (mut added, mut errors) = (0, Vec::new());
        for (path, rel) in &files {
            let mut sp = tx.savepoint()?;
            match index_file(&sp, path, rel) {
                Ok(n) => {
                    sp.commit()?;
                    added += n;
                }
                Err(e) => {
                    sp.rollback()?;
                    errors.push(e);
                }
            }
        }
        tx.commit()?;
        Ok((added, errors))
    }

    /// Brings the index up to date with every transcript of the state directory (and forgets
    /// files that are gone).
    pub fn sync_all(&mut self) -> Result<Synced> {
        let files = self.transcripts();
        let known: Vec<String> = {
            let mut st = self.conn.prepare("SELECT path FROM files")?;
            let rows = st.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect::<std::result::Result<_, _>>()?
        };
        let mut out = Synced::default();
        let gone: Vec<PathBuf> = known.iter().map(|rel| self.state_dir.join(rel)).filter(|p| !p.exists()).collect();
        for batch in files.chunks(SYNC_BATCH).chain(gone.chunks(SYNC_BATCH)) {
            let (added, mut errors) = self.sync_files(batch)?;
            if let Some(e) = errors.pop() {
                return Err(e);
            }
            out.messages += added;
        }
        out.files = files.len();
        Ok(out)
    }

    /// Drops everything and indexes every transcript again.
    pub fn rebuild(&mut self) -> Result<Synced> {
        self.conn.execute_batch(
            "DELETE FROM files; DELETE FROM messages; INSERT INTO messages(messages) VALUES('optimize');",
        )?;
        self.sync_all()
    }

    /// Title (the first user message, one line) of an indexed transcript.
    pub fn title(&self, file: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT title FROM files WHERE path = ?1", [file], |r| r.get::<_, Option<String>>(0))
            .optional()?
            .flatten())
    }

    /// The best `limit` hits of a query among the transcripts `files` (relative paths; `None`: all).
    ///
    /// Ranked by BM25 among the newest [`CANDIDATES`] matches: FTS5 walks a term's rows newest
    /// first and stops there, so a word found in half the messages costs no more than a rare one
    /// (for queries with fewer matches, which are what people look for, this is the full ranking).
    ///
    /// Refused with an error naming the limit: more than [`text::MAX_QUERY_WORDS`] words, a
    /// `prefix*` standing for more than [`MAX_PREFIX_WORDS`] indexed words; stopped with an error
    /// at the time limit or when the pool closes.
    pub fn search(&self, query: &str, files: Option<&[String]>, limit: usize) -> Result<Vec<Hit>> {
        let terms = parse_query(query);
        text::check_query_size(&terms).map_err(SearchError)?;
        let Some(q) = fts_terms(&terms) else {
            return Err(SearchError(format!("query {query:?} has no words to search for")));
        };
        let deadline = Instant::now() + self.time_limit;
        *pincer_pi::lock(&self.guard.deadline) = Some(deadline);
        let watched =
            self.pool.as_ref().and_then(Weak::upgrade).map(|p| p.watch(deadline, self.conn.get_interrupt_handle()));
        let found = self.check_prefixes(&terms).and_then(|()| self.run_query(&q, files, limit));
        drop(watched);
        *pincer_pi::lock(&self.guard.deadline) = None;
        found.map_err(|e| self.explain(e))
    }

    /// The error a stopped query gives, saying why it was stopped.
    fn explain(&self, e: SearchError) -> SearchError {
        if e.0 != INTERRUPTED {
            return e;
        }
        if self.guard.closed.load(Ordering::Relaxed) {
            return SearchError(STOPPED.into());
        }
        SearchError(format!(
            "search stopped at its time limit of {} ms; narrow the query (fewer words, more letters before a *)",
            self.time_limit.as_millis()
        ))
    }

    /// Refuses a `prefix*` that FTS5 would expand word by word into more than
    /// [`MAX_PREFIX_WORDS`] indexed words.
    fn check_prefixes(&self, terms: &[Term]) -> Result<()> {
        let mut count = self.conn.prepare_cached(
            "SELECT count(*) FROM (SELECT term FROM temp.words WHERE term >= ?1 AND term <= ?2 LIMIT ?3)",
        )?;
        for t in terms {
            let Some(word) = text::prefix_word(t) else { continue };
            if INDEXED_PREFIXES.contains(&word.chars().count()) {
                continue;
            }
            let n: i64 =
                count.query_row(params![word, format!("{word}\u{10FFFF}"), MAX_PREFIX_WORDS + 1], |r| r.get(0))?;
            if n as usize > MAX_PREFIX_WORDS {
                return Err(SearchError(format!(
                    "{}* stands for more than {MAX_PREFIX_WORDS} indexed words (the most one prefix may); type more of the word",
                    t.text
                )));
            }
        }
        Ok(())
    }

    /// The query itself (see [`Index::search`]).
    fn run_query(&self, q: &str, files: Option<&[String]>, limit: usize) -> Result<Vec<Hit>> {
        let known: Vec<(i64, String)> = {
            let mut st = self.conn.prepare_cached("SELECT id, path FROM files")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<std::result::Result<_, _>>()?
        };
        let filter = match files {
            None => String::new(),
            Some(fs) => {
                let visible: std::collections::HashSet<&str> = fs.iter().map(String::as_str).collect();
                let (shown, hidden): (Vec<_>, Vec<_>) = known.iter().partition(|(_, p)| visible.contains(p.as_str()));
                let list = |v: &[&(i64, String)]| v.iter().map(|(id, _)| id.to_string()).collect::<Vec<_>>().join(",");
                match (shown.is_empty(), hidden.is_empty()) {
                    (true, _) => return Ok(Vec::new()),
                    (false, true) => String::new(),
                    _ if hidden.len() <= shown.len() => {
                        format!(" AND (rowid >> {SEQ_BITS}) NOT IN ({})", list(&hidden))
                    }
                    _ => format!(" AND (rowid >> {SEQ_BITS}) IN ({})", list(&shown)),
                }
            }
        };
        let paths: std::collections::HashMap<i64, String> = known.into_iter().collect();
        let sql = format!(
            "SELECT rowid, entry, role, ts, bm25(messages) FROM messages
             WHERE messages MATCH ?1{filter} ORDER BY rowid DESC LIMIT {CANDIDATES}"
        );
        let mut st = self.conn.prepare_cached(&sql)?;
        let rows = st.query_map(params![q], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, f64>(4)?,
            ))
        })?;
        let mut found: Vec<(i64, String, String, i64, f64)> = rows.collect::<std::result::Result<_, _>>()?;
        // bm25() is lower for better matches; newer first among equals.
        found.sort_by(|a, b| a.4.total_cmp(&b.4).then(b.0.cmp(&a.0)));
        found.truncate(limit);
        let mut snip = self.conn.prepare_cached(
            "SELECT snippet(messages, 0, '', '', '…', 24) FROM messages WHERE messages MATCH ?1 AND rowid = ?2",
        )?;
        let mut out = Vec::with_capacity(found.len());
        for (rowid, entry_id, role, timestamp, rank) in found {
            let snippet = snip.query_row(params![q, rowid], |r| r.get::<_, String>(0)).optional()?.unwrap_or_default();
            out.push(Hit {
                file: paths.get(&(rowid >> SEQ_BITS)).cloned().unwrap_or_default(),
                entry_id,
                role,
                timestamp,
                snippet,
                score: -rank,
            });
        }
        Ok(out)
    }
}

/// How many of the newest matches a query ranks (see [`Index::search`]).
pub const CANDIDATES: usize = 500;

fn drop_rows(tx: &Connection, file_id: i64) -> Result<()> {
    tx.execute(
        "DELETE FROM messages WHERE rowid >= ?1 AND rowid < ?2",
        params![file_id << SEQ_BITS, (file_id + 1) << SEQ_BITS],
    )?;
    Ok(())
}

/// A user's query as an FTS5 query: every word and `"phrase"` of [`parse_query`] must match (each
/// quoted, so no FTS5 operator or column filter can be typed), `word*` and `"a phrase"*` match
/// prefixes. `None` when nothing searchable is left.
pub fn fts_query(input: &str) -> Option<String> {
    fts_terms(&parse_query(input))
}

/// [`fts_query`] of parsed terms.
fn fts_terms(terms: &[Term]) -> Option<String> {
    let terms: Vec<String> = terms
        .iter()
        .map(|t| {
            let quoted = format!("\"{}\"", t.text.replace('"', "\"\""));
            if t.prefix {
                format!("{quoted}*")
            } else {
                quoted
            }
        })
        .collect();
    (!terms.is_empty()).then(|| terms.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_cannot_reach_fts5_syntax() {
        assert_eq!(fts_query("lisbon museum").as_deref(), Some("\"lisbon\" \"museum\""));
        assert_eq!(fts_query("\"pena palace\" sin*").as_deref(), Some("\"pena palace\" \"sin\"*"));
        assert_eq!(fts_query("\"pena pal\"*").as_deref(), Some("\"pena pal\"*"));
        assert_eq!(fts_query("a\"b OR text:NEAR(").as_deref(), Some("\"a\" \"b OR text:NEAR(\""));
        assert_eq!(fts_query("  * \"\" -- ").as_deref(), None);
    }
}
