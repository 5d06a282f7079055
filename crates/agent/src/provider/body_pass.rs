//! Accounting of the request-body pass: every request body written in this process adds its size
//! and the CPU time its writing took (the writing thread's own CPU clock, so waiting for the CPU
//! on a busy machine does not count) to two process-wide totals. The pass is O(context) by nature;
//! the totals let a measurement report its throughput (MB/s) and take it out of the per-turn CPU
//! cost that must not grow with the session (the gateway exports them on `/metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

static BYTES: AtomicU64 = AtomicU64::new(0);
static CPU_NS: AtomicU64 = AtomicU64::new(0);
static BODIES: AtomicU64 = AtomicU64::new(0);

/// What the request-body pass has done in this process so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BodyPassTotals {
    /// Bodies written.
    pub bodies: u64,
    /// Bytes written.
    pub bytes: u64,
    /// CPU time of the writing threads, in nanoseconds.
    pub cpu_ns: u64,
}

/// The totals so far.
pub fn totals() -> BodyPassTotals {
    BodyPassTotals {
        bodies: BODIES.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
        cpu_ns: CPU_NS.load(Ordering::Relaxed),
    }
}

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// Runs `write` (which writes one body and returns it with its size) and adds it to the totals.
pub(crate) fn measured<T>(write: impl FnOnce() -> Option<(T, usize)>) -> Option<T> {
    let started = thread_cpu_ns();
    let (out, bytes) = write()?;
    CPU_NS.fetch_add(thread_cpu_ns().saturating_sub(started), Ordering::Relaxed);
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    BODIES.fetch_add(1, Ordering::Relaxed);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_body_adds_its_size_and_some_cpu_time() {
        let before = totals();
        let got = measured(|| {
            let body: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
            let n = body.len();
            Some((body, n))
        });
        assert_eq!(got.map(|b| b.len()), Some(800_000));
        let after = totals();
        // Other tests may write bodies meanwhile: the totals grow by at least this one.
        assert!(after.bodies > before.bodies);
        assert!(after.bytes >= before.bytes + 800_000);
        assert!(after.cpu_ns > before.cpu_ns, "building 800 kB takes some CPU time");
        assert_eq!(measured::<()>(|| None), None, "no body, nothing counted");
    }
}
