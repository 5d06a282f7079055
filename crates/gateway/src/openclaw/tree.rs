//! The session tree's methods, with OpenClaw 2026.9.6's names and shapes: `sessions.branches.list`,
//! `sessions.branches.switch`, `sessions.rewind`, `sessions.fork`, `chat.message.get`, and
//! Pincer's `sessions.tree` and `sessions.label`. Each decodes its params, calls the engine's
//! operation ([`crate::tree`]) and shapes its answer. Nothing is written when the input is wrong:
//! the errors name the session or the entry that was not found or not allowed.

use crate::protocol::{params, Bounded, Method, NonBlank, RpcError};
use crate::state::Engine;
use crate::tree::{self, Message, SessionSel};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// `chat.message.get`'s largest `maxChars`.
const MESSAGE_MAX_CHARS: u64 = 2_000_000;

/// `chat.message.get`'s `maxChars` when none is given.
const MESSAGE_DEFAULT_CHARS: usize = 1_000_000;

/// `{sessionKey, agentId?}`: the session every tree method works on.
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionParams {
    session_key: NonBlank,
    agent_id: Option<crate::sessions::AgentId>,
}

impl SessionParams {
    fn sel(self) -> SessionSel {
        SessionSel { key: self.session_key.0, agent_id: self.agent_id }
    }
}

/// `sessions.branches.switch`.
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SwitchParams {
    #[serde(flatten)]
    session: SessionParams,
    leaf_entry_id: NonBlank,
}

/// `sessions.rewind`, `sessions.fork`.
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntryParams {
    #[serde(flatten)]
    session: SessionParams,
    entry_id: NonBlank,
}

/// `chat.message.get`.
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageGetParams {
    #[serde(flatten)]
    session: SessionParams,
    message_id: NonBlank,
    max_chars: Option<Bounded<1, MESSAGE_MAX_CHARS>>,
}

/// `sessions.label` (`label: null` or absent clears it).
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LabelParams {
    #[serde(flatten)]
    session: SessionParams,
    entry_id: NonBlank,
    label: Option<String>,
}

/// `sessions.branches.list`: the tips one can switch to (none for an unknown session).
pub async fn branches_list(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: SessionParams = params(Method::SessionsBranchesList, raw)?;
    let branches = tree::branches(gw, p.sel()).await?.unwrap_or_default();
    let branches: Vec<Value> = (branches.into_iter())
        .map(|b| {
            let mut v = json!({
                "leafEntryId": b.leaf_entry_id,
                "headline": b.headline,
                "messageCount": b.message_count,
                "active": b.active,
            });
            if let Some(ts) = b.updated_at {
                v["updatedAt"] = json!(ts);
            }
            v
        })
        .collect();
    Ok(json!({"branches": branches}))
}

/// `sessions.tree` (Pincer): every message with its parent and the newest tip below it.
pub async fn tree(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: SessionParams = params(Method::SessionsTree, raw)?;
    let t = tree::tree(gw, p.sel()).await?;
    let nodes: Vec<Value> = (t.nodes.into_iter())
        .map(|n| json!({"id": n.id, "parentId": n.parent_id, "role": n.role, "tipId": n.tip_id}))
        .collect();
    let labels: Map<String, Value> = t.labels.into_iter().map(|(target, l)| (target, json!(l))).collect();
    let turns: Map<String, Value> = (t.turns.into_iter())
        .map(|(user, m)| {
            let mut mark = json!({"resumed": m.resumed});
            if let Some(why) = m.interrupted {
                mark["interrupted"] = why;
            }
            (user, mark)
        })
        .collect();
    Ok(json!({"sessionKey": t.session_key, "leafId": t.leaf_id, "nodes": nodes, "labels": labels, "turns": turns}))
}

/// `sessions.branches.switch`.
pub async fn branches_switch(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: SwitchParams = params(Method::SessionsBranchesSwitch, raw)?;
    tree::switch(gw, p.session.sel(), p.leaf_entry_id.0).await?;
    Ok(json!({}))
}

/// `sessions.rewind`: the leaf goes to the parent of a user message; its text comes back.
pub async fn rewind(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: EntryParams = params(Method::SessionsRewind, raw)?;
    Ok(match tree::rewind(gw, p.session.sel(), p.entry_id.0).await? {
        Some(text) => json!({"editorText": text}),
        None => json!({}),
    })
}

/// `sessions.fork`: a new dashboard session holding the active path before a user message.
pub async fn fork(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: EntryParams = params(Method::SessionsFork, raw)?;
    let (key, text) = tree::fork(gw, p.session.sel(), p.entry_id.0).await?;
    let mut out = json!({"sessionKey": key});
    if let Some(text) = text {
        out["editorText"] = json!(text);
    }
    Ok(out)
}

/// `chat.message.get`: one entry of the session in full (up to `maxChars` per text).
pub async fn message_get(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: MessageGetParams = params(Method::ChatMessageGet, raw)?;
    let max_chars = p.max_chars.map_or(MESSAGE_DEFAULT_CHARS, |m| m.0 as usize);
    Ok(match tree::message(gw, p.session.sel(), p.message_id.0, max_chars).await? {
        Message::Found(m) => json!({"ok": true, "message": m}),
        Message::NotFound => json!({"ok": false, "unavailableReason": "not_found"}),
        Message::NotVisible => json!({"ok": false, "unavailableReason": "not_visible"}),
    })
}

/// `sessions.label` (Pincer): sets or clears a Pi `label` on an entry of the session.
pub async fn label(gw: &Arc<Engine>, raw: &Value) -> Result<Value, RpcError> {
    let p: LabelParams = params(Method::SessionsLabel, raw)?;
    let l = tree::label(gw, p.session.sel(), p.entry_id.0, p.label).await?;
    Ok(json!({"ok": true, "entryId": l.entry_id, "targetId": l.target_id, "label": l.label}))
}
