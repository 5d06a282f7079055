//! OpenClaw's `<file>.lock` protocol, so Pincer and OpenClaw processes never write one file at once.
//!
//! The lock file is created exclusively (`O_CREAT|O_EXCL`, mode 0600) with the body
//! `{"pid","createdAt","maxHoldMs","starttime"}` that OpenClaw writes and reads. While Pincer owns a
//! lock it also holds an exclusive `flock` on it: the kernel drops that the instant the process dies,
//! so a waiting Pincer proves the owner dead (flock obtainable *and* pid gone or recycled) and takes
//! the lock over at once, instead of waiting out OpenClaw's 30-minute stale timeout. Lock files of
//! live OpenClaw processes (which do not flock) are respected until the process is gone.
//!
//! Within one process the lock is re-entrant: a registry counts holders per path, so a holder that
//! appends again never deadlocks on its own lock. A released lock lingers for 500 ms
//! (still flocked, still ours) so a burst of commits does not create and unlink the lock file —
//! two metadata operations every fdatasync would otherwise have to journal — for each commit;
//! [`LockRegistry::release_idle`] ends the linger at once (a CLI command's exit, shutdown). At most
//! [`LockOptions::max_lingering`] released locks linger at a time (each holds a file descriptor);
//! the oldest is released when another would exceed that. The reaper thread that ends lingers is
//! owned by the registry: it stops (and lingering locks are released) when the last clone of the
//! registry is dropped.

use crate::ids::now_iso;
use pincer_pi::lock;
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long to wait for a lock and what to write into it.
#[derive(Clone, Debug)]
pub struct LockOptions {
    /// Give up after this long (OpenClaw's default: 60 s).
    pub acquire_timeout: Duration,
    /// Written into the lock body for OpenClaw's `hold-exceeded` report.
    pub max_hold: Duration,
    /// A lock file without a readable body is stale once it is this old (the creator died between
    /// creating and writing it).
    pub payload_grace: Duration,
    /// How long a released lock is kept for the next commit of this process.
    pub linger: Duration,
    /// Most released locks kept lingering at once (each keeps its lock file open).
    pub max_lingering: usize,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            acquire_timeout: Duration::from_secs(60),
            max_hold: Duration::from_secs(300),
            payload_grace: Duration::from_secs(2),
            linger: Duration::from_millis(500),
            max_lingering: 128,
        }
    }
}

/// Why acquiring failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("session file locked (timeout {timeout_ms}ms): pid={pid} alive={alive} ageMs={age_ms} {path}")]
    Timeout { timeout_ms: u128, pid: String, alive: bool, age_ms: u128, path: String },
    #[error("cannot create lock file {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// One lock file this process holds.
struct Held {
    count: usize,
    file: File,
    /// When the last guard was dropped (lingering), `None` while in use.
    idle_since: Option<Instant>,
    linger: Duration,
    max_lingering: usize,
}

/// The locks held, and whether the registry is gone (the reaper's signal to stop).
#[derive(Default)]
struct HeldState {
    locks: foldhash::HashMap<PathBuf, Held>,
    shutdown: bool,
    /// When the reaper wakes by itself next: `None` while it sleeps until woken (or has not
    /// started). A release wakes it only when its linger ends before that.
    reaper_wakes_at: Option<Instant>,
    /// Times the reaper went round its loop (woken or due).
    reaper_rounds: u64,
}

/// What the reaper thread shares with the registry.
#[derive(Default)]
struct Shared {
    held: Mutex<HeldState>,
    wake: Condvar,
}

/// The registry proper; dropped with its last [`LockRegistry`] clone (guards hold one).
#[derive(Default)]
struct Registry {
    shared: Arc<Shared>,
    reaper: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Registry {
    /// Stops the reaper (it releases whatever still lingers) and waits for it to end.
    fn drop(&mut self) {
        lock(&self.shared.held).shutdown = true;
        self.shared.wake.notify_all();
        let handle = match self.reaper.get_mut() {
            Ok(h) => h.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(h) = handle {
            let _ = h.join();
        }
        let mut held = lock(&self.shared.held);
        for (p, h) in std::mem::take(&mut held.locks) {
            release(&p, h);
        }
    }
}

/// Locks this process holds, by lock-file path. Cheap to clone; all clones share the locks.
#[derive(Default, Clone)]
pub struct LockRegistry {
    inner: Arc<Registry>,
}

/// Unlinks while still holding the flock, then closes (which releases it). While we hold the flock
/// and live, nobody judges the file stale, so it is still ours.
fn release(path: &Path, held: Held) {
    let _ = std::fs::remove_file(path);
    drop(held.file);
}

/// A held lock; dropping the last guard for a path removes the lock file.
pub struct LockGuard {
    registry: LockRegistry,
    path: PathBuf,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let shared = &self.registry.inner.shared;
        let mut held = lock(&shared.held);
        let Some(h) = held.locks.get_mut(&self.path) else { return };
        h.count -= 1;
        if h.count > 0 {
            return;
        }
        if h.linger.is_zero() || h.max_lingering == 0 {
            if let Some(h) = held.locks.remove(&self.path) {
                release(&self.path, h);
            }
            return;
        }
        let now = Instant::now();
        h.idle_since = Some(now);
        let (max_lingering, deadline) = (h.max_lingering, now + h.linger);
        let idle = held.locks.values().filter(|h| h.count == 0).count();
        if idle > max_lingering {
            release_oldest_idle(&mut held.locks, max_lingering);
        }
        let wake = held.reaper_wakes_at.is_none_or(|w| deadline < w);
        drop(held);
        self.registry.start_reaper();
        // A burst of commits to one transcript releases its lock each time: the reaper, already
        // due to wake by then, is not woken for each (a wake-up and a sleep per commit).
        if wake {
            shared.wake.notify_all();
        }
    }
}

/// Releases the longest-lingering locks until at most `keep` linger.
fn release_oldest_idle(locks: &mut foldhash::HashMap<PathBuf, Held>, keep: usize) {
    let mut idle: Vec<(Instant, PathBuf)> =
        locks.iter().filter(|(_, h)| h.count == 0).filter_map(|(p, h)| Some((h.idle_since?, p.clone()))).collect();
    if idle.len() <= keep {
        return;
    }
    idle.sort();
    let excess = idle.len() - keep;
    for (_, p) in idle.into_iter().take(excess) {
        if let Some(h) = locks.remove(&p) {
            release(&p, h);
        }
    }
}

/// `<file>.lock` beside a transcript.
pub fn lock_path_for(transcript: &Path) -> PathBuf {
    crate::fsutil::with_suffix(transcript, ".lock")
}

impl LockRegistry {
    /// Releases every lingering lock now.
    pub fn release_idle(&self) {
        release_oldest_idle(&mut lock(&self.inner.shared.held).locks, 0);
    }

    /// Lock files this process holds or keeps lingering (each is an open file descriptor).
    pub fn held_count(&self) -> usize {
        lock(&self.inner.shared.held).locks.len()
    }

    /// Starts, once, the thread that releases locks whose linger ran out. It sleeps while nothing
    /// lingers, holds no reference to the registry, and ends when the registry is dropped.
    fn start_reaper(&self) {
        let mut slot = lock(&self.inner.reaper);
        if slot.is_some() {
            return;
        }
        let shared = self.inner.shared.clone();
        *slot = std::thread::Builder::new().name("pincer-lock-reaper".into()).spawn(move || reap(&shared)).ok();
    }

    /// Takes the lock for `transcript`, waiting (with short, growing sleeps) while a live process holds it.
    pub fn acquire(&self, transcript: &Path, opts: &LockOptions) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let mut sleep = Duration::from_millis(1);
        loop {
            if let Some(guard) = self.try_acquire(transcript, opts, started)? {
                return Ok(guard);
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_millis(50));
        }
    }

    /// Takes the lock for `transcript` if no live process holds it (a stale lock file is removed
    /// first); `None` while one does. Past `opts.acquire_timeout` after `waiting_since` a live
    /// holder is an error: the caller has waited long enough.
    pub fn try_acquire(
        &self,
        transcript: &Path,
        opts: &LockOptions,
        waiting_since: Instant,
    ) -> Result<Option<LockGuard>, LockError> {
        let path = lock_path_for(transcript);
        loop {
            {
                let mut held = lock(&self.inner.shared.held);
                if let Some(h) = held.locks.get_mut(&path) {
                    h.count += 1;
                    h.idle_since = None;
                    return Ok(Some(LockGuard { registry: self.clone(), path }));
                }
                match create_lock(&path, opts) {
                    Ok(file) => {
                        let h = Held {
                            count: 1,
                            file,
                            idle_since: None,
                            linger: opts.linger,
                            max_lingering: opts.max_lingering,
                        };
                        held.locks.insert(path.clone(), h);
                        return Ok(Some(LockGuard { registry: self.clone(), path }));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(source) => return Err(LockError::Io { path: path.display().to_string(), source }),
                }
            }
            match inspect(&path, opts, self) {
                Holder::Gone | Holder::Stale => continue,
                Holder::Live { pid, age_ms } => {
                    if waiting_since.elapsed() >= opts.acquire_timeout {
                        return Err(LockError::Timeout {
                            timeout_ms: opts.acquire_timeout.as_millis(),
                            pid,
                            alive: true,
                            age_ms,
                            path: path.display().to_string(),
                        });
                    }
                    return Ok(None);
                }
            }
        }
    }

    fn holds(&self, path: &Path) -> bool {
        lock(&self.inner.shared.held).locks.contains_key(path)
    }
}

/// The reaper's loop: release expired lingers, sleep until the next expires or a lock is released.
fn reap(shared: &Shared) {
    let mut guard = lock(&shared.held);
    loop {
        if guard.shutdown {
            return;
        }
        let now = Instant::now();
        let expired: Vec<PathBuf> = guard
            .locks
            .iter()
            .filter(|(_, h)| h.count == 0 && h.idle_since.is_some_and(|t| now >= t + h.linger))
            .map(|(p, _)| p.clone())
            .collect();
        for p in expired {
            if let Some(h) = guard.locks.remove(&p) {
                release(&p, h);
            }
        }
        let next =
            guard.locks.values().filter(|h| h.count == 0).filter_map(|h| h.idle_since.map(|t| t + h.linger)).min();
        guard.reaper_wakes_at = next;
        guard.reaper_rounds += 1;
        guard = match next {
            Some(at) => match shared.wake.wait_timeout(guard, at.saturating_duration_since(Instant::now())) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            },
            None => match shared.wake.wait(guard) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            },
        };
    }
}

/// Creates the lock file exclusively and writes its body. If anything after the creation fails (a
/// full disk: the file exists but its body cannot be written), the file is removed again, so no
/// empty lock file is left behind for others to wait out.
fn create_lock(path: &Path, opts: &LockOptions) -> std::io::Result<File> {
    let file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    match lock_and_write_body(file, opts) {
        Ok(file) => Ok(file),
        Err(e) => {
            // Still ours: created exclusively a moment ago, and nobody judges a fresh file stale.
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

fn lock_and_write_body(mut file: File, opts: &LockOptions) -> std::io::Result<File> {
    file.lock()?;
    let mut body = json!({
        "pid": std::process::id(),
        "createdAt": now_iso(),
        "maxHoldMs": opts.max_hold.as_millis() as u64,
    });
    // Our own start time never changes: read /proc once.
    static OWN_STARTTIME: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    if let Some(st) = OWN_STARTTIME.get_or_init(|| process_starttime(std::process::id())) {
        body["starttime"] = json!(st);
    }
    file.write_all(body.to_string().as_bytes())?;
    Ok(file)
}

enum Holder {
    /// The lock file vanished: try again.
    Gone,
    /// The holder is proven dead (or the file is an orphan): it was removed.
    Stale,
    /// A live holder.
    Live { pid: String, age_ms: u128 },
}

fn inspect(path: &Path, opts: &LockOptions, registry: &LockRegistry) -> Holder {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Holder::Gone,
        Err(_) => return Holder::Live { pid: "?".into(), age_ms: 0 },
    };
    let age_ms = file
        .metadata()
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map(|d| d.as_millis())
        .unwrap_or(0);
    // A Pincer owner holds the flock for as long as it lives.
    if file.try_lock().is_err() {
        return Holder::Live { pid: read_pid(path).unwrap_or_else(|| "?".into()), age_ms };
    }
    let mut body = String::new();
    let _ = file.read_to_string(&mut body);
    let parsed: Option<Value> = serde_json::from_str(&body).ok();
    let pid = parsed.as_ref().and_then(|v| v.get("pid")).and_then(Value::as_u64);
    let stale = match pid {
        None => age_ms >= opts.payload_grace.as_millis(),
        Some(pid) if pid == u64::from(std::process::id()) => !registry.holds(path),
        Some(pid) => {
            let pid = pid as u32;
            if !process_alive(pid) {
                true
            } else {
                let want = parsed.as_ref().and_then(|v| v.get("starttime")).and_then(Value::as_u64);
                matches!((want, process_starttime(pid)), (Some(w), Some(now)) if w != now)
            }
        }
    };
    if !stale {
        return Holder::Live { pid: pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into()), age_ms };
    }
    // Remove only the file we inspected (another process may have replaced it meanwhile).
    if !same_file(path, &file) {
        return Holder::Gone;
    }
    match std::fs::remove_file(path) {
        Ok(()) => Holder::Stale,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Holder::Gone,
        Err(_) => Holder::Live { pid: pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into()), age_ms },
    }
}

fn read_pid(path: &Path) -> Option<String> {
    let body = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    v.get("pid").map(|p| p.to_string())
}

fn same_file(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// `kill(pid, 0)`: false only when the process does not exist.
pub fn process_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
        return false;
    };
    !matches!(rustix::process::test_kill_process(pid), Err(rustix::io::Errno::SRCH))
}

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks), as OpenClaw records it.
pub fn process_starttime(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reentrant_and_removed_on_last_release() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = dir.path().join("s.jsonl");
        let reg = LockRegistry::default();
        let opts = LockOptions::default();
        let a = reg.acquire(&t, &opts).expect("first");
        let b = reg.acquire(&t, &opts).expect("re-entrant");
        let body: Value =
            serde_json::from_str(&std::fs::read_to_string(lock_path_for(&t)).expect("body")).expect("json");
        assert_eq!(body["pid"], json!(std::process::id()));
        assert!(body["createdAt"].is_string() && body["maxHoldMs"].is_u64() && body["starttime"].is_u64());
        drop(a);
        assert!(lock_path_for(&t).exists());
        drop(b);
        assert!(lock_path_for(&t).exists(), "lingers for the next commit");
        let c = reg.acquire(&t, &opts).expect("taken again from the linger");
        drop(c);
        reg.release_idle();
        assert!(!lock_path_for(&t).exists());
        // Without an explicit release, the linger ends by itself.
        drop(reg.acquire(&t, &opts).expect("again"));
        for _ in 0..200 {
            if !lock_path_for(&t).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!lock_path_for(&t).exists(), "the reaper released it");
    }

    #[test]
    fn a_burst_of_commits_does_not_wake_the_reaper_each_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = dir.path().join("s.jsonl");
        let reg = LockRegistry::default();
        let opts = LockOptions { linger: Duration::from_millis(300), ..LockOptions::default() };
        let rounds = || lock(&reg.inner.shared.held).reaper_rounds;
        drop(reg.acquire(&t, &opts).expect("first"));
        let started = Instant::now();
        while rounds() == 0 && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = rounds();
        assert!(before > 0, "the reaper started and went to sleep until the linger ends");
        for _ in 0..500 {
            drop(reg.acquire(&t, &opts).expect("again"));
        }
        let woken = rounds() - before;
        // Only the reaper's own deadlines (one per 300 ms at most) can have passed meanwhile.
        let due = started.elapsed().as_millis() / 300 + 1;
        assert!(woken as u128 <= due, "woken {woken} times for 500 releases (due {due})");
        assert!(lock_path_for(&t).exists(), "still lingering");
        // The linger still ends by itself after the last release.
        let last = Instant::now();
        while lock_path_for(&t).exists() && last.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!lock_path_for(&t).exists(), "the reaper released it");
        assert!(last.elapsed() >= Duration::from_millis(250), "not before its linger ended");
    }

    #[test]
    fn lingering_is_bounded_and_the_reaper_ends_with_its_registry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = LockRegistry::default();
        let opts = LockOptions { linger: Duration::from_secs(60), max_lingering: 3, ..LockOptions::default() };
        let paths: Vec<PathBuf> = (0..10).map(|i| dir.path().join(format!("s{i}.jsonl"))).collect();
        for p in &paths {
            drop(reg.acquire(p, &opts).expect("acquire"));
            assert!(reg.held_count() <= 3, "{} lingering", reg.held_count());
        }
        // The three most recent linger; the older ones were released (their lock files are gone).
        let present: Vec<bool> = paths.iter().map(|p| lock_path_for(p).exists()).collect();
        assert_eq!(present, [vec![false; 7], vec![true; 3]].concat());
        let shared = Arc::downgrade(&reg.inner.shared);
        let second = reg.clone();
        drop(reg);
        assert!(shared.upgrade().is_some(), "a clone still owns the registry");
        drop(second);
        assert!(shared.upgrade().is_none(), "the reaper thread ended and let go of the registry");
        assert!(paths.iter().all(|p| !lock_path_for(p).exists()), "lingering locks released at drop");
    }

    #[test]
    fn dead_owner_is_taken_over_and_live_openclaw_owner_is_respected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = dir.path().join("s.jsonl");
        // A lock left by a process that no longer exists.
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        std::fs::write(lock_path_for(&t), json!({"pid": dead, "createdAt": now_iso()}).to_string()).expect("write");
        let reg = LockRegistry::default();
        let g = reg.acquire(&t, &LockOptions::default()).expect("stale lock taken over");
        drop(g);
        reg.release_idle();
        // A live process that does not flock (as OpenClaw): respected until the timeout.
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().expect("spawn");
        std::fs::write(
            lock_path_for(&t),
            json!({"pid": sleeper.id(), "createdAt": now_iso(), "starttime": process_starttime(sleeper.id())})
                .to_string(),
        )
        .expect("write");
        let opts = LockOptions { acquire_timeout: Duration::from_millis(200), ..LockOptions::default() };
        let err = reg.acquire(&t, &opts).err().expect("must time out");
        assert!(err.to_string().contains("session file locked"), "{err}");
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        reg.acquire(&t, &opts).expect("taken once the owner is dead");
    }
}
