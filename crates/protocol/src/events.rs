//! The payloads of the events a run sends, typed: `chat` ([`ChatEvent`], with what each state
//! carries) and `agent` ([`AgentEvent`]). Their fields serialize in the order clients have always
//! seen them (the wire snapshots hold it); the gateway builds them from borrowed values, so no JSON
//! tree is made for an event.

use crate::ErrorKind;
use serde::Serialize;
use serde_json::Value;

/// A `chat` event's `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatState {
    /// A startup phase of the run (before its first token).
    Status,
    /// Text streamed so far.
    Delta,
    /// The run's reply, as written.
    Final,
    /// The run was stopped; the partial as written, if any.
    Aborted,
    /// The run failed.
    Error,
}

impl ChatState {
    /// Superseded by what follows: a slow client may lose it.
    pub fn droppable(self) -> bool {
        matches!(self, ChatState::Status | ChatState::Delta)
    }
}

/// A `chat` event: the run it belongs to, its place in the run (`seq`), its state and what that
/// state carries (`extra`, flattened after `state`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatEvent<'a, E> {
    pub run_id: &'a str,
    pub session_key: &'a str,
    pub agent_id: &'a str,
    pub seq: u64,
    pub state: ChatState,
    #[serde(flatten)]
    pub extra: E,
}

/// What a failed run's `chat` error carries when nothing was written for it (a run cut by a
/// replica's death, announced from its marker).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatFailure<'a> {
    pub error_message: &'a str,
    pub error_kind: ErrorKind<'a>,
}

/// The end of a run announced from its written reply (by a replica that did not run it, or a
/// catch-up): `final`, `aborted` (its `stopReason` is the abort's origin) or `error`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatEnd<'a, M> {
    pub stop_reason: &'a Value,
    pub message: M,
    /// An `error`'s message, as the row has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<&'a Value>,
    /// A `final`'s usage, when the row has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<&'a Value>,
}

/// An `agent` event: a run's stream (`lifecycle`, `assistant`, `tool`, …) with its own `seq`, or a
/// session's compaction (no run: `runId` is `null`, and no `seq`, `agentId` or `sessionId`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentEvent<'a> {
    pub run_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub session_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<&'a str>,
    pub stream: &'a str,
    pub ts: u64,
    pub data: &'a Value,
}

/// A `sessions.changed` event: session `sessionKey` was created, patched, reset, deleted,
/// compacted, or an approval of it changed (`reason`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionsChanged<'a> {
    pub session_key: &'a str,
    pub reason: &'a str,
    /// The active leaf after a change of the tree (`Some(None)`: before the first entry); absent
    /// for other changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaf_entry_id: Option<Option<&'a str>>,
    pub ts: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_keep_their_field_order() {
        let message = json!({"role": "assistant"});
        let end = ChatEnd { stop_reason: &json!("stop"), message: &message, error_message: None, usage: None };
        let e =
            ChatEvent { run_id: "r", session_key: "k", agent_id: "main", seq: 1, state: ChatState::Final, extra: end };
        assert_eq!(
            serde_json::to_string(&e).unwrap_or_default(),
            r#"{"runId":"r","sessionKey":"k","agentId":"main","seq":1,"state":"final","stopReason":"stop","message":{"role":"assistant"}}"#
        );
        let failure = ChatFailure { error_message: "gone", error_kind: ErrorKind::Interrupted };
        let e = ChatEvent {
            run_id: "r",
            session_key: "k",
            agent_id: "main",
            seq: 1,
            state: ChatState::Error,
            extra: failure,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap_or_default(),
            r#"{"runId":"r","sessionKey":"k","agentId":"main","seq":1,"state":"error","errorMessage":"gone","errorKind":"interrupted"}"#
        );
        let data = json!({"phase": "start"});
        let a = AgentEvent {
            run_id: None,
            seq: None,
            session_key: "k",
            agent_id: None,
            session_id: None,
            stream: "compaction",
            ts: 5,
            data: &data,
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap_or_default(),
            r#"{"runId":null,"sessionKey":"k","stream":"compaction","ts":5,"data":{"phase":"start"}}"#
        );
    }
}

/// Where a run stands: what `chat.send` answers (`started`, or `in_flight` for a key already
/// running) and how a run ended (`ok`, `error`, `aborted`, `blocked` by a hook, `interrupted`: cut
/// by a stop and out of resume attempts), as its idempotency key keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Started,
    InFlight,
    Ok,
    Error,
    Aborted,
    Blocked,
    Interrupted,
}

impl RunStatus {
    /// The wire name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Started => "started",
            RunStatus::InFlight => "in_flight",
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Aborted => "aborted",
            RunStatus::Blocked => "blocked",
            RunStatus::Interrupted => "interrupted",
        }
    }

    /// A run that is going or waits in its session's queue (this answer is not its end).
    pub fn running(self) -> bool {
        matches!(self, RunStatus::Started | RunStatus::InFlight)
    }

    /// A run stopped before its reply was whole (aborted, or cut and not taken up again).
    pub fn cut(self) -> bool {
        matches!(self, RunStatus::Aborted | RunStatus::Interrupted)
    }
}

/// `{runId, status}`: `chat.send`'s answer, and a finished run's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAnswer {
    pub run_id: String,
    pub status: RunStatus,
}

impl RunAnswer {
    pub fn new(run_id: &str, status: RunStatus) -> RunAnswer {
        RunAnswer { run_id: run_id.to_owned(), status }
    }

    /// The answer as the wire has it.
    pub fn to_value(&self) -> Value {
        serde_json::json!({"runId": self.run_id, "status": self.status.as_str()})
    }
}
