//! The session index (`<state>/agents/<agentId>/sessions/sessions.json`): session keys, their
//! current `sessionId` and transcript path. Keys from clients are canonicalised (NFKC, lowercase;
//! invisible format characters refused) and never become paths unchecked; only known agents have
//! an index (no directory is created for an unknown agent id). Every change is made under
//! OpenClaw's lock-file protocol (`sessions.json.lock`, shared with transcripts through the store),
//! on the file as it is on disk at that moment (re-read when another process changed it), and
//! rewritten atomically (temp + fsync + rename). Activity timestamps are kept in memory and merged
//! into the file every few seconds. An index that cannot be parsed is never overwritten: operations
//! on that agent fail instead. Every method but `touch` does file I/O: call them off the async
//! threads (`Engine::index`).

use crate::error::EngineError;
use pincer_pi::now_ms;
use pincer_store::{valid_session_id, IndexStamp, Transcripts, TranscriptsExt};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use unicode_normalization::UnicodeNormalization;

/// The default agent and main key.
pub const DEFAULT_AGENT: &str = "main";
pub const MAIN_KEY: &str = "agent:main:main";

/// One session as the gateway uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRef {
    /// Canonical key (`agent:<agentId>:<rest>`).
    pub key: String,
    pub agent_id: String,
    pub session_id: String,
    /// The transcript.
    pub path: PathBuf,
    /// The index row (shared by the clones a turn makes).
    pub entry: Arc<Map<String, Value>>,
    /// [`Sessions::moved`] when this was read: a turn that waited compares the two.
    pub moved: u64,
}

impl SessionRef {
    /// A row for `sessions.list` and `sessionInfo`.
    pub fn row(&self) -> Value {
        let mut row = (*self.entry).clone();
        row.insert("key".into(), json!(self.key));
        row.insert("agentId".into(), json!(self.agent_id));
        row.insert("sessionId".into(), json!(self.session_id));
        row.insert("kind".into(), json!("direct"));
        row.insert("isMain".into(), json!(self.key == MAIN_KEY));
        Value::Object(row)
    }

    /// The session's own model as `provider/model`, if it has one: Pincer's `model` (already
    /// `provider/model`), or OpenClaw's pairs, a bare model id beside its provider
    /// (`modelOverride` + `providerOverride`, the user's choice, before `model` + `modelProvider`,
    /// the model last run). The one reading of a session's model.
    pub fn model(&self) -> Option<String> {
        entry_model(&self.entry)
    }

    /// The principal that owns the session ([`OWNER_FIELD`]); `None`: the operator's.
    pub fn owner(&self) -> Option<&str> {
        self.entry.get(OWNER_FIELD).and_then(Value::as_str)
    }
}

/// The index field naming the principal that created a session (absent: the operator).
pub const OWNER_FIELD: &str = "pincerOwner";

/// Who is asking. The operator (the gateway token, or anyone when auth is off and no API keys are
/// configured) reaches every session; a client with its own API key
/// (`gateway.openai_api.api_keys`) reaches only the sessions it created: its history matches,
/// named session keys, retries and answers never touch another principal's sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Operator,
    /// `apikey:<16 hex digits of the key's SHA-256>`: stable across restarts, and not the key.
    Client(Arc<str>),
}

impl Principal {
    /// The principal of a configured API key.
    pub fn of_api_key(key: &str) -> Principal {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Principal::Client(Arc::from(format!("apikey:{hex}")))
    }

    /// The id written as [`OWNER_FIELD`] of the sessions it creates (`None`: the operator's).
    pub fn id(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Client(id) => Some(id),
        }
    }

    /// Whether this principal may use a session owned by `owner`.
    pub fn reaches(&self, owner: Option<&str>) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Client(id) => owner == Some(&**id),
        }
    }
}

/// Entry fields naming a session's model: the pairs [`SessionRef::model`] reads, in its order.
pub const MODEL_FIELDS: [(&str, &str); 2] = [("modelOverride", "providerOverride"), ("model", "modelProvider")];

/// [`SessionRef::model`] of an index entry.
pub fn entry_model(entry: &Map<String, Value>) -> Option<String> {
    let text = |k: &str| entry.get(k).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty());
    MODEL_FIELDS.iter().find_map(|(model, provider)| {
        let model = text(model)?;
        Some(match text(provider) {
            Some(p) if !model.starts_with(&format!("{p}/")) => format!("{p}/{model}"),
            _ => model.to_owned(),
        })
    })
}

/// An agent id, checked: `[a-z0-9][a-z0-9_-]{0,63}`. Every path of an agent's files is built from
/// one ([`Sessions::sessions_dir`]), so no client-given `agentId` can name `..` or an absolute path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentId(String);

impl TryFrom<String> for AgentId {
    type Error = String;
    fn try_from(raw: String) -> Result<AgentId, String> {
        AgentId::parse(&raw).map_err(|e| e.to_string())
    }
}

impl From<AgentId> for String {
    fn from(a: AgentId) -> String {
        a.0
    }
}

impl std::borrow::Borrow<str> for AgentId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for AgentId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl AgentId {
    /// The id, or an error naming what is wrong with it.
    pub fn parse(raw: &str) -> Result<AgentId, EngineError> {
        if valid_agent_id(raw) {
            Ok(AgentId(raw.to_owned()))
        } else {
            Err(EngineError::invalid(format!(
                "agentId {raw:?} is not an agent id (lowercase letters, digits, '-' and '_', at most 64)"
            )))
        }
    }

    /// The default agent, `main`.
    pub fn main() -> AgentId {
        AgentId(DEFAULT_AGENT.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for AgentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn valid_agent_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'))
}

/// Invisible characters that make two different keys look the same: Unicode format characters
/// (bidi controls, zero-width joiners and spaces, the BOM, tags) and variation selectors.
fn invisible(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F | 0xFEFF
        | 0xFFA0 | 0xFFF0..=0xFFFB | 0x1D173..=0x1D17A | 0xE0000..=0xE0FFF)
}

/// NFKC, lowercase and trimmed, repeated until stable (lowercasing can leave combining marks out
/// of canonical order, and NFKC can yield capitals, as `ℌ` → `H`), so folding a folded key is a no-op.
fn fold(raw: &str) -> Option<String> {
    let mut cur: String = raw.nfkc().collect::<String>().trim().to_owned();
    for _ in 0..4 {
        let lower = cur.to_lowercase();
        let next: String = lower.nfkc().collect::<String>().trim().to_owned();
        if next == cur && lower == cur {
            return Some(cur);
        }
        cur = next;
    }
    None
}

/// Longest canonical session key, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// The agent of canonical session key `key` (`agent:<agent>:<rest>`).
pub fn agent_of(key: &str) -> &str {
    key.strip_prefix("agent:").and_then(|rest| rest.split_once(':')).map_or(DEFAULT_AGENT, |(agent, _)| agent)
}

/// Whether session `key` (canonical) may be deleted: every one but the main session.
pub fn deletable(key: &str) -> Result<(), EngineError> {
    if key == MAIN_KEY {
        return Err(EngineError::invalid(format!("Cannot delete the main session ({MAIN_KEY}).")));
    }
    Ok(())
}

/// Canonical form of a client's session key, and its agent id. Compatibility forms (fullwidth
/// letters, ligatures) are folded by NFKC, so `ａｇｅｎｔ:main:x` and `agent:main:x` are one session.
/// Idempotent: a canonical key (as `sessions.list` returns it) canonicalises to itself.
pub fn canonical_key(raw: &str) -> Result<(String, AgentId), EngineError> {
    let (key, agent) = canonical_key_unbounded(raw)?;
    // The limit applies to the canonical form, so a key accepted once is accepted again.
    if key.len() > MAX_KEY_LEN {
        return Err(EngineError::invalid(format!("sessionKey is longer than {MAX_KEY_LEN} bytes once canonical")));
    }
    Ok((key, AgentId(agent)))
}

fn canonical_key_unbounded(raw: &str) -> Result<(String, String), EngineError> {
    if let Some(c) = raw.chars().find(|c| invisible(*c)) {
        return Err(EngineError::invalid(format!(
            "sessionKey {raw:?} contains the invisible character U+{:04X}, which is not allowed",
            c as u32
        )));
    }
    let k = fold(raw).ok_or_else(|| EngineError::invalid(format!("sessionKey {raw:?} has no stable normal form")))?;
    if k.is_empty() {
        return Err(EngineError::invalid("sessionKey must not be empty"));
    }
    if k.len() > MAX_KEY_LEN {
        return Err(EngineError::invalid(format!("sessionKey is longer than {MAX_KEY_LEN} bytes")));
    }
    if k.chars().any(|c| c.is_control() || c == '/' || c == '\\') {
        return Err(EngineError::invalid(format!("sessionKey {raw:?} contains characters that are not allowed")));
    }
    if k == "main" {
        return Ok((MAIN_KEY.into(), DEFAULT_AGENT.into()));
    }
    if let Some(rest) = k.strip_prefix("agent:") {
        let Some((agent, tail)) = rest.split_once(':') else {
            return Err(EngineError::invalid(format!("sessionKey {raw:?} must look like agent:<agentId>:<key>")));
        };
        if !valid_agent_id(agent) || tail.is_empty() {
            return Err(EngineError::invalid(format!("sessionKey {raw:?} must look like agent:<agentId>:<key>")));
        }
        return Ok((k.clone(), agent.to_owned()));
    }
    Ok((format!("agent:{DEFAULT_AGENT}:{k}"), DEFAULT_AGENT.into()))
}

struct AgentIndex {
    path: PathBuf,
    map: Map<String, Value>,
    /// The file version `map` was read from or written as (`None`: no file).
    stamp: Option<IndexStamp>,
    /// Activity not yet on disk: key → `updatedAt` (see [`Sessions::touch`]).
    touched: HashMap<String, u64>,
}

/// All agents' session indexes.
pub struct Sessions {
    state_dir: PathBuf,
    store: Arc<dyn Transcripts>,
    /// The indexes read, by agent. Held across the store's calls (reading, locking, writing an
    /// index), so never waited for on an async thread: see [`Sessions::touch`].
    agents: Mutex<HashMap<AgentId, AgentIndex>>,
    /// Activity marked while `agents` was busy (agent, key, when), merged in by the next holder.
    /// Held only to push or drain.
    touches: Mutex<Vec<(AgentId, String, u64)>>,
    /// How many transcripts this process moved aside (resets, deletes); see [`Sessions::moved`].
    moved: AtomicU64,
    /// Agents the config names.
    configured: Vec<AgentId>,
}

/// Moves a row's `updatedAt` to `t`, never back.
fn updated_at(row: &mut Map<String, Value>, t: u64) {
    if row.get("updatedAt").and_then(Value::as_u64).is_none_or(|u| u < t) {
        row.insert("updatedAt".into(), json!(t));
    }
}

/// Notes activity on a session's row (see [`Sessions::touch`]).
fn mark_touched(agents: &mut HashMap<AgentId, AgentIndex>, (agent, key, now): (AgentId, String, u64)) {
    if let Some(idx) = agents.get_mut(&agent) {
        if let Some(Value::Object(e)) = idx.map.get_mut(&key) {
            updated_at(e, now);
        }
        let t = idx.touched.entry(key).or_insert(now);
        *t = (*t).max(now);
    }
}

fn read_index(store: &dyn Transcripts, path: &Path) -> Result<(Map<String, Value>, Option<IndexStamp>), EngineError> {
    // Stamp first: a change racing the read makes the next check read again.
    let st = store.index_stamp(path);
    match store.read_index(path) {
        Ok(Some(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => Ok((m, st)),
            _ => Err(EngineError::Persistence(format!(
                "{} is not a JSON object; fix or move it (it is never overwritten)",
                path.display()
            ))),
        },
        Ok(None) => Ok((Map::new(), None)),
        Err(e) => Err(EngineError::Persistence(format!("cannot read the session index: {e}"))),
    }
}

impl Sessions {
    pub fn new(state_dir: &Path, store: Arc<dyn Transcripts>) -> Sessions {
        Sessions {
            state_dir: state_dir.to_path_buf(),
            store,
            agents: Mutex::new(HashMap::new()),
            touches: Mutex::new(Vec::new()),
            moved: AtomicU64::new(0),
            configured: Vec::new(),
        }
    }

    /// The same, also serving the agents the config names (`[agents.<id>]`) before they have sessions.
    pub fn with_agents(mut self, ids: impl IntoIterator<Item = AgentId>) -> Sessions {
        self.configured = ids.into_iter().collect();
        self
    }

    /// An agent with sessions here: the default agent, a configured one, or one whose index exists
    /// on disk.
    pub fn known_agent(&self, agent: &AgentId) -> bool {
        agent.0 == DEFAULT_AGENT
            || self.configured.contains(agent)
            || self.store.index_stamp(&self.sessions_dir(agent).join("sessions.json")).is_some()
    }

    /// `<state>/agents/<agent>/sessions`.
    pub fn sessions_dir(&self, agent: &AgentId) -> PathBuf {
        self.state_dir.join("agents").join(&agent.0).join("sessions")
    }

    /// Runs `f` on an agent's index as it is on disk now. With `change`, under the index's
    /// cross-process lock (so `f` may [`Sessions::save`]).
    fn with_index<T>(
        &self,
        agent: &AgentId,
        change: bool,
        f: impl FnOnce(&mut AgentIndex) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        if !self.known_agent(agent) {
            return Err(EngineError::NotFound(format!(
                "unknown agent id {:?}: this gateway serves agent \"{DEFAULT_AGENT}\"",
                agent.as_str()
            )));
        }
        let mut agents = pincer_pi::lock(&self.agents);
        self.merge_touches(&mut agents);
        let path = self.sessions_dir(agent).join("sessions.json");
        let _guard = match change {
            true => {
                let fail = |e: String| EngineError::Persistence(format!("{}: {e}", path.display()));
                pincer_store::files::create_dir_for(&path).map_err(|e| fail(e.to_string()))?;
                Some(self.store.lock(&path).map_err(|e| fail(e.to_string()))?)
            }
            false => None,
        };
        let idx = match agents.entry(agent.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let (map, stamp) = read_index(self.store.as_ref(), &path)?;
                v.insert(AgentIndex { path, map, stamp, touched: HashMap::new() })
            }
        };
        if self.store.index_stamp(&idx.path) != idx.stamp {
            // Another process changed it: work on what is on disk.
            let (map, stamp) = read_index(self.store.as_ref(), &idx.path)?;
            idx.map = map;
            idx.stamp = stamp;
        }
        f(idx)
    }

    /// Writes the index (with pending activity) atomically. Only under `with_index(_, true, _)`.
    fn save(&self, idx: &mut AgentIndex) -> Result<(), EngineError> {
        for (k, t) in idx.touched.drain() {
            if let Some(Value::Object(e)) = idx.map.get_mut(&k) {
                updated_at(e, t);
            }
        }
        let bytes = serde_json::to_vec_pretty(&idx.map).map_err(|e| EngineError::Internal(e.to_string()))?;
        self.store
            .write_index(&idx.path, &bytes)
            .map_err(|e| EngineError::Persistence(format!("cannot write the session index: {e}")))?;
        idx.stamp = self.store.index_stamp(&idx.path);
        Ok(())
    }

    fn to_ref(&self, key: &str, agent: &AgentId, entry: &Map<String, Value>) -> Result<SessionRef, EngineError> {
        let session_id = entry.get("sessionId").and_then(Value::as_str).unwrap_or("");
        if !valid_session_id(session_id) {
            return Err(EngineError::Persistence(format!(
                "session {key} has an invalid sessionId {session_id:?} in sessions.json"
            )));
        }
        let dir = self.sessions_dir(agent);
        // A stored sessionFile is honoured only if it names a file directly in the sessions dir.
        let path = entry
            .get("sessionFile")
            .and_then(Value::as_str)
            .map(Path::new)
            .filter(|p| p.parent().is_none_or(|d| d.as_os_str().is_empty() || d == dir))
            .and_then(|p| p.file_name())
            .map(|n| dir.join(n))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .unwrap_or_else(|| dir.join(format!("{session_id}.jsonl")));
        Ok(SessionRef {
            key: key.into(),
            agent_id: agent.0.clone(),
            session_id: session_id.into(),
            path,
            entry: Arc::new(entry.clone()),
            moved: self.moved(),
        })
    }

    /// Counts the transcripts moved aside by this process (resets, deletes): a [`SessionRef`] read
    /// before the last one may name a transcript that is gone (checked cheaply by turns that waited).
    pub fn moved(&self) -> u64 {
        self.moved.load(Ordering::Acquire)
    }

    fn fresh_entry() -> Map<String, Value> {
        let now = now_ms();
        let mut e = Map::new();
        e.insert("sessionId".into(), json!(uuid::Uuid::new_v4().to_string()));
        e.insert("updatedAt".into(), json!(now));
        e.insert("sessionStartedAt".into(), json!(now));
        e
    }

    /// The session of a key; created in the index when `create` and missing.
    pub fn resolve(&self, raw_key: &str, create: bool) -> Result<Option<SessionRef>, EngineError> {
        self.resolve_for(raw_key, create, &Principal::Operator)
    }

    /// [`Sessions::resolve`] for a principal: a session it creates is owned by it (written with
    /// the new row, in one change of the index). Whether it may use an existing one is the
    /// caller's check ([`Principal::reaches`]).
    pub fn resolve_for(
        &self,
        raw_key: &str,
        create: bool,
        principal: &Principal,
    ) -> Result<Option<SessionRef>, EngineError> {
        let (key, agent) = canonical_key(raw_key)?;
        if !create && !self.known_agent(&agent) {
            return Ok(None);
        }
        let found = self.with_index(&agent, false, |idx| match idx.map.get(&key) {
            Some(Value::Object(e)) => self.to_ref(&key, &agent, e).map(Some),
            _ => Ok(None),
        })?;
        if found.is_some() || !create {
            return Ok(found);
        }
        self.with_index(&agent, true, |idx| {
            if let Some(Value::Object(e)) = idx.map.get(&key) {
                return self.to_ref(&key, &agent, e).map(Some);
            }
            let mut e = Self::fresh_entry();
            if let Some(owner) = principal.id() {
                e.insert(OWNER_FIELD.into(), json!(owner));
            }
            idx.map.insert(key.clone(), Value::Object(e.clone()));
            self.save(idx)?;
            self.to_ref(&key, &agent, &e).map(Some)
        })
    }

    /// The session of a key (created in the index when `create` and missing): from memory when it
    /// can be answered there ([`Sessions::resolve_cached`]), else on a blocking thread.
    pub async fn session(self: Arc<Self>, key: &str, create: bool) -> Result<Option<SessionRef>, EngineError> {
        if let Some(s) = self.resolve_cached(key) {
            return Ok(Some(s));
        }
        let k = key.to_owned();
        tokio::task::spawn_blocking(move || self.resolve(&k, create)).await.map_err(EngineError::task)?
    }

    /// Whether `session` (read before) no longer names its key's transcript: reset or deleted by
    /// this process since (looked up only when [`Sessions::moved`] says some transcript was moved
    /// aside meanwhile).
    pub async fn moved_aside(self: &Arc<Self>, session: &SessionRef) -> bool {
        session.moved != self.moved()
            && !matches!(self.clone().session(&session.key, false).await, Ok(Some(now)) if now.path == session.path)
    }

    /// [`Sessions::resolve`] of an existing session from memory, without blocking (safe on async
    /// threads): `None` when the index is busy, not read yet, changed on disk (a `stat`, where the
    /// store answers that without blocking) or without the key; then ask [`Sessions::resolve`].
    pub fn resolve_cached(&self, raw_key: &str) -> Option<SessionRef> {
        let (key, agent) = canonical_key(raw_key).ok()?;
        let agents = self.agents.try_lock().ok()?;
        let idx = agents.get(&agent)?;
        if self.store.peek_index_stamp(&idx.path)? != idx.stamp {
            return None;
        }
        match idx.map.get(&key) {
            Some(Value::Object(e)) => self.to_ref(&key, &agent, e).ok(),
            _ => None,
        }
    }

    /// Updates fields of a session's row (`null` removes a field). `updatedAt` (the lists' order) moves
    /// only for a change of the session's behaviour: a name, archiving or read marks leave it.
    pub fn patch(&self, raw_key: &str, fields: &Map<String, Value>) -> Result<SessionRef, EngineError> {
        const QUIET: &[&str] = &["label", "displayName", "archivedAt", "markedUnreadAt", "lastReadAt"];
        let (key, agent) = canonical_key(raw_key)?;
        self.with_index(&agent, true, |idx| {
            let Some(Value::Object(e)) = idx.map.get_mut(&key) else {
                return Err(EngineError::NotFound(format!("session not found: {key}")));
            };
            for (k, v) in fields {
                if matches!(k.as_str(), "sessionId" | "sessionFile") {
                    return Err(EngineError::invalid(format!("{k} cannot be patched")));
                }
                if v.is_null() {
                    e.remove(k);
                } else {
                    e.insert(k.clone(), v.clone());
                }
            }
            if fields.keys().any(|k| !QUIET.contains(&k.as_str())) || !e.contains_key("updatedAt") {
                e.insert("updatedAt".into(), json!(now_ms()));
            }
            let e = e.clone();
            self.save(idx)?;
            self.to_ref(&key, &agent, &e)
        })
    }

    /// Marks activity on a session. Only `updatedAt` changes, so it is kept in memory (no file
    /// I/O) and merged into the file by [`Sessions::flush`] (every few seconds and at shutdown), not
    /// with an fsync on every turn. Never waits (safe on async threads): while the indexes are busy
    /// (another thread reads or writes one, which on PostgreSQL waits for the runtime's tasks) the
    /// mark waits in `touches` for the next holder.
    pub fn touch(&self, s: &SessionRef) {
        let mark = (AgentId(s.agent_id.clone()), s.key.clone(), now_ms());
        let mut agents = match self.agents.try_lock() {
            Ok(agents) => agents,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return pincer_pi::lock(&self.touches).push(mark),
        };
        self.merge_touches(&mut agents);
        mark_touched(&mut agents, mark);
    }

    /// Applies the marks [`Sessions::touch`] left while the indexes were busy.
    fn merge_touches(&self, agents: &mut HashMap<AgentId, AgentIndex>) {
        let marks = std::mem::take(&mut *pincer_pi::lock(&self.touches));
        for mark in marks {
            mark_touched(agents, mark);
        }
    }

    /// Merges pending activity into every index file that has some.
    pub fn flush(&self) {
        let pending: Vec<AgentId> = {
            let mut agents = pincer_pi::lock(&self.agents);
            self.merge_touches(&mut agents);
            agents.iter().filter(|(_, i)| !i.touched.is_empty()).map(|(a, _)| a.clone()).collect()
        };
        for agent in pending {
            if let Err(e) = self.with_index(&agent, true, |idx| self.save(idx)) {
                tracing::warn!("cannot write the session index: {}", e);
            }
        }
    }

    /// Starts a new transcript for a key; the old one is archived as `<file>.<reason>.<ts>`.
    pub fn reset(&self, raw_key: &str, reason: &str) -> Result<(SessionRef, Option<PathBuf>), EngineError> {
        let (key, agent) = canonical_key(raw_key)?;
        self.with_index(&agent, true, |idx| {
            let old = match idx.map.get(&key) {
                Some(Value::Object(e)) => Some(self.to_ref(&key, &agent, e)?),
                _ => None,
            };
            let archived = match &old {
                Some(o) => self
                    .store
                    .archive_transcript(&o.path, reason)
                    .map_err(|e| EngineError::Persistence(format!("cannot archive the transcript: {e}")))?,
                None => None,
            };
            let mut e = Self::fresh_entry();
            if let Some(o) = &old {
                for (k, v) in o.entry.iter() {
                    let model_field = MODEL_FIELDS.iter().any(|(m, p)| k == m || k == p);
                    if model_field
                        || matches!(
                            k.as_str(),
                            "label"
                                | "displayName"
                                | "thinkingLevel"
                                | OWNER_FIELD
                                | "deliveryContext"
                                | "origin"
                                | "chatType"
                        )
                    {
                        e.insert(k.clone(), v.clone());
                    }
                }
            }
            idx.map.insert(key.clone(), Value::Object(e.clone()));
            self.moved.fetch_add(1, Ordering::AcqRel);
            self.save(idx)?;
            Ok((self.to_ref(&key, &agent, &e)?, archived))
        })
    }

    /// Removes a key from the index; its transcript is archived as `<file>.deleted.<ts>`.
    pub fn delete(&self, raw_key: &str) -> Result<(bool, Vec<PathBuf>), EngineError> {
        let (key, agent) = canonical_key(raw_key)?;
        deletable(&key)?;
        self.with_index(&agent, true, |idx| {
            let Some(Value::Object(e)) = idx.map.get(&key).cloned() else {
                return Ok((false, vec![]));
            };
            let r = self.to_ref(&key, &agent, &e)?;
            let archived = self
                .store
                .archive_transcript(&r.path, "deleted")
                .map_err(|e| EngineError::Persistence(format!("cannot archive the transcript: {e}")))?;
            idx.map.remove(&key);
            self.moved.fetch_add(1, Ordering::AcqRel);
            self.save(idx)?;
            Ok((true, archived.into_iter().collect()))
        })
    }

    /// Imports a transcript (checked by `pincer_export::prepare_import`) as a new session of the
    /// default agent, `agent:main:import:<sessionId>`. The session id is kept unless it clashes
    /// with a session or file already here (or cannot name a file): then a new one is put in the
    /// header, the only byte that changes. The transcript is written first (never over an
    /// existing file), then the index row, both under the index's lock.
    pub fn import(&self, prepared: &pincer_export::Prepared) -> Result<SessionRef, EngineError> {
        let agent = &AgentId::main();
        let dir = self.sessions_dir(agent);
        self.with_index(agent, true, |idx| {
            // (A store that cannot say whether the file exists counts it taken: a fresh id is used.)
            let taken = |id: &str| {
                self.store.exists(&dir.join(format!("{id}.jsonl"))).unwrap_or(true)
                    || idx.map.values().any(|v| v.get("sessionId").and_then(Value::as_str) == Some(id))
                    || idx.map.contains_key(&format!("agent:{agent}:import:{id}"))
            };
            let (id, bytes) = match prepared.session_id.as_deref().filter(|id| !taken(id)) {
                Some(id) => (id.to_owned(), std::borrow::Cow::Borrowed(&prepared.bytes)),
                None => {
                    let id = uuid::Uuid::new_v4().to_string();
                    let b = pincer_export::import::with_session_id(&prepared.bytes, &id)
                        .map_err(|e| EngineError::invalid(e.to_string()))?;
                    (id, std::borrow::Cow::Owned(b))
                }
            };
            let key = format!("agent:{agent}:import:{id}");
            let path = dir.join(format!("{id}.jsonl"));
            self.store
                .import_transcript(&path, &bytes)
                .map_err(|e| EngineError::Persistence(format!("cannot write the transcript: {e}")))?;
            let now = now_ms();
            let mut e = Map::new();
            e.insert("sessionId".into(), json!(id));
            e.insert("updatedAt".into(), json!(now));
            e.insert("sessionStartedAt".into(), json!(now));
            idx.map.insert(key.clone(), Value::Object(e.clone()));
            self.save(idx)?;
            self.to_ref(&key, agent, &e)
        })
    }

    /// Sessions of one agent (or all agents found on disk), most recent first.
    /// The stamp of every agent's `sessions.json` (one `stat` each): when it changed, someone (this
    /// gateway or another process) wrote the index.
    pub fn index_stamps(&self) -> Vec<Option<pincer_store::IndexStamp>> {
        let mut agents: Vec<String> = self.store.agents(&self.state_dir);
        if !agents.iter().any(|a| a == DEFAULT_AGENT) {
            agents.push(DEFAULT_AGENT.into());
        }
        agents.sort();
        agents
            .into_iter()
            .filter_map(|a| AgentId::parse(&a).ok())
            .map(|a| self.store.index_stamp(&self.sessions_dir(&a).join("sessions.json")))
            .collect()
    }

    pub fn list(&self, agent: Option<&AgentId>) -> Result<Vec<SessionRef>, EngineError> {
        let agents: Vec<AgentId> = match agent {
            Some(a) => vec![a.clone()],
            None => {
                let mut v: Vec<AgentId> =
                    self.store.agents(&self.state_dir).iter().filter_map(|a| AgentId::parse(a).ok()).collect();
                if !v.iter().any(|a| a.0 == DEFAULT_AGENT) {
                    v.push(AgentId::main());
                }
                v
            }
        };
        let mut out = Vec::new();
        for a in agents {
            if !self.known_agent(&a) {
                continue;
            }
            self.with_index(&a, false, |idx| {
                for (k, v) in &idx.map {
                    if let Value::Object(e) = v {
                        if let Ok(r) = self.to_ref(k, &a, e) {
                            out.push(r);
                        }
                    }
                }
                Ok(())
            })?;
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.entry.get("updatedAt").and_then(Value::as_i64).unwrap_or(0)));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_canonicalised_and_checked() {
        assert_eq!(canonical_key("main").expect("ok"), (MAIN_KEY.to_string(), AgentId::main()));
        assert_eq!(canonical_key(" Agent:Main:Main ").expect("ok").0, MAIN_KEY);
        assert_eq!(canonical_key("dashboard:x").expect("ok").0, "agent:main:dashboard:x");
        assert_eq!(canonical_key("agent:ops:daily").expect("ok"), ("agent:ops:daily".into(), AgentId("ops".into())));
        for bad in ["", "agent:../x:y", "a/b", "agent:main:", "x\u{0}y", "agent:"] {
            assert!(canonical_key(bad).is_err(), "{bad:?}");
        }
        // Look-alikes: invisible characters are refused, compatibility forms folded.
        for bad in ["ma\u{200b}in", "main\u{202e}", "\u{feff}main", "a\u{2066}b", "x\u{fe0f}"] {
            let e = canonical_key(bad).expect_err(bad);
            assert!(e.to_string().contains("invisible character U+"), "{}", e);
        }
        assert_eq!(canonical_key("ａｇｅｎｔ：ｍａｉｎ：ｘ").expect("fullwidth").0, "agent:main:x");
        assert_eq!(canonical_key("ＭＡＩＮ").expect("fullwidth").0, MAIN_KEY);
        // Found by the fuzzer: İ lowercases to i + U+0307, out of canonical order before U+0326.
        for tricky in ["\u{130}\u{326}\u{a6}nbbl", "\u{210c}ello", "\u{2160}x"] {
            let (k, _) = canonical_key(tricky).expect(tricky);
            assert_eq!(canonical_key(&k).expect("again").0, k, "{tricky:?} folds to a fixed point");
        }
    }

    #[test]
    fn canonical_keys_canonicalise_to_themselves_up_to_the_length_limit() {
        // Found by fuzz/fuzz_targets/canonical_key.rs: a 502..=512-byte key was accepted, but its
        // canonical form `agent:main:<key>` (up to 523 bytes) was refused when a client sent it back.
        for len in [500, 501, 502, 512, 513] {
            let raw = "k".repeat(len);
            match canonical_key(&raw) {
                Ok((key, agent)) => {
                    assert!(key.len() <= MAX_KEY_LEN, "{len}");
                    assert_eq!(canonical_key(&key).expect("canonical key accepted again"), (key, agent));
                }
                Err(e) => assert!(e.to_string().contains("longer than 512 bytes"), "{len}: {}", e),
            }
        }
        assert!(canonical_key(&"k".repeat(MAX_KEY_LEN - "agent:main:".len())).is_ok());
        assert!(canonical_key(&"k".repeat(MAX_KEY_LEN - "agent:main:".len() + 1)).is_err());
        assert!(canonical_key(&format!("agent:ops:{}", "k".repeat(MAX_KEY_LEN - 10))).is_ok());
    }

    #[test]
    fn create_reset_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Sessions::new(dir.path(), Arc::new(pincer_store::Store::new(Default::default())));
        assert_eq!(s.resolve("main", false).expect("ok"), None);
        let a = s.resolve("main", true).expect("ok").expect("created");
        assert_eq!(a.path, dir.path().join(format!("agents/main/sessions/{}.jsonl", a.session_id)));
        std::fs::write(&a.path, "x").expect("write");
        let (b, archived) = s.reset("main", "reset").expect("reset");
        assert_ne!(a.session_id, b.session_id);
        assert!(archived.expect("archived").to_string_lossy().contains(".jsonl.reset."));
        assert!(s.delete("main").is_err());
        s.resolve("other", true).expect("ok");
        assert!(s.delete("other").expect("ok").0);
        let fresh = Sessions::new(dir.path(), Arc::new(pincer_store::Store::new(Default::default())));
        assert_eq!(fresh.resolve("main", false).expect("ok").map(|r| r.session_id), Some(b.session_id));
        // Unknown agents: refused for creation, absent for lookups, and no directory appears.
        let e = s.resolve("agent:ghost:x", true).expect_err("unknown agent");
        assert!(e.to_string().contains("unknown agent id \"ghost\""), "{}", e);
        assert_eq!(s.resolve("agent:ghost:x", false).expect("lookup"), None);
        assert!(!dir.path().join("agents/ghost").exists());
        // Another process's change to sessions.json is seen, not overwritten.
        let idx = dir.path().join("agents/main/sessions/sessions.json");
        let mut on_disk: Value = serde_json::from_slice(&std::fs::read(&idx).expect("read")).expect("json");
        on_disk["agent:main:theirs"] = json!({"sessionId": "their-session", "updatedAt": 1});
        std::fs::write(&idx, serde_json::to_vec(&on_disk).expect("json")).expect("write");
        assert_eq!(s.resolve_cached("main"), None, "the cached index is stale after the change");
        assert!(s.resolve("agent:main:theirs", false).expect("ok").is_some(), "re-read after the change");
        assert_eq!(s.resolve_cached("agent:main:theirs").map(|r| r.session_id).as_deref(), Some("their-session"));
        assert_eq!(s.resolve_cached("agent:main:nobody"), None);
        s.resolve("mine", true).expect("create");
        let after: Value = serde_json::from_slice(&std::fs::read(&idx).expect("read")).expect("json");
        assert!(after.get("agent:main:theirs").is_some() && after.get("agent:main:mine").is_some(), "{after}");
        let lock_file = dir.path().join("agents/main/sessions/sessions.json.lock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while lock_file.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!lock_file.exists(), "the lock is released after its short linger");
        std::fs::write(dir.path().join("agents/main/sessions/sessions.json"), "[broken").expect("write");
        assert!(Sessions::new(dir.path(), Arc::new(pincer_store::Store::new(Default::default())))
            .resolve("main", true)
            .is_err());
    }
}
