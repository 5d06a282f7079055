//! Live events of other replicas (the PostgreSQL store only). Each replica announces its own
//! appends as it writes them; this task announces the others': for every session some local
//! client watches, it reads the rows after the last seq it has seen and publishes them on the hub
//! as this replica's own appends are published (`session.message` for each message, and a `chat`
//! final for each reply that ends a run, under the run id of the user row it answers). A
//! notification (`pg_notify` of `<file>:<seq>` on commit) only wakes it; it also looks every
//! [`POLL`], and everything after a reconnect of the listener, so a lost notification costs
//! latency, never an event. Rows this replica wrote are skipped (the store remembers them).

use crate::sessions::SessionRef;
use crate::state::Gateway;
use pincer_pg::watch::Wake;
use pincer_pg::PgStore;
use serde_json::{json, Value};
use std::collections::HashMap;
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
pub fn start(gw: &Arc<Gateway>) {
    let Some(pg) = gw.pg.clone() else { return };
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

/// Follows the sessions local clients watch now: a new one from its current end on, or from just
/// before the row `woke` names (the wake-up that made it look).
async fn refresh(gw: &Arc<Gateway>, pg: &PgStore, watched: &mut HashMap<String, Watched>, woke: Option<(&str, i64)>) {
    let keys = gw.hub.watched_sessions();
    watched.retain(|k, _| keys.contains(k));
    let gw2 = gw.clone();
    let resolved = gw2
        .index(move |s| Ok(keys.iter().filter_map(|k| s.resolve(k, false).ok().flatten()).collect::<Vec<_>>()))
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
        if let Some((f, seq)) = woke.filter(|(f, _)| *f == file) {
            last_seq = last_seq.min(seq - 1);
            let _ = f;
        }
        watched.insert(s.key.clone(), Watched { session: s, file, last_seq, run: None });
    }
}

/// Announces the rows of one session after its last seen seq.
async fn catch_up(gw: &Arc<Gateway>, pg: &PgStore, w: &mut Watched) {
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
            announce(gw, w, &entry);
        }
        if n < BATCH {
            return;
        }
    }
}

/// Publishes one row written by another replica as this replica publishes its own.
fn announce(gw: &Gateway, w: &mut Watched, entry: &Value) {
    if entry.get("type").and_then(Value::as_str) != Some("message") {
        return;
    }
    let msg = &entry["message"];
    if let Some(run) = msg["idempotencyKey"].as_str().and_then(|k| k.strip_suffix(":user")) {
        w.run = Some(run.to_owned());
    }
    crate::chat::publish_session_message(gw, &w.session, entry);
    let ends_run = msg["role"] == "assistant" && msg["stopReason"] != "toolUse";
    if let (true, Some(run)) = (ends_run, w.run.as_deref()) {
        let mut p = json!({"runId": run, "sessionKey": w.session.key, "agentId": w.session.agent_id, "seq": 1,
            "state": "final", "stopReason": msg["stopReason"], "message": crate::chat::with_meta(entry, run)});
        if let Some(u) = msg.get("usage") {
            p["usage"] = u.clone();
        }
        gw.hub.publish("chat", Some(&w.session.key), p, false, crate::hub::Audience::All);
    }
}
