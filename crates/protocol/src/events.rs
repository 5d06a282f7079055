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

/// The end of a run as the process that ran it announces it: `final` or `aborted` (`stopReason`:
/// `stop`, the abort's origin, or what a resend found on disk), or `error` (with its message and
/// kind); with the reply or partial it wrote, when there is one.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEnded<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind<'a>>,
    pub stop_reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'a Value>,
}

impl<'a> RunEnded<'a> {
    /// A `final` or `aborted` end for `stop_reason`, with the row written for it, if any.
    pub fn stopped(stop_reason: &'a str, message: Option<&'a Value>) -> RunEnded<'a> {
        RunEnded { error_message: None, error_kind: None, stop_reason, message }
    }

    /// An `error` end.
    pub fn failed(error_message: &'a str, error_kind: ErrorKind<'a>, message: Option<&'a Value>) -> RunEnded<'a> {
        RunEnded { error_message: Some(error_message), error_kind: Some(error_kind), stop_reason: "error", message }
    }
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
pub struct AgentEvent<'a, D: Serialize = Value> {
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
    pub data: &'a D,
}

/// What a run's `agent` event says: its lifecycle, a tool call's start and progress (OpenClaw's
/// shapes), or another stream's data as it comes (usage, approvals, a tool's result). Serialized
/// as the event's `data`; [`AgentUpdate::stream`] names its stream.
#[derive(Debug, Clone, Copy)]
pub enum AgentUpdate<'a> {
    /// `lifecycle` `{phase: "start"}`.
    Started,
    /// `lifecycle` `{phase: "end"}`.
    Ended,
    /// `lifecycle` `{phase: "error", error}`.
    Failed { error: &'a str },
    /// `tool` `{phase: "start", toolCallId, name, args}`.
    ToolStarted { tool_call_id: &'a str, name: &'a str, args: &'a Value },
    /// `tool` `{phase: "update", name, toolCallId, partialResult}`: a running tool's output so far.
    ToolUpdated { tool_call_id: &'a str, name: &'a str, partial: &'a Value },
    /// `tool` `{phase: "result", name, toolCallId, isError, result: {content, details?}}`: a tool's
    /// result as written (`message`: the toolResult message), as OpenClaw 2026.9.6 sends it.
    ToolResult { message: &'a Value },
    /// `approval`: a tool call waiting for a person's decision, then the decision.
    Approval(&'a ApprovalUpdate<'a>),
    /// Any other stream's data, as built by its owner.
    Other { stream: &'a str, data: &'a Value },
}

/// A run's `approval` stream in OpenClaw's shape: `requested` (what waits, where, until when), then
/// `resolved` (the decision and why).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalUpdate<'a> {
    phase: &'static str,
    kind: &'static str,
    status: &'a str,
    title: &'static str,
    tool_call_id: &'a Value,
    approval_id: &'a str,
    #[serde(flatten)]
    detail: ApprovalDetail<'a>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ApprovalDetail<'a> {
    #[serde(rename_all = "camelCase")]
    Requested {
        command: &'a Value,
        cwd: &'a Value,
        name: &'a Value,
        host: &'static str,
        expires_at_ms: u64,
    },
    Resolved {
        decision: &'a str,
        reason: &'a str,
    },
}

impl<'a> ApprovalUpdate<'a> {
    /// An exec approval requested (`request`: its record's `request`, which names the tool call,
    /// the command, its `cwd` and the tool), waiting until `expires_at_ms`.
    pub fn requested(approval_id: &'a str, request: &'a Value, expires_at_ms: u64) -> ApprovalUpdate<'a> {
        ApprovalUpdate {
            phase: "requested",
            kind: "exec",
            status: "pending",
            title: "Command approval requested",
            tool_call_id: &request["toolCallId"],
            approval_id,
            detail: ApprovalDetail::Requested {
                command: &request["command"],
                cwd: &request["cwd"],
                name: &request["toolName"],
                host: "gateway",
                expires_at_ms,
            },
        }
    }

    /// The decision on it (`approved` when `allowed`, else `denied`).
    pub fn resolved(
        approval_id: &'a str,
        request: &'a Value,
        allowed: bool,
        decision: &'a str,
        reason: &'a str,
    ) -> ApprovalUpdate<'a> {
        ApprovalUpdate {
            phase: "resolved",
            kind: "exec",
            status: if allowed { "approved" } else { "denied" },
            title: "Command approval resolved",
            tool_call_id: &request["toolCallId"],
            approval_id,
            detail: ApprovalDetail::Resolved { decision, reason },
        }
    }
}

impl AgentUpdate<'_> {
    /// The event's `stream`.
    pub fn stream(&self) -> &str {
        match self {
            AgentUpdate::Started | AgentUpdate::Ended | AgentUpdate::Failed { .. } => "lifecycle",
            AgentUpdate::ToolStarted { .. } | AgentUpdate::ToolUpdated { .. } | AgentUpdate::ToolResult { .. } => {
                "tool"
            }
            AgentUpdate::Approval(_) => "approval",
            AgentUpdate::Other { stream, .. } => stream,
        }
    }

    /// A lifecycle update's phase (`start`, `end`, `error`).
    pub fn lifecycle(&self) -> Option<&'static str> {
        match self {
            AgentUpdate::Started => Some("start"),
            AgentUpdate::Ended => Some("end"),
            AgentUpdate::Failed { .. } => Some("error"),
            _ => None,
        }
    }
}

impl Serialize for AgentUpdate<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m;
        match self {
            AgentUpdate::Other { data, .. } => return data.serialize(s),
            AgentUpdate::Approval(a) => return a.serialize(s),
            AgentUpdate::Started | AgentUpdate::Ended => {
                m = s.serialize_map(Some(1))?;
                m.serialize_entry("phase", &self.lifecycle())?;
            }
            AgentUpdate::Failed { error } => {
                m = s.serialize_map(Some(2))?;
                m.serialize_entry("phase", "error")?;
                m.serialize_entry("error", error)?;
            }
            AgentUpdate::ToolStarted { tool_call_id, name, args } => {
                m = s.serialize_map(Some(4))?;
                m.serialize_entry("phase", "start")?;
                m.serialize_entry("toolCallId", tool_call_id)?;
                m.serialize_entry("name", name)?;
                m.serialize_entry("args", args)?;
            }
            AgentUpdate::ToolUpdated { tool_call_id, name, partial } => {
                m = s.serialize_map(Some(4))?;
                m.serialize_entry("phase", "update")?;
                m.serialize_entry("name", name)?;
                m.serialize_entry("toolCallId", tool_call_id)?;
                m.serialize_entry("partialResult", partial)?;
            }
            AgentUpdate::ToolResult { message } => {
                #[derive(Serialize)]
                struct Result<'a> {
                    content: &'a Value,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    details: Option<&'a Value>,
                }
                m = s.serialize_map(Some(5))?;
                m.serialize_entry("phase", "result")?;
                m.serialize_entry("name", &message["toolName"])?;
                m.serialize_entry("toolCallId", &message["toolCallId"])?;
                m.serialize_entry("isError", &message["isError"].as_bool().unwrap_or(false))?;
                m.serialize_entry("result", &Result { content: &message["content"], details: message.get("details") })?;
            }
        }
        m.end()
    }
}

/// A `chat` event of state `status`: what a run is doing before its first token (OpenClaw's
/// `phase`), with the count when a rate limit made it start the model again.
#[derive(Debug, Serialize)]
pub struct ChatStatus {
    pub phase: StatusPhase,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusPhase {
    PreparingContext,
    StartingModel,
}

/// A rate-limited retry: attempt `attempt` of `maxAttempts` (each 1 to 10, the schema's bounds).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    pub attempt: u32,
    pub max_attempts: u32,
    pub reason: &'static str,
}

impl Retry {
    /// After a rate limit, clamped to the schema's bounds.
    pub fn rate_limited(attempt: u32, max_attempts: u32) -> Retry {
        Retry { attempt: attempt.clamp(1, 10), max_attempts: max_attempts.clamp(1, 10), reason: "rate_limit" }
    }
}

/// A session's compaction as its `agent` events on stream `compaction` tell it: `start`, then `end`
/// (what it summarised, and the entry it wrote) or `error` (why nothing was written).
#[derive(Debug, Serialize)]
#[serde(tag = "phase", rename_all = "camelCase")]
pub enum CompactionUpdate<'a> {
    Start {
        reason: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    End {
        reason: &'a str,
        tokens_before: u64,
        first_kept_entry_id: &'a str,
        entry_id: Option<&'a Value>,
    },
    Error {
        reason: &'a str,
        error: &'a str,
    },
}

/// `logs.tail`'s answer: the lines after the cursor asked for (or the newest), the cursor to ask
/// from next, and whether the cursor was older than the log or past its end (`reset`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogsTail {
    pub file: &'static str,
    pub cursor: u64,
    pub size: u64,
    pub lines: Vec<String>,
    pub truncated: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
}

/// An exec approval request, as OpenClaw's `exec.approval.requested` event carries it and as the
/// transcript's request entry keeps it (with the run and the tool call beside it).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecord<'a> {
    pub id: &'a str,
    pub request: ApprovalRequest<'a>,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
}

/// What an [`ApprovalRecord`] asks: a command the gateway would run (OpenClaw's exec request; the
/// fields Pincer has no use for are `null`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest<'a> {
    pub command: &'a str,
    pub cwd: &'a str,
    pub host: &'static str,
    pub security: Option<&'a str>,
    pub ask: &'static str,
    pub agent_id: &'a str,
    pub resolved_path: Option<&'a str>,
    pub session_key: &'a str,
    pub run_id: &'a str,
    pub tool_call_id: &'a str,
    pub tool_name: &'a str,
    pub reason: String,
    pub allowed_decisions: &'a [&'a str],
}

/// `exec.approval.resolved`: request `id` was decided (`request`: the request as recorded).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalResolved<'a> {
    pub id: &'a str,
    pub decision: &'a str,
    pub resolved_by: &'a str,
    pub ts: u64,
    pub request: &'a Value,
    pub reason: &'a str,
}

/// `exec.approval.resolve`'s answer: request `id` is decided.
#[derive(Debug, Serialize)]
pub struct ApprovalDecided<'a> {
    pub ok: bool,
    pub id: &'a str,
    pub decision: &'a str,
}

/// `exec.approval.get`: a waiting request as OpenClaw describes it (what Pincer has no notion of,
/// a preview and a node, is `null`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView<'a> {
    pub id: &'a str,
    pub command_text: &'a Value,
    pub command_preview: Option<&'a str>,
    pub allowed_decisions: &'a [&'a str],
    pub host: &'a Value,
    pub node_id: Option<&'a str>,
    pub agent_id: &'a Value,
    pub expires_at_ms: u64,
}

/// The MCP servers and each agent's tools from them (`status`'s `mcp`, `GET /api/mcp`,
/// `pincer mcp list`).
#[derive(Debug, Serialize)]
pub struct McpStatus<'a> {
    /// Each server's own status.
    pub servers: Vec<Value>,
    /// By agent id, in the config's order.
    #[serde(serialize_with = "as_map")]
    pub agents: Vec<(&'a str, AgentMcp<'a>)>,
}

/// Pairs as a JSON object, in their order.
fn as_map<S: serde::Serializer, K: Serialize, V: Serialize>(pairs: &[(K, V)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// An agent's MCP servers and the tools it has from them.
#[derive(Debug, Serialize)]
pub struct AgentMcp<'a> {
    pub servers: &'a [String],
    pub tools: Vec<String>,
}

/// A started messaging channel and what it did (the `status` RPC's `channels`).
#[derive(Debug, Serialize)]
pub struct ChannelStatus<'a> {
    pub id: &'a str,
    pub state: String,
    pub account: String,
    pub received: u64,
    pub deduplicated: u64,
    pub refused: u64,
    pub sent: u64,
    pub failed: u64,
}

/// `sessions.changed` for a run starting or ending, as OpenClaw's gateway sends it: the run, the
/// session's run state and its row (with that state in it).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStateChanged<'a> {
    pub session_key: &'a str,
    pub agent_id: &'a str,
    pub phase: Option<&'a str>,
    pub run_id: &'a str,
    pub ts: u64,
    pub session_id: &'a str,
    pub status: &'a str,
    pub has_active_run: bool,
    pub active_run_ids: &'a [String],
    pub session: &'a Value,
}

/// `sessions.usage`'s answer in OpenClaw's shape (the breakdowns Pincer does not keep are empty).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionsUsage<'a> {
    pub updated_at: u64,
    pub start_date: &'a str,
    pub end_date: &'a str,
    pub sessions: Vec<SessionUsage<'a>>,
    pub totals: UsageTotals,
    pub aggregates: UsageAggregates,
    pub creator_options: [(); 0],
}

/// One session's row of [`SessionsUsage`].
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionUsage<'a> {
    pub key: &'a str,
    pub label: Option<&'a Value>,
    pub session_id: &'a str,
    pub updated_at: Option<&'a Value>,
    pub agent_id: &'a str,
    pub chat_type: &'static str,
    pub model_provider: Option<&'a str>,
    pub model: Option<&'a str>,
    pub usage: SessionUsageDetail,
    pub has_context_weight: bool,
}

/// A session's usage: its totals, its message counts and when it was last active.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionUsageDetail {
    #[serde(flatten)]
    pub totals: UsageTotals,
    pub message_counts: MessageCounts,
    pub last_activity: Option<u64>,
}

/// Token and cost totals (OpenClaw's; costs per kind are not kept: 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub total_tokens: u64,
    pub total_cost: f64,
    pub input_cost: u8,
    pub output_cost: u8,
    pub cache_read_cost: u8,
    pub cache_write_cost: u8,
    pub missing_cost_entries: u8,
}

/// Messages by role (tool calls and results are not counted: 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageCounts {
    pub total: u64,
    pub user: u64,
    pub assistant: u64,
    pub tool_calls: u8,
    pub tool_results: u8,
    pub errors: u64,
}

/// [`SessionsUsage`]'s aggregates: the message counts; the other breakdowns empty.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageAggregates {
    pub messages: MessageCounts,
    pub tools: ToolUsage,
    pub by_model: [(); 0],
    pub by_provider: [(); 0],
    pub by_agent: [(); 0],
    pub by_channel: [(); 0],
    pub daily: [(); 0],
}

/// `usage.status`: provider quota windows (Pincer tracks none).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageStatus {
    pub updated_at: u64,
    pub providers: [(); 0],
}

/// Tool calls (not counted).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolUsage {
    pub total_calls: u8,
    pub unique_tools: u8,
    pub tools: [(); 0],
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
    fn approval_records_and_resolutions_keep_the_fields_and_order_they_had() {
        let record = ApprovalRecord {
            id: "a1",
            request: ApprovalRequest {
                command: "ls -l",
                cwd: "/w",
                host: "gateway",
                security: None,
                ask: "on-miss",
                agent_id: "main",
                resolved_path: None,
                session_key: "agent:main:main",
                run_id: "r1",
                tool_call_id: "call_1",
                tool_name: "bash",
                reason: "bash needs approval under this agent's policy".into(),
                allowed_decisions: &["allow-once", "allow-always", "deny"],
            },
            created_at_ms: 1,
            expires_at_ms: 2,
        };
        let was = json!({
            "id": "a1",
            "request": {
                "command": "ls -l", "cwd": "/w", "host": "gateway", "security": null, "ask": "on-miss",
                "agentId": "main", "resolvedPath": null, "sessionKey": "agent:main:main", "runId": "r1",
                "toolCallId": "call_1", "toolName": "bash",
                "reason": "bash needs approval under this agent's policy",
                "allowedDecisions": ["allow-once", "allow-always", "deny"],
            },
            "createdAtMs": 1,
            "expiresAtMs": 2,
        });
        assert_eq!(serde_json::to_string(&record).unwrap_or_default(), was.to_string());
        let request = &was["request"];
        let resolved =
            ApprovalResolved { id: "a1", decision: "deny", resolved_by: "operator", ts: 3, request, reason: "timeout" };
        let was = json!({"id": "a1", "decision": "deny", "resolvedBy": "operator", "ts": 3, "request": request,
            "reason": "timeout"});
        assert_eq!(serde_json::to_string(&resolved).unwrap_or_default(), was.to_string());
    }

    #[test]
    fn a_tool_result_and_a_run_state_change_keep_the_fields_and_order_they_had() {
        let msg = json!({"role": "toolResult", "toolCallId": "c1", "toolName": "read", "isError": true,
            "content": [{"type": "text", "text": "no"}], "details": {"path": "/x"}});
        let was = json!({"phase": "result", "name": "read", "toolCallId": "c1", "isError": true,
            "result": {"content": [{"type": "text", "text": "no"}], "details": {"path": "/x"}}});
        assert_eq!(
            serde_json::to_string(&AgentUpdate::ToolResult { message: &msg }).unwrap_or_default(),
            was.to_string()
        );
        let bare = json!({"toolCallId": "c2", "toolName": "ls", "content": []});
        assert_eq!(
            serde_json::to_string(&AgentUpdate::ToolResult { message: &bare }).unwrap_or_default(),
            r#"{"phase":"result","name":"ls","toolCallId":"c2","isError":false,"result":{"content":[]}}"#
        );
        let runs = vec!["r1".to_owned()];
        let row = json!({"key": "agent:main:main", "status": "running"});
        let change = RunStateChanged {
            session_key: "agent:main:main",
            agent_id: "main",
            phase: Some("start"),
            run_id: "r1",
            ts: 5,
            session_id: "s1",
            status: "running",
            has_active_run: true,
            active_run_ids: &runs,
            session: &row,
        };
        let was = json!({"sessionKey": "agent:main:main", "agentId": "main", "phase": "start", "runId": "r1", "ts": 5,
            "sessionId": "s1", "status": "running", "hasActiveRun": true, "activeRunIds": ["r1"], "session": row});
        assert_eq!(serde_json::to_string(&change).unwrap_or_default(), was.to_string());
    }

    #[test]
    fn compaction_updates_keep_the_fields_and_order_they_had() {
        let ser = |u: &CompactionUpdate| serde_json::to_string(u).unwrap_or_default();
        assert_eq!(ser(&CompactionUpdate::Start { reason: "manual" }), r#"{"phase":"start","reason":"manual"}"#);
        let id = json!("e9");
        let end = CompactionUpdate::End {
            reason: "threshold",
            tokens_before: 1200,
            first_kept_entry_id: "e5",
            entry_id: Some(&id),
        };
        assert_eq!(
            ser(&end),
            r#"{"phase":"end","reason":"threshold","tokensBefore":1200,"firstKeptEntryId":"e5","entryId":"e9"}"#
        );
        assert_eq!(
            ser(&CompactionUpdate::Error { reason: "overflow", error: "nothing to compact" }),
            r#"{"phase":"error","reason":"overflow","error":"nothing to compact"}"#
        );
    }

    #[test]
    fn approval_updates_have_openclaws_fields_in_its_order() {
        let req = json!({"toolCallId": "call_1", "command": "ls -l", "cwd": "/w", "toolName": "bash"});
        let ser = |u: &ApprovalUpdate| serde_json::to_string(&AgentUpdate::Approval(u)).unwrap_or_default();
        assert_eq!(
            ser(&ApprovalUpdate::requested("a1", &req, 5)),
            r#"{"phase":"requested","kind":"exec","status":"pending","title":"Command approval requested","toolCallId":"call_1","approvalId":"a1","command":"ls -l","cwd":"/w","name":"bash","host":"gateway","expiresAtMs":5}"#
        );
        assert_eq!(
            ser(&ApprovalUpdate::resolved("a1", &req, false, "deny", "timeout")),
            r#"{"phase":"resolved","kind":"exec","status":"denied","title":"Command approval resolved","toolCallId":"call_1","approvalId":"a1","decision":"deny","reason":"timeout"}"#
        );
        assert_eq!(
            AgentUpdate::Approval(&ApprovalUpdate::resolved("a1", &req, true, "allow-once", "operator")).stream(),
            "approval"
        );
    }

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

    #[test]
    fn rpc_results_keep_the_fields_and_order_their_json_had() {
        fn text(v: &impl Serialize) -> String {
            serde_json::to_string(v).unwrap_or_default()
        }
        let decided = ApprovalDecided { ok: true, id: "a1", decision: "deny" };
        assert_eq!(text(&decided), json!({"ok": true, "id": "a1", "decision": "deny"}).to_string());
        let (cmd, host, agent) = (json!("ls"), json!("gateway"), json!("main"));
        let view = ApprovalView {
            id: "a1",
            command_text: &cmd,
            command_preview: None,
            allowed_decisions: &["allow-once", "deny"],
            host: &host,
            node_id: None,
            agent_id: &agent,
            expires_at_ms: 9,
        };
        let want = json!({"id": "a1", "commandText": "ls", "commandPreview": null, "allowedDecisions": ["allow-once", "deny"],
            "host": "gateway", "nodeId": null, "agentId": "main", "expiresAtMs": 9});
        assert_eq!(text(&view), want.to_string());
        let servers = vec!["fs".to_string()];
        let mcp = McpStatus {
            servers: vec![json!({"id": "fs"})],
            agents: vec![
                ("main", AgentMcp { servers: &servers, tools: vec!["mcp__fs__read".into()] }),
                ("alpha", AgentMcp { servers: &[], tools: vec![] }),
            ],
        };
        let want = json!({"servers": [{"id": "fs"}], "agents": {"main": {"servers": ["fs"], "tools": ["mcp__fs__read"]},
            "alpha": {"servers": [], "tools": []}}});
        assert_eq!(text(&mcp), want.to_string(), "agents in the config's order");
        let ch = ChannelStatus {
            id: "telegram",
            state: "running".into(),
            account: "@bot".into(),
            received: 1,
            deduplicated: 2,
            refused: 3,
            sent: 4,
            failed: 5,
        };
        let want = json!({"id": "telegram", "state": "running", "account": "@bot", "received": 1, "deduplicated": 2,
            "refused": 3, "sent": 4, "failed": 5});
        assert_eq!(text(&ch), want.to_string());
    }

    #[test]
    fn a_status_says_its_phase_and_a_rate_limited_retry_its_count() {
        let s = ChatStatus { phase: StatusPhase::PreparingContext, retry: None };
        assert_eq!(serde_json::to_string(&s).unwrap_or_default(), r#"{"phase":"preparing_context"}"#);
        let s = ChatStatus { phase: StatusPhase::StartingModel, retry: Some(Retry::rate_limited(0, 12)) };
        assert_eq!(
            serde_json::to_string(&s).unwrap_or_default(),
            r#"{"phase":"starting_model","retry":{"attempt":1,"maxAttempts":10,"reason":"rate_limit"}}"#
        );
    }

    #[test]
    fn agent_updates_serialize_as_the_data_openclaw_sends() {
        let args = json!({"path": "a"});
        let partial = json!({"content": []});
        let data = json!({"input": 1});
        let cases = [
            (AgentUpdate::Started, "lifecycle", json!({"phase": "start"})),
            (AgentUpdate::Ended, "lifecycle", json!({"phase": "end"})),
            (AgentUpdate::Failed { error: "boom" }, "lifecycle", json!({"phase": "error", "error": "boom"})),
            (
                AgentUpdate::ToolStarted { tool_call_id: "c1", name: "read", args: &args },
                "tool",
                json!({"phase": "start", "toolCallId": "c1", "name": "read", "args": {"path": "a"}}),
            ),
            (
                AgentUpdate::ToolUpdated { tool_call_id: "c1", name: "read", partial: &partial },
                "tool",
                json!({"phase": "update", "name": "read", "toolCallId": "c1", "partialResult": {"content": []}}),
            ),
            (AgentUpdate::Other { stream: "usage", data: &data }, "usage", json!({"input": 1})),
        ];
        for (update, stream, want) in cases {
            assert_eq!(update.stream(), stream);
            // The text too: the keys in OpenClaw's order.
            assert_eq!(serde_json::to_string(&update).unwrap_or_default(), want.to_string());
        }
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
