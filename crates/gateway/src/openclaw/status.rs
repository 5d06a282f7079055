//! Read-only discovery methods OpenClaw's CLI and Control UI call, answered from what Pincer
//! knows, in OpenClaw's shapes: `status`, `system-presence`, `sessions.describe`,
//! `commands.list` (the slash commands `chat.send` answers), `chat.metadata`, `models.authStatus`,
//! `config.get` (a redacted view of Pincer's settings), `themes.list`, `update.status`, `logs.tail`.

use crate::protocol::{Method, NonBlank, RpcError};
use crate::state::Engine;
use serde_json::{json, Value};
use std::sync::Arc;

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "pincer".into())
}

/// The model catalog (`models.list`, `chat.metadata`): OpenClaw's entries, `provider` and `id` apart.
pub fn models(gw: &Engine) -> Vec<Value> {
    (gw.settings.providers.configured().iter())
        .filter_map(|spec| spec.split_once('/').filter(|(_, id)| !id.starts_with('<')))
        .map(|(provider, id)| {
            let window =
                gw.settings.providers.resolve(&format!("{provider}/{id}")).ok().and_then(|m| m.model.context_window);
            json!({"id": id, "name": id, "provider": provider, "contextWindow": window})
        })
        .collect()
}

/// `status`: the gateway, its runs and sessions (`openclaw gateway call status`, the debug view).
pub fn status(gw: &Engine) -> Result<Value, RpcError> {
    let sessions = gw.sessions.list(None)?;
    let runs = gw.all_runs();
    let (provider, model) = gw.settings.model.split_once('/').unwrap_or(("", gw.settings.model.as_str()));
    let recent: Vec<Value> = sessions
        .iter()
        .take(10)
        .map(|s| {
            json!({"key": s.key, "sessionId": s.session_id,
        "updatedAt": s.entry.get("updatedAt"), "agentId": s.agent_id})
        })
        .collect();
    Ok(json!({
        "ok": true, "ts": pincer_pi::now_ms(), "uptimeMs": gw.uptime_ms(),
        "server": {"name": "pincer", "version": env!("CARGO_PKG_VERSION"), "host": host()},
        "gateway": {"mode": "local", "stateDir": gw.settings.state_dir.display().to_string()},
        "model": {"provider": provider, "model": model, "primary": gw.settings.model},
        "agents": [{"id": crate::sessions::DEFAULT_AGENT, "sessions": sessions.len()}],
        "sessions": {"count": sessions.len(), "recent": recent,
            "defaults": {"model": gw.settings.model, "mainSessionKey": crate::sessions::MAIN_KEY}},
        "runs": {"active": runs.len(), "runIds": runs.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>()},
        "channels": gw.channels.status(), "heartbeat": null,
        // Pincer: each MCP server's state (starting, ready with its tools, failed with the reason)
        // and each agent's tools from them.
        "mcp": gw.mcp_status(),
    }))
}

/// `system-presence`: this gateway as OpenClaw's presence list has it.
pub fn presence() -> Value {
    let host = host();
    json!([{"host": host, "version": env!("CARGO_PKG_VERSION"), "platform": std::env::consts::OS,
        "mode": "gateway", "reason": "self", "roles": ["gateway"], "scopes": [],
        "text": format!("Gateway: {host} · pincer {}", env!("CARGO_PKG_VERSION")), "ts": pincer_pi::now_ms()}])
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeParams {
    key: NonBlank,
    include_derived_titles: Option<bool>,
}

/// `sessions.describe {key}` → `{key, session}`: one session's row (as `sessions.list` has it).
pub fn describe(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    let p: DescribeParams = crate::protocol::params(Method::SessionsDescribe, params)?;
    let Some(s) = gw.sessions.resolve(&p.key, false)? else {
        // A key no turn has used yet (the UI describes `agent:main:main` before the first message):
        // the row it will have, empty, as `chat.history` answers for it. Nothing is written.
        let (key, agent) = crate::sessions::canonical_key(&p.key)?;
        let row = json!({"key": key, "agentId": agent, "kind": "direct", "isMain": key == crate::sessions::MAIN_KEY,
            "status": "idle", "hasActiveRun": false, "archived": false, "messageCount": 0});
        return Ok(json!({"ok": true, "key": key, "session": row}));
    };
    let mut row = crate::openclaw::methods::session_row(gw, &s);
    let (title, count) = crate::openclaw::methods::transcript_summary(gw.store.as_ref(), &s.path);
    row["messageCount"] = json!(count);
    if p.include_derived_titles == Some(true) {
        row["derivedTitle"] = json!(title);
    }
    Ok(json!({"ok": true, "key": s.key, "session": row}))
}

/// `commands.list`: the slash commands `chat.send` answers without a model.
pub fn commands() -> Value {
    let commands: Vec<Value> = (crate::commands::SLASH_COMMANDS.iter())
        .map(|c| {
            let aliases: Vec<&str> = c.texts.iter().skip(1).copied().collect();
            let mut e = json!({"name": c.name, "nativeName": c.name, "description": c.description,
                "category": if c.name == "status" || c.name == "help" { "status" } else { "session" },
                "source": "native", "scope": "both", "acceptsArgs": c.accepts_args});
            if !aliases.is_empty() {
                e["textAliases"] = json!(aliases);
            }
            e
        })
        .collect();
    json!({"commands": commands})
}

/// `chat.metadata`: what the chat view's model picker and composer need.
pub fn chat_metadata(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct MetadataParams {
        agent_id: Option<crate::sessions::AgentId>,
    }
    let p: MetadataParams = crate::protocol::params(Method::ChatMetadata, params)?;
    let agent = p.agent_id.unwrap_or_else(crate::sessions::AgentId::main);
    let (provider, model) = gw.settings.model.split_once('/').unwrap_or(("", gw.settings.model.as_str()));
    Ok(json!({"agentId": agent, "models": models(gw), "defaults": {"modelProvider": provider, "model": model},
        "thinkingLevels": ["off", "minimal", "low", "medium", "high"], "commands": commands()["commands"]}))
}

/// `models.authStatus`: each configured provider, with whether Pincer holds a credential for it
/// (never the credential).
pub fn auth_status(gw: &Engine) -> Value {
    let configured = gw.settings.providers.configured();
    let mut providers: Vec<&str> = configured.iter().filter_map(|s| s.split_once('/').map(|(p, _)| p)).collect();
    providers.dedup();
    let rows: Vec<Value> = providers.iter().map(|p| json!({"provider": p, "status": "ok", "profiles": []})).collect();
    json!({"ts": pincer_pi::now_ms(), "providers": rows})
}

/// `config.get`: a redacted view of Pincer's settings in the snapshot shape OpenClaw's settings
/// views read (no secret, no token: only where they come from).
pub fn config_get(gw: &Engine) -> Value {
    let s = &gw.settings;
    let path = s.state_dir.join("pincer.toml");
    let config = json!({
        "agents": {"defaults": {"model": {"primary": s.model}}, "list": [{"id": crate::sessions::DEFAULT_AGENT, "default": true}]},
        "gateway": {"mode": "local", "auth": {"mode": "token", "tokenSource": s.token_source}},
        "models": {"providers": s.providers.configured()},
        "logging": {"redactSensitive": if s.redact { "tools" } else { "off" }},
    });
    json!({"path": path.display().to_string(), "exists": path.exists(), "valid": true, "issues": [], "warnings": [],
        "legacyIssues": [], "config": config, "parsed": config, "resolved": config, "runtimeConfig": config,
        "hash": null, "raw": null})
}

/// `themes.list`: no themes of Pincer's own; the UI's built-in one is active.
pub fn themes() -> Value {
    json!({"themes": [], "activeId": null, "mode": "system"})
}

/// `update.status`: Pincer is updated by its package manager, never by the gateway.
pub fn update_status() -> Value {
    json!({"sentinel": null, "updateAvailable": null})
}

/// Dispatches this module's methods.
pub async fn dispatch(gw: &Arc<Engine>, method: Method, params: &Value) -> Result<Value, RpcError> {
    let params = params.clone();
    match method {
        Method::Status => gw.blocking(status).await,
        Method::SystemPresence => Ok(presence()),
        Method::SessionsDescribe => gw.blocking(move |gw| describe(gw, &params)).await,
        Method::CommandsList => Ok(commands()),
        Method::ChatMetadata => chat_metadata(gw, &params),
        Method::ModelsAuthStatus => Ok(auth_status(gw)),
        Method::ConfigGet => Ok(config_get(gw)),
        Method::ThemesList => Ok(themes()),
        Method::UpdateStatus => Ok(update_status()),
        Method::LogsTail => logs_tail(gw, &params),
        _ => Err(RpcError::invalid(format!("unknown method: {}", method.name()))),
    }
}

/// `logs.tail {cursor?, limit? (1–5000, 200), maxBytes? (1–1e6, 250,000)}`.
fn logs_tail(gw: &Engine, params: &Value) -> Result<Value, RpcError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TailParams {
        cursor: Option<u64>,
        limit: Option<u32>,
        max_bytes: Option<u32>,
    }
    let p: TailParams = crate::protocol::params(Method::LogsTail, params)?;
    let limit = p.limit.unwrap_or(200) as usize;
    let max_bytes = p.max_bytes.unwrap_or(250_000) as usize;
    if !(1..=5000).contains(&limit) {
        return Err(RpcError::invalid("invalid logs.tail params: at /limit: must be from 1 to 5000"));
    }
    if !(1..=1_000_000).contains(&max_bytes) {
        return Err(RpcError::invalid("invalid logs.tail params: at /maxBytes: must be from 1 to 1000000"));
    }
    Ok(serde_json::to_value(crate::logs::tail(gw.redactor.as_ref(), p.cursor, limit, max_bytes)).unwrap_or_default())
}
