//! The connections searches run on, for a process that searches while it indexes (the gateway):
//! each running search has a connection of its own ([`Readers::take`] hands out an idle one or
//! opens one), so a slow query never makes another wait; a few stay open between searches.
//!
//! A query stops at its deadline ([`crate::QUERY_TIME_LIMIT`]): SQLite's progress handler looks at
//! it between steps, and a watchdog thread interrupts a connection past its deadline while FTS5
//! works inside one step (merging the lists of a prefix). [`Readers::close`] (at shutdown) stops
//! every running query at once and refuses new ones.

use crate::{Index, Result, SearchError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Connections kept open between searches.
const MAX_IDLE: usize = 4;
/// How often the watchdog looks at the running queries' deadlines.
const WATCH_EVERY: Duration = Duration::from_millis(50);

pub(crate) struct Shared {
    state_dir: PathBuf,
    idle: Mutex<Vec<Index>>,
    closed: Arc<AtomicBool>,
    /// Running queries: their deadline and how to interrupt their connection.
    running: Mutex<HashMap<u64, (Instant, rusqlite::InterruptHandle)>>,
    wake: Condvar,
    next: AtomicU64,
}

/// The pool of search connections of one state directory.
pub struct Readers {
    shared: Arc<Shared>,
}

/// A connection taken from [`Readers`] for one search; it goes back when dropped.
pub struct Reader<'a> {
    shared: &'a Shared,
    index: Option<Index>,
}

impl std::ops::Deref for Reader<'_> {
    type Target = Index;
    fn deref(&self) -> &Index {
        // Set from `take` until drop.
        self.index.as_ref().unwrap_or_else(|| unreachable!("a reader holds its index until dropped"))
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if let Some(index) = self.index.take() {
            let mut idle = pincer_pi::lock(&self.shared.idle);
            if !self.shared.closed.load(Ordering::Relaxed) && idle.len() < MAX_IDLE {
                idle.push(index);
            }
        }
    }
}

/// A running query, watched until dropped.
pub(crate) struct Watched {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Removed under the lock the watchdog interrupts under: it never interrupts the next query.
        pincer_pi::lock(&self.shared.running).remove(&self.id);
    }
}

impl Shared {
    /// Watches a query that must stop at `deadline`, until the returned guard is dropped.
    pub(crate) fn watch(self: &Arc<Shared>, deadline: Instant, handle: rusqlite::InterruptHandle) -> Watched {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        pincer_pi::lock(&self.running).insert(id, (deadline, handle));
        self.wake.notify_all();
        Watched { shared: self.clone(), id }
    }
}

impl Readers {
    /// A pool for the index of `state_dir` (connections are opened when searches need them) and
    /// its watchdog thread.
    pub fn new(state_dir: &Path) -> Result<Readers> {
        let shared = Arc::new(Shared {
            state_dir: state_dir.to_path_buf(),
            idle: Mutex::new(Vec::new()),
            closed: Arc::new(AtomicBool::new(false)),
            running: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
            next: AtomicU64::new(0),
        });
        let watched = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("pincer-search-watchdog".into())
            .spawn(move || watchdog(&watched))
            .map_err(|e| SearchError(format!("cannot start the search watchdog: {e}")))?;
        Ok(Readers { shared })
    }

    /// A connection for one search: an idle one, or a new one.
    pub fn take(&self) -> Result<Reader<'_>> {
        if self.shared.closed.load(Ordering::Relaxed) {
            return Err(SearchError("search stopped: the gateway is shutting down".into()));
        }
        let idle = pincer_pi::lock(&self.shared.idle).pop();
        let index = match idle {
            Some(i) => i,
            None => {
                Index::open_in(&self.shared.state_dir, self.shared.closed.clone(), Some(Arc::downgrade(&self.shared)))?
            }
        };
        Ok(Reader { shared: &self.shared, index: Some(index) })
    }

    /// Stops every running query (each ends with an error saying so) and refuses new ones.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        pincer_pi::lock(&self.shared.idle).clear();
        for (_, handle) in pincer_pi::lock(&self.shared.running).values() {
            handle.interrupt();
        }
        self.shared.wake.notify_all();
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.close();
    }
}

/// Interrupts the connections whose query is past its deadline, until the pool is gone or closed.
fn watchdog(shared: &std::sync::Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        let running = pincer_pi::lock(&s.running);
        if s.closed.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        for (deadline, handle) in running.values() {
            if *deadline <= now {
                handle.interrupt();
            }
        }
        // Sleeps while nothing runs (woken when a query starts), else looks again shortly.
        let wait = if running.is_empty() { Duration::from_secs(3600) } else { WATCH_EVERY };
        drop(s.wake.wait_timeout(running, wait));
    }
}
