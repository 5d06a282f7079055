//! The one in-process event bus. Every live event (chat deltas and finals, `session.message`,
//! `agent`, `sessions.changed`, `shutdown`) is published here once; WebSocket connections and SSE
//! streams subscribe. Session-scoped events also get a per-session id and are kept in a bounded
//! log, so an SSE client reconnecting with `Last-Event-ID` gets what it missed, or `reset` when the
//! gap is older than the log.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Events kept per session for SSE catch-up.
pub const SSE_LOG_LEN: usize = 512;

/// Who receives an event on the WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Every connection, with a frame `seq`.
    All,
    /// Connections that called `sessions.messages.subscribe` for the event's session (no `seq`).
    SessionSubscribers,
    /// Connections that called `sessions.subscribe` (no `seq`).
    SessionsWatchers,
}

#[derive(Debug)]
pub struct BusEvent {
    pub name: &'static str,
    pub session_key: Option<String>,
    pub payload: Value,
    /// `payload` serialized once, shared by every connection that forwards it.
    pub payload_json: String,
    /// May be skipped for a slow consumer (deltas, `sessions.changed`).
    pub droppable: bool,
    pub audience: Audience,
    /// Per-session id for SSE (`chat` and `session.message` only).
    pub sse_id: Option<u64>,
}

#[derive(Default)]
struct SseLog {
    next_id: u64,
    events: VecDeque<Arc<BusEvent>>,
}

/// What an SSE reconnect gets.
pub enum Replay {
    Events(Vec<Arc<BusEvent>>),
    /// The gap is older than the log: refetch history.
    Reset,
}

pub struct Hub {
    tx: broadcast::Sender<Arc<BusEvent>>,
    logs: Mutex<HashMap<String, SseLog>>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub { tx: broadcast::channel(8192).0, logs: Mutex::new(HashMap::new()) }
    }
}

impl Hub {
    /// Publishes one event to every subscriber.
    pub fn publish(
        &self,
        name: &'static str,
        session_key: Option<&str>,
        payload: Value,
        droppable: bool,
        audience: Audience,
    ) {
        let mut logs = match self.logs.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let logged = matches!(name, "chat" | "session.message");
        let mut ev = BusEvent {
            name,
            session_key: session_key.map(str::to_owned),
            payload_json: payload.to_string(),
            payload,
            droppable,
            audience,
            sse_id: None,
        };
        let ev = match (logged, session_key) {
            (true, Some(key)) => {
                let log = logs.entry(key.to_owned()).or_default();
                log.next_id += 1;
                ev.sse_id = Some(log.next_id);
                let ev = Arc::new(ev);
                log.events.push_back(ev.clone());
                if log.events.len() > SSE_LOG_LEN {
                    log.events.pop_front();
                }
                ev
            }
            _ => Arc::new(ev),
        };
        // Sent while the log is locked, so the broadcast order is the id order.
        let _ = self.tx.send(ev);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<BusEvent>> {
        self.tx.subscribe()
    }

    /// Subscribes and returns what a client that last saw `after` missed, atomically (no event can
    /// fall between the replay and the live stream).
    pub fn subscribe_with_replay(
        &self,
        key: &str,
        after: Option<u64>,
    ) -> (broadcast::Receiver<Arc<BusEvent>>, Replay, u64) {
        let logs = match self.logs.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let rx = self.tx.subscribe();
        let Some(log) = logs.get(key) else {
            return (rx, if after.is_some_and(|a| a > 0) { Replay::Reset } else { Replay::Events(vec![]) }, 0);
        };
        let last = log.next_id;
        let replay = match after {
            None => Replay::Events(vec![]),
            Some(a) if a > last => Replay::Reset,
            Some(a) => {
                let oldest = log.events.front().and_then(|e| e.sse_id).unwrap_or(last + 1);
                if a + 1 < oldest {
                    Replay::Reset
                } else {
                    Replay::Events(log.events.iter().filter(|e| e.sse_id.is_some_and(|id| id > a)).cloned().collect())
                }
            }
        };
        (rx, replay, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(r: Replay) -> Option<Vec<u64>> {
        match r {
            Replay::Events(v) => Some(v.iter().filter_map(|e| e.sse_id).collect()),
            Replay::Reset => None,
        }
    }

    #[test]
    fn replay_and_reset() {
        let hub = Hub::default();
        for n in 0..(SSE_LOG_LEN + 10) {
            hub.publish("chat", Some("k"), json!({"n": n}), false, Audience::All);
        }
        hub.publish("tick", None, json!({}), false, Audience::All);
        let last = (SSE_LOG_LEN + 10) as u64;
        assert_eq!(ids(hub.subscribe_with_replay("k", Some(last - 2)).1), Some(vec![last - 1, last]));
        assert_eq!(ids(hub.subscribe_with_replay("k", Some(last)).1), Some(vec![]));
        assert_eq!(ids(hub.subscribe_with_replay("k", Some(1)).1), None, "too old: reset");
        assert_eq!(ids(hub.subscribe_with_replay("k", Some(last + 5)).1), None, "from the future: reset");
        assert_eq!(ids(hub.subscribe_with_replay("other", Some(3)).1), None);
        assert_eq!(ids(hub.subscribe_with_replay("other", None).1), Some(vec![]));
    }
}
