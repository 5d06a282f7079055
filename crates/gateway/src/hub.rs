//! The one in-process event bus. Every live event (chat deltas and finals, `session.message`,
//! `agent`, `sessions.changed`, `shutdown`) is published here once, serialized once, and handed to
//! each interested subscriber (a WebSocket connection's outbox, an SSE stream) right away; the hub
//! keeps no ring of past events for them, so memory is bounded by each subscriber's own budget.
//! Session-scoped `chat` and `session.message` events also get a per-session id, and those that
//! are not deltas are kept in catch-up logs bounded per session and in total bytes, so an SSE client reconnecting with
//! `Last-Event-ID` gets what it missed, or `reset` when the gap is older than the log. A session's
//! log is dropped when it is reset or deleted, so deleted content never replays.

use crate::state::lock;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Events kept per session for SSE catch-up.
pub const SSE_LOG_LEN: usize = 512;
/// Bytes kept in all catch-up logs together; the oldest events (of any session) go first.
pub const SSE_LOG_TOTAL_BYTES: usize = 64 * 1024 * 1024;

/// Who receives an event on the WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Every connection that works with the event's session (or all, for events without one), with
    /// a frame `seq`.
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
    /// The payload serialized once, shared by every subscriber that forwards it.
    pub payload_json: String,
    /// May be skipped for a slow consumer (deltas, `sessions.changed`).
    pub droppable: bool,
    pub audience: Audience,
    /// Per-session id for SSE (`chat` and `session.message` only).
    pub sse_id: Option<u64>,
}

impl BusEvent {
    /// Bytes this event holds.
    pub fn size(&self) -> usize {
        self.payload_json.len() + self.session_key.as_ref().map_or(0, String::len) + 96
    }
}

/// Receives events as they are published. Called with the hub's lock held, so it must not block:
/// queue the event (or drop it) and return. Returning false unsubscribes.
pub trait Subscriber: Send + Sync {
    fn deliver(&self, ev: &Arc<BusEvent>) -> bool;
}

#[derive(Default)]
struct SseLog {
    next_id: u64,
    events: VecDeque<Arc<BusEvent>>,
    /// The highest id of a kept event that is gone (trimmed or forgotten): a client that saw less
    /// than this missed something and gets `reset`.
    lost_upto: u64,
}

impl SseLog {
    fn pop(&mut self) -> Option<Arc<BusEvent>> {
        let e = self.events.pop_front()?;
        self.lost_upto = self.lost_upto.max(e.sse_id.unwrap_or(0));
        Some(e)
    }
}

/// What an SSE reconnect gets.
pub enum Replay {
    Events(Vec<Arc<BusEvent>>),
    /// The gap is older than the log: refetch history.
    Reset,
}

#[derive(Default)]
struct Inner {
    logs: HashMap<String, SseLog>,
    /// Bytes and events in all logs.
    log_bytes: usize,
    log_count: usize,
    /// Every logged event in publication order (session, id), for evicting the oldest overall.
    log_order: VecDeque<(String, u64)>,
    subscribers: BTreeMap<u64, Arc<dyn Subscriber>>,
    /// Session key → the subscribers that watch it: a session's events go to these alone, so a
    /// turn costs the same with 1 or 1,000 connections open.
    watching: HashMap<String, BTreeSet<u64>>,
    /// Subscriber → the keys it watches (to forget them with it).
    watched_by: HashMap<u64, Vec<String>>,
}

impl Inner {
    fn remove_subscriber(&mut self, id: u64) {
        self.subscribers.remove(&id);
        for key in self.watched_by.remove(&id).unwrap_or_default() {
            if let Some(ids) = self.watching.get_mut(&key) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.watching.remove(&key);
                }
            }
        }
    }

    fn watch(&mut self, id: u64, key: &str) {
        if self.subscribers.contains_key(&id) && self.watching.entry(key.to_owned()).or_default().insert(id) {
            self.watched_by.entry(id).or_default().push(key.to_owned());
        }
    }
}

/// A subscription; dropping it unsubscribes.
pub struct Subscription {
    hub: Arc<Hub>,
    id: u64,
}

impl Subscription {
    /// From now on the subscriber also gets the events of this session (`watch` is how a
    /// subscriber says it may want them; it still chooses in [`Subscriber::deliver`]).
    pub fn watch(&self, key: &str) {
        self.hub.watch(self.id, key);
    }

    /// The subscriber's id (for [`Hub::watch`]).
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        lock(&self.hub.inner).remove_subscriber(self.id);
    }
}

#[derive(Default)]
pub struct Hub {
    inner: Mutex<Inner>,
    next_sub: AtomicU64,
    /// Largest total of the catch-up logs (tests lower it).
    log_budget: Option<usize>,
}

impl Hub {
    /// A hub whose catch-up logs keep at most `bytes` together.
    pub fn with_log_budget(bytes: usize) -> Hub {
        Hub { log_budget: Some(bytes), ..Hub::default() }
    }

    fn budget(&self) -> usize {
        self.log_budget.unwrap_or(SSE_LOG_TOTAL_BYTES)
    }

    /// Publishes one event: a session's event (other than a `sessions.subscribe` notice) to the
    /// subscribers watching that session, any other event to every subscriber.
    pub fn publish(
        &self,
        name: &'static str,
        session_key: Option<&str>,
        payload: serde_json::Value,
        droppable: bool,
        audience: Audience,
    ) {
        let payload_json = payload.to_string();
        drop(payload);
        let mut inner = lock(&self.inner);
        let mut ev = BusEvent {
            name,
            session_key: session_key.map(str::to_owned),
            payload_json,
            droppable,
            audience,
            sse_id: None,
        };
        let streamed = matches!(name, "chat" | "session.message");
        let ev = match (streamed, session_key) {
            // Deltas get an id but are not kept: each carries the whole text so far, so the next
            // one (or the final) supersedes it, and keeping them would hold the reply many times.
            (true, Some(key)) if droppable => {
                let log = inner.logs.entry(key.to_owned()).or_default();
                log.next_id += 1;
                ev.sse_id = Some(log.next_id);
                Arc::new(ev)
            }
            (true, Some(key)) => {
                let log = inner.logs.entry(key.to_owned()).or_default();
                log.next_id += 1;
                let id = log.next_id;
                ev.sse_id = Some(id);
                let ev = Arc::new(ev);
                log.events.push_back(ev.clone());
                let mut freed = (0, 0);
                if log.events.len() > SSE_LOG_LEN {
                    freed = log.pop().map_or((0, 0), |e| (e.size(), 1));
                }
                inner.log_bytes = inner.log_bytes + ev.size() - freed.0;
                inner.log_count = inner.log_count + 1 - freed.1;
                inner.log_order.push_back((key.to_owned(), id));
                self.trim(&mut inner);
                ev
            }
            _ => Arc::new(ev),
        };
        // Delivered while the hub is locked, so every subscriber sees the id order.
        let routed = ev.session_key.as_deref().filter(|_| ev.audience != Audience::SessionsWatchers);
        let Some(key) = routed else {
            let gone: Vec<u64> = inner.subscribers.iter().filter(|(_, s)| !s.deliver(&ev)).map(|(id, _)| *id).collect();
            for id in gone {
                inner.remove_subscriber(id);
            }
            return;
        };
        let mut gone = Vec::new();
        if let Some(ids) = inner.watching.get(key) {
            for id in ids {
                if inner.subscribers.get(id).is_some_and(|s| !s.deliver(&ev)) {
                    gone.push(*id);
                }
            }
        }
        for id in gone {
            inner.remove_subscriber(id);
        }
    }

    /// Drops the oldest logged events until the logs fit their byte budget.
    fn trim(&self, inner: &mut Inner) {
        let budget = self.budget();
        while inner.log_bytes > budget {
            let Some((key, id)) = inner.log_order.pop_front() else { break };
            let Some(log) = inner.logs.get_mut(&key) else { continue };
            while log.events.front().and_then(|e| e.sse_id).is_some_and(|e| e <= id) {
                if let Some(e) = log.pop() {
                    inner.log_bytes -= e.size();
                    inner.log_count -= 1;
                }
            }
        }
        if inner.log_order.len() > inner.log_count * 2 + 1024 {
            // Entries of events already gone (per-session trims, forgotten sessions).
            let logs = &inner.logs;
            inner.log_order.retain(|(k, id)| {
                logs.get(k).and_then(|l| l.events.front()).and_then(|e| e.sse_id).is_some_and(|f| *id >= f)
            });
        }
    }

    /// Forgets a session's catch-up log (reset, delete): its content is never replayed. Ids keep
    /// counting up, so a client that saw the old events gets `reset`.
    pub fn forget_session(&self, key: &str) {
        let mut inner = lock(&self.inner);
        if let Some(log) = inner.logs.get_mut(key) {
            let (bytes, count) = log.events.drain(..).fold((0, 0), |(b, c), e| (b + e.size(), c + 1));
            log.lost_upto = log.next_id;
            inner.log_bytes -= bytes;
            inner.log_count -= count;
        }
    }

    /// Subscriber `id` also gets the events of session `key` (see [`Subscription::watch`]).
    pub fn watch(&self, id: u64, key: &str) {
        lock(&self.inner).watch(id, key);
    }

    /// The sessions some subscriber watches now.
    pub fn watched_sessions(&self) -> Vec<String> {
        lock(&self.inner).watching.keys().cloned().collect()
    }

    /// Bytes held by the catch-up logs.
    pub fn log_bytes(&self) -> usize {
        lock(&self.inner).log_bytes
    }

    /// Subscribes; events published from now on are delivered until the subscription is dropped.
    pub fn subscribe(self: &Arc<Self>, sub: Arc<dyn Subscriber>) -> Subscription {
        let id = self.next_sub.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner).subscribers.insert(id, sub);
        Subscription { hub: self.clone(), id }
    }

    /// Subscribes and returns what a client that last saw `after` missed, atomically (no event can
    /// fall between the replay and the live stream).
    pub fn subscribe_with_replay(
        self: &Arc<Self>,
        key: &str,
        after: Option<u64>,
        sub: Arc<dyn Subscriber>,
    ) -> (Subscription, Replay) {
        let mut inner = lock(&self.inner);
        let id = self.next_sub.fetch_add(1, Ordering::Relaxed);
        inner.subscribers.insert(id, sub);
        inner.watch(id, key);
        let subscription = Subscription { hub: self.clone(), id };
        let Some(log) = inner.logs.get(key) else {
            return (subscription, if after.is_some_and(|a| a > 0) { Replay::Reset } else { Replay::Events(vec![]) });
        };
        let last = log.next_id;
        let replay = match after {
            None => Replay::Events(vec![]),
            Some(a) if a > last => Replay::Reset,
            Some(a) => {
                if a < log.lost_upto {
                    Replay::Reset
                } else {
                    Replay::Events(log.events.iter().filter(|e| e.sse_id.is_some_and(|id| id > a)).cloned().collect())
                }
            }
        };
        (subscription, replay)
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

    struct Collect(Mutex<Vec<u64>>);
    impl Subscriber for Collect {
        fn deliver(&self, ev: &Arc<BusEvent>) -> bool {
            lock(&self.0).extend(ev.sse_id);
            true
        }
    }

    fn replay(hub: &Arc<Hub>, key: &str, after: Option<u64>) -> Option<Vec<u64>> {
        ids(hub.subscribe_with_replay(key, after, Arc::new(Collect(Mutex::new(vec![])))).1)
    }

    #[test]
    fn replay_and_reset() {
        let hub = Arc::new(Hub::default());
        for n in 0..(SSE_LOG_LEN + 10) {
            hub.publish("chat", Some("k"), json!({"n": n}), false, Audience::All);
        }
        hub.publish("tick", None, json!({}), false, Audience::All);
        let last = (SSE_LOG_LEN + 10) as u64;
        assert_eq!(replay(&hub, "k", Some(last - 2)), Some(vec![last - 1, last]));
        assert_eq!(replay(&hub, "k", Some(last)), Some(vec![]));
        assert_eq!(replay(&hub, "k", Some(1)), None, "too old: reset");
        assert_eq!(replay(&hub, "k", Some(last + 5)), None, "from the future: reset");
        assert_eq!(replay(&hub, "other", Some(3)), None);
        assert_eq!(replay(&hub, "other", None), Some(vec![]));
    }

    #[test]
    fn logs_are_bounded_in_total_and_forgotten_sessions_never_replay() {
        let hub = Arc::new(Hub::with_log_budget(200_000));
        let big = "x".repeat(10_000);
        for s in 0..50 {
            hub.publish("chat", Some(&format!("s{s}")), json!({"text": big}), false, Audience::All);
        }
        assert!(hub.log_bytes() <= 200_000, "{} bytes kept", hub.log_bytes());
        assert_eq!(replay(&hub, "s0", Some(0)), None, "the oldest session's events were evicted");
        assert_eq!(replay(&hub, "s49", Some(0)), Some(vec![1]));
        hub.forget_session("s49");
        assert_eq!(replay(&hub, "s49", Some(0)), None, "a forgotten session replays nothing");
        hub.publish("chat", Some("s49"), json!({}), false, Audience::All);
        assert_eq!(replay(&hub, "s49", Some(1)), Some(vec![2]), "ids go on after a reset");
        for _ in 0..10_000 {
            hub.publish("chat", Some("busy"), json!({"text": "y"}), false, Audience::All);
        }
        assert!(lock(&hub.inner).log_order.len() < 5_000, "the eviction order does not grow without bound");
    }

    #[test]
    fn deltas_are_streamed_with_ids_but_not_kept() {
        let hub = Arc::new(Hub::default());
        hub.publish("chat", Some("k"), json!({"state": "delta", "text": "x".repeat(100_000)}), true, Audience::All);
        hub.publish("chat", Some("k"), json!({"state": "final"}), false, Audience::All);
        assert!(hub.log_bytes() < 1_000, "{} bytes kept", hub.log_bytes());
        assert_eq!(replay(&hub, "k", Some(0)), Some(vec![2]), "the final replays; the delta it supersedes does not");
        assert_eq!(replay(&hub, "k", None), Some(vec![]));
        assert_eq!(replay(&hub, "k", Some(1)), Some(vec![2]));
    }

    #[test]
    fn subscribers_get_events_until_dropped() {
        let hub = Arc::new(Hub::default());
        let c = Arc::new(Collect(Mutex::new(vec![])));
        let sub = hub.subscribe(c.clone());
        hub.publish("chat", Some("k"), json!({}), false, Audience::All);
        assert!(lock(&c.0).is_empty(), "a session's events go to the subscribers watching it");
        sub.watch("k");
        hub.publish("chat", Some("k"), json!({}), false, Audience::All);
        hub.publish("chat", Some("other"), json!({}), false, Audience::All);
        drop(sub);
        hub.publish("chat", Some("k"), json!({}), false, Audience::All);
        assert_eq!(*lock(&c.0), vec![2]);
        let inner = lock(&hub.inner);
        assert!(inner.watching.is_empty() && inner.watched_by.is_empty(), "a dropped subscriber is forgotten");
    }
}
