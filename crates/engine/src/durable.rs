//! What the transcript itself says about a `chat.send` turn, so that a resent idempotency key is
//! recognised after any restart or crash. A turn with key `K` writes its user row keyed `K:user`,
//! then the run's rows chained below it; gateway-written replies (slash commands, hook blocks,
//! abort partials, panics) are keyed `K:assistant`. From the file alone:
//!
//! - a reply on disk → the turn is done (the client can fetch it);
//! - the user row (and maybe tool steps) with no reply, still at the leaf, resumed fewer than the
//!   allowed attempts (`resume_attempts`, 3 by default) → the run is resumed for that same row,
//!   each attempt recorded by a chained `pincer.turn-resumed` custom entry;
//! - otherwise it stays interrupted.
//!
//! The gateway resumes such turns by itself ([`recover`]): at startup, every session whose leaf is
//! an unanswered turn; with replicas, a dead replica's turns on a survivor. A turn out of attempts
//! gets a chained `pincer.turn-interrupted` custom entry (not part of the LLM context) and a `chat`
//! error, and the session goes on with its next message.
//!
//! A message acknowledged while another turn of its session runs is recorded first (a chained
//! `pincer.turn-queued` custom entry with its text; `pincer.turn-dropped` if it ends without
//! running): after a restart, the ones that never started run in order, behind the resumed turn.

use crate::sessions::SessionRef;
use crate::state::{Gateway, TurnSlot};
use pincer_store::{NewEntry, StoreError, Transcripts};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// `customType` of the marker written at startup for a turn left without its reply.
pub const INTERRUPTED: &str = "pincer.turn-interrupted";
/// `customType` of the marker written when such a turn is run again.
pub const RESUMED: &str = "pincer.turn-resumed";
/// `customType` of the record of a turn acknowledged while another turn of its session runs: its
/// text (and images), written before the ack, so that a crash before its user row is written
/// does not lose it ([`queued_unstarted`]).
pub const QUEUED: &str = "pincer.turn-queued";
/// `customType` of the record that a queued turn ended without running (aborted while it waited,
/// or refused once its turn came): it is not to be run after a restart.
pub const DROPPED: &str = "pincer.turn-dropped";
/// Most of the file read after a turn's user row to find its reply.
const TURN_WINDOW: u64 = 64 * 1024 * 1024;
/// Tail read at startup to find an unanswered turn at the leaf: first this much, at most the second.
const FIRST_TAIL: u64 = 16 * 1024;
const TAIL_WINDOW: u64 = 1024 * 1024;

/// A turn as the transcript has it.
#[derive(Debug, Clone, PartialEq)]
pub enum OnDisk {
    /// No row of this key.
    New,
    /// The reply is on disk: `ok`, `aborted`, `error` or `blocked`.
    Done(&'static str),
    /// Written without a reply, at the leaf, with attempts left: run it again for this user entry.
    Resume(Value),
    /// Written without a reply, and the session moved on or it was out of attempts.
    Interrupted,
}

/// The idempotency key of turn `run_id`'s user row.
pub fn user_key(run_id: &str) -> String {
    format!("{run_id}:user")
}

/// The idempotency key of a gateway-written reply that ends turn `run_id`.
pub fn reply_key(run_id: &str) -> String {
    format!("{run_id}:assistant")
}

/// The turn a user row's idempotency key names ([`user_key`] read back).
pub fn run_of_user_key(key: &str) -> Option<&str> {
    key.strip_suffix(":user")
}

/// The turn a reply's idempotency key names ([`reply_key`] read back).
pub fn run_of_reply_key(key: &str) -> Option<&str> {
    key.strip_suffix(":assistant")
}

fn message(e: &Value) -> Option<&Map<String, Value>> {
    (e.get("type")?.as_str()? == "message").then(|| e.get("message")?.as_object())?
}

fn custom_of<'a>(e: &'a Value, custom_type: &str) -> Option<&'a str> {
    if e.get("type")?.as_str()? != "custom" || e.get("customType")?.as_str()? != custom_type {
        return None;
    }
    e.get("data")?.get("runId")?.as_str()
}

/// How a reply row ends its turn, or `None` when the run goes on after it (a tool step).
fn reply_status(m: &Map<String, Value>) -> Option<&'static str> {
    if m.get("role")?.as_str()? != "assistant" {
        return None;
    }
    if m.contains_key("openclawAbort") {
        return Some("aborted");
    }
    if m.contains_key(pincer_agent::run::CLIENT_CALLS_FIELD) {
        return Some("ok"); // the turn handed its client's tool calls back: it is answered
    }
    match m.get("stopReason").and_then(Value::as_str) {
        Some("toolUse") => None,
        Some("error") => Some("error"),
        Some("aborted") => Some("aborted"),
        _ => Some("ok"),
    }
}

/// True when the store knows without blocking that the transcript holds nothing of turn `run_id`
/// (the common case, answered on the async thread); false: ask [`on_disk`].
pub fn known_new(store: &dyn Transcripts, path: &Path, run_id: &str) -> bool {
    store.known_unkeyed(path, &[&reply_key(run_id), &user_key(run_id)])
}

/// Reads the state of turn `run_id` from the transcript; `attempts`: how many times a turn may be
/// resumed.
pub fn on_disk(store: &dyn Transcripts, path: &Path, run_id: &str, attempts: usize) -> Result<OnDisk, StoreError> {
    if let Some((e, _)) = store.find_keyed(path, &reply_key(run_id))? {
        return Ok(OnDisk::Done(message(&e).and_then(reply_status).unwrap_or("ok")));
    }
    let Some((user, offset)) = store.find_keyed(path, &user_key(run_id))? else { return Ok(OnDisk::New) };
    let Some(user_id) = user.get("id").and_then(Value::as_str) else { return Ok(OnDisk::Interrupted) };
    if message(&user).is_some_and(|m| m.contains_key("openclawHookBlock")) {
        return Ok(OnDisk::Done("blocked"));
    }
    let mut turn: Vec<String> = vec![user_id.to_owned()];
    let mut resumed = 0;
    for e in store.entries_from(path, offset, TURN_WINDOW)?.iter().skip(1) {
        let Some(parent) = e.get("parentId").and_then(Value::as_str) else { continue };
        if !turn.iter().any(|t| t == parent) {
            continue;
        }
        if let Some(m) = message(e) {
            if m.get("role").and_then(Value::as_str) == Some("user") {
                break; // the next turn
            }
            if let Some(status) = reply_status(m) {
                return Ok(OnDisk::Done(status));
            }
        }
        resumed += usize::from(custom_of(e, RESUMED) == Some(run_id));
        if let Some(id) = e.get("id").and_then(Value::as_str) {
            turn.push(id.to_owned());
        }
    }
    let at_leaf = store.leaf(path)?.is_some_and(|l| turn.last() == Some(&l));
    Ok(if at_leaf && resumed < attempts { OnDisk::Resume(user) } else { OnDisk::Interrupted })
}

/// The idempotency key of the first client tool result a stateless client's turn writes when it
/// goes on after its tools ran (no user row): the row its reply is found from, like [`user_key`].
pub fn results_key(run_id: &str) -> String {
    format!("{run_id}:results")
}

/// The assistant messages of a finished turn `run_id`, in order (its tool steps, then the reply);
/// empty when the transcript has no reply for it.
pub fn replies(store: &dyn Transcripts, path: &Path, run_id: &str) -> Result<Vec<Value>, StoreError> {
    Ok(reply_entries(store, path, run_id)?.iter().filter_map(message).map(|m| Value::Object(m.clone())).collect())
}

/// [`replies`] as the entries that hold them (with their ids): the gateway-written reply of
/// `run_id`, or the assistant rows chained below its user row ([`user_key`]) or its first client
/// tool result ([`results_key`]) up to the one that ends the turn.
pub fn reply_entries(store: &dyn Transcripts, path: &Path, run_id: &str) -> Result<Vec<Value>, StoreError> {
    if let Some((e, _)) = store.find_keyed(path, &reply_key(run_id))? {
        return Ok(message(&e).is_some().then_some(e).into_iter().collect());
    }
    let anchor = match store.find_keyed(path, &user_key(run_id))? {
        Some(a) => a,
        None => match store.find_keyed(path, &results_key(run_id))? {
            Some(a) => a,
            None => return Ok(vec![]),
        },
    };
    let (first, offset) = anchor;
    let Some(first_id) = first.get("id").and_then(Value::as_str) else { return Ok(vec![]) };
    let mut turn: Vec<String> = vec![first_id.to_owned()];
    let mut out = Vec::new();
    for e in store.entries_from(path, offset, TURN_WINDOW)?.into_iter().skip(1) {
        let Some(parent) = e.get("parentId").and_then(Value::as_str) else { continue };
        if !turn.iter().any(|t| t == parent) {
            continue;
        }
        let id = e.get("id").and_then(Value::as_str).map(str::to_owned);
        if let Some(m) = message(&e) {
            match m.get("role").and_then(Value::as_str) {
                Some("user") => break,
                Some("assistant") => {
                    let done = reply_status(m).is_some();
                    out.push(e);
                    if done {
                        return Ok(out);
                    }
                }
                _ => {}
            }
        }
        if let Some(id) = id {
            turn.push(id);
        }
    }
    Ok(vec![])
}

/// The run id of an unanswered `chat.send` turn ending at the file's leaf, if there is one. Reads a
/// small tail first and a larger one only while the leaf's chain leaves it.
pub fn unanswered_at_leaf(store: &dyn Transcripts, path: &Path) -> Result<Option<String>, StoreError> {
    let Some(leaf) = store.leaf(path)? else { return Ok(None) };
    let mut window = FIRST_TAIL;
    loop {
        let tail = store.tail_entries(path, window)?;
        let by_id = |id: &str| tail.iter().rev().find(|e| e.get("id").and_then(Value::as_str) == Some(id));
        let mut at = by_id(&leaf);
        while let Some(e) = at {
            if custom_of(e, INTERRUPTED).is_some() {
                return Ok(None); // marked already
            }
            if let Some(m) = message(e) {
                if reply_status(m).is_some() {
                    return Ok(None);
                }
                if m.get("role").and_then(Value::as_str) == Some("user") {
                    let key = m.get("idempotencyKey").and_then(Value::as_str).unwrap_or("");
                    return Ok(run_of_user_key(key).map(str::to_owned));
                }
            }
            at = e.get("parentId").and_then(Value::as_str).and_then(by_id);
        }
        if window >= TAIL_WINDOW {
            return Ok(None);
        }
        window *= 4;
    }
}

/// A marker custom entry for turn `run_id`.
pub fn marker(custom_type: &str, run_id: &str, reason: &str) -> NewEntry {
    let mut payload = Map::new();
    payload.insert("customType".into(), json!(custom_type));
    payload.insert("data".into(), json!({"runId": run_id, "reason": reason, "at": pincer_pi::now_ms()}));
    NewEntry::of("custom", payload)
}

/// The record of turn `run_id`, queued with `text` and `images` ([`QUEUED`]).
pub fn queued_marker(run_id: &str, text: &str, images: &[Value]) -> NewEntry {
    let mut payload = Map::new();
    payload.insert("customType".into(), json!(QUEUED));
    let mut data = json!({"runId": run_id, "text": text, "at": pincer_pi::now_ms()});
    if !images.is_empty() {
        data["images"] = json!(images);
    }
    payload.insert("data".into(), data);
    NewEntry::of("custom", payload)
}

/// The turns queued in the transcript's tail ([`QUEUED`]) that never started (no row of their key
/// after the record, not [`DROPPED`]), oldest first: `(run id, the record's data)`. Blocking.
///
/// Reads a small tail first and more only while it might miss a record: a queued turn that never
/// started has fewer than [`crate::turn::MAX_QUEUED_PER_SESSION`] turns after its record (only the
/// ones ahead of it in the queue started), so a tail holding that many user rows holds every such
/// record (as does one holding the whole file, or [`TAIL_WINDOW`] at most).
pub fn queued_unstarted(store: &dyn Transcripts, path: &Path) -> Result<Vec<(String, Value)>, StoreError> {
    let mut window = FIRST_TAIL;
    let tail = loop {
        let tail = store.tail_entries(path, window)?;
        let whole = tail.first().is_some_and(|e| e["type"] == "session");
        let users = tail.iter().filter(|e| message(e).is_some_and(|m| m.get("role") == Some(&json!("user")))).count();
        if whole || users >= crate::turn::MAX_QUEUED_PER_SESSION || window >= TAIL_WINDOW {
            break tail;
        }
        window *= 4;
    };
    let dropped: HashSet<&str> = tail.iter().filter_map(|e| custom_of(e, DROPPED)).collect();
    // A turn's rows (user row, or a gateway reply) come after its record, so they are in the tail.
    let started: HashSet<&str> = (tail.iter().filter_map(message))
        .filter_map(|m| m.get("idempotencyKey")?.as_str())
        .filter_map(|k| run_of_user_key(k).or_else(|| run_of_reply_key(k)))
        .collect();
    let mut out: Vec<(String, Value)> = Vec::new();
    for e in &tail {
        let Some(run_id) = custom_of(e, QUEUED) else { continue };
        if dropped.contains(run_id) || started.contains(run_id) || out.iter().any(|(r, _)| r == run_id) {
            continue;
        }
        out.push((run_id.to_owned(), e["data"].clone()));
    }
    Ok(out)
}

/// In the background after startup: takes up this replica's turns of every session
/// ([`take_up`]). Each session is looked at in its queue, so a turn resumed meanwhile is left alone.
pub fn recover_interrupted(gw: &Arc<Gateway>) {
    let gw = gw.clone();
    // Taken now, before the first connection is served; new turns wait for it to end.
    let recovering = gw.recovering.clone().try_write_owned();
    tokio::spawn(async move {
        let _recovering = recovering;
        gw.mcp.started().await;
        let list = {
            let gw = gw.clone();
            tokio::task::spawn_blocking(move || gw.sessions.list(None)).await
        };
        let Ok(Ok(sessions)) = list else { return };
        let looked = sessions.len();
        let mut all = TakenUp::default();
        for s in sessions {
            if let Ok(t) = take_up(&gw, s, Whose::Mine, |_| {}).await {
                all.resumed += t.resumed;
                all.gave_up += t.gave_up;
                all.queued.extend(t.queued);
            }
        }
        let TakenUp { resumed, gave_up, queued, .. } = all;
        let queued = queued.len();
        tracing::info!(
            "startup check done: {looked} session(s), {resumed} interrupted turn(s) resumed, {gave_up} out of attempts, \
             {queued} queued message(s) taken up"
        );
    });
}

/// Whose turns [`take_up`] takes.
pub enum Whose<'a> {
    /// At startup: this replica's own, and those of runs no replica recorded ([`mine`]).
    Mine,
    /// The runs of a dead replica that this replica claimed.
    Claimed(&'a HashSet<String>),
}

impl Whose<'_> {
    async fn take(&self, gw: &Arc<Gateway>, s: &SessionRef, run_id: &str) -> bool {
        match self {
            Whose::Mine => mine(gw, s, run_id).await,
            Whose::Claimed(runs) => runs.contains(run_id),
        }
    }

    /// Why such a turn has no reply.
    fn why(&self) -> &'static str {
        match self {
            Whose::Mine => "the gateway stopped before this turn's reply was written",
            Whose::Claimed(_) => "the replica running this turn stopped before its reply was written",
        }
    }
}

/// What [`take_up`] did.
#[derive(Debug, Default)]
pub struct TakenUp {
    pub resumed: usize,
    pub gave_up: usize,
    /// The queued turns that will run, in order, in the background.
    pub queued: Vec<String>,
}

/// Takes up session `s`'s turns that `whose` says are this replica's: first the unanswered turn at
/// its leaf ([`recover`]), then, in the background and in their order, the turns queued behind it
/// that never started ([`queued_unstarted`]), each in its turn of the session's queue; `started`
/// is told each queued run once it was started (or could not be). `Err`: the store could not be
/// read now.
pub async fn take_up(
    gw: &Arc<Gateway>,
    s: SessionRef,
    whose: Whose<'_>,
    started: impl Fn(&str) + Send + 'static,
) -> Result<TakenUp, ()> {
    let mut out = TakenUp::default();
    if let Some((run_id, slot)) = unanswered(gw, &s).await? {
        if whose.take(gw, &s, &run_id).await {
            match recover(gw, &s, &run_id, slot, whose.why()).await? {
                Recovered::Resumed => out.resumed += 1,
                Recovered::GaveUp => out.gave_up += 1,
                Recovered::Nothing => {}
            }
        }
    }
    let (store, path) = (gw.store.clone(), s.path.clone());
    let queued = match tokio::task::spawn_blocking(move || queued_unstarted(store.as_ref(), &path)).await {
        Ok(Ok(queued)) => queued,
        _ => return Err(()),
    };
    let mut ours = Vec::new();
    for (run_id, data) in queued {
        if whose.take(gw, &s, &run_id).await {
            ours.push((run_id, data));
        }
    }
    out.queued = ours.iter().map(|(run_id, _)| run_id.clone()).collect();
    if !ours.is_empty() {
        tokio::spawn(run_queued(gw.clone(), s, ours, started));
    }
    Ok(out)
}

/// With replicas, whether turn `run_id` is this replica's to take up at startup: a run another
/// replica recorded is that replica's, live or not (if it died, a survivor takes the run over);
/// this scan is for turns of this replica's own previous life, and of runs no replica recorded.
async fn mine(gw: &Arc<Gateway>, s: &SessionRef, run_id: &str) -> bool {
    let (Some(pg), Some(me)) = (&gw.pg, gw.replica_id()) else { return true };
    match pg.run_replica(run_id.to_owned()).await {
        Ok(Some(owner)) => owner == me,
        Ok(None) => true,
        Err(e) => {
            tracing::warn!(session = %s.key, "cannot check an unanswered turn's run: {e}");
            false
        }
    }
}

/// Runs the turns queued in session `s` before a restart or a replica's death
/// ([`queued_unstarted`]), one after the other in their order: each waits for the session's queue
/// (behind a turn resumed there first); `started` is told each one once it was started.
async fn run_queued(gw: Arc<Gateway>, s: SessionRef, queued: Vec<(String, Value)>, started: impl Fn(&str)) {
    let cancel = gw.stopping();
    for (run_id, data) in queued {
        let Ok(slot) = gw.turn_slot(&s.key, &cancel).await else { return };
        tracing::warn!(session = %s.key, run = %run_id, "running a message queued before its gateway stopped");
        if let Err(e) = crate::turn::run_queued(&gw, s.clone(), &run_id, &data, slot).await {
            tracing::warn!(session = %s.key, run = %run_id, "cannot run a queued message: {}", e.message);
        }
        started(&run_id);
    }
}

/// The run id of the unanswered turn at session `s`'s leaf, read in its queue, with the queue slot
/// still held (for [`recover`]); `None` when there is none, or when the session was reset or deleted
/// meanwhile; `Err` when it could not be read now.
pub async fn unanswered(gw: &Arc<Gateway>, s: &SessionRef) -> Result<Option<(String, TurnSlot)>, ()> {
    let cancel = gw.stopping();
    let slot = gw.turn_slot(&s.key, &cancel).await.map_err(drop)?;
    if slot.moved(gw, s).await {
        return Ok(None); // the turn went aside with its transcript
    }
    let (store, path) = (gw.store.clone(), s.path.clone());
    match tokio::task::spawn_blocking(move || unanswered_at_leaf(store.as_ref(), &path)).await {
        Ok(Ok(found)) => Ok(found.map(|run_id| (run_id, slot))),
        _ => Err(()),
    }
}

/// What [`recover`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovered {
    /// The turn runs again (or was already running again).
    Resumed,
    /// Out of attempts: marked interrupted and announced.
    GaveUp,
    /// Answered or moved past meanwhile.
    Nothing,
}

/// Takes up turn `run_id` of session `s`, unanswered at its leaf, interrupted because `why`, in the
/// session's queue `slot` (from [`unanswered`]): runs it again from where the transcript stands
/// ([`crate::turn::resume`], keeping the slot) while it has attempts left, else marks it
/// interrupted (a chained marker, then a `chat` error). `Err`: the store could not be asked; try
/// again later.
pub async fn recover(
    gw: &Arc<Gateway>,
    s: &SessionRef,
    run_id: &str,
    slot: TurnSlot,
    why: &str,
) -> Result<Recovered, ()> {
    let attempts = gw.settings.resume_attempts;
    let (store, path, id) = (gw.store.clone(), s.path.clone(), run_id.to_owned());
    let state = match tokio::task::spawn_blocking(move || on_disk(store.as_ref(), &path, &id, attempts)).await {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => {
            tracing::warn!(session = %s.key, run = %run_id, "cannot read an interrupted turn: {e}");
            return Err(());
        }
        Err(_) => return Err(()),
    };
    match state {
        OnDisk::Resume(user) => match crate::turn::resume(gw, s.clone(), run_id, &user, slot).await {
            Ok(_) => {
                tracing::warn!(session = %s.key, run = %run_id, "resuming a turn interrupted before its reply: {why}");
                Ok(Recovered::Resumed)
            }
            Err(e) => {
                tracing::warn!(session = %s.key, run = %run_id, "cannot resume an interrupted turn: {}", e.message);
                Err(())
            }
        },
        OnDisk::Interrupted => {
            let reason = format!("{why}; it could not be completed after {attempts} attempt(s): send it again");
            match gw.append(s, marker(INTERRUPTED, run_id, &reason)).await {
                Ok(a) => {
                    tracing::warn!(session = %s.key, run = %run_id, "an interrupted turn is out of attempts");
                    // Clients may be here already (or, with replicas, watching on another one).
                    crate::relay::publish_interrupted(gw, s, run_id, &reason, a.pos);
                    Ok(Recovered::GaveUp)
                }
                Err(e) => {
                    tracing::warn!(session = %s.key, "cannot mark an interrupted turn: {e}");
                    Err(())
                }
            }
        }
        OnDisk::New | OnDisk::Done(_) => Ok(Recovered::Nothing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pincer_store::{Store, StoreOptions};

    fn msg(role: &str, key: Option<&str>, stop: Option<&str>) -> NewEntry {
        let mut m = json!({"role": role, "content": [{"type": "text", "text": "x"}], "timestamp": 1});
        if let Some(k) = key {
            m["idempotencyKey"] = json!(k);
        }
        if let Some(s) = stop {
            m["stopReason"] = json!(s);
        }
        NewEntry::message(m)
    }

    #[test]
    fn a_turn_is_read_back_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let store = Store::new(StoreOptions::default());
        let add = |e: NewEntry| store.append(&path, e).expect("append");
        assert_eq!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::New);
        add(msg("user", Some("k1:user"), None));
        assert!(matches!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Resume(_)));
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read").as_deref(), Some("k1"));
        // A tool step is not a reply: still unanswered, still at the leaf.
        add(msg("assistant", None, Some("toolUse")));
        add(msg("toolResult", None, None));
        assert!(matches!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Resume(_)));
        add(marker(INTERRUPTED, "k1", "test"));
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read"), None, "marked once");
        add(marker(RESUMED, "k1", "test"));
        assert!(matches!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Resume(_)), "one attempt left");
        add(marker(RESUMED, "k1", "test"));
        assert_eq!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Interrupted, "out of attempts");
        add(msg("assistant", None, Some("stop")));
        assert_eq!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Done("ok"));
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read"), None);
        // A turn the session moved past stays interrupted; an abort partial answers it.
        add(msg("user", Some("k2:user"), None));
        add(msg("user", Some("k3:user"), None));
        assert_eq!(on_disk(&store, &path, "k2", 2).expect("read"), OnDisk::Interrupted);
        add(msg("assistant", Some("k3:assistant"), Some("stop")));
        assert_eq!(on_disk(&store, &path, "k3", 2).expect("read"), OnDisk::Done("ok"));
    }
}
