//! [`SessionQueue`]: the order of a session's turns in this process, one at a time per session key
//! ([`crate::state::Engine::turn_slot`] adds the replicas' lock on top). Later sends wait in FIFO
//! order (tokio's mutex is fair), and a waiting send can be cancelled through its token without
//! disturbing the order of the others. Idle keys are removed, so the map holds only busy sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

/// A waiting `acquire` whose token fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cancelled while waiting for the session's previous run")]
pub struct Cancelled;

#[derive(Debug)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// Holders plus waiters; the slot is removed when it drops to zero.
    users: usize,
}

type Slots = Arc<Mutex<HashMap<String, Slot>>>;

/// Per-session FIFO of runs.
#[derive(Debug, Clone, Default)]
pub struct SessionQueue {
    slots: Slots,
}

/// Holds the session's turn; dropping it lets the next waiter run.
#[derive(Debug)]
pub struct SessionGuard {
    _lock: OwnedMutexGuard<()>,
    _user: UserCount,
}

/// Decrements the slot's user count on drop (also when an `acquire` future is dropped).
#[derive(Debug)]
struct UserCount {
    slots: Slots,
    key: String,
}

impl Drop for UserCount {
    fn drop(&mut self) {
        if let Ok(mut slots) = self.slots.lock() {
            if let Some(slot) = slots.get_mut(&self.key) {
                slot.users -= 1;
                if slot.users == 0 {
                    slots.remove(&self.key);
                }
            }
        }
    }
}

impl SessionQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits for the session's turn. Returns [`Cancelled`] if `cancel` fires first.
    pub async fn acquire(&self, session_key: &str, cancel: &CancellationToken) -> Result<SessionGuard, Cancelled> {
        let (lock, user) = {
            let mut slots = self.slots.lock().map_err(|_| Cancelled)?;
            let slot = slots
                .entry(session_key.to_owned())
                .or_insert_with(|| Slot { lock: Arc::new(tokio::sync::Mutex::new(())), users: 0 });
            slot.users += 1;
            (slot.lock.clone(), UserCount { slots: self.slots.clone(), key: session_key.to_owned() })
        };
        if cancel.is_cancelled() {
            return Err(Cancelled);
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(Cancelled),
            guard = lock.lock_owned() => Ok(SessionGuard { _lock: guard, _user: user }),
        }
    }

    /// Runs holding or waiting for this session (0 when idle).
    pub fn users(&self, session_key: &str) -> usize {
        self.slots.lock().ok().and_then(|s| s.get(session_key).map(|slot| slot.users)).unwrap_or(0)
    }

    /// Number of sessions with a run active or waiting.
    pub fn busy_sessions(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn session_queue_is_fifo_and_waiters_can_be_cancelled() {
        let q = SessionQueue::new();
        let never = CancellationToken::new();
        let first = q.acquire("s", &never).await.expect("acquire");
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        let cancel_b = CancellationToken::new();
        for (name, token) in [("a", never.clone()), ("b", cancel_b.clone()), ("c", never.clone())] {
            let q2 = q.clone();
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                match q2.acquire("s", &token).await {
                    Ok(g) => {
                        order.lock().expect("order").push(name);
                        tokio::task::yield_now().await;
                        drop(g);
                    }
                    Err(Cancelled) => order.lock().expect("order").push("b-cancelled"),
                }
            }));
            // Let each waiter enqueue before the next one.
            while q.users("s") < waiters.len() + 1 {
                tokio::task::yield_now().await;
            }
        }
        // Another session is independent.
        let other = q.acquire("t", &never).await.expect("acquire");
        cancel_b.cancel();
        while order.lock().expect("order").is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(*order.lock().expect("order"), vec!["b-cancelled"]);
        drop(first);
        for w in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(30), w).await.expect("in time").expect("waiter");
        }
        assert_eq!(*order.lock().expect("order"), vec!["b-cancelled", "a", "c"]);
        assert_eq!((q.users("s"), q.busy_sessions()), (0, 1));
        drop(other);
        assert_eq!(q.busy_sessions(), 0);
    }
}
