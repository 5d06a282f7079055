//! How a turn's rows and progress are announced on the hub: `session.message` for each row as
//! written, the `agent` event stream of a run (and the `sessions.changed` its lifecycle tells
//! session lists), and the message of a row with OpenClaw's `__openclaw` identity block
//! ([`WithMeta`], serialized without a copy).

use crate::hub::{Audience, EventId};
use crate::protocol::{AgentUpdate, ChatEvent, ChatFailure, ChatState, ErrorKind};
use crate::sessions::SessionRef;
use crate::state::{Engine, RunHandle};
use pincer_pi::now_ms;
use pincer_store::Pos;
use serde_json::{json, Value};

/// An `agent` event of run `run` in `session` (a `lifecycle` one also tells session lists, as
/// `sessions.changed`).
pub fn publish_agent_event(gw: &Engine, session: &SessionRef, run: &RunHandle, update: AgentUpdate) {
    use crate::hub::Audience;
    let key = Some(session.key.as_str());
    let phase = update.lifecycle();
    if phase.is_some() && gw.hub.wants("sessions.changed", key, Audience::SessionsWatchers) {
        // Session lists follow runs starting and ending. As OpenClaw's gateway does, the event
        // carries the row's run state (and the row): its Control UI shows Stop from it at once,
        // instead of after its next look at the list.
        let runs: Vec<String> = (gw.runs_of(&session.key).into_iter())
            .filter(|r| phase == Some("start") || r.run_id != run.run_id)
            .map(|r| r.run_id.clone())
            .collect();
        let status = match (runs.is_empty(), phase) {
            (false, _) => "running",
            (true, Some("error")) => "failed",
            (true, _) => "done",
        };
        let mut row = session.row();
        row["status"] = json!(status);
        row["hasActiveRun"] = json!(!runs.is_empty());
        row["activeRunIds"] = json!(runs);
        let p = crate::protocol::RunStateChanged {
            session_key: &session.key,
            agent_id: &session.agent_id,
            phase,
            run_id: &run.run_id,
            ts: now_ms(),
            session_id: &session.session_id,
            status,
            has_active_run: !runs.is_empty(),
            active_run_ids: &runs,
            session: &row,
        };
        let p = serde_json::to_value(p).unwrap_or_default();
        gw.hub.publish("sessions.changed", Some(&session.key), p, true, crate::hub::Audience::SessionsWatchers);
    }
    let seq = run.next_agent_seq();
    if !gw.hub.wants("agent", key, Audience::All) {
        return;
    }
    let p = crate::protocol::AgentEvent {
        run_id: Some(&run.run_id),
        seq: Some(seq),
        session_key: &session.key,
        agent_id: Some(&session.agent_id),
        session_id: Some(&session.session_id),
        stream: update.stream(),
        ts: now_ms(),
        data: &update,
    };
    if let Some(json) = crate::hub::to_json(&p) {
        gw.hub.publish_json("agent", &session.key, json, true, Audience::All, None);
    }
}

/// The message of an entry with OpenClaw's `__openclaw` identity block (`{id, runId}`; in
/// `session.message`, `{id}`), serialized from the entry as it is (no copy of the message). A
/// message that is not an object goes out as it is; `null` when the entry has none.
pub struct WithMeta<'a> {
    entry: &'a Value,
    run_id: Option<&'a str>,
}

impl<'a> WithMeta<'a> {
    /// As a run's events carry it: `{id, runId}`.
    pub fn run(entry: &'a Value, run_id: &'a str) -> WithMeta<'a> {
        WithMeta { entry, run_id: Some(run_id) }
    }

    /// As `session.message` carries it: `{id}`, when the entry has one.
    fn entry(entry: &'a Value) -> WithMeta<'a> {
        WithMeta { entry, run_id: None }
    }
}

impl serde::Serialize for WithMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            run_id: Option<&'a str>,
        }
        let message = self.entry.get("message").unwrap_or(&Value::Null);
        let meta = Meta { id: self.entry.get("id"), run_id: self.run_id };
        let (Some(obj), true) = (message.as_object(), meta.id.is_some() || meta.run_id.is_some()) else {
            return message.serialize(s);
        };
        // An `__openclaw` the message already has keeps its place, with the new value.
        let had = obj.contains_key("__openclaw");
        let mut map = s.serialize_map(Some(obj.len() + usize::from(!had)))?;
        for (k, v) in obj {
            if k == "__openclaw" {
                map.serialize_entry(k, &meta)?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        if !had {
            map.serialize_entry("__openclaw", &meta)?;
        }
        map.end()
    }
}

/// [`WithMeta::run`] as a value.
pub fn with_meta(entry: &Value, run_id: &str) -> Value {
    serde_json::to_value(WithMeta::run(entry, run_id)).unwrap_or(Value::Null)
}

/// `session.message`'s payload for an entry as written, with its durable position as OpenClaw's
/// `messageSeq` (ascending with the transcript, the same on every replica; not a count).
pub fn session_message_payload<'a>(
    gw: &Engine,
    session: &'a SessionRef,
    entry: &'a Value,
    pos: Option<Pos>,
) -> SessionMessage<'a> {
    // Whether the session still runs: the Control UI takes a row without `hasActiveRun: true` as the
    // end of the run and hides its Stop button while the reply is still streaming.
    let active: Vec<String> = gw.runs_of(&session.key).iter().map(|r| r.run_id.clone()).collect();
    SessionMessage {
        session_key: &session.key,
        message: WithMeta::entry(entry),
        has_active_run: !active.is_empty(),
        active_run_ids: active,
        message_id: entry.get("id"),
        message_seq: pos.filter(|p| *p > Pos::START),
    }
}

/// `session.message`'s payload (see [`session_message_payload`]).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMessage<'a> {
    session_key: &'a str,
    message: WithMeta<'a>,
    has_active_run: bool,
    active_run_ids: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_id: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_seq: Option<Pos>,
}

/// `session.message` for subscribers of the session, carrying the entry as written, under its
/// durable id (`pos`: where the store put it; `None`: where this process's append put it).
pub fn publish_session_message(gw: &Engine, session: &SessionRef, entry: &Value, pos: Option<Pos>) {
    if !gw.hub.wants("session.message", Some(&session.key), crate::hub::Audience::SessionSubscribers) {
        return;
    }
    let id = match pos {
        Some(pos) => Some(crate::hub::EventId::message(&session.session_id, pos)),
        None => entry.get("id").and_then(Value::as_str).and_then(|id| gw.event_id(session, id, 0)),
    };
    let p = session_message_payload(gw, session, entry, id.as_ref().map(|i| i.pos));
    gw.hub.publish_entry("session.message", &session.key, &p, crate::hub::Audience::SessionSubscribers, id);
}

/// Announces the interrupted marker at `pos` this replica wrote (other replicas announce it from
/// the row, `crate::relay::render`).
pub fn publish_interrupted(gw: &Engine, s: &SessionRef, run_id: &str, reason: &str, pos: Pos) {
    let id = EventId::chat(&s.session_id, pos);
    gw.hub.publish_entry("chat", &s.key, &interrupted(s, run_id, reason), Audience::All, Some(id));
}

/// The `chat` error of a turn whose replica died (announcing its interrupted marker).
pub fn interrupted(s: &SessionRef, run_id: &str, reason: &str) -> Value {
    let failure = ChatFailure { error_message: reason, error_kind: ErrorKind::Interrupted };
    let e = ChatEvent {
        run_id,
        session_key: &s.key,
        agent_id: &s.agent_id,
        seq: 1,
        state: ChatState::Error,
        extra: failure,
    };
    serde_json::to_value(e).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    /// What `with_meta` wrote when it copied the message and inserted the block (the rule
    /// [`WithMeta`] serializes without the copy).
    fn copied(entry: &Value, meta: Option<Map<String, Value>>) -> Value {
        let mut m = entry.get("message").cloned().unwrap_or(Value::Null);
        if let (Some(obj), Some(meta)) = (m.as_object_mut(), meta) {
            obj.insert("__openclaw".into(), Value::Object(meta));
        }
        m
    }

    #[test]
    fn with_meta_serializes_what_a_copy_with_the_block_inserted_would() {
        let entries = [
            json!({"id": "e1", "message": {"role": "assistant", "content": [{"type": "text", "text": "hi \"x\""}], "usage": {"input": 1}}}),
            json!({"id": "e2", "message": {"role": "user", "__openclaw": {"old": true}, "content": "kept in place"}}),
            json!({"message": {"role": "assistant", "content": []}}),
            json!({"id": "e3", "message": "not an object"}),
            json!({"id": "e4"}),
        ];
        for e in &entries {
            let mut run_meta = Map::new();
            if let Some(id) = e.get("id") {
                run_meta.insert("id".into(), id.clone());
            }
            run_meta.insert("runId".into(), json!("r1"));
            let want = copied(e, Some(run_meta));
            assert_eq!(serde_json::to_string(&WithMeta::run(e, "r1")).ok(), serde_json::to_string(&want).ok(), "{e}");
            assert_eq!(with_meta(e, "r1"), want);
            // session.message: `{id}`, and only when the entry has one.
            let id_meta = e.get("id").map(|id| Map::from_iter([("id".to_owned(), id.clone())]));
            let want = copied(e, id_meta);
            assert_eq!(serde_json::to_string(&WithMeta::entry(e)).ok(), serde_json::to_string(&want).ok(), "{e}");
        }
    }
}
