//! Approvals: a tool call under an `ask` policy waits for a human before it runs, as durable state.
//!
//! Each agent has a policy per tool (`allow`, `ask`, `deny`; `[agents.<id>.tools] approval`), `ask`
//! by default for `bash`, `write` and `edit`. A call under `ask` whose command and working directory
//! are not on the allow-always list (`<state>/approvals.json`) goes through [`Gate`]:
//!
//! 1. the request is written to the session's transcript, a chained `custom` entry
//!    ([`REQUEST`], outside the LLM context), and only then announced (`exec.approval.requested`,
//!    OpenClaw's event, and an `agent` event on stream `approval`);
//! 2. the call waits for a decision: `exec.approval.resolve`, `approval.resolve` or `/approve <id>
//!    allow-once|allow-always|deny` in the chat, from any connection; the first answer wins, the
//!    decision is written ([`DECISION`]) before the call runs, later answers are told it was
//!    already decided;
//! 3. the expiry (30 minutes by default) decides `deny` (reason `timeout`), `chat.abort` decides
//!    `deny` (reason `aborted`) and the call gets a denied result.
//!
//! A gateway killed while a call waits leaves the request on disk without a decision: the turn is
//! resumed at startup ([`crate::takeup::recover`]), the request is registered again under its id
//! and expiry ([`resume_call`]), and the call runs once, when it is allowed.
//!
//! With replicas (PostgreSQL), `exec.approval.list` also lists the requests waiting on the others
//! (read from the database), and an answer for one of them is written as an [`ANSWER`] entry: the
//! replica the call waits on (or the survivor that took its turn over) sees it, records it as the
//! decision and runs the call. Only the replica that runs a call writes its decision, so a call
//! whose decision is on disk from before a crash may have run, and is never run again.

use crate::config::approvals::Policy;
use crate::error::EngineError;
use crate::hub::Audience;
use crate::pending::{Decided, Pending, REMEMBERED, SLUG_CHARS};
use crate::protocol::{
    AgentUpdate, ApprovalDecided, ApprovalRecord, ApprovalRequest, ApprovalResolved, ApprovalUpdate, ApprovalView,
};
use crate::sessions::SessionRef;
use crate::state::{Engine, RunHandle};
use pincer_agent::tools::{Tool, ToolError, ToolFuture, ToolOutput, ToolUpdates};
use pincer_pi::lock;
use pincer_store::{NewEntry, TranscriptsExt};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `customType` of the entry recording an approval request (`data`: the request as announced,
/// plus `runId` and `toolCallId`).
pub const REQUEST: &str = "pincer.approval-request";
/// `customType` of the entry recording its decision (`data`: `id`, `decision`, `reason`, …).
pub const DECISION: &str = "pincer.approval-decision";
/// `customType` of an answer given on another replica than the one the call waits on (PostgreSQL):
/// the first answer in the transcript wins, and the waiting replica records it as the decision
/// before the call runs (so only the replica that runs the call writes the decision).
pub const ANSWER: &str = "pincer.approval-answer";
/// The decisions a human may give.
pub const DECISIONS: &[&str] = &["allow-once", "allow-always", "deny"];
/// How often a request waiting on a replica looks for a decision written by another one.
const REMOTE_POLL: Duration = Duration::from_millis(500);
/// Records `d` for `p` unless it was decided already: the decision entry first (and for
/// `allow-always` the allow-list entry before it), then the waiter is woken and
/// `exec.approval.resolved` announced. `Ok(Err(earlier))`: someone answered first.
async fn decide(gw: &Arc<Engine>, p: &Arc<Pending>, d: Decided) -> Result<Result<Decided, Decided>, EngineError> {
    let mut slot = p.decided.lock().await;
    if let Some(earlier) = slot.clone() {
        return Ok(Err(earlier));
    }
    // With replicas: a decision on disk stands; an answer given elsewhere first wins over `d`.
    let (d, won) = match on_disk_for(gw, &p.session, &p.id).await {
        Some((earlier, true)) => {
            *slot = Some(earlier.clone());
            drop(slot);
            settled(gw, p, &earlier);
            return Ok(Err(earlier));
        }
        Some((answer, false)) => (answer, false),
        None => (d, true),
    };
    if d.decision == "allow-always" {
        gw.approvals
            .allow_always(&p.record)
            .map_err(|e| EngineError::Persistence(format!("cannot write the allow-always list: {e}")))?;
    }
    let request = json!({"id": p.id, "runId": p.run_id, "toolCallId": p.tool_call_id});
    if let Err(e) = gw.append(&p.session, decision_entry(&request, &d)).await {
        return Err(EngineError::Persistence(format!("the decision was not recorded: {}", EngineError::unsaved(&e))));
    }
    *slot = Some(d.clone());
    drop(slot);
    settled(gw, p, &d);
    Ok(if won { Ok(d) } else { Err(d) })
}

/// After `p` was decided `d` (its entry written): no longer waiting, remembered, its waiter
/// woken, `exec.approval.resolved` announced.
fn settled(gw: &Engine, p: &Pending, d: &Decided) {
    lock(&gw.approvals.pending).remove(&p.id);
    remember(gw, &p.id, d);
    p.tx.send_replace(Some(d.clone()));
    announce_resolved(gw, &p.id, &p.record["request"], d);
    gw.hub.sessions_changed(&p.session.key, "approval");
}

fn remember(gw: &Engine, id: &str, d: &Decided) {
    let mut decided = lock(&gw.approvals.decided);
    decided.push_back((id.to_owned(), d.clone()));
    while decided.len() > REMEMBERED {
        decided.pop_front();
    }
}

fn announce_resolved(gw: &Engine, id: &str, request: &Value, d: &Decided) {
    let event =
        ApprovalResolved { id, decision: &d.decision, resolved_by: &d.by, ts: d.ts, request, reason: &d.reason };
    gw.hub.publish(
        "exec.approval.resolved",
        None,
        serde_json::to_value(event).unwrap_or_default(),
        false,
        Audience::All,
    );
}

/// The decision entry fields of `data` as a [`Decided`].
fn decided_of(data: &Value) -> Decided {
    let s = |k: &str, or: &str| data[k].as_str().unwrap_or(or).to_owned();
    Decided {
        decision: s("decision", "deny"),
        reason: s("reason", "operator"),
        by: s("resolvedBy", "operator"),
        ts: data["ts"].as_u64().unwrap_or(0),
    }
}

/// With replicas (PostgreSQL): the decision (`true`) or else the first answer (`false`) on disk
/// for request `id` of `session`.
async fn on_disk_for(gw: &Arc<Engine>, session: &SessionRef, id: &str) -> Option<(Decided, bool)> {
    gw.pg.as_ref()?;
    let (store, path) = (gw.store.clone(), session.path.clone());
    let tail = tokio::task::spawn_blocking(move || store.tail_entries(&path, 1024 * 1024)).await.ok()?.ok()?;
    let of =
        |kind: &str| tail.iter().find(|e| e["type"] == "custom" && e["customType"] == kind && e["data"]["id"] == id);
    of(DECISION).map(|e| (decided_of(&e["data"]), true)).or_else(|| of(ANSWER).map(|e| (decided_of(&e["data"]), false)))
}

/// With replicas (PostgreSQL): every request in the database, with its decision or first answer
/// if it has one, in the transcripts' order.
async fn in_database(gw: &Engine) -> Vec<(Value, Option<Value>)> {
    let Some(pg) = &gw.pg else { return vec![] };
    let rows = match pg.custom_rows(vec![REQUEST.to_owned(), DECISION.to_owned(), ANSWER.to_owned()]).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!("cannot read other replicas' approvals: {e}");
            return vec![];
        }
    };
    let mut out: Vec<(Value, Option<Value>)> = Vec::new();
    for (_, e) in rows {
        match e["customType"].as_str() {
            Some(REQUEST) => out.push((e["data"].clone(), None)),
            Some(DECISION | ANSWER) => {
                if let Some((_, d)) = out.iter_mut().find(|(r, d)| d.is_none() && r["id"] == e["data"]["id"]) {
                    *d = Some(e["data"].clone());
                }
            }
            _ => {}
        }
    }
    out
}

/// A request as listed, from its entry's data.
fn record_of(data: &Value) -> Value {
    let mut record = Map::new();
    for k in ["id", "request", "createdAtMs", "expiresAtMs"] {
        record.insert(k.into(), data[k].clone());
    }
    Value::Object(record)
}

/// `exec.approval.list`: the requests waiting here and, with replicas, on the others, oldest first.
pub async fn list(gw: &Engine) -> Vec<Value> {
    let mut all = gw.approvals.local();
    let now = pincer_pi::now_ms();
    for (data, decided) in in_database(gw).await {
        let expired = data["expiresAtMs"].as_u64().is_none_or(|e| e <= now);
        if decided.is_none() && !expired && !all.iter().any(|r| r["id"] == data["id"]) {
            let mut r = record_of(&data);
            r["approvalKind"] = json!("exec");
            all.push(r);
        }
    }
    all.sort_by(|a, b| {
        let at = |r: &Value| r["createdAtMs"].as_u64().unwrap_or(0);
        at(a).cmp(&at(b)).then_with(|| a["id"].as_str().cmp(&b["id"].as_str()))
    });
    all
}

/// With replicas: answers request `id`, which waits on another replica (or on none, its replica
/// dead and its turn not taken over yet), with an answer entry; the first answer in the transcript
/// wins. `None`: no such request in the database.
async fn resolve_remote(
    gw: &Arc<Engine>,
    id: &str,
    d: Decided,
) -> Option<Result<Result<Decided, Decided>, EngineError>> {
    let (data, decided) = in_database(gw).await.into_iter().find(|(r, _)| r["id"] == id)?;
    if let Some(earlier) = decided {
        return Some(Ok(Err(decided_of(&earlier))));
    }
    if data["expiresAtMs"].as_u64().is_none_or(|e| e <= pincer_pi::now_ms()) {
        return None;
    }
    let key = data["request"]["sessionKey"].as_str().unwrap_or_default().to_owned();
    let session = match gw.session(&key, false).await {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    let mut entry = decision_entry(&data, &d);
    entry.payload.insert("customType".into(), json!(ANSWER));
    if let Err(e) = gw.append(&session, entry).await {
        return Some(Err(EngineError::Persistence(format!(
            "the answer was not recorded: {}",
            EngineError::unsaved(&e)
        ))));
    }
    match on_disk_for(gw, &session, id).await {
        Some((first, _)) if first != d => Some(Ok(Err(first))),
        _ => {
            remember(gw, id, &d);
            announce_resolved(gw, id, &data["request"], &d);
            Some(Ok(Ok(d)))
        }
    }
}

/// The decision entry of request `data` (its entry's data).
fn decision_entry(request: &Value, d: &Decided) -> NewEntry {
    let mut data = Map::new();
    for (k, v) in [
        ("id", request["id"].clone()),
        ("runId", request["runId"].clone()),
        ("toolCallId", request["toolCallId"].clone()),
        ("decision", json!(d.decision)),
        ("reason", json!(d.reason)),
        ("resolvedBy", json!(d.by)),
        ("ts", json!(d.ts)),
    ] {
        data.insert(k.into(), v);
    }
    let mut payload = Map::new();
    payload.insert("customType".into(), json!(DECISION));
    payload.insert("data".into(), Value::Object(data));
    NewEntry::of("custom", payload)
}

/// `exec.approval.resolve` / `approval.resolve` / `/approve`: decides `id` as `decision` for
/// `by`. The first answer wins; a later one is refused, saying what was decided.
pub async fn resolve(gw: &Arc<Engine>, id: &str, decision: &str, by: &str) -> Result<Value, EngineError> {
    if !DECISIONS.contains(&decision) {
        return Err(EngineError::invalid(format!(
            "invalid decision {decision:?} (decisions: {})",
            DECISIONS.join(", ")
        )));
    }
    let already = |d: Decided| EngineError::ApprovalResolved { id: id.to_owned(), decision: d.decision, by: d.by };
    let d = Decided {
        decision: decision.to_owned(),
        reason: "operator".into(),
        by: by.to_owned(),
        ts: pincer_pi::now_ms(),
    };
    let mut id = id.trim().to_owned();
    let outcome = match gw.approvals.get(&id) {
        Some(p) => {
            id.clone_from(&p.id); // a short code names its request's full id from here on
            decide(gw, &p, d).await?
        }
        None => match gw.approvals.remembered(&id) {
            Some(earlier) => Err(earlier),
            // With replicas, the request may wait on another one.
            None => match resolve_remote(gw, id.trim(), d).await {
                Some(outcome) => outcome?,
                None => return Err(EngineError::ApprovalNotFound { id }),
            },
        },
    };
    match outcome {
        Ok(d) => {
            Ok(serde_json::to_value(ApprovalDecided { ok: true, id: &id, decision: &d.decision }).unwrap_or_default())
        }
        Err(earlier) => Err(already(earlier)),
    }
}

/// `exec.approval.get`: one waiting request, as OpenClaw describes it.
pub fn get(gw: &Engine, id: &str) -> Result<Value, EngineError> {
    let p = gw.approvals.get(id).ok_or_else(|| EngineError::ApprovalNotFound { id: id.to_owned() })?;
    let req = &p.record["request"];
    let view = ApprovalView {
        id: &p.id,
        command_text: &req["command"],
        command_preview: None,
        allowed_decisions: DECISIONS,
        host: &req["host"],
        node_id: None,
        agent_id: &req["agentId"],
        expires_at_ms: p.expires_at,
    };
    Ok(serde_json::to_value(view).unwrap_or_default())
}

/// Ends the waits of run `run_id` (aborted): each is decided `deny` (reason `aborted`). Returns
/// the calls denied here, `(toolCallId, tool, error)`, for their results to be written.
pub async fn abort_run(gw: &Arc<Engine>, run_id: &str, by: &str) -> Vec<(String, String, ToolError)> {
    let mut out = Vec::new();
    for p in gw.approvals.of_run(run_id) {
        let d =
            Decided { decision: "deny".into(), reason: "aborted".into(), by: by.to_owned(), ts: pincer_pi::now_ms() };
        match decide(gw, &p, d).await {
            Ok(Ok(d)) => out.push((p.tool_call_id.clone(), p.tool.clone(), d.denied())),
            Ok(Err(_)) => {}
            Err(e) => tracing::warn!(approval = %p.id, "the abort's denial was not recorded: {e}"),
        }
    }
    out
}

/// What a call of `tool` asks to do, as the approval shows it: `bash`'s command, else the tool and
/// its path (or its arguments).
fn describe(tool: &str, args: &Value) -> String {
    match (tool, args.get("command").and_then(Value::as_str), args.get("path").and_then(Value::as_str)) {
        ("bash", Some(c), _) => c.to_owned(),
        (_, _, Some(path)) => format!("{tool} {path}"),
        _ => format!("{tool} {args}"),
    }
}

/// The turn a [`Gate`] belongs to.
pub struct TurnGates {
    gw: Arc<Engine>,
    session: SessionRef,
    run: Arc<RunHandle>,
    /// Tool calls of the turn already asked about (two identical calls get a request each).
    claimed: Mutex<HashSet<String>>,
}

/// A tool behind its agent's approval policy: `call` asks first when the policy says so.
pub struct Gate {
    inner: Arc<dyn Tool>,
    policy: Policy,
    turn: Arc<TurnGates>,
}

/// The agent's tools for one turn of `session`, each behind its approval policy (the specs are
/// the agent's, shared).
pub fn gated(gw: &Arc<Engine>, session: &SessionRef, run: &Arc<RunHandle>) -> pincer_agent::ToolRegistry {
    let tools = gw.tools(&session.agent_id);
    let approvals = &gw.settings.agents.get(&session.agent_id).approvals;
    let turn =
        Arc::new(TurnGates { gw: gw.clone(), session: session.clone(), run: run.clone(), claimed: Mutex::default() });
    tools.wrapped(|tool| match approvals.policy(tool.name(), tool.destructive()) {
        Policy::Allow => tool.clone(),
        policy => Arc::new(Gate { inner: tool.clone(), policy, turn: turn.clone() }),
    })
}

impl Tool for Gate {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn parameters(&self) -> Value {
        self.inner.parameters()
    }
    fn prepare(&self, arguments: Value) -> Value {
        self.inner.prepare(arguments)
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn destructive(&self) -> bool {
        self.inner.destructive()
    }
    fn call(&self, arguments: Value) -> ToolFuture<'_> {
        self.gate(arguments, ToolUpdates::none())
    }
    fn call_with_updates(&self, arguments: Value, updates: ToolUpdates) -> ToolFuture<'_> {
        self.gate(arguments, updates)
    }
}

impl Gate {
    /// Asks first when the policy says so, then runs the call with its partial results reported
    /// to `updates` (the wait's own text first: what it waits for and how to answer).
    fn gate(&self, arguments: Value, updates: ToolUpdates) -> ToolFuture<'_> {
        Box::pin(async move {
            let name = self.inner.name();
            if self.policy == Policy::Deny {
                return Err(ToolError::failed(format!(
                    "Denied: this agent's approval policy denies {name} ([agents.<id>.tools] approval); it did not run."
                )));
            }
            let t = &self.turn;
            let command = describe(name, &arguments);
            let agent = &t.gw.settings.agents.get(&t.session.agent_id);
            let cwd = agent.workspace.display().to_string();
            if t.gw.approvals.is_allowed(&t.session.agent_id, name, &command, &cwd) {
                return self.inner.call_with_updates(arguments, updates).await;
            }
            let call_id = self.call_id(&arguments).await;
            let now = pincer_pi::now_ms();
            let expires = now + agent.approvals.timeout.as_millis() as u64;
            let id = uuid::Uuid::new_v4().to_string();
            let record = serde_json::to_value(ApprovalRecord {
                id: &id,
                request: ApprovalRequest {
                    command: &command,
                    cwd: &cwd,
                    host: "gateway",
                    security: None,
                    ask: "on-miss",
                    agent_id: &t.session.agent_id,
                    resolved_path: None,
                    session_key: &t.session.key,
                    run_id: &t.run.run_id,
                    tool_call_id: &call_id,
                    tool_name: name,
                    reason: format!("{name} needs approval under this agent's policy"),
                    allowed_decisions: DECISIONS,
                },
                created_at_ms: now,
                expires_at_ms: expires,
            })
            .map_err(|e| ToolError::failed(format!("The approval request could not be made ({e}); it did not run.")))?;
            let mut data = record.as_object().cloned().unwrap_or_default();
            data.insert("runId".into(), json!(t.run.run_id));
            data.insert("toolCallId".into(), json!(call_id));
            let mut payload = Map::new();
            payload.insert("customType".into(), json!(REQUEST));
            payload.insert("data".into(), Value::Object(data));
            if let Err(e) = t.gw.append(&t.session, NewEntry::of("custom", payload)).await {
                return Err(ToolError::failed(format!(
                    "The approval request was not recorded ({}); it did not run.",
                    EngineError::unsaved(&e)
                )));
            }
            let d = wait(&t.gw, &t.session, &t.run, record, &|pending| updates.report(pending)).await;
            if d.allows() {
                self.inner.call_with_updates(arguments, updates).await
            } else {
                Err(d.denied())
            }
        })
    }

    /// The id of the call being made: the first call of this tool in the turn's last assistant
    /// message with these arguments that has no result and was not asked about yet.
    async fn call_id(&self, arguments: &Value) -> String {
        let t = &self.turn;
        let Ok(messages) = t.gw.context(&t.session).await else { return String::new() };
        let calls = crate::durable::unanswered_calls(&messages, false);
        let mut claimed = lock(&t.claimed);
        let name = self.inner.name();
        let open = |b: &&Value| b["name"] == name && !claimed.contains(b["id"].as_str().unwrap_or_default());
        let same =
            |b: &&Value| b["arguments"] == *arguments || self.inner.prepare(b["arguments"].clone()) == *arguments;
        let found = calls.iter().filter(open).find(same).or_else(|| calls.iter().find(open));
        let id = found.and_then(|b| b["id"].as_str()).unwrap_or_default().to_owned();
        claimed.insert(id.clone());
        id
    }
}

/// Registers the request `record` (written already), announces it and waits for its decision or
/// its expiry (then decided `deny`, reason `timeout`). `report` shows the call's partial result: the
/// wait's text in OpenClaw's words ([`pending_text`]). An abort drops this future; the turn then
/// denies the wait ([`abort_run`]).
async fn wait(
    gw: &Arc<Engine>,
    session: &SessionRef,
    run: &Arc<RunHandle>,
    record: Value,
    report: &(dyn Fn(ToolOutput) + Send + Sync),
) -> Decided {
    let id = record["id"].as_str().unwrap_or_default().to_owned();
    let expires_at = record["expiresAtMs"].as_u64().unwrap_or(0);
    let req = &record["request"];
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let p = Arc::new(Pending {
        id: id.clone(),
        session: session.clone(),
        run_id: run.run_id.clone(),
        tool_call_id: req["toolCallId"].as_str().unwrap_or_default().to_owned(),
        tool: req["toolName"].as_str().unwrap_or_default().to_owned(),
        expires_at,
        decided: tokio::sync::Mutex::new(None),
        tx,
        record: record.clone(),
    });
    lock(&gw.approvals.pending).insert(id.clone(), p.clone());
    gw.hub.publish("exec.approval.requested", None, record.clone(), false, Audience::All);
    // Its row says `waiting` now (and again `running` once decided: [`settled`]).
    gw.hub.sessions_changed(&session.key, "approval");
    let requested = ApprovalUpdate::requested(&id, req, expires_at);
    crate::announce::publish_agent_event(gw, session, run, AgentUpdate::Approval(&requested));
    // The call's card says what it waits for and how to answer, in OpenClaw's words: a client
    // without an approval view (OpenClaw's TUI) shows it as the running tool's output.
    report(ToolOutput::text(pending_text(&id, req)));
    let left = Duration::from_millis(expires_at.saturating_sub(pincer_pi::now_ms()));
    let decided = tokio::select! {
        r = rx.wait_for(Option::is_some) => r.ok().and_then(|d| d.clone()),
        () = tokio::time::sleep(left) => None,
        d = decided_elsewhere(gw, &p) => Some(d),
    };
    let d = match decided {
        Some(d) => d,
        None => {
            let d = Decided {
                decision: "deny".into(),
                reason: "timeout".into(),
                by: "pincer".into(),
                ts: pincer_pi::now_ms(),
            };
            match decide(gw, &p, d.clone()).await {
                Ok(Ok(d) | Err(d)) => d,
                Err(e) => {
                    tracing::warn!(approval = %id, "the expiry was not recorded: {e}");
                    lock(&gw.approvals.pending).remove(&id);
                    d
                }
            }
        }
    };
    let resolved = ApprovalUpdate::resolved(&id, req, d.allows(), &d.decision, &d.reason);
    crate::announce::publish_agent_event(gw, session, run, AgentUpdate::Approval(&resolved));
    d
}

/// OpenClaw's approval-pending message for request `id` (`req`: its `request`).
fn pending_text(id: &str, req: &Value) -> String {
    let slug: String = id.chars().take(SLUG_CHARS).collect();
    let cwd = req["cwd"].as_str().unwrap_or("(default)");
    let command = req["command"].as_str().unwrap_or_default();
    format!(
        "Approval required (id {slug}, full {id}).\nHost: gateway\nCWD: {cwd}\nCommand:\n```sh\n{command}\n```\n\
         Reply with: /approve {slug} {}",
        DECISIONS.join("|")
    )
}

/// With replicas: an answer another replica wrote for `p` (looked for now and every
/// [`REMOTE_POLL`]), recorded here as the decision; without replicas, never.
async fn decided_elsewhere(gw: &Arc<Engine>, p: &Arc<Pending>) -> Decided {
    if gw.pg.is_none() {
        return std::future::pending().await;
    }
    loop {
        if let Some((d, _)) = on_disk_for(gw, &p.session, &p.id).await {
            match decide(gw, p, d).await {
                Ok(Ok(d) | Err(d)) => return d,
                Err(e) => tracing::warn!(approval = %p.id, "the answer was not recorded: {e}"),
            }
        }
        tokio::time::sleep(REMOTE_POLL).await;
    }
}

/// What the transcript says about the approvals of the calls `ids`: toolCallId → (the request
/// entry's data, its decision's data if any). Blocking.
pub fn on_disk(
    store: &dyn pincer_store::Transcripts,
    path: &Path,
    ids: &HashSet<String>,
) -> Result<HashMap<String, (Value, Option<Value>)>, pincer_store::StoreError> {
    let mut out: HashMap<String, (Value, Option<Value>)> = HashMap::new();
    for e in store.tail_entries(path, 4 * 1024 * 1024)? {
        if e["type"] != "custom" {
            continue;
        }
        let data = &e["data"];
        let call = data["toolCallId"].as_str().unwrap_or_default();
        if !ids.contains(call) {
            continue;
        }
        match e["customType"].as_str() {
            Some(REQUEST) => {
                out.insert(call.to_owned(), (data.clone(), None));
            }
            Some(DECISION) => {
                if let Some((req, d)) = out.get_mut(call) {
                    if req["id"] == data["id"] {
                        *d = Some(data.clone());
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A call cut by a restart while it waited (its request on disk, no decision): waits again under
/// the same id and expiry, then runs it through `tools` once allowed, else a denied result.
pub async fn resume_call(
    gw: &Arc<Engine>,
    session: &SessionRef,
    run: &Arc<RunHandle>,
    request: &Value,
    tools: &pincer_agent::ToolRegistry,
    call: &Value,
) -> Result<ToolOutput, ToolError> {
    let mut record = Map::new();
    for k in ["id", "request", "createdAtMs", "expiresAtMs"] {
        record.insert(k.into(), request[k].clone());
    }
    // The call's `start` went out already (the turn announced it before settling the call): its
    // update goes straight to the clients, after it.
    let report = |pending: ToolOutput| {
        let (tool_call_id, name) = (call["id"].as_str().unwrap_or_default(), call["name"].as_str().unwrap_or_default());
        let partial = pending.to_value();
        crate::announce::publish_agent_event(
            gw,
            session,
            run,
            AgentUpdate::ToolUpdated { tool_call_id, name, partial: &partial },
        );
    };
    let d = wait(gw, session, run, Value::Object(record), &report).await;
    if d.allows() {
        tools.execute(call["name"].as_str().unwrap_or_default(), call["arguments"].clone()).await
    } else {
        Err(d.denied())
    }
}

/// The denied result of a call whose request was decided `deny` before a restart cut it.
pub fn denied_on_disk(decision: &Value) -> Option<ToolError> {
    (decision["decision"] == "deny").then(|| {
        Decided {
            decision: "deny".into(),
            reason: decision["reason"].as_str().unwrap_or("operator").to_owned(),
            by: decision["resolvedBy"].as_str().unwrap_or("operator").to_owned(),
            ts: 0,
        }
        .denied()
    })
}
