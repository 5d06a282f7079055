//! The one in-process event bus. Every live event (chat deltas and finals, `session.message`,
//! `agent`, `sessions.changed`, `shutdown`) is published here once, serialized once, and handed to
//! each interested subscriber (a WebSocket connection's outbox, an SSE stream) right away; the hub
//! keeps no ring of past events for them, so memory is bounded by each subscriber's own budget.
//! An event that announces a persisted entry carries that entry's durable [`EventId`]; a client
//! that missed events catches up from the store ([`crate::catchup`]), on any replica.

use pincer_pi::lock;
use pincer_store::Pos;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The durable id of an event that announces a persisted entry: the transcript (its session id),
/// the entry's position in it ([`pincer_store::Appended::pos`]: a byte offset for JSONL, the `seq`
/// for PostgreSQL) and which of the entry's events it is — 0 for `session.message`, 1 for the `chat`
/// event (a final, an abort, an error) that carries the entry. Written `<sessionId>:<pos>` and
/// `<sessionId>:<pos>.1`; the same on every replica and after a restart, and ordered as the
/// entries are, so a client that saw an entry's `session.message` but not its final gets the final.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventId {
    pub session_id: String,
    pub pos: Pos,
    pub part: u8,
}

/// The largest position an id may name (what PostgreSQL's `bigint` holds).
const MAX_POS: u64 = i64::MAX as u64;

impl EventId {
    /// `session.message` of the entry at `pos`.
    pub fn message(session_id: &str, pos: Pos) -> EventId {
        EventId { session_id: session_id.to_owned(), pos, part: 0 }
    }

    /// The `chat` event that carries the entry at `pos`.
    pub fn chat(session_id: &str, pos: Pos) -> EventId {
        EventId { session_id: session_id.to_owned(), pos, part: 1 }
    }

    /// Reads an id as [`EventId`]'s `Display` writes it; the reason when it is not one.
    pub fn parse(text: &str) -> Result<EventId, String> {
        let bad = |why: &str| format!("{text:?} is not an event id of this gateway ({why})");
        let (sid, at) = text.trim().rsplit_once(':').ok_or_else(|| bad("expected <sessionId>:<position>"))?;
        if sid.is_empty() || sid.len() > 128 {
            return Err(bad("no session id"));
        }
        let (pos, part) = match at.split_once('.') {
            None => (at, 0),
            Some((pos, "1")) => (pos, 1),
            Some(_) => return Err(bad("the part after the dot must be 1")),
        };
        if pos.is_empty() || pos.len() > 19 || !pos.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the position must be a whole number"));
        }
        let pos: u64 = pos.parse().map_err(|_| bad("the position must be a whole number"))?;
        if pos > MAX_POS {
            return Err(bad("the position is too large"));
        }
        Ok(EventId { session_id: sid.to_owned(), pos: Pos(pos), part })
    }

    /// Whether this id comes after `other` in the same transcript (false for another transcript).
    pub fn after(&self, other: &EventId) -> bool {
        self.session_id == other.session_id && (self.pos, self.part) > (other.pos, other.part)
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.part {
            0 => write!(f, "{}:{}", self.session_id, self.pos),
            n => write!(f, "{}:{}.{n}", self.session_id, self.pos),
        }
    }
}

/// An event payload serialized straight from a typed value (no JSON tree built for it); `None`
/// (logged) in the impossible case that it does not serialize.
pub fn to_json(payload: &impl serde::Serialize) -> Option<String> {
    serde_json::to_string(payload).map_err(|e| tracing::error!("an event payload did not serialize: {e}")).ok()
}

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
    /// The durable id of an event that announces a persisted entry (see [`EventId`]).
    pub id: Option<EventId>,
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

    /// Whether [`Subscriber::deliver`] would take an event of this name, session and audience: asked
    /// before an event is built ([`Hub::wants`]), so that nobody pays for events nobody reads.
    fn wants(&self, _name: &'static str, _session_key: Option<&str>, _audience: Audience) -> bool {
        true
    }
}

#[derive(Default)]
struct Inner {
    subscribers: BTreeMap<u64, Arc<dyn Subscriber>>,
    /// Session key → the subscribers that watch it: a session's events go to these alone, so a
    /// turn costs the same with 1 or 1,000 connections open.
    watching: foldhash::HashMap<String, BTreeSet<u64>>,
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

    /// The subscribers an event reaches: a session's event (other than a `sessions.subscribe`
    /// notice) those watching that session, any other event every subscriber.
    fn reached<'a>(
        &'a self,
        session_key: Option<&'a str>,
        audience: Audience,
    ) -> impl Iterator<Item = (u64, &'a Arc<dyn Subscriber>)> + 'a {
        let routed = session_key.filter(|_| audience != Audience::SessionsWatchers);
        let all = routed.is_none().then(|| self.subscribers.iter().map(|(id, s)| (*id, s)));
        let watchers = routed
            .and_then(|k| self.watching.get(k))
            .map(|ids| ids.iter().filter_map(|id| self.subscribers.get(id).map(|s| (*id, s))));
        all.into_iter().flatten().chain(watchers.into_iter().flatten())
    }

    fn watch(&mut self, id: u64, key: &str) {
        if self.subscribers.contains_key(&id) && self.watching.entry(key.to_owned()).or_default().insert(id) {
            self.watched_by.entry(id).or_default().push(key.to_owned());
        }
    }

    fn unwatch(&mut self, id: u64, key: &str) {
        if let Some(ids) = self.watching.get_mut(key) {
            ids.remove(&id);
            if ids.is_empty() {
                self.watching.remove(key);
            }
        }
        if let Some(keys) = self.watched_by.get_mut(&id) {
            keys.retain(|k| k != key);
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
}

impl Hub {
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
        self.publish_event(BusEvent {
            name,
            session_key: session_key.map(str::to_owned),
            payload_json: payload.to_string(),
            droppable,
            audience,
            id: None,
        });
    }

    /// Tells the `sessions.subscribe` watchers that session `key` changed because of `reason`.
    pub fn sessions_changed(&self, key: &str, reason: &str) {
        self.changed(key, reason, None);
    }

    /// Publishes `sessions.changed` for a change of session `key`'s tree: its active leaf now.
    pub fn sessions_changed_at(&self, key: &str, reason: &str, leaf: Option<&str>) {
        self.changed(key, reason, Some(leaf));
    }

    fn changed(&self, key: &str, reason: &str, leaf_entry_id: Option<Option<&str>>) {
        let event =
            crate::protocol::SessionsChanged { session_key: key, reason, leaf_entry_id, ts: pincer_pi::now_ms() };
        let payload = serde_json::to_value(event).unwrap_or_default();
        self.publish("sessions.changed", Some(key), payload, true, Audience::SessionsWatchers);
    }

    /// Publishes a session's event whose payload is already serialized (see [`to_json`]).
    pub fn publish_json(
        &self,
        name: &'static str,
        session_key: &str,
        payload_json: String,
        droppable: bool,
        audience: Audience,
        id: Option<EventId>,
    ) {
        self.publish_event(BusEvent {
            name,
            session_key: Some(session_key.to_owned()),
            payload_json,
            droppable,
            audience,
            id,
        });
    }

    /// Publishes an event that announces a persisted entry, under its durable id.
    pub fn publish_entry(
        &self,
        name: &'static str,
        session_key: &str,
        payload: &impl serde::Serialize,
        audience: Audience,
        id: Option<EventId>,
    ) {
        let Some(json) = to_json(payload) else { return };
        self.publish_json(name, session_key, json, false, audience, id);
    }

    fn publish_event(&self, ev: BusEvent) {
        let ev = Arc::new(ev);
        let mut inner = lock(&self.inner);
        // Delivered while the hub is locked, so every subscriber sees one order.
        let gone: Vec<u64> = inner
            .reached(ev.session_key.as_deref(), ev.audience)
            .filter(|(_, s)| !s.deliver(&ev))
            .map(|(id, _)| id)
            .collect();
        for id in gone {
            inner.remove_subscriber(id);
        }
    }

    /// Whether some subscriber would take an event of this name, session and audience now. A caller
    /// may skip building an event nobody wants; a subscriber that comes a moment later has missed
    /// it anyway, and one that catches up reads persisted entries from the store, which holds them
    /// before they are announced.
    pub fn wants(&self, name: &'static str, session_key: Option<&str>, audience: Audience) -> bool {
        lock(&self.inner).reached(session_key, audience).any(|(_, s)| s.wants(name, session_key, audience))
    }

    /// Subscriber `id` also gets the events of session `key` (see [`Subscription::watch`]).
    pub fn watch(&self, id: u64, key: &str) {
        lock(&self.inner).watch(id, key);
    }

    /// Subscriber `id` no longer needs the events of session `key`.
    pub fn unwatch(&self, id: u64, key: &str) {
        lock(&self.inner).unwatch(id, key);
    }

    /// The sessions some subscriber watches now.
    pub fn watched_sessions(&self) -> Vec<String> {
        lock(&self.inner).watching.keys().cloned().collect()
    }

    /// Subscribes; events published from now on are delivered until the subscription is dropped.
    pub fn subscribe(self: &Arc<Self>, sub: Arc<dyn Subscriber>) -> Subscription {
        let id = self.next_sub.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner).subscribers.insert(id, sub);
        Subscription { hub: self.clone(), id }
    }

    /// Subscribes to the events of session `key` (and those of no session).
    pub fn subscribe_to(self: &Arc<Self>, key: &str, sub: Arc<dyn Subscriber>) -> Subscription {
        let subscription = self.subscribe(sub);
        subscription.watch(key);
        subscription
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Collect(Mutex<Vec<String>>);
    impl Subscriber for Collect {
        fn deliver(&self, ev: &Arc<BusEvent>) -> bool {
            lock(&self.0).push(ev.id.as_ref().map_or_else(|| ev.name.to_owned(), EventId::to_string));
            true
        }
    }

    #[test]
    fn ids_read_back_and_order_within_a_transcript() {
        for id in [EventId::message("s-1", Pos(0)), EventId::chat("s:1", Pos(42)), EventId::message("x", Pos(MAX_POS))]
        {
            assert_eq!(EventId::parse(&id.to_string()), Ok(id.clone()), "{id}");
        }
        let (m, c) = (EventId::message("s", Pos(7)), EventId::chat("s", Pos(7)));
        assert!(c.after(&m) && !m.after(&c) && EventId::message("s", Pos(8)).after(&c));
        assert!(!EventId::chat("t", Pos(9)).after(&m), "another transcript is not after");
        for bad in [
            "",
            "17",
            ":5",
            "s:",
            "s:-1",
            "s:+1",
            "s:1.2",
            "s:1.",
            "s:x",
            "s:99999999999999999999",
            "s:9223372036854775808",
        ] {
            let e = EventId::parse(bad).expect_err(bad);
            assert!(e.contains("is not an event id"), "{bad}: {e}");
        }
    }

    /// Takes only `chat` events.
    struct ChatOnly;
    impl Subscriber for ChatOnly {
        fn deliver(&self, _: &Arc<BusEvent>) -> bool {
            true
        }
        fn wants(&self, name: &'static str, _: Option<&str>, _: Audience) -> bool {
            name == "chat"
        }
    }

    #[test]
    fn wants_asks_only_the_subscribers_an_event_would_reach() {
        let hub = Arc::new(Hub::default());
        assert!(!hub.wants("chat", None, Audience::All), "no subscriber: nobody wants anything");
        let sub = hub.subscribe(Arc::new(ChatOnly));
        assert!(hub.wants("chat", None, Audience::All));
        assert!(!hub.wants("agent", None, Audience::All), "the subscriber said no");
        assert!(!hub.wants("chat", Some("k"), Audience::All), "a session's event reaches its watchers alone");
        assert!(hub.wants("chat", Some("k"), Audience::SessionsWatchers), "sessions.subscribe notices go to all");
        sub.watch("k");
        assert!(hub.wants("chat", Some("k"), Audience::All) && !hub.wants("chat", Some("other"), Audience::All));
        drop(sub);
        assert!(!hub.wants("chat", Some("k"), Audience::All), "a dropped subscriber wants nothing");
    }

    #[test]
    fn subscribers_get_events_until_dropped() {
        let hub = Arc::new(Hub::default());
        let c = Arc::new(Collect(Mutex::new(vec![])));
        let sub = hub.subscribe(c.clone());
        hub.publish_entry("chat", "k", &json!({}), Audience::All, Some(EventId::chat("s", Pos(1))));
        assert!(lock(&c.0).is_empty(), "a session's events go to the subscribers watching it");
        sub.watch("k");
        hub.publish_entry("chat", "k", &json!({}), Audience::All, Some(EventId::chat("s", Pos(2))));
        hub.publish("chat", Some("k"), json!({}), true, Audience::All);
        hub.publish("chat", Some("other"), json!({}), false, Audience::All);
        drop(sub);
        hub.publish("chat", Some("k"), json!({}), false, Audience::All);
        assert_eq!(*lock(&c.0), vec!["s:2.1".to_owned(), "chat".to_owned()]);
        let inner = lock(&hub.inner);
        assert!(inner.watching.is_empty() && inner.watched_by.is_empty(), "a dropped subscriber is forgotten");
    }
}
