//! The connections searches run on, for a process that searches while it indexes (the gateway):
//! each running search has a connection of its own ([`Readers::take`] hands out an idle one or
//! opens one), so a slow query never makes another wait; a few stay open between searches. At
//! most [`MAX_OPEN`] are out at once (each holds a page cache): a search beyond waits for one,
//! which the time limit frees within seconds, and is refused if none comes.
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
/// Most searches running at once.
pub const MAX_OPEN: usize = 8;
/// How often the watchdog looks at the running queries' deadlines.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The idle connections and how many are out.
#[derive(Default)]
struct Slots {
    idle: Vec<Index>,
    out: usize,
}

pub(crate) struct Shared {
    state_dir: PathBuf,
    slots: Mutex<Slots>,
    /// Signalled when a connection comes back.
    freed: Condvar,
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
        let mut slots = pincer_pi::lock(&self.shared.slots);
        slots.out -= 1;
        if let Some(index) = self.index.take() {
            if !self.shared.closed.load(Ordering::Relaxed) && slots.idle.len() < MAX_IDLE {
                slots.idle.push(index);
            }
        }
        self.shared.freed.notify_one();
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
            slots: Mutex::new(Slots::default()),
            freed: Condvar::new(),
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

    /// A connection for one search: an idle one, or a new one; when [`MAX_OPEN`] are out, waits
    /// up to [`crate::QUERY_TIME_LIMIT`] for one to come back.
    pub fn take(&self) -> Result<Reader<'_>> {
        let until = Instant::now() + crate::QUERY_TIME_LIMIT;
        let mut slots = pincer_pi::lock(&self.shared.slots);
        loop {
            if self.shared.closed.load(Ordering::Relaxed) {
                return Err(SearchError(crate::STOPPED.into()));
            }
            if let Some(index) = slots.idle.pop() {
                slots.out += 1;
                return Ok(Reader { shared: &self.shared, index: Some(index) });
            }
            if slots.out < MAX_OPEN {
                slots.out += 1;
                drop(slots);
                let weak = Some(Arc::downgrade(&self.shared));
                // Counted out from here: dropping the reader gives the slot back, opened or not.
                let mut reader = Reader { shared: &self.shared, index: None };
                reader.index = Some(Index::open_in(&self.shared.state_dir, self.shared.closed.clone(), weak)?);
                return Ok(reader);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SearchError(format!(
                    "{MAX_OPEN} searches are running (the most at once); try again in a moment"
                )));
            }
            slots = self.shared.freed.wait_timeout(slots, left).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Stops every running query (each ends with an error saying so) and refuses new ones.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        pincer_pi::lock(&self.shared.slots).idle.clear();
        self.shared.freed.notify_all();
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
