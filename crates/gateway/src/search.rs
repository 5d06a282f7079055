//! `sessions.search` with OpenClaw 2026.9.6's parameters (`query`, `agentId`, `sessionKeys`,
//! `limit`; `scope.archived`) and result shape (`{results: [{sessionKey, sessionId, messageId,
//! role, timestamp, snippet, score}], truncated, indexing?}`), plus Pincer's `entryId` (the same id as
//! `messageId`, the name the WebChat and the CLI use), `title` and `archived` on each hit and
//! `includeArchived`. The full-text index is `pincer_search`'s (SQLite beside a JSONL state dir) or
//! the PostgreSQL store's (`pincer_pg::search`); this module joins their hits to
//! the session index (keys, titles, archived sessions), the one place `pincer sessions search`
//! and the RPC share.

use crate::protocol::{Method, RpcError};
use crate::sessions::{canonical_key, Sessions};
use crate::state::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Default and largest number of hits.
pub const DEFAULT_LIMIT: usize = 20;
pub const MAX_LIMIT: usize = 100;

/// What to search.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchParams {
    pub query: String,
    #[serde(default)]
    pub agent_id: Option<crate::sessions::AgentId>,
    #[serde(default)]
    pub session_keys: Option<Vec<String>>,
    #[serde(default)]
    pub limit: Option<usize>,
    /// Pincer: include sessions archived with `sessions.patch {archived: true}`.
    #[serde(default)]
    pub include_archived: Option<bool>,
    /// OpenClaw's roster filter; only `archived` is read.
    #[serde(default)]
    pub scope: Option<Value>,
}

/// Where hits come from: the SQLite index of a state directory (the JSONL store) or the PostgreSQL
/// store's own search (rows written with each append, seen by every replica).
#[derive(Clone, Copy)]
pub enum SearchIndex<'a> {
    Sqlite(&'a pincer_search::Index),
    Postgres(&'a pincer_pg::PgStore),
}

impl SearchIndex<'_> {
    fn hits(&self, query: &str, files: &[String], limit: usize) -> Result<Vec<pincer_search::Hit>, String> {
        match self {
            SearchIndex::Sqlite(i) => i.search(query, Some(files), limit).map_err(|e| e.to_string()),
            SearchIndex::Postgres(pg) => pg.search(query, Some(files), limit).map_err(|e| e.to_string()),
        }
    }

    fn title(&self, file: &str) -> Option<String> {
        match self {
            SearchIndex::Sqlite(i) => i.title(file).ok().flatten(),
            SearchIndex::Postgres(pg) => pg.search_title(file).ok().flatten(),
        }
    }
}

/// Runs a search over `index` and describes each hit with its session.
pub fn search(sessions: &Sessions, index: SearchIndex<'_>, p: &SearchParams) -> Result<Value, RpcError> {
    let query = p.query.trim();
    if query.is_empty() {
        return Err(RpcError::invalid("query must not be empty"));
    }
    if query.chars().count() > 4096 {
        return Err(RpcError::invalid("query is longer than 4096 characters"));
    }
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(RpcError::invalid(format!("limit must be an integer from 1 to {MAX_LIMIT}")));
    }
    let archived = p.include_archived.unwrap_or(false)
        || p.scope.as_ref().and_then(|s| s.get("archived")).and_then(Value::as_bool).unwrap_or(false);
    let keys: Option<Vec<String>> = match &p.session_keys {
        None => None,
        Some(ks) => Some(ks.iter().map(|k| canonical_key(k).map(|(k, _)| k)).collect::<Result<_, _>>()?),
    };
    let mut by_file: HashMap<String, crate::sessions::SessionRef> = HashMap::new();
    for s in sessions.list(p.agent_id.as_ref())? {
        if !archived && s.entry.get("archivedAt").is_some_and(|a| !a.is_null()) {
            continue;
        }
        if keys.as_ref().is_some_and(|ks| !ks.contains(&s.key)) {
            continue;
        }
        let Some(name) = s.path.file_name().and_then(|n| n.to_str()) else { continue };
        by_file.insert(format!("agents/{}/sessions/{name}", s.agent_id), s);
    }
    let files: Vec<String> = by_file.keys().cloned().collect();
    let hits = index.hits(query, &files, limit + 1).map_err(|e| match e == pincer_search::STOPPED {
        true => RpcError::unavailable(e),
        false => RpcError::invalid(e),
    })?;
    let truncated = hits.len() > limit;
    let mut results = Vec::new();
    for h in hits.into_iter().take(limit) {
        let Some(s) = by_file.get(&h.file) else { continue };
        let label = s.entry.get("label").and_then(Value::as_str).filter(|l| !l.trim().is_empty()).map(str::to_owned);
        let title = label.or_else(|| index.title(&h.file));
        results.push(json!({
            "sessionKey": s.key, "sessionId": s.session_id, "messageId": h.entry_id, "entryId": h.entry_id,
            "role": h.role, "timestamp": h.timestamp.max(0), "snippet": h.snippet, "score": h.score,
            "title": title, "archived": s.entry.get("archivedAt").is_some_and(|a| !a.is_null()),
        }));
    }
    Ok(json!({"results": results, "truncated": truncated}))
}

/// `sessions.search`: waits for the indexer to take in what was appended, then searches.
pub async fn rpc(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    let p: SearchParams = crate::protocol::params(Method::SessionsSearch, params)?;
    gw.blocking(move |gw| {
        if let Some(pg) = &gw.pg {
            // Indexed in the transaction of each append: nothing to wait for, on any replica.
            return search(&gw.sessions, SearchIndex::Postgres(pg), &p);
        }
        let Some(indexer) = gw.indexer.as_ref() else {
            return Err(RpcError::unavailable("the search index could not be opened; see the gateway's log"));
        };
        // What was appended is searchable at once; while the first sync of a large state dir runs,
        // the answer says `indexing` (OpenClaw's flag) and holds what is indexed so far.
        let indexing = !indexer.flush_within(Some(std::time::Duration::from_secs(2)));
        // A connection of its own: a slow search never makes another wait.
        let readers = gw.search_readers.as_ref().ok_or_else(|| RpcError::unavailable("search index not open"))?;
        let index = readers.take().map_err(|e| RpcError::unavailable(e.to_string()))?;
        let mut found = search(&gw.sessions, SearchIndex::Sqlite(&index), &p)?;
        if indexing {
            found["indexing"] = json!(true);
        }
        Ok(found)
    })
    .await
}
