//! Request dispatch: every RPC method the gateway serves, by name. `chat.*` lives in [`crate::openclaw::chat`];
//! the session methods, `health` and the small discovery methods the Control UI asks for are here.
//! Anything else is answered `INVALID_REQUEST "unknown method: X"`.

use super::chat;
use super::Ctx;
use crate::error::EngineError;
use crate::protocol::{present, Bounded, Method, NonBlank, RpcError, Text, MAX_LABEL_CHARS};
use crate::sessions::{canonical_key, SessionRef};
use crate::state::Engine;
use pincer_store::TranscriptsExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub async fn dispatch(gw: &Arc<Engine>, ctx: &Ctx, method: &str, params: &Value) -> Result<Value, RpcError> {
    let params = if params.is_null() { &Value::Object(Map::new()) } else { params };
    if !params.is_object() {
        return Err(RpcError::invalid("params must be an object"));
    }
    let Some(method) = Method::parse(method) else {
        return Err(RpcError::invalid(format!("unknown method: {method}")));
    };
    if method.writes() && !ctx.can_write {
        return Err(RpcError::invalid(format!(
            "missing scope: operator.write ({} changes state; this connection was granted read only)",
            method.name()
        )));
    }
    if method.approves() && !ctx.can_approve {
        return Err(RpcError::invalid(format!(
            "missing scope: operator.approvals ({} is about approvals; this connection was not granted them)",
            method.name()
        )));
    }
    // A connection that works with a session hears that session's `chat` and `agent` events.
    if method.joins_session() {
        let raw = params.get("sessionKey").or_else(|| params.get("key")).and_then(Value::as_str);
        if let Some(Ok((key, _))) = raw.map(canonical_key) {
            ctx.subs.add_chat(key)?;
        }
    }
    match method {
        Method::Health => Ok(json!({"ok": true, "uptimeMs": gw.uptime_ms(), "activeRuns": gw.all_runs().len()})),
        Method::ChatSend => chat::send(gw, ctx, params).await,
        Method::Agent => crate::openclaw::agent::agent(gw, ctx, params).await,
        Method::AgentWait => crate::openclaw::agent::wait(gw, params).await,
        Method::Status
        | Method::SystemPresence
        | Method::LogsTail
        | Method::SessionsDescribe
        | Method::CommandsList
        | Method::ChatMetadata
        | Method::ModelsAuthStatus
        | Method::ConfigGet
        | Method::ThemesList
        | Method::UpdateStatus => crate::openclaw::status::dispatch(gw, method, params).await,
        Method::SessionsUsage => blocking(gw, params, sessions_usage).await,
        Method::UsageStatus => Ok(crate::usage::usage_status()),
        Method::CronList
        | Method::CronStatus
        | Method::CronRuns
        | Method::ChannelsStatus
        | Method::ChannelsPairingList
        | Method::SkillsStatus
        | Method::SkillsSearch
        | Method::SkillsLibraryList
        | Method::PluginsList
        | Method::TasksList
        | Method::ArtifactsList
        | Method::QuestionList
        | Method::ProgressCardGet
        | Method::LastHeartbeat
        | Method::DiagnosticsLanes
        | Method::PluginApprovalList
        | Method::OpenclawApprovalList
        | Method::SessionsObserverVisibility
        | Method::SessionsCompanionState
        | Method::TalkCatalog
        | Method::DevicePairList
        | Method::NodeList => crate::openclaw::stubs::answer(method)
            .ok_or_else(|| RpcError::invalid(format!("unknown method: {}", method.name()))),
        Method::ExecApprovalList => Ok(Value::Array(crate::approvals::list(gw).await)),
        Method::ExecApprovalGet | Method::ExecApprovalResolve | Method::ApprovalResolve => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct ApprovalParams {
                id: NonBlank,
                decision: Option<String>,
                /// `approval.resolve`: the approval's kind (Pincer's are `exec`).
                kind: Option<String>,
            }
            let p: ApprovalParams = crate::protocol::params(method, params)?;
            if p.kind.as_deref().is_some_and(|k| k != "exec") {
                return Err(RpcError::invalid(format!(
                    "unknown or expired approval id: {} (kind {:?})",
                    p.id.0,
                    p.kind.unwrap_or_default()
                ))
                .with_details(json!({"reason": "APPROVAL_NOT_FOUND"})));
            }
            match (method, p.decision) {
                (Method::ExecApprovalGet, _) => Ok(crate::approvals::get(gw, &p.id.0)?),
                (_, Some(decision)) => Ok(crate::approvals::resolve(gw, &p.id.0, &decision, &ctx.client_id).await?),
                (_, None) => Err(RpcError::invalid("decision is required (allow-once, allow-always or deny)")),
            }
        }
        Method::ChatHistory | Method::ChatStartup => chat::history(gw, params).await,
        Method::ChatAbort => chat::abort(gw, params).await,
        Method::ChatInject => chat::inject(gw, params).await,
        Method::ChatMessageGet => super::tree::message_get(gw, params).await,
        Method::SessionsBranchesList => super::tree::branches_list(gw, params).await,
        Method::SessionsBranchesSwitch => super::tree::branches_switch(gw, params).await,
        Method::SessionsRewind => super::tree::rewind(gw, params).await,
        Method::SessionsFork => super::tree::fork(gw, params).await,
        Method::SessionsTree => super::tree::tree(gw, params).await,
        Method::SessionsLabel => super::tree::label(gw, params).await,
        Method::SessionsArchivesList => blocking(gw, params, archives_list).await,
        Method::SessionsArchivesGet => archives_get(gw, params).await,
        Method::SessionsArchivesRestore => archives_restore(gw, params).await,
        Method::SessionsSearch => crate::search::rpc(gw, params).await,
        Method::SessionsExport => crate::export::rpc(gw, params).await,
        Method::SessionsList => blocking(gw, params, sessions_list).await,
        Method::SessionsCreate => sessions_create(gw, ctx, params).await,
        Method::SessionsPatch => blocking(gw, params, sessions_patch).await,
        Method::SessionsReset | Method::SessionsDelete => {
            // The session's runs are aborted, and its transcript moved aside once they have
            // written what they still write (an aborted partial): in the session's queue. A
            // request refused is refused before anything is stopped.
            let key = session_key(method, params)?;
            if method == Method::SessionsReset {
                let _: ResetParams = crate::protocol::params(method, params)?;
            } else {
                crate::sessions::deletable(&key)?;
            }
            crate::abort::abort_to_move(gw, &key).await?;
            let _slot = gw.turn_slot(&key, &gw.stopping()).await.map_err(|e| RpcError::unavailable(e.to_string()))?;
            let f = if method == Method::SessionsReset { sessions_reset } else { sessions_delete };
            // Between two of the session's appends, never during one (its owner's order).
            let (g, params) = (gw.clone(), params.clone());
            gw.with_transcript(&key, async move { blocking(&g, &params, f).await }).await?
        }
        Method::SessionsCompact => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct CompactParams {
                #[serde(alias = "sessionKey")]
                key: NonBlank,
                instructions: Option<String>,
                /// OpenClaw's compaction without a model: keep the last lines (see `pincer_store::trim`).
                max_lines: Option<Bounded<1, { u32::MAX as u64 }>>,
            }
            let p: CompactParams = crate::protocol::params(method, params)?;
            let key = p.key.0;
            let session = gw.blocking(move |gw| existing(gw, &key)).await?;
            let cancel = gw.stopping();
            // In the session's queue: never while a turn is being written.
            let _slot = gw.slot_for(&session, &cancel).await?;
            if let Some(Bounded(max_lines)) = p.max_lines {
                return trim(gw, session, max_lines as usize).await;
            }
            let focus = p.instructions.filter(|i| !i.trim().is_empty());
            let reason = pincer_compaction::CompactionReason::Manual;
            match crate::compact::run(gw, &session, reason, focus, cancel).await {
                Ok(o) => Ok(json!({"ok": true, "key": session.key, "compacted": true, "tokensBefore": o.tokens_before,
                    "firstKeptEntryId": o.first_kept_entry_id, "entryId": o.entry.get("id")})),
                Err(reason) => Ok(json!({"ok": true, "key": session.key, "compacted": false, "reason": reason})),
            }
        }
        Method::SessionsAbort => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct AbortParams {
                key: NonBlank,
                run_id: Option<String>,
            }
            let p: AbortParams = crate::protocol::params(method, params)?;
            let key = canonical_key(&p.key)?.0;
            let ids = crate::abort::abort(gw, &key, p.run_id.as_deref(), "rpc").await?;
            Ok(
                json!({"ok": true, "abortedRunId": ids.first(), "status": if ids.is_empty() { "no-active-run" } else { "aborted" }}),
            )
        }
        Method::SessionsSubscribe => {
            ctx.subs.sessions.store(true, Ordering::Relaxed);
            Ok(json!({"subscribed": true}))
        }
        Method::SessionsUnsubscribe => {
            ctx.subs.sessions.store(false, Ordering::Relaxed);
            Ok(json!({"subscribed": false}))
        }
        Method::SessionsMessagesSubscribe => crate::openclaw::subscribe::subscribe_messages(gw, ctx, params).await,
        Method::SessionsMessagesUnsubscribe => {
            let key = session_key(method, params)?;
            ctx.subs.leave(&key);
            Ok(json!({"subscribed": false, "key": key}))
        }
        // The Control UI gates sending on the agent's `model.primary` ("No AI provider configured").
        Method::AgentsList => {
            let agents: Vec<Value> = gw
                .settings
                .agents
                .configured()
                .map(|a| {
                    let name = if a.id == *"main" { "Main".to_owned() } else { a.id.to_string() };
                    json!({"id": a.id, "name": name, "model": {"primary": a.model}})
                })
                .collect();
            Ok(json!({"defaultId": "main", "mainKey": "main", "scope": "per-sender", "agents": agents}))
        }
        Method::AgentIdentityGet => Ok(json!({"agentId": "main", "name": "Pincer", "avatarStatus": "none"})),
        // OpenClaw's catalog entries: `provider` and `id` apart (the Control UI fails without `provider`).
        Method::ModelsList => Ok(json!({"models": crate::openclaw::status::models(gw), "default": gw.settings.model})),
        // Pincer: the real paths for the WebChat's hints (never `~/.pincer` when the state is elsewhere).
        Method::PincerInfo => Ok(json!({"version": env!("CARGO_PKG_VERSION"),
            "stateDir": gw.settings.state_dir.display().to_string(),
            "configFile": gw.settings.state_dir.join("pincer.toml").display().to_string(),
            "tokenSource": gw.settings.token_source, "model": gw.settings.model,
            "modelIsFallback": gw.settings.model_is_fallback,
            "tools": gw.tools("main").names(),
            "workspace": gw.settings.agents.get("main").workspace.display().to_string(),
            "agents": gw.settings.agents.configured().map(|a| json!({"id": a.id, "model": a.model,
                "workspace": a.workspace.display().to_string(), "tools": a.tools.tools})).collect::<Vec<_>>(),
            "limits": {"attachmentBytes": chat::MAX_ATTACHMENT_BYTES, "attachmentsBytes": chat::MAX_ATTACHMENTS_BYTES}})),
        Method::ToolsEffective => tools_effective(gw, method, params),
        Method::Connect => Err(RpcError::invalid("already connected")),
    }
}

/// `tools.effective {agentId?, sessionKey?}`: the agent's tools in OpenClaw's inventory shape (one
/// group of built-in tools, each with a label and the first sentence of its description), so the
/// Control UI and the TUI show what the model is offered.
fn tools_effective(gw: &Arc<Engine>, method: Method, params: &Value) -> Result<Value, RpcError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct EffectiveParams {
        agent_id: Option<crate::sessions::AgentId>,
        /// Its agent's tools, when no `agentId` is given.
        session_key: Option<String>,
    }
    let p: EffectiveParams = crate::protocol::params(method, params)?;
    let agent = match (p.agent_id, p.session_key) {
        (Some(id), _) => id,
        (None, Some(key)) => crate::sessions::canonical_key(&key)?.1,
        (None, None) => crate::sessions::AgentId::main(),
    };
    if !gw.sessions.known_agent(&agent) {
        return Err(RpcError::invalid(format!("unknown agent id {:?}", agent.as_str())));
    }
    let settings = gw.settings.agents.get(agent.as_str());
    let specs = gw.tools(agent.as_str()).specs();
    let (mcp, core): (Vec<_>, Vec<_>) = specs.iter().partition(|t| t.name.starts_with(pincer_agent::mcp::PREFIX));
    let mut tools: Vec<Value> = core
        .iter()
        .map(|t| {
            let label: Vec<String> = t
                .name
                .split('_')
                .map(|w| w.chars().take(1).flat_map(char::to_uppercase).chain(w.chars().skip(1)).collect())
                .collect();
            let summary = t.description.split_once(". ").map_or(t.description.as_str(), |(first, _)| first);
            json!({"id": t.name, "label": label.join(" "), "description": summary.trim_end_matches('.'),
                "rawDescription": t.description, "source": "core"})
        })
        .collect();
    tools.sort_by(|a, b| a["label"].as_str().cmp(&b["label"].as_str()));
    let mut groups = vec![json!({"id": "core", "label": "Built-in tools", "source": "core", "tools": tools})];
    if !mcp.is_empty() {
        let tools: Vec<Value> = mcp
            .iter()
            .map(|t| json!({"id": t.name, "label": t.name, "description": t.description, "rawDescription": t.description, "source": "mcp"}))
            .collect();
        groups.push(json!({"id": "mcp", "label": "MCP servers' tools", "source": "mcp", "tools": tools}));
    }
    Ok(json!({"agentId": agent, "profile": settings.tools.profile, "groups": groups}))
}

/// `sessions.compact {maxLines}`: the transcript keeps its last lines (the whole old file stays
/// beside it), in OpenClaw's answer shape.
async fn trim(gw: &Arc<Engine>, session: SessionRef, max_lines: usize) -> Result<Value, RpcError> {
    let key = session.key.clone();
    let g = gw.clone();
    let rewrite = async move {
        g.blocking(move |gw| {
            if !gw.store.exists(&session.path).map_err(|e| EngineError::Persistence(e.to_string()))? {
                return Ok::<_, EngineError>(None);
            }
            let t = gw.store.trim(&session.path, max_lines).map_err(|e| EngineError::Persistence(e.to_string()))?;
            if t.compacted {
                gw.replaced(&session);
            }
            Ok(Some(t))
        })
        .await
    };
    // In the session's owner's order: no append lands in the file being rewritten.
    let trimmed = gw.with_transcript(&key, rewrite).await??;
    Ok(match trimmed {
        None => json!({"ok": true, "key": key, "compacted": false, "reason": "no transcript"}),
        Some(t) => {
            if t.compacted {
                gw.hub.sessions_changed(&key, "compact");
            }
            json!({"ok": true, "key": key, "compacted": t.compacted, "kept": t.kept,
                "backup": t.backup.map(|b| b.display().to_string())})
        }
    })
}

/// The canonical session key of a method whose params are `{key, …}`.
fn session_key(method: Method, params: &Value) -> Result<String, RpcError> {
    #[derive(Deserialize)]
    struct KeyParams {
        key: NonBlank,
    }
    let p: KeyParams = crate::protocol::params(method, params)?;
    Ok(canonical_key(&p.key)?.0)
}

/// Runs a method that works on the session index on a blocking thread.
async fn blocking(
    gw: &Arc<Engine>,
    params: &Value,
    f: fn(&Engine, &Value) -> Result<Value, RpcError>,
) -> Result<Value, RpcError> {
    let params = params.clone();
    gw.blocking(move |gw| f(gw, &params)).await
}

/// `sessions.usage {key?, agentId?, limit? (at most 1000)}`.
fn sessions_usage(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct UsageParams {
        key: Option<NonBlank>,
        agent_id: Option<crate::sessions::AgentId>,
        limit: Option<u32>,
    }
    let p: UsageParams = crate::protocol::params(Method::SessionsUsage, params)?;
    let limit = p.limit.unwrap_or(1000).min(1000) as usize;
    Ok(crate::usage::sessions_usage(gw, p.key.as_ref().map(|k| k.0.as_str()), p.agent_id.as_ref(), limit)?)
}

fn existing(gw: &Engine, key: &str) -> Result<SessionRef, RpcError> {
    gw.sessions.resolve(key, false)?.ok_or_else(|| RpcError::invalid(format!("session not found: {key}")))
}

/// Most rows `sessions.list` returns at once.
const MAX_LIST_ROWS: u64 = 1000;

fn sessions_list(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ListParams {
        agent_id: Option<crate::sessions::AgentId>,
        limit: Option<Bounded<1, { u32::MAX as u64 }>>,
        offset: Option<Bounded<0, { u32::MAX as u64 }>>,
        include_derived_titles: Option<bool>,
        /// Archived sessions (`sessions.patch {archived: true}`) are left out unless asked for.
        include_archived: Option<bool>,
        /// Only the archived ones (the WebChat's "Archived" section pages through these alone).
        only_archived: Option<bool>,
    }
    let p: ListParams = crate::protocol::params(Method::SessionsList, params)?;
    let agent = p.agent_id.as_ref();
    let limit = p.limit.map_or(200, |l| l.0.min(MAX_LIST_ROWS)) as usize;
    let offset = p.offset.map_or(0, |o| o.0) as usize;
    let (titles, archived) = (p.include_derived_titles.unwrap_or(false), p.include_archived.unwrap_or(false));
    let only = p.only_archived.unwrap_or(false);
    let listed: Vec<SessionRef> = (gw.sessions.list(agent)?.into_iter())
        .filter(|s| match s.entry.contains_key("archivedAt") {
            true => archived || only,
            false => !only,
        })
        .collect();
    let total = listed.len();
    let rows: Vec<Value> = (listed.iter())
        .skip(offset)
        .take(limit)
        .map(|s| {
            let mut row = session_row(gw, s);
            if titles {
                let (title, count) = transcript_summary(gw.store.as_ref(), &s.path);
                row["derivedTitle"] = json!(title);
                row["messageCount"] = json!(count);
            }
            row
        })
        .collect();
    let more = total > offset.saturating_add(rows.len());
    Ok(json!({"ts": pincer_pi::now_ms(), "count": rows.len(), "totalCount": total, "hasMore": more, "sessions": rows,
        "defaults": {"model": gw.settings.model, "mainSessionKey": crate::sessions::MAIN_KEY}}))
}

async fn sessions_create(gw: &Arc<Engine>, ctx: &Ctx, params: &Value) -> Result<Value, RpcError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct CreateParams {
        key: Option<NonBlank>,
        agent_id: Option<crate::sessions::AgentId>,
        label: Option<Text<MAX_LABEL_CHARS>>,
        model: Option<Text<MAX_FIELD_CHARS>>,
        message: Option<String>,
    }
    let p: CreateParams = crate::protocol::params(Method::SessionsCreate, params)?;
    let agent = p.agent_id.unwrap_or_else(crate::sessions::AgentId::main);
    let key = match &p.key {
        Some(k) => canonical_key(k)?.0,
        None => format!("agent:{agent}:dashboard:{}", uuid::Uuid::new_v4()),
    };
    if let Some(m) = &p.model {
        gw.settings.providers.resolve(m).map_err(|e| RpcError::invalid(e.to_string()))?;
    }
    let k = key.clone();
    let created = gw
        .index(move |s| match s.resolve(&k, false)? {
            Some(_) => Err(EngineError::invalid(format!("session already exists: {k}"))),
            None => s.resolve(&k, true),
        })
        .await?;
    let mut session = created.ok_or_else(|| RpcError::unavailable("session not created"))?;
    let mut fields = Map::new();
    for (k, v) in [("label", p.label.map(|t| t.0)), ("model", p.model.map(|t| t.0))] {
        if let Some(v) = v {
            fields.insert(k.into(), Value::String(v));
        }
    }
    if !fields.is_empty() {
        let k = key.clone();
        session = gw.index(move |s| s.patch(&k, &fields)).await?;
    }
    gw.ensure_transcript(&session).await?;
    gw.hub.sessions_changed(&key, "create");
    let mut out =
        json!({"ok": true, "key": key, "sessionId": session.session_id, "entry": session.row(), "runStarted": false});
    if let Some(message) = p.message.filter(|m| !m.trim().is_empty()) {
        let run_id = uuid::Uuid::new_v4().to_string();
        let r = chat::send(gw, ctx, &json!({"sessionKey": key, "message": message, "idempotencyKey": run_id})).await?;
        out["runStarted"] = json!(true);
        out["runId"] = r["runId"].clone();
        out["status"] = r["status"].clone();
    }
    Ok(out)
}

fn sessions_patch(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    /// A field that is left alone when absent, removed when `null`, set otherwise.
    type Change<T> = Option<Option<T>>;
    /// The fields Pincer keeps; the many others the Control UI sends are accepted and ignored.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct PatchParams {
        key: NonBlank,
        #[serde(default, deserialize_with = "present")]
        label: Change<Text<MAX_LABEL_CHARS>>,
        #[serde(default, deserialize_with = "present")]
        display_name: Change<Text<MAX_LABEL_CHARS>>,
        #[serde(default, deserialize_with = "present")]
        thinking_level: Change<Text<MAX_FIELD_CHARS>>,
        #[serde(default, deserialize_with = "present")]
        verbose_level: Change<Text<MAX_FIELD_CHARS>>,
        #[serde(default, deserialize_with = "present")]
        model: Change<Text<MAX_FIELD_CHARS>>,
        #[serde(default, deserialize_with = "present")]
        send_policy: Change<SendPolicy>,
        #[serde(default, deserialize_with = "present")]
        unread: Change<bool>,
        /// Archiving hides the session from `sessions.list` (it stays on disk, restorable).
        #[serde(default, deserialize_with = "present")]
        archived: Change<bool>,
    }
    #[derive(Deserialize, serde::Serialize)]
    #[serde(rename_all = "lowercase")]
    enum SendPolicy {
        Allow,
        Deny,
    }
    let p: PatchParams = crate::protocol::params(Method::SessionsPatch, params)?;
    let mut fields = Map::new();
    let text = |t: Option<Text<MAX_LABEL_CHARS>>| t.map_or(Value::Null, |t| Value::String(t.0));
    let short = |t: Option<Text<MAX_FIELD_CHARS>>| t.map_or(Value::Null, |t| Value::String(t.0));
    let changes = [
        ("label", p.label.map(text)),
        ("displayName", p.display_name.map(text)),
        ("thinkingLevel", p.thinking_level.map(short)),
        ("verboseLevel", p.verbose_level.map(short)),
        ("model", p.model.map(short)),
        ("sendPolicy", p.send_policy.map(|s| json!(s))),
        ("archivedAt", p.archived.map(|a| if a == Some(true) { json!(pincer_pi::now_ms()) } else { Value::Null })),
    ];
    for (k, v) in changes {
        if let Some(v) = v {
            fields.insert(k.into(), v);
        }
    }
    // As OpenClaw records it: marking unread stamps `markedUnreadAt` (always later than the last
    // mark); reading clears it and stamps `lastReadAt`, after which a new reply is unread again.
    let key = &p.key;
    match p.unread {
        Some(Some(true)) => {
            let last = gw.sessions.resolve(key, false)?.and_then(|s| s.entry.get("markedUnreadAt")?.as_u64());
            let at = pincer_pi::now_ms().max(last.map_or(0, |l| l + 1));
            fields.insert("markedUnreadAt".into(), json!(at));
        }
        Some(Some(false)) | Some(None) => {
            fields.insert("lastReadAt".into(), json!(pincer_pi::now_ms()));
            fields.insert("markedUnreadAt".into(), Value::Null);
        }
        None => {}
    }
    if let Some(m) = fields.get("model").and_then(Value::as_str) {
        gw.settings.providers.resolve(m).map_err(|e| RpcError::invalid(e.to_string()))?;
    }
    if fields.contains_key("model") {
        // The patched `provider/model` replaces OpenClaw's own model fields, so they cannot override it.
        for (model_field, provider_field) in crate::sessions::MODEL_FIELDS {
            fields.entry(model_field).or_insert(Value::Null);
            fields.insert(provider_field.into(), Value::Null);
        }
    }
    let s = gw.sessions.patch(key, &fields)?;
    gw.hub.sessions_changed(&s.key, "patch");
    let model = gw.session_model(&s);
    let (provider, model_id) = model.split_once('/').unwrap_or(("", model.as_str()));
    Ok(json!({"ok": true, "path": s.path.display().to_string(), "key": s.key, "entry": s.row(),
        "resolved": {"modelProvider": provider, "model": model_id}}))
}

/// A session's row as `sessions.list` and `sessions.describe` give it: the index entry, its run
/// status (`running` while a turn runs or waits, else `done` after a reply, `idle` before any;
/// `waitingForApproval` while a run waits for a human — OpenClaw's clients take any other status
/// than `running` for a session without a run, and would hide its Stop) and
/// its token counts from the transcript's tail (last turn's usage, context tokens vs the model's window).
pub fn session_row(gw: &Engine, s: &SessionRef) -> Value {
    let mut row = s.row();
    let usage = crate::usage::of_tail(gw.store.as_ref(), &s.path);
    let running = !gw.runs_of(&s.key).is_empty();
    let waiting = running && gw.approvals.waiting_in(&s.key);
    row["status"] = json!(match (running, usage.counts.assistant) {
        (true, _) => "running",
        (false, 0) => "idle",
        (false, _) => "done",
    });
    row["hasActiveRun"] = json!(running);
    row["waitingForApproval"] = json!(waiting);
    row["archived"] = json!(s.entry.get("archivedAt").is_some_and(|a| !a.is_null()));
    // Unread: marked so, or a reply came after the session was last read (OpenClaw's rule, with
    // `lastReadAt` alone as the baseline: a session nobody has read yet is not flagged).
    let at = |k: &str| s.entry.get(k).and_then(Value::as_u64);
    let replied_since_read = matches!((at("lastReadAt"), usage.last_at), (Some(read), Some(reply)) if reply > read);
    row["unread"] = json!(at("markedUnreadAt").is_some() || replied_since_read);
    if let (Value::Object(row), Value::Object(tokens)) = (&mut row, crate::usage::row_fields(gw, s, &usage)) {
        for (k, v) in tokens {
            row.entry(k).or_insert(v);
        }
    }
    row
}

/// Longest string field of `sessions.create|patch` other than a label or display name.
const MAX_FIELD_CHARS: usize = 128;

/// OpenClaw's reasons for `sessions.reset`; both archive the old transcript as `reset`.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum ResetReason {
    New,
    Reset,
}

#[derive(Deserialize)]
struct ResetParams {
    #[serde(rename = "reason")]
    _reason: Option<ResetReason>,
}

fn sessions_reset(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    let key = session_key(Method::SessionsReset, params)?;
    let _: ResetParams = crate::protocol::params(Method::SessionsReset, params)?;
    let reason = "reset";
    let old = gw.sessions.resolve(&key, false)?;
    let (s, archived) = gw.sessions.reset(&key, reason)?;
    if let Some(o) = old {
        gw.store.forget(&o.path);
    }
    gw.hub.sessions_changed(&key, "reset");
    Ok(json!({"ok": true, "key": s.key, "entry": s.row(), "archived": archived.map(|p| p.display().to_string())}))
}

fn sessions_delete(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    let key = session_key(Method::SessionsDelete, params)?;
    let old = gw.sessions.resolve(&key, false)?;
    let (deleted, archived) = gw.sessions.delete(&key)?;
    if let Some(o) = old {
        gw.store.forget(&o.path);
    }
    gw.hub.sessions_changed(&key, "delete");
    let archived: Vec<String> = archived.iter().map(|p| p.display().to_string()).collect();
    Ok(json!({"ok": true, "key": key, "deleted": deleted, "archived": archived}))
}

/// Largest transcript read for a title and message count in `sessions.list`.
const SUMMARY_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// The first user message (one line, shortened) and the number of user and assistant messages.
pub fn transcript_summary(store: &dyn pincer_store::Transcripts, path: &std::path::Path) -> (Option<String>, usize) {
    let Ok(Some(bytes)) = store.read_bytes(path, SUMMARY_MAX_BYTES) else { return (None, 0) };
    let (mut title, mut count) = (None, 0);
    for line in bytes.split(|b| *b == b'\n') {
        let has = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
        if !has(b"\"type\":\"message\"") {
            continue;
        }
        let user = has(b"\"role\":\"user\"");
        if user || has(b"\"role\":\"assistant\"") {
            count += 1;
        }
        if user && title.is_none() {
            title = serde_json::from_slice::<Value>(line)
                .ok()
                .map(|v| crate::tree::display_text(&v["message"]))
                // A slash command names no chat: the first message after it does.
                .filter(|t| {
                    !t.is_empty() && crate::commands::slash_command(t).is_none() && !crate::commands::is_stop(t)
                });
        }
    }
    (title, count)
}

/// Transcripts moved aside by `/new`, `sessions.reset` and `sessions.delete` (`<file>.<reason>.<ts>`),
/// newest first, with when each was archived (ms), from whichever store holds them.
fn archive_files(
    gw: &Engine,
    agent: &crate::sessions::AgentId,
) -> Vec<(String, String, std::path::PathBuf, Option<u64>)> {
    let dir = gw.sessions.sessions_dir(agent);
    let mut out = Vec::new();
    for (path, modified) in gw.store.set_aside(&dir) {
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
        let Some((_, rest)) = name.split_once(".jsonl.") else { continue };
        let Some((reason, stamp)) = rest.split_once('.') else { continue };
        if matches!(reason, "reset" | "deleted" | "new") && !stamp.is_empty() {
            out.push((name.clone(), reason.to_owned(), path, modified));
        }
    }
    out.sort_by(|a, b| b.0.cmp(&a.0));
    out
}

/// `sessions.archives.list` (Pincer): archived transcripts, newest first, with a title and size.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArchivesParams {
    agent_id: Option<crate::sessions::AgentId>,
    /// `sessions.archives.get`: a file name as `sessions.archives.list` gives it.
    file: Option<NonBlank>,
    /// `sessions.archives.get`: a window of at most this many messages (as `chat.history`'s).
    limit: Option<Bounded<1, { pincer_store::history::MAX_LIMIT as u64 }>>,
    /// `sessions.archives.get`: the window before this entry (as `chat.history`'s `beforeEntryId`).
    before_entry_id: Option<NonBlank>,
}

fn archives_list(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    let p: ArchivesParams = crate::protocol::params(Method::SessionsArchivesList, params)?;
    let agent = &p.agent_id.unwrap_or_else(crate::sessions::AgentId::main);
    if !gw.sessions.known_agent(agent) {
        return Err(RpcError::invalid(format!("unknown agent id {:?}", agent.as_str())));
    }
    let mut rows = Vec::new();
    for (file, reason, path, modified) in archive_files(gw, agent).into_iter().take(200) {
        let h = gw
            .store
            .history(&path, pincer_store::history::HistoryOptions { limit: 1000, max_chars: 200, before: None })
            .map_err(|e| RpcError::unavailable(format!("cannot read: {e}")))?;
        let count = h.messages.iter().filter(|m| matches!(m["role"].as_str(), Some("user" | "assistant"))).count();
        let title = h.messages.iter().find(|m| m["role"] == "user").map(crate::tree::display_text).unwrap_or_default();
        rows.push(
            json!({"file": file, "reason": reason, "archivedAt": modified, "title": title, "messageCount": count}),
        );
    }
    Ok(json!({"agentId": agent, "archives": rows}))
}

/// The largest transcript `sessions.archives.restore` reads into memory (`pincer transcript import`
/// takes larger ones).
const MAX_RESTORE_BYTES: u64 = 64 * 1024 * 1024;

/// `sessions.archives.restore {file}` (Pincer): a transcript moved aside by /new, reset or delete
/// back as a chat of its own: a new session of the default agent, made as `pincer transcript
/// import` makes one (checked first; nothing is written when it is refused). The archived file
/// stays where it is.
async fn archives_restore(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    let p: ArchivesParams = crate::protocol::params(Method::SessionsArchivesRestore, params)?;
    let Some(NonBlank(file)) = p.file else {
        return Err(RpcError::invalid("invalid sessions.archives.restore params: missing field `file`"));
    };
    if p.agent_id.as_ref().is_some_and(|a| *a != crate::sessions::AgentId::main()) {
        return Err(RpcError::invalid("only the default agent's transcripts can be restored"));
    }
    let gw2 = gw.clone();
    let s = tokio::task::spawn_blocking(move || {
        // Only a name the listing gives: never a path of the client's choosing.
        let Some((_, _, path, _)) =
            archive_files(&gw2, &crate::sessions::AgentId::main()).into_iter().find(|(n, ..)| *n == file)
        else {
            return Err(RpcError::invalid(format!("archived transcript not found: {file}")));
        };
        let read = gw2.store.read_bytes(&path, MAX_RESTORE_BYTES);
        let bytes = read.map_err(|e| RpcError::unavailable(format!("{file}: {e}")))?.ok_or_else(|| {
            RpcError::unavailable(format!(
                "{file} cannot be read here (gone, or over {} MiB): restore it with `pincer transcript import`",
                MAX_RESTORE_BYTES >> 20
            ))
        })?;
        let prepared = pincer_export::prepare_import(&bytes).map_err(|e| RpcError::invalid(format!("{file}: {e}")))?;
        Ok(gw2.sessions.import(&prepared)?)
    })
    .await
    .map_err(|e| RpcError::unavailable(format!("task failed: {e}")))??;
    gw.hub.sessions_changed(&s.key, "create");
    Ok(json!({"ok": true, "key": s.key, "sessionId": s.session_id}))
}

/// `sessions.archives.get` (Pincer): the messages of one archived transcript, read-only.
async fn archives_get(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    let p: ArchivesParams = crate::protocol::params(Method::SessionsArchivesGet, params)?;
    let Some(NonBlank(file)) = p.file else {
        return Err(RpcError::invalid("invalid sessions.archives.get params: missing field `file`"));
    };
    let agent = p.agent_id.unwrap_or_else(crate::sessions::AgentId::main);
    let mut opts =
        pincer_store::history::HistoryOptions { before: p.before_entry_id.map(|b| b.0), ..Default::default() };
    if let Some(l) = p.limit {
        opts.limit = l.0 as usize;
    }
    let found = gw
        .blocking(move |gw| {
            if !gw.sessions.known_agent(&agent) {
                return Err(RpcError::invalid(format!("unknown agent id {:?}", agent.as_str())));
            }
            // Only a name the listing gives: never a path of the client's choosing.
            let Some((_, _, path, _)) = archive_files(gw, &agent).into_iter().find(|(n, ..)| *n == file) else {
                return Err(RpcError::invalid(format!("archived transcript not found: {file}")));
            };
            Ok((file, path))
        })
        .await?;
    let (file, path) = found;
    let _held = gw.reserve_answer(&path, crate::budget::Answer::History, "the archived transcript").await?;
    let gw2 = gw.clone();
    tokio::task::spawn_blocking(move || {
        let h = gw2.store.history(&path, opts).map_err(|e| RpcError::unavailable(format!("cannot read: {e}")))?;
        Ok(json!({"file": file, "messages": h.messages, "hasOlder": h.has_older}))
    })
    .await
    .map_err(|e| RpcError::unavailable(format!("task failed: {e}")))?
}
