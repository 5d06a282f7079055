//! Live events of other replicas (the PostgreSQL store only). Each replica announces its own
//! appends as it writes them; this task announces the others': for every session some local
//! client watches, it reads the rows after the last seq it has seen and publishes them on the hub
//! as this replica's own appends are published (`session.message` for each message, and a `chat`
//! final for each reply that ends a run, under the run id of the user row it answers), under the
//! rows' durable ids; [`render`] is the one rendering of rows, which catch-up replays too. A
//! notification (`pg_notify` of `<file>:<seq>` on commit) only wakes it; it also looks every
//! [`POLL`], and everything after a reconnect of the listener, so a lost notification costs
//! latency, never an event. Rows this replica wrote are skipped (the store remembers them).
//!
//! It also keeps this replica's rows of the `runs` table beating, aborts local runs another
//! replica's `chat.abort` asked for, and takes over the runs of a replica that stopped beating:
//! their turns are marked interrupted within [`STALE_AFTER`] plus a [`HEARTBEAT`] or two.

use crate::hub::{Audience, EventId};
use crate::protocol::{ChatEnd, ChatEvent, ChatState};
use crate::sessions::SessionRef;
use crate::state::Engine;
use pincer_pg::watch::Wake;
use pincer_pg::PgStore;
use pincer_store::Pos;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How often watched sessions are checked without a notification.
pub const POLL: Duration = Duration::from_millis(1000);

/// Rows read per session per look.
const BATCH: i64 = 500;

/// One watched session: where it is and how far it was announced.
struct Watched {
    session: SessionRef,
    file: String,
    last_seq: i64,
    /// The run of the last user row seen (its key without `:user`).
    run: Option<String>,
}

/// Starts the relay when the store is PostgreSQL; it stops with the gateway.
pub fn start(gw: &Arc<Engine>) {
    let Some(pg) = gw.pg.clone() else { return };
    start_heartbeat(gw, pg.clone());
    let stop = gw.shutdown.clone();
    let wakes = pg.listen(stop.child_token());
    let mut rx = wakes.subscribe();
    let gw = gw.clone();
    tokio::spawn(async move {
        let mut watched: HashMap<String, Watched> = HashMap::new();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let only: Option<String> = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    refresh(&gw, &pg, &mut watched, None).await;
                    None
                }
                w = rx.recv() => match w {
                    Ok(Wake::Abort { run_id, origin }) => {
                        if let Some(r) = gw.run(&run_id) {
                            r.abort(crate::abort::origin_named(&origin));
                        }
                        continue;
                    }
                    Ok(Wake::Appended { file, seq }) => {
                        if !watched.values().any(|w| w.file == file) {
                            // Maybe a session a client began to watch since the last look.
                            refresh(&gw, &pg, &mut watched, Some((&file, seq))).await;
                        }
                        Some(file)
                    }
                    Ok(Wake::All) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            };
            for w in watched.values_mut() {
                if only.as_ref().is_none_or(|f| *f == w.file) {
                    catch_up(&gw, &pg, w).await;
                }
            }
        }
    });
}

/// How often this replica beats for its runs (and looks for aborts and dead replicas' runs).
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// A replica silent this long is taken for dead: a survivor takes its runs over.
pub const STALE_AFTER: Duration = Duration::from_millis(2500);

/// Beats for this replica's runs, aborts those other replicas asked to, and marks the turns of
/// runs whose replica stopped beating as interrupted (persisted, chained, announced), once each.
fn start_heartbeat(gw: &Arc<Engine>, pg: PgStore) {
    let Some(replica) = gw.replica_id().map(str::to_owned) else { return };
    let gw = gw.clone();
    let stop = gw.shutdown.clone();
    // Runs this replica claimed from a dead one and is still taking over (run → session key,
    // whether a takeover of its session runs now): beaten as its own until each is started here
    // or found to need nothing, so that if this replica dies too meanwhile another survivor
    // claims them in turn; a takeover that failed is tried again.
    let claimed: Claimed = Arc::default();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut mine: Vec<String> = gw.all_runs().iter().map(|r| r.run_id.clone()).collect();
            mine.extend(pincer_pi::lock(&claimed).keys().cloned());
            match pg.heartbeat(replica.clone(), mine).await {
                Ok(aborts) => {
                    for (id, origin) in aborts {
                        if let Some(r) = gw.run(&id) {
                            r.abort(crate::abort::origin_named(&origin));
                        }
                    }
                }
                Err(e) => tracing::debug!("heartbeat: {e}"),
            }
            let stale = pg.claim_stale_runs(replica.clone(), STALE_AFTER).await.unwrap_or_default();
            let mut runs = pincer_pi::lock(&claimed);
            runs.extend(stale.into_iter().map(|(run_id, key)| (run_id, (key, false))));
            // One takeover per session at a time, with all its claimed runs: its turns run in order.
            let busy: HashSet<String> = runs.values().filter(|(_, busy)| *busy).map(|(k, _)| k.clone()).collect();
            let mut sessions: HashMap<String, HashSet<String>> = HashMap::new();
            for (run_id, (key, taken)) in runs.iter_mut().filter(|(_, (key, _))| !busy.contains(key)) {
                *taken = true;
                sessions.entry(key.clone()).or_default().insert(run_id.clone());
            }
            for (key, ids) in sessions {
                let (gw2, claimed) = (gw.clone(), claimed.clone());
                tokio::spawn(async move { take_over(&gw2, &key, ids, claimed).await });
            }
        }
    });
}

/// Runs claimed from dead replicas and not yet taken over: run → (session key, whether a takeover
/// of its session runs now).
type Claimed = Arc<std::sync::Mutex<HashMap<String, (String, bool)>>>;

/// The runs `ids` of session `key`, whose replica died (claimed by this one): the session's
/// turns among them are taken up here ([`crate::takeup::take_up`]: the unanswered one at the leaf
/// resumed while it has attempts left, else marked interrupted; then the queued ones, in order);
/// each is let go of once started here or found to need nothing (the next heartbeat drops its
/// row). When the store failed, the runs not yet taken are tried again.
async fn take_over(gw: &Arc<Engine>, key: &str, ids: HashSet<String>, claimed: Claimed) {
    let taken = match gw.session(key, false).await {
        Ok(Some(s)) => {
            let claimed = claimed.clone();
            let started = move |run_id: &str| drop(pincer_pi::lock(&claimed).remove(run_id));
            crate::takeup::take_up(gw, s, crate::takeup::Whose::Claimed(&ids), started).await
        }
        Ok(None) => Ok(crate::takeup::TakenUp::default()),
        Err(_) => Err(()),
    };
    let mut runs = pincer_pi::lock(&claimed);
    match taken {
        // The queued runs are let go of as they start; the others now.
        Ok(t) => runs.retain(|id, _| !ids.contains(id) || t.queued.contains(id)),
        // Tried again at the next heartbeat.
        Err(()) => {
            for (id, (_, busy)) in runs.iter_mut() {
                if ids.contains(id) {
                    *busy = false;
                }
            }
        }
    }
}

/// Follows the sessions local clients watch now: a new one from its current end on, or from just
/// before the row `woke` names (the wake-up that made it look).
async fn refresh(gw: &Arc<Engine>, pg: &PgStore, watched: &mut HashMap<String, Watched>, woke: Option<(&str, i64)>) {
    let keys = gw.hub.watched_sessions();
    watched.retain(|k, _| keys.contains(k));
    let gw2 = gw.clone();
    let resolved = gw2
        .index(move |s| {
            Ok::<_, crate::error::EngineError>(
                keys.iter().filter_map(|k| s.resolve(k, false).ok().flatten()).collect::<Vec<_>>(),
            )
        })
        .await
        .unwrap_or_default();
    let mut fresh = Vec::new();
    for s in resolved {
        let file = pg.name(&s.path);
        match watched.get_mut(&s.key) {
            // Same transcript: keep going from where it was.
            Some(w) if w.file == file => w.session = s,
            _ => fresh.push((s, file)),
        }
    }
    if fresh.is_empty() {
        return;
    }
    let files: Vec<String> = fresh.iter().map(|(_, f)| f.clone()).collect();
    let Ok(seqs) = pg.last_seqs(files).await else { return };
    for (s, file) in fresh {
        let mut last_seq = seqs.get(&file).copied().unwrap_or(0);
        if let Some((_, seq)) = woke.filter(|(f, _)| *f == file) {
            last_seq = last_seq.min(seq - 1);
        }
        // A catch-up read the rows up to here: what came after must be announced.
        if let Some(seq) = gw.take_relay_from(&s.key) {
            last_seq = last_seq.min(pincer_pg::seq(seq));
        }
        watched.insert(s.key.clone(), Watched { session: s, file, last_seq, run: None });
    }
}

/// Announces the rows of one session after its last seen seq.
async fn catch_up(gw: &Arc<Engine>, pg: &PgStore, w: &mut Watched) {
    loop {
        let rows = match pg.entries_after_async(w.file.clone(), w.last_seq, BATCH).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(session = %w.session.key, "cannot read other replicas' rows: {e}");
                return;
            }
        };
        let n = rows.len() as i64;
        for (seq, entry) in rows {
            w.last_seq = seq;
            if pg.take_own(&w.file, seq) {
                continue;
            }
            announce(gw, w, pincer_pg::pos(seq), &entry);
        }
        if n < BATCH {
            return;
        }
    }
}

/// Publishes one row written by another replica as this replica publishes its own.
fn announce(gw: &Engine, w: &mut Watched, pos: Pos, entry: &Value) {
    for ev in render(gw, &w.session, pos, entry, &mut w.run) {
        gw.hub.publish_entry(ev.name, &w.session.key, &ev.payload, ev.audience, Some(ev.id));
    }
}

/// OpenClaw's `exec.approval.requested` / `exec.approval.resolved` for an approval request or
/// decision row ([`crate::approvals::REQUEST`], [`crate::approvals::DECISION`]), as the replica
/// whose call waits announced them: clients of the other replicas see the wait live too.
fn approval_event(session: &SessionRef, pos: Pos, entry: &Value) -> Option<EntryEvent> {
    let data = &entry["data"];
    let (name, payload) = match entry["customType"].as_str()? {
        crate::approvals::REQUEST => {
            let fields = ["id", "request", "createdAtMs", "expiresAtMs"];
            (
                "exec.approval.requested",
                Value::Object(fields.iter().map(|k| (k.to_string(), data[*k].clone())).collect()),
            )
        }
        crate::approvals::DECISION => {
            let fields = ["id", "decision", "resolvedBy", "ts", "reason"];
            (
                "exec.approval.resolved",
                Value::Object(fields.iter().map(|k| (k.to_string(), data[*k].clone())).collect()),
            )
        }
        _ => return None,
    };
    Some(EntryEvent { name, payload, audience: Audience::All, id: EventId::chat(&session.session_id, pos) })
}

/// The run a user row starts (its `<run>:user` key without the suffix).
pub fn user_run(entry: &Value) -> Option<&str> {
    let msg = entry.get("message").filter(|m| m["role"] == "user")?;
    crate::durable::run_of_user_key(msg.get("idempotencyKey")?.as_str()?)
}

/// An event announcing a persisted entry, rendered from the entry alone.
pub struct EntryEvent {
    pub name: &'static str,
    pub payload: Value,
    pub audience: Audience,
    pub id: EventId,
}

/// The events that announce the row at `pos`, as a replica that did not write it announces it
/// (and as a catch-up replays it, [`crate::catchup`]): `session.message` for each message, a
/// `chat` final for each reply that ends a run (under the run of its own `<run>:assistant` key,
/// `inject-<id>` for a `chat.inject` row, else the last user row's, `run`; `aborted` for an
/// aborted reply's partial, `error` for a failed run's row), the `chat` error of an interrupted marker,
/// the `exec.approval.*` events of approval rows.
pub fn render(gw: &Engine, session: &SessionRef, pos: Pos, entry: &Value, run: &mut Option<String>) -> Vec<EntryEvent> {
    let kind = entry.get("type").and_then(Value::as_str);
    if kind == Some("custom") && entry["customType"] == crate::durable::INTERRUPTED {
        let Some(run) = entry["data"]["runId"].as_str() else { return vec![] };
        let reason = entry["data"]["reason"].as_str().unwrap_or("the turn was interrupted");
        let id = EventId::chat(&session.session_id, pos);
        return vec![EntryEvent {
            name: "chat",
            payload: crate::announce::interrupted(session, run, reason),
            audience: Audience::All,
            id,
        }];
    }
    if kind == Some("custom") {
        return approval_event(session, pos, entry).into_iter().collect();
    }
    if kind != Some("message") {
        return vec![];
    }
    let msg = &entry["message"];
    let key = msg["idempotencyKey"].as_str();
    if let Some(r) = user_run(entry) {
        *run = Some(r.to_owned());
    }
    let mut out = vec![EntryEvent {
        name: "session.message",
        payload: serde_json::to_value(crate::announce::session_message_payload(gw, session, entry, Some(pos)))
            .unwrap_or_default(),
        audience: Audience::SessionSubscribers,
        id: EventId::message(&session.session_id, pos),
    }];
    let ends_run = msg["role"] == "assistant" && msg["stopReason"] != "toolUse";
    // A reply's run: its own `<run>:assistant` key; a `chat.inject` row's, `inject-<id>` (as
    // the gateway's `chat.inject` announces it); else the last user row's.
    let own = key.and_then(crate::durable::run_of_reply_key).map(str::to_owned);
    let injected = (crate::state::is_injected(msg)).then(|| entry["id"].as_str().map(|id| format!("inject-{id}")));
    if let (true, Some(r)) = (ends_run, own.or(injected.flatten()).or(run.clone())) {
        let r = r.as_str();
        // As the run announced it: an aborted reply's partial, a failed run's error row.
        let abort_origin = msg.get("openclawAbort").map(|a| &a["origin"]);
        let (state, stop_reason) = match abort_origin {
            Some(origin) => (ChatState::Aborted, origin),
            None if msg["stopReason"] == "error" => (ChatState::Error, &msg["stopReason"]),
            None => (ChatState::Final, &msg["stopReason"]),
        };
        let end = ChatEnd {
            stop_reason,
            message: crate::announce::WithMeta::run(entry, r),
            error_message: (state == ChatState::Error).then(|| &msg["errorMessage"]),
            usage: msg.get("usage").filter(|_| state == ChatState::Final),
        };
        let e =
            ChatEvent { run_id: r, session_key: &session.key, agent_id: &session.agent_id, seq: 1, state, extra: end };
        let p = serde_json::to_value(e).unwrap_or_default();
        out.push(EntryEvent {
            name: "chat",
            payload: p,
            audience: Audience::All,
            id: EventId::chat(&session.session_id, pos),
        });
    }
    out
}
