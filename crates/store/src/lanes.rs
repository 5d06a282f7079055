//! The threads that write transcript files (the store's async appends, [`crate::Transcripts::append_held`]).
//! An append blocks for its fdatasync, so it cannot run on an
//! async thread; tokio's blocking pool would take it, but every hand-off there goes through one
//! mutex and condvar shared by all of the pool's threads, and at a few thousand appends a second
//! that lock is contended (threads spin, yield and park on it: a tenth of the gateway's CPU at 100
//! busy sessions). Here each lane is one thread with its own queue, and a transcript always goes
//! to the same lane (by a hash of its path): a hand-off is a lock-free push and, when the lane
//! was idle, one wake-up. Appends of different transcripts in different lanes sync at once (the
//! filesystem's journal commits them together); those sharing a lane wait their turn, which an
//! fdatasync of a fraction of a millisecond makes short. Lanes start on first use.
//!
//! A lane runs under `SCHED_BATCH`: when its fdatasync completes, its wake-up does not preempt
//! the async thread running on that core (which then had to be switched out and back for a few
//! microseconds of the lane's work); the lane runs when that thread waits or its slice ends, or at
//! once on an idle core. At 100 busy sessions that took context switches from ~10.2 to ~7.6 per
//! turn and the gateway's CPU per turn down by ~10% (issue 9), at the same turns/s and latency.

use std::path::Path;
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

/// How many lanes, so how many fdatasyncs can be in flight at once: two per core, at least 4 and at
/// most 32. On 2 cores, 4 lanes kept throughput at 100 busy sessions and cost less than 8: a lane
/// that finds its next append already queued does not sleep and wake for it (9.0-9.9 context
/// switches per turn against 10.1-10.5; 5 alternated rounds of 100 sessions x 60 turns, CPU per
/// turn medians 0.478 against 0.498 ms, turns/s 2,652 against 2,413). 16 lanes cost more still.
pub fn lane_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (2 * cores).clamp(4, 32)
}

/// Which of `lanes` lanes writes transcript `path`: FNV-1a over the path's bytes (stable for a
/// path, cheap: no component parsing).
pub fn lane_index(path: &Path, lanes: usize) -> usize {
    let h = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    (h % lanes.max(1) as u64) as usize
}

type Job = Box<dyn FnOnce() + Send>;

/// The lanes of one gateway.
pub struct Lanes {
    lanes: Vec<OnceLock<Sender<Job>>>,
}

impl Default for Lanes {
    fn default() -> Self {
        Lanes { lanes: (0..lane_count()).map(|_| OnceLock::new()).collect() }
    }
}

/// The job panicked, or its lane could not be started.
#[derive(Debug)]
pub struct LaneGone;

impl Lanes {
    /// Runs `f` on the lane of transcript `path` and returns what it returned.
    pub async fn run<T: Send + 'static>(
        &self,
        path: &Path,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, LaneGone> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.sender(path).ok_or(LaneGone)?.send(job).map_err(|_| LaneGone)?;
        rx.await.map_err(|_| LaneGone)
    }

    fn sender(&self, path: &Path) -> Option<&Sender<Job>> {
        let i = lane_index(path, self.lanes.len());
        let slot = self.lanes.get(i)?;
        if let Some(s) = slot.get() {
            return Some(s);
        }
        let (tx, rx) = channel::<Job>();
        let started = std::thread::Builder::new().name(format!("pincer-lane-{i}")).spawn(move || {
            batch_scheduling();
            for job in rx {
                // A panicking job fails its own caller (its answer is dropped), not the lane.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        });
        if let Err(e) = started {
            tracing::error!("cannot start a transcript writer thread: {e}");
            return None;
        }
        // Another caller may have started the lane first: then this thread ends with its sender.
        Some(slot.get_or_init(|| tx))
    }
}

/// Puts the calling thread under `SCHED_BATCH` (see the module doc); where that is refused (a
/// sandbox), the thread stays as it was.
fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is the calling thread.
    #[allow(unsafe_code)]
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if r != 0 {
        tracing::debug!("a transcript writer thread keeps the default scheduling: {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_of_one_path_run_in_order_on_one_thread() {
        let lanes = Lanes::default();
        let p = Path::new("/state/agents/main/sessions/a.jsonl");
        let mut names = Vec::new();
        for i in 0..20u32 {
            let (n, v) =
                lanes.run(p, move || (std::thread::current().name().map(str::to_owned), i)).await.expect("lane");
            assert_eq!(v, i);
            names.push(n.expect("named"));
        }
        assert!(names[0].starts_with("pincer-lane-"), "{names:?}");
        assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
        let threads = lanes_of_many_paths(&lanes).await;
        assert!(threads.len() > 1, "different transcripts spread over lanes: {threads:?}");
    }

    #[tokio::test]
    async fn lanes_run_under_sched_batch() {
        let lanes = Lanes::default();
        let stat = lanes
            .run(Path::new("/b.jsonl"), || std::fs::read_to_string("/proc/thread-self/stat"))
            .await
            .expect("lane")
            .expect("stat");
        // Field 41 of proc_pid_stat(5) is the policy: the fields after the command name start at 3.
        let policy = |stat: &str| {
            let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
            after.split_whitespace().nth(41 - 3).map(str::to_owned)
        };
        assert_eq!(policy(&stat), Some(libc::SCHED_BATCH.to_string()), "{stat}");
        let here = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        assert_eq!(policy(&here).as_deref(), Some("0"), "the caller's thread is left as it was: {here}");
    }

    async fn lanes_of_many_paths(lanes: &Lanes) -> std::collections::HashSet<String> {
        let mut out = std::collections::HashSet::new();
        for i in 0..64 {
            let p = std::path::PathBuf::from(format!("/state/agents/main/sessions/{i}.jsonl"));
            let n = lanes.run(&p, || std::thread::current().name().map(str::to_owned)).await.expect("lane");
            out.insert(n.expect("named"));
        }
        out
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_not_a_hang() {
        let lanes = Lanes::default();
        let p = Path::new("/x.jsonl");
        let r = lanes.run(p, || -> u32 { panic!("boom") }).await;
        assert!(r.is_err());
        assert_eq!(lanes.run(p, || 7u32).await.expect("the lane goes on"), 7);
    }
}
