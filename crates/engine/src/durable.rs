//! What the transcript itself says about a `chat.send` turn, so that a resent idempotency key is
//! recognised after any restart or crash. A turn with key `K` writes its user row keyed `K:user`,
//! then the run's rows chained below it; gateway-written replies (slash commands, hook blocks,
//! abort partials, panics) are keyed `K:assistant`. From the file alone:
//!
//! - a reply on disk → the turn is done (the client can fetch it);
//! - the user row (and maybe tool steps) with no reply, still at the leaf, resumed fewer than the
//!   allowed attempts (`resume_attempts`, 3 by default) → the run is resumed for that same row,
//!   each attempt recorded by a chained `pincer.turn-resumed` custom entry;
//! - otherwise it stays interrupted (as it does once marked so: out of attempts, or stopped before
//!   any reply was written).
//!
//! The gateway resumes such turns by itself (`crate::takeup`): at startup, every session whose leaf is
//! an unanswered turn; with replicas, a dead replica's turns on a survivor. A turn out of attempts
//! gets a chained `pincer.turn-interrupted` custom entry (not part of the LLM context) and a `chat`
//! error, and the session goes on with its next message.
//!
//! A message acknowledged while another turn of its session runs is recorded first (a chained
//! `pincer.turn-queued` custom entry with its text; `pincer.turn-dropped` if it ends without
//! running): after a restart, the ones that never started run in order, behind the resumed turn.

use crate::protocol::RunStatus;
use pincer_store::{NewEntry, StoreError, Transcripts, TranscriptsExt};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::path::Path;

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
/// How many times [`on_disk`] reads a turn whose place moves while it is read (a rewrite) before
/// it gives up.
const MOVING_READS: usize = 8;
/// Tail read at startup to find an unanswered turn at the leaf: first this much, at most the second.
const FIRST_TAIL: u64 = 16 * 1024;
const TAIL_WINDOW: u64 = 1024 * 1024;

/// A turn as the transcript has it.
#[derive(Debug, Clone, PartialEq)]
pub enum OnDisk {
    /// No row of this key.
    New,
    /// The reply is on disk: `ok`, `aborted`, `error` or `blocked`.
    Done(RunStatus),
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
fn reply_status(m: &Map<String, Value>) -> Option<RunStatus> {
    if m.get("role")?.as_str()? != "assistant" {
        return None;
    }
    if m.contains_key("openclawAbort") {
        return Some(RunStatus::Aborted);
    }
    if m.contains_key(pincer_agent::run::CLIENT_CALLS_FIELD) {
        return Some(RunStatus::Ok); // the turn handed its client's tool calls back: it is answered
    }
    match m.get("stopReason").and_then(Value::as_str) {
        Some("toolUse") => None,
        Some("error") => Some(RunStatus::Error),
        Some("aborted") => Some(RunStatus::Aborted),
        _ => Some(RunStatus::Ok),
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
    on_disk_at(store, path, run_id, attempts).map(|(state, _)| state)
}

/// [`on_disk`], and whether the turn still ends the session's branch (false for a turn the
/// session moved past; true for one resumable, or interrupted at the leaf: out of attempts, or
/// marked).
pub fn on_disk_at(
    store: &dyn Transcripts,
    path: &Path,
    run_id: &str,
    attempts: usize,
) -> Result<(OnDisk, bool), StoreError> {
    if let Some((e, _)) = store.find_keyed(path, &reply_key(run_id))? {
        return Ok((OnDisk::Done(message(&e).and_then(reply_status).unwrap_or(RunStatus::Ok)), false));
    }
    // The leaf is read first, then the turn: entries appended meanwhile (another message's queued
    // record, by this very process: the transcript's lock keeps out other processes only) come
    // after it, so the turn was at the leaf when the leaf is one of its entries. A rewrite
    // (`sessions.compact {maxLines}`) moves the user row: read again when it is not where it was.
    for _ in 0..MOVING_READS {
        let leaf = store.leaf(path)?;
        let Some((user, offset)) = store.find_keyed(path, &user_key(run_id))? else { return Ok((OnDisk::New, false)) };
        let Some(user_id) = user.get("id").and_then(Value::as_str) else { return Ok((OnDisk::Interrupted, false)) };
        if message(&user).is_some_and(|m| m.contains_key("openclawHookBlock")) {
            return Ok((OnDisk::Done(RunStatus::Blocked), false));
        }
        let entries = store.entries_from(path, offset, TURN_WINDOW)?;
        if entries.first().and_then(|e| e.get("id")).and_then(Value::as_str) != Some(user_id) {
            continue;
        }
        let (mut turn, mut resumed, mut marked) = (vec![user_id.to_owned()], 0, false);
        for e in entries.iter().skip(1) {
            let Some(parent) = e.get("parentId").and_then(Value::as_str) else { continue };
            if !turn.iter().any(|t| t == parent) {
                continue;
            }
            if let Some(m) = message(e) {
                if m.get("role").and_then(Value::as_str) == Some("user") {
                    break; // the next turn
                }
                if let Some(status) = reply_status(m) {
                    return Ok((OnDisk::Done(status), false));
                }
            }
            resumed += usize::from(custom_of(e, RESUMED) == Some(run_id));
            marked |= custom_of(e, INTERRUPTED) == Some(run_id);
            if let Some(id) = e.get("id").and_then(Value::as_str) {
                turn.push(id.to_owned());
            }
        }
        let at_leaf = leaf.is_some_and(|l| turn.contains(&l));
        let resumable = at_leaf && resumed < attempts && !marked;
        return Ok((if resumable { OnDisk::Resume(user) } else { OnDisk::Interrupted }, at_leaf));
    }
    Err(StoreError::Internal(format!(
        "{}: the transcript was rewritten while turn {run_id} was read; try again",
        path.display()
    )))
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
        // Interrupted markers on the way up: a turn marked so is not taken up (a marker for another
        // turn, chained here when that turn was found moved past, says nothing of this one).
        let mut marked = HashSet::new();
        while let Some(e) = at {
            marked.extend(custom_of(e, INTERRUPTED));
            if let Some(m) = message(e) {
                if reply_status(m).is_some() {
                    return Ok(None);
                }
                if m.get("role").and_then(Value::as_str) == Some("user") {
                    let key = m.get("idempotencyKey").and_then(Value::as_str).unwrap_or("");
                    return Ok(run_of_user_key(key).filter(|run| !marked.contains(run)).map(str::to_owned));
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

/// The tool calls of the context's last assistant message that have no result after it, in the
/// message's order (none when the context ends otherwise; with `tool_use_only`, also when that
/// message did not stop for its tools).
pub fn unanswered_calls(messages: &pincer_agent::Messages, tool_use_only: bool) -> Vec<Value> {
    let mut answered = HashSet::new();
    for m in messages.iter().rev() {
        let v = m.value();
        match v["role"].as_str() {
            Some("toolResult") => {
                answered.insert(v["toolCallId"].as_str().unwrap_or_default().to_owned());
            }
            Some("assistant") if !tool_use_only || v["stopReason"] == "toolUse" => {
                let blocks = v["content"].as_array().into_iter().flatten();
                return blocks
                    .filter(|b| b["type"] == "toolCall" && !answered.contains(b["id"].as_str().unwrap_or_default()))
                    .cloned()
                    .collect();
            }
            _ => break,
        }
    }
    Vec::new()
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
/// started has fewer than [`crate::state::MAX_QUEUED_PER_SESSION`] turns after its record (only the
/// ones ahead of it in the queue started), so a tail holding that many user rows holds every such
/// record (as does one holding the whole file, or [`TAIL_WINDOW`] at most).
pub fn queued_unstarted(store: &dyn Transcripts, path: &Path) -> Result<Vec<(String, Value)>, StoreError> {
    let mut window = FIRST_TAIL;
    let tail = loop {
        let tail = store.tail_entries(path, window)?;
        let whole = tail.first().is_some_and(|e| e["type"] == "session");
        let users = tail.iter().filter(|e| message(e).is_some_and(|m| m.get("role") == Some(&json!("user")))).count();
        if whole || users >= crate::state::MAX_QUEUED_PER_SESSION || window >= TAIL_WINDOW {
            break tail;
        }
        window *= 4;
    };
    // A turn's rows (user row, or a gateway reply) come after its record, so they are in the tail.
    let started: HashSet<&str> = (tail.iter().filter_map(message))
        .filter_map(|m| m.get("idempotencyKey")?.as_str())
        .filter_map(|k| run_of_user_key(k).or_else(|| run_of_reply_key(k)))
        .collect();
    // In the file's order: a drop cancels the records of its run before it, not a record of the
    // same key sent again after it (its client was told to send it again).
    let mut out: Vec<(String, Value)> = Vec::new();
    for e in &tail {
        if let Some(run_id) = custom_of(e, DROPPED) {
            out.retain(|(r, _)| r != run_id);
        } else if let Some(run_id) = custom_of(e, QUEUED).filter(|r| !started.contains(r)) {
            if !out.iter().any(|(r, _)| r == run_id) {
                out.push((run_id.to_owned(), e["data"].clone()));
            }
        }
    }
    Ok(out)
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

    /// Entries chained to a turn while it is read (records of messages queued behind it, appended
    /// by this very process: the transcript's lock does not keep them out) leave it at the leaf:
    /// the read never answers with a leaf newer than the entries it walked.
    #[test]
    fn a_turn_read_while_entries_are_chained_to_it_stays_resumable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let store = Store::new(StoreOptions::default());
        store.append(&path, msg("user", Some("k1:user"), None)).expect("append");
        let done = std::sync::atomic::AtomicBool::new(false);
        let misread = std::thread::scope(|scope| {
            scope.spawn(|| {
                for n in 0..500 {
                    store
                        .append(&path, marker("test.note", &format!("n{n}"), "chained below the turn"))
                        .expect("append");
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            let mut misread = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if !matches!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Resume(_)) {
                    misread += 1;
                }
            }
            misread
        });
        assert_eq!(misread, 0, "reads that took the turn for one the session moved past");
    }

    /// A drop cancels the records of its run before it only: the same key queued again after it
    /// (its client was told to send it again) runs after a restart.
    #[test]
    fn a_message_queued_again_after_its_drop_is_still_taken_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let store = Store::new(StoreOptions::default());
        let add = |e: NewEntry| store.append(&path, e).expect("append");
        add(msg("user", Some("k1:user"), None));
        add(queued_marker("q", "first try", &[]));
        add(marker(DROPPED, "q", "its hook could not decide"));
        assert_eq!(queued_unstarted(&store, &path).expect("read"), vec![], "dropped");
        add(queued_marker("q", "second try", &[]));
        let queued = queued_unstarted(&store, &path).expect("read");
        assert_eq!(
            queued.iter().map(|(r, d)| (r.as_str(), d["text"].clone())).collect::<Vec<_>>(),
            [("q", json!("second try"))]
        );
    }

    /// A marker for a turn found moved past is chained where the session stands, below a later
    /// turn: it says nothing of that turn, which is still taken up.
    #[test]
    fn a_marker_for_another_turn_does_not_hide_the_unanswered_one_at_the_leaf() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let store = Store::new(StoreOptions::default());
        let add = |e: NewEntry| store.append(&path, e).expect("append");
        add(msg("user", Some("x:user"), None));
        add(msg("user", Some("y:user"), None));
        add(marker(INTERRUPTED, "x", "moved past"));
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read").as_deref(), Some("y"));
        add(marker(INTERRUPTED, "y", "out of attempts"));
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read"), None, "its own marker");
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
        add(marker(RESUMED, "k1", "test"));
        assert!(matches!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Resume(_)), "one attempt left");
        add(marker(RESUMED, "k1", "test"));
        assert_eq!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Interrupted, "out of attempts");
        add(msg("assistant", None, Some("stop")));
        assert_eq!(on_disk(&store, &path, "k1", 2).expect("read"), OnDisk::Done(RunStatus::Ok));
        // A turn marked interrupted is neither taken up nor run again for its key.
        add(msg("user", Some("k0:user"), None));
        add(marker(INTERRUPTED, "k0", "test"));
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read"), None, "marked once");
        assert_eq!(on_disk(&store, &path, "k0", 2).expect("read"), OnDisk::Interrupted, "marked");
        assert_eq!(unanswered_at_leaf(&store, &path).expect("read"), None);
        // A turn the session moved past stays interrupted; an abort partial answers it.
        add(msg("user", Some("k2:user"), None));
        add(msg("user", Some("k3:user"), None));
        assert_eq!(on_disk(&store, &path, "k2", 2).expect("read"), OnDisk::Interrupted);
        add(msg("assistant", Some("k3:assistant"), Some("stop")));
        assert_eq!(on_disk(&store, &path, "k3", 2).expect("read"), OnDisk::Done(RunStatus::Ok));
    }
}
