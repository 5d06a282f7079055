//! The index kept up to date beside a running gateway: one thread owns the database, takes the
//! paths the store reports after each durable commit (reporting one never blocks an append: it
//! joins a set, and only the first path of a gathering wakes the thread) and indexes what was
//! appended, the paths of [`GATHER`] together in one commit.
//! At start it syncs every transcript, so what a crash left out is indexed again, and again every
//! [`FULL_SYNC`] when idle (transcripts written by other processes, such as `pincer transcript
//! append` or `import`); [`Indexer::flush`] waits until everything sent is indexed.

use crate::{Index, Result, SearchError};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};

/// How often an idle indexer looks at every transcript.
pub const FULL_SYNC: std::time::Duration = std::time::Duration::from_secs(30);
/// How long appends are gathered before they are indexed together: each commit costs FTS5 a new
/// segment and its merges, so a gateway pays that once per gathering, not per turn; a slower one
/// (long sessions, a few hundred turns a second) gathers fewer rows in the same time, so the
/// gathering is long enough for it too. What waits is only a set of paths (the rows are read from
/// the transcripts), and a search waits for what is queued ([`Indexer::flush`]), so it never
/// misses a turn.
const GATHER: std::time::Duration = std::time::Duration::from_secs(3);

enum Job {
    /// Paths are waiting in [`Indexer::pending`].
    Wake,
    Flush(Sender<()>),
}

/// The background indexer of one state directory.
pub struct Indexer {
    tx: Mutex<Option<Sender<Job>>>,
    /// Paths appended to since the thread last took them.
    pending: Arc<Mutex<foldhash::HashSet<PathBuf>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Indexer {
    /// Opens the index and starts its thread (which first syncs every transcript).
    pub fn start(state_dir: &Path) -> Result<Arc<Indexer>> {
        let mut index = Index::open(state_dir)?;
        let (tx, rx) = channel::<Job>();
        let pending = Arc::new(Mutex::new(foldhash::HashSet::default()));
        let queued = pending.clone();
        let thread = std::thread::Builder::new()
            .name("pincer-search-index".into())
            .spawn(move || {
                if let Err(e) = index.sync_all() {
                    tracing_warn(&e);
                }
                loop {
                    let job = match rx.recv_timeout(FULL_SYNC) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => {
                            if let Err(e) = index.sync_all() {
                                tracing_warn(&e);
                            }
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    };
                    // Appends of a busy gateway are gathered for a moment (they do not wake the
                    // thread meanwhile) and indexed in one commit; a flush is answered at once.
                    let mut waiters = Vec::new();
                    let until = std::time::Instant::now() + GATHER;
                    let mut next = Some(job);
                    while let Some(j) = next.take() {
                        if let Job::Flush(w) = j {
                            waiters.push(w);
                        }
                        next = match rx.try_recv() {
                            Ok(j) => Some(j),
                            Err(_) if !waiters.is_empty() => None,
                            Err(_) => rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now())).ok(),
                        };
                    }
                    let files: Vec<PathBuf> = pincer_pi::lock(&queued).drain().collect();
                    match index.sync_files(&files) {
                        Ok((_, errors)) => errors.iter().for_each(tracing_warn),
                        Err(e) => tracing_warn(&e),
                    }
                    for w in waiters {
                        let _ = w.send(());
                    }
                }
            })
            .map_err(|e| SearchError(format!("cannot start the search indexer: {e}")))?;
        Ok(Arc::new(Indexer { tx: Mutex::new(Some(tx)), pending, thread: Mutex::new(Some(thread)) }))
    }

    /// Queues `path` to be indexed (never blocks on the indexer; wakes it only when nothing was
    /// queued yet).
    pub fn notify(&self, path: &Path) {
        let first = {
            let mut pending = pincer_pi::lock(&self.pending);
            let first = pending.is_empty();
            if !pending.contains(path) {
                pending.insert(path.to_path_buf());
            }
            first
        };
        if first {
            if let Some(tx) = pincer_pi::lock(&self.tx).as_ref() {
                let _ = tx.send(Job::Wake);
            }
        }
    }

    /// The store observer that feeds this indexer.
    pub fn observer(self: &Arc<Self>) -> pincer_store::store::AppendObserver {
        let me = Arc::downgrade(self);
        Arc::new(move |p: &Path| {
            if let Some(i) = me.upgrade() {
                i.notify(p);
            }
        })
    }

    /// Waits until everything queued so far is indexed.
    pub fn flush(&self) {
        self.flush_within(None);
    }

    /// [`Indexer::flush`] for at most `patience`; false when the indexer is still busy then (the
    /// first sync of a large state directory).
    pub fn flush_within(&self, patience: Option<std::time::Duration>) -> bool {
        let (tx, rx) = channel();
        let sent = pincer_pi::lock(&self.tx).as_ref().is_some_and(|t| t.send(Job::Flush(tx)).is_ok());
        if !sent {
            return true;
        }
        match patience {
            None => rx.recv().is_ok(),
            Some(d) => rx.recv_timeout(d).is_ok(),
        }
    }

    /// Indexes what is queued and stops the thread.
    pub fn stop(&self) {
        pincer_pi::lock(&self.tx).take();
        if let Some(t) = pincer_pi::lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

fn tracing_warn(e: &SearchError) {
    tracing::warn!("{e} (`pincer sessions reindex` rebuilds the search index)");
}
