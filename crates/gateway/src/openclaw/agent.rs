//! `agent` and `agent.wait`: OpenClaw's scripting path (`openclaw agent -m …`). `agent` takes
//! OpenClaw's params, picks the session (`sessionKey`, else `sessionId`, else the agent's main
//! session), runs the turn through the one turn pipeline ([`crate::turn::start_turn`], the same
//! parsing as `chat.send`), answers `status: "accepted"` at once and, on the same request id, the
//! final `{runId, status, summary, result: {payloads, meta}}` read back from the transcript.
//! `agent.wait` waits (bounded) for a run to end and says how it ended.

use super::chat;
use super::Ctx;
use crate::protocol::{Method, NonBlank, RpcError, RunAnswer, RunStatus};
use crate::sessions::SessionRef;
use crate::state::Engine;
use crate::turn::TurnRequest;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// `agent`'s params: the ones Pincer acts on (OpenClaw's others, such as delivery to channels,
/// are accepted and ignored).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentParams {
    message: NonBlank,
    idempotency_key: NonBlank,
    agent_id: Option<crate::sessions::AgentId>,
    session_key: Option<String>,
    session_id: Option<String>,
    /// A model for this turn: `provider/model`, or a bare id with `provider`.
    model: Option<String>,
    provider: Option<String>,
    attachments: Option<Vec<Value>>,
    /// Seconds OpenClaw would allow the run; Pincer's runs end on their own (kept for validation).
    #[allow(dead_code)]
    timeout: Option<u64>,
}

/// `agent`.
pub async fn agent(gw: &Arc<Engine>, ctx: &Ctx, params: &Value) -> Result<Value, RpcError> {
    let p: AgentParams = crate::protocol::params(Method::Agent, params)?;
    let run_id = chat::check_idempotency_key(&p.idempotency_key)?;
    let message = chat::sanitize_message(&p.message)?;
    let images = chat::parse_attachments(p.attachments.as_deref().unwrap_or_default())?;
    let model = turn_model(gw, p.model.as_deref(), p.provider.as_deref())?;
    let session = pick_session(gw, p.agent_id, p.session_key.as_deref(), p.session_id.as_deref()).await?;
    ctx.subs.add_chat(session.key.clone())?;
    let accepted = json!({"runId": run_id, "sessionKey": session.key, "agentId": session.agent_id,
        "status": "accepted", "acceptedAt": pincer_pi::now_ms()});
    if images.is_empty() && crate::commands::is_stop(&message) {
        let ids = crate::abort::abort(gw, &session.key, None, "stop-command").await?;
        ctx.interim(accepted);
        let text = if ids.is_empty() { "No active run." } else { "Stopped." };
        return Ok(json!({"runId": run_id, "status": "ok", "summary": "completed",
            "result": {"payloads": [{"text": text, "isStatusNotice": true}], "meta": {"durationMs": 0}}}));
    }
    let started_at = std::time::Instant::now();
    let (go, acked) = tokio::sync::oneshot::channel();
    let request = TurnRequest {
        session: session.clone(),
        run_id: run_id.clone(),
        text: message,
        images,
        regenerate: None,
        expected_leaf: None,
        graft: None,
        model,
        conn_id: ctx.conn_id,
    };
    let started = crate::turn::start_turn(gw, request, acked).await?;
    ctx.interim(accepted);
    let _ = go.send(());
    let outcome = match &started.run {
        Some(run) if started.answer.status.running() => {
            run.done.cancelled().await;
            let ended = gw.dedupe_result(&format!("chat:{run_id}"));
            ended.unwrap_or_else(|| Ok(RunAnswer::new(&run_id, RunStatus::Ok)))?.status
        }
        _ => started.answer.status,
    };
    final_payload(gw, &session, &run_id, outcome, started_at.elapsed()).await
}

/// A turn's own model (`--model`), checked against the configured providers.
fn turn_model(gw: &Engine, model: Option<&str>, provider: Option<&str>) -> Result<Option<String>, RpcError> {
    let Some(model) = model.map(str::trim).filter(|m| !m.is_empty()) else { return Ok(None) };
    let spec = match provider.map(str::trim).filter(|p| !p.is_empty()) {
        Some(p) if !model.starts_with(&format!("{p}/")) => format!("{p}/{model}"),
        _ => model.to_owned(),
    };
    gw.settings
        .providers
        .resolve(&spec)
        .map_err(|e| RpcError::invalid(format!("invalid agent params: at /model: {e}")))?;
    Ok(Some(spec))
}

/// The session of an `agent` call: `sessionKey`, else the session whose id is `sessionId`, else
/// the main session of `agentId` (default `main`). A key is created on first use, as `chat.send` does.
async fn pick_session(
    gw: &Arc<Engine>,
    agent_id: Option<crate::sessions::AgentId>,
    session_key: Option<&str>,
    session_id: Option<&str>,
) -> Result<SessionRef, RpcError> {
    let agent = agent_id.unwrap_or_else(crate::sessions::AgentId::main);
    let key = session_key.map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned);
    let id = session_id.map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned);
    gw.index(move |s| {
        if let Some(key) = key {
            return s.resolve(&key, true)?.ok_or_else(|| RpcError::invalid(format!("session not found: {key}")));
        }
        if let Some(id) = id {
            let found = s.list(s.known_agent(&agent).then_some(&agent))?.into_iter().find(|r| r.session_id == id);
            return found
                .ok_or_else(|| RpcError::invalid(format!("invalid agent params: no session has sessionId {id:?}")));
        }
        let key = format!("agent:{agent}:main");
        s.resolve(&key, true)?.ok_or_else(|| RpcError::invalid(format!("session not found: {key}")))
    })
    .await
}

/// OpenClaw's final answer of a finished turn: its replies (from the transcript) as payloads.
async fn final_payload(
    gw: &Arc<Engine>,
    session: &SessionRef,
    run_id: &str,
    outcome: RunStatus,
    took: Duration,
) -> Result<Value, RpcError> {
    let (path, id) = (session.path.clone(), run_id.to_owned());
    let replies = gw
        .blocking(move |gw| {
            crate::durable::replies(&gw.store, &path, &id)
                .map_err(|e| RpcError::unavailable(format!("cannot read the transcript: {e}")))
        })
        .await?;
    let payloads: Vec<Value> = (replies.iter())
        .map(|m| pincer_pi::text_blocks(m.get("content")).concat())
        .filter(|t| !t.trim().is_empty())
        .map(|text| json!({"text": text}))
        .collect();
    let last = replies.last();
    let stop = last.and_then(|m| m.get("stopReason")).and_then(Value::as_str);
    let (status, summary) = match outcome {
        _ if outcome.cut() => ("timeout", "aborted"),
        _ if stop == Some("error") => ("error", "failed"),
        _ => ("ok", "completed"),
    };
    let usage = last.and_then(|m| m.get("usage")).map(|u| {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        json!({"input": n("input"), "output": n("output"), "cacheRead": n("cacheRead"),
            "cacheWrite": n("cacheWrite"), "total": n("totalTokens")})
    });
    let provider = last.and_then(|m| m.get("provider")).cloned().unwrap_or(Value::Null);
    let model = last.and_then(|m| m.get("model")).cloned().unwrap_or(Value::Null);
    let mut out = json!({"runId": run_id, "status": status, "summary": summary,
        "result": {"payloads": payloads, "meta": {"durationMs": took.as_millis() as u64,
            "agentMeta": {"sessionId": session.session_id, "provider": provider, "model": model, "usage": usage},
            "stopReason": stop}}});
    if status != "ok" {
        out["stopReason"] = json!(stop.unwrap_or("aborted"));
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WaitParams {
    run_id: NonBlank,
    timeout_ms: Option<u64>,
}

/// Longest `agent.wait` (OpenClaw's default is 30 s).
const MAX_WAIT_MS: u64 = 10 * 60 * 1000;
const DEFAULT_WAIT_MS: u64 = 30_000;

/// `agent.wait`: `{runId, status: ok|error|timeout, startedAt?, endedAt?, error?}`.
pub async fn wait(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    let p: WaitParams = crate::protocol::params(Method::AgentWait, params)?;
    let run_id = p.run_id.0;
    if let Some(run) = gw.run(&run_id) {
        let limit = Duration::from_millis(p.timeout_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS));
        if tokio::time::timeout(limit, run.done.cancelled()).await.is_err() {
            return Ok(json!({"runId": run_id, "status": "timeout"}));
        }
    }
    // The same answer whether the run ended before this was asked or while it waited.
    let done = gw.dedupe_done(&format!("chat:{run_id}"));
    let started_at = done.as_ref().and_then(|(_, at)| *at);
    match done.map(|(r, _)| r) {
        Some(Ok(v)) => {
            let status = if v.status.cut() { "timeout" } else { "ok" };
            Ok(json!({"runId": run_id, "status": status, "startedAt": started_at, "endedAt": pincer_pi::now_ms()}))
        }
        Some(Err(e)) => Ok(json!({"runId": run_id, "status": "error", "error": e.to_string(),
            "startedAt": started_at, "endedAt": pincer_pi::now_ms()})),
        None => Err(RpcError::invalid(format!("agent run was not found: {run_id}"))),
    }
}
