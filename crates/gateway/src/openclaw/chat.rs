//! `chat.*`, the OpenClaw methods of the one turn pipeline ([`crate::turn`]): `chat.send`
//! validates its message (NFC, control characters, attachments, key), answers `/stop` and
//! `/approve` itself, and starts the turn; `chat.abort` stops runs ([`crate::abort`]);
//! `chat.inject` appends a gateway-injected row; `chat.history`/`chat.startup` read the active
//! branch from a bounded tail.

use super::Ctx;
use crate::announce::{publish_session_message, with_meta};
use crate::commands::{approve_command, is_stop};
use crate::protocol::{Bounded, Method, NonBlank, RpcError};
use crate::state::{injected_message, Engine};
use crate::turn::{start_turn, TurnRequest};
use base64::Engine as _;
use pincer_store::history::{HistoryOptions, DEFAULT_MAX_CHARS, MAX_LIMIT};
use pincer_store::NewEntry;
use serde_json::{json, Value};
use std::sync::Arc;
use unicode_normalization::UnicodeNormalization;

/// Largest decoded attachment, and all attachments of one message together.
pub const MAX_ATTACHMENT_BYTES: usize = 5 * 1024 * 1024;

pub const MAX_ATTACHMENTS_BYTES: usize = 20 * 1024 * 1024;

const MAX_MESSAGE_CHARS: usize = 200_000;

/// Longest idempotency key.
pub const MAX_KEY_CHARS: usize = 256;

/// `chat.send`'s params (OpenClaw's, and Pincer's `regenerateEntryId`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendParams {
    session_key: NonBlank,
    idempotency_key: NonBlank,
    message: Option<String>,
    attachments: Option<Vec<Value>>,
    /// Pincer: run the agent again for an existing user row (a sibling reply), writing no new row.
    regenerate_entry_id: Option<NonBlank>,
    /// OpenClaw's guard: the turn is refused when the active branch is not where the client
    /// thinks (`null`: before the first entry).
    #[serde(default, deserialize_with = "crate::protocol::present")]
    expected_leaf_entry_id: Option<Option<NonBlank>>,
}

/// An idempotency key: non-empty, at most [`MAX_KEY_CHARS`], no control characters.
pub(crate) fn check_idempotency_key(k: &str) -> Result<String, RpcError> {
    if k.chars().count() > MAX_KEY_CHARS {
        return Err(RpcError::invalid(format!("idempotencyKey is longer than {MAX_KEY_CHARS} characters")));
    }
    if k.chars().any(char::is_control) {
        return Err(RpcError::invalid("idempotencyKey must not contain control characters"));
    }
    Ok(k.to_owned())
}

/// NFC, no NUL, control characters other than tab/newline/CR removed.
pub fn sanitize_message(raw: &str) -> Result<String, RpcError> {
    if raw.contains('\u{0}') {
        return Err(RpcError::invalid("message must not contain null bytes"));
    }
    let s: String = raw.nfc().filter(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r')).collect();
    if s.chars().count() > MAX_MESSAGE_CHARS {
        return Err(RpcError::invalid(format!("message is longer than {MAX_MESSAGE_CHARS} characters")));
    }
    Ok(s)
}

/// Attachments as Pi image blocks. Only images are accepted; each is checked to be base64 and
/// within the size limits.
pub(crate) fn parse_attachments(list: &[Value]) -> Result<Vec<Value>, RpcError> {
    let mut total = 0;
    let mut out = Vec::new();
    for (i, a) in list.iter().enumerate() {
        let mime = a.get("mimeType").and_then(Value::as_str).unwrap_or("");
        if !mime.starts_with("image/") {
            return Err(RpcError::invalid(format!("attachments[{i}]: only images are supported (mimeType {mime:?})")));
        }
        let Some(content) = a.get("content").and_then(Value::as_str) else {
            return Err(RpcError::invalid(format!("attachments[{i}].content must be a base64 string")));
        };
        let data = content.split_once(";base64,").map(|(_, d)| d).unwrap_or(content);
        if data.trim().len() / 4 * 3 > MAX_ATTACHMENT_BYTES + 3 {
            return Err(RpcError::invalid(format!("attachments[{i}] is larger than {MAX_ATTACHMENT_BYTES} bytes")));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| RpcError::invalid(format!("attachments[{i}].content is not base64: {e}")))?;
        if bytes.len() > MAX_ATTACHMENT_BYTES {
            return Err(RpcError::invalid(format!("attachments[{i}] is larger than {MAX_ATTACHMENT_BYTES} bytes")));
        }
        total += bytes.len();
        if total > MAX_ATTACHMENTS_BYTES {
            return Err(RpcError::invalid(format!(
                "attachments are larger than {MAX_ATTACHMENTS_BYTES} bytes together"
            )));
        }
        out.push(json!({"type": "image", "data": data.trim(), "mimeType": mime}));
    }
    Ok(out)
}

/// `chat.send`.
pub async fn send(gw: &Arc<Engine>, ctx: &Ctx, params: &Value) -> Result<Value, RpcError> {
    let p: SendParams = crate::protocol::params(Method::ChatSend, params)?;
    let raw_key = &*p.session_key;
    let run_id = check_idempotency_key(&p.idempotency_key)?;
    let message = sanitize_message(p.message.as_deref().unwrap_or_default())?;
    let images = parse_attachments(p.attachments.as_deref().unwrap_or_default())?;
    let regenerate = p.regenerate_entry_id.map(|id| id.0);
    let expected_leaf = p.expected_leaf_entry_id.map(|leaf| leaf.map(|id| id.0));
    if message.trim().is_empty() && images.is_empty() && regenerate.is_none() {
        return Err(RpcError::invalid("message or attachment required"));
    }
    let session = gw.session(raw_key, true).await?.ok_or_else(|| RpcError::invalid("session not found"))?;
    if images.is_empty() && regenerate.is_none() && is_stop(&message) {
        let ids = crate::abort::abort(gw, &session.key, None, "stop-command").await?;
        return Ok(json!({"ok": true, "aborted": !ids.is_empty(), "runIds": ids}));
    }
    if images.is_empty() && regenerate.is_none() {
        if let Some(args) = approve_command(&message) {
            // Answered here, not queued: the session's queue is held by the turn that waits.
            if !ctx.can_approve {
                return Err(RpcError::invalid("missing scope: operator.approvals (/approve answers approvals)"));
            }
            let mut words = args.split_whitespace();
            let (Some(id), Some(decision), None) = (words.next(), words.next(), words.next()) else {
                return Err(RpcError::invalid("usage: /approve <id> allow-once|allow-always|deny"));
            };
            let resolved = crate::approvals::resolve(gw, id, decision, &ctx.client_id).await?;
            return Ok(json!({"ok": true, "runId": run_id, "status": "ok", "approval": resolved}));
        }
    }
    let request = TurnRequest {
        session,
        run_id,
        text: message,
        images,
        regenerate,
        expected_leaf,
        graft: None,
        model: None,
        conn_id: ctx.conn_id,
    };
    Ok(start_turn(gw, request, ctx.after_response()).await.map(|turn| turn.answer.to_value())?)
}

/// `chat.abort`.
pub async fn abort(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct AbortParams {
        session_key: NonBlank,
        run_id: Option<String>,
    }
    let p: AbortParams = crate::protocol::params(Method::ChatAbort, params)?;
    let (key, _) = crate::sessions::canonical_key(&p.session_key)?;
    let run_id = p.run_id.as_deref();
    if let Some(id) = run_id {
        if let Some(r) = gw.run(id) {
            if r.session_key != key {
                return Err(RpcError::invalid("runId does not match sessionKey"));
            }
        }
    }
    let ids = crate::abort::abort(gw, &key, run_id, "rpc").await?;
    Ok(json!({"ok": true, "aborted": !ids.is_empty(), "runIds": ids}))
}

/// `chat.inject`: a gateway-injected assistant row, announced as a `final`.
pub async fn inject(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct InjectParams {
        session_key: NonBlank,
        message: NonBlank,
        label: Option<String>,
        idempotency_key: Option<NonBlank>,
    }
    let p: InjectParams = crate::protocol::params(Method::ChatInject, params)?;
    let message = sanitize_message(&p.message)?;
    let label = match p.label {
        None => None,
        Some(l) if l.chars().count() <= 100 => Some(sanitize_message(&l)?),
        Some(_) => return Err(RpcError::invalid("label must be a string of at most 100 characters")),
    };
    let key = p.idempotency_key.as_deref().map(check_idempotency_key).transpose()?;
    let session = gw.session(&p.session_key.0, false).await?.ok_or_else(|| RpcError::invalid("session not found"))?;
    let text = match &label {
        Some(l) if !l.is_empty() => format!("[{l}]\n\n{message}"),
        _ => message,
    };
    let msg = injected_message(&text, key.as_deref(), None);
    let a = gw
        .append(&session, NewEntry::message(msg))
        .await
        .map_err(|e| RpcError::unavailable(format!("failed to write transcript: {e}")))?;
    let id = a.entry["id"].as_str().unwrap_or_default().to_owned();
    if a.appended {
        publish_session_message(gw, &session, &a.entry, Some(a.pos));
        let run_id = format!("inject-{id}");
        let p = json!({"runId": run_id, "sessionKey": session.key, "agentId": session.agent_id, "seq": 0,
            "state": "final", "stopReason": "stop", "message": with_meta(&a.entry, &run_id)});
        let eid = crate::hub::EventId::chat(&session.session_id, a.pos);
        gw.hub.publish_entry("chat", &session.key, &p, crate::hub::Audience::All, Some(eid));
        gw.sessions.touch(&session);
    }
    Ok(json!({"ok": true, "messageId": id, "appended": a.appended}))
}

/// `chat.history` and `chat.startup`.
pub async fn history(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct HistoryParams {
        session_key: NonBlank,
        limit: Option<Bounded<1, { MAX_LIMIT as u64 }>>,
        max_chars: Option<Bounded<1, 500_000>>,
        /// Pincer's paging: the window of messages before this entry on its branch (the WebChat's
        /// "older messages"); `hasOlder` in the answer says whether any are left before the window.
        before_entry_id: Option<NonBlank>,
    }
    let p: HistoryParams = crate::protocol::params(Method::ChatHistory, params)?;
    let limit = p.limit.map_or(200, |l| l.0 as usize);
    let max_chars = p.max_chars.map_or(DEFAULT_MAX_CHARS, |m| m.0 as usize);
    let before = p.before_entry_id.map(|b| b.0);
    let (key, agent) = crate::sessions::canonical_key(&p.session_key)?;
    let session = gw.session(&key, false).await?;
    let (session_id, messages, thinking, has_older) = match &session {
        None => (Value::Null, vec![], None, false),
        Some(s) => {
            let _held = gw.reserve_answer(&s.path, crate::budget::Answer::History, "the history").await?;
            let (store, path) = (gw.store.clone(), s.path.clone());
            let opts = HistoryOptions { limit, max_chars, before };
            let h = tokio::task::spawn_blocking(move || store.history(&path, opts))
                .await
                .map_err(|e| RpcError::unavailable(format!("history task failed: {e}")))?
                .map_err(|e| RpcError::unavailable(format!("cannot read the transcript: {e}")))?;
            (json!(s.session_id), h.messages, h.thinking_level, h.has_older)
        }
    };
    // A run whose end was announced is over for the client, though it may not have let go yet.
    let mut runs: Vec<_> = gw.runs_of(&key).into_iter().filter(|r| !r.ended()).collect();
    runs.sort_by_key(|r| r.started_at);
    let active: Vec<String> = runs.iter().map(|r| r.run_id.clone()).collect();
    // The run that streams now (the session's oldest: the others wait behind it), as OpenClaw's
    // `inFlightRun` gives it: a client that reloads the history in the middle of a run (OpenClaw's
    // Control UI does, at every run's start) keeps it as running, with its text so far.
    let in_flight = runs.first().map(|r| {
        let text = r.streamed();
        json!({"runId": r.run_id, "text": text, "startedAt": r.started_at})
    });
    let mut info = session.as_ref().map(|s| s.row()).unwrap_or_else(
        || json!({"key": key, "agentId": agent, "kind": "direct", "isMain": key == crate::sessions::MAIN_KEY}),
    );
    info["hasActiveRun"] = json!(!active.is_empty());
    info["activeRunIds"] = json!(active);
    let session_model = match &session {
        Some(s) => gw.session_model(s),
        None => gw.settings.agents.get(agent.as_str()).model.clone(),
    };
    let (provider, model) = session_model.split_once('/').unwrap_or(("pincer", "echo"));
    info["modelProvider"] = json!(provider);
    info["model"] = json!(model);
    let total = messages.len();
    let mut answer = json!({
        "sessionKey": key,
        "sessionId": session_id,
        "messages": messages,
        "thinkingLevel": thinking.unwrap_or_else(|| json!("off")),
        "fastMode": false,
        "verboseLevel": "off",
        "hasMore": false,
        "hasOlder": has_older,
        "totalMessages": total,
        "defaults": {"modelProvider": provider, "model": model,
            "contextTokens": gw.settings.providers.resolve(&session_model).ok().and_then(|m| m.model.context_window)},
        "sessionInfo": info,
    });
    if let Some(run) = in_flight {
        answer["inFlightRun"] = run;
    }
    Ok(answer)
}
