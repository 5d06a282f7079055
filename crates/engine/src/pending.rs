//! The approvals the engine holds ([`crate::state::Engine::approvals`]): the requests waiting
//! for a decision here, the ones decided lately (to answer a late `resolve` with "already
//! decided") and the allow-always list (`<state>/approvals.json`). The gate that fills it and
//! decides is [`crate::approvals`].

use crate::sessions::SessionRef;
use pincer_agent::tools::ToolError;
use pincer_pi::lock;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The length of a request's short code (its id's first characters), as OpenClaw shows it.
pub const SLUG_CHARS: usize = 8;
/// How many decided approvals are remembered to answer a late `resolve` with "already decided".
pub(crate) const REMEMBERED: usize = 4096;

/// A decision, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// `allow-once`, `allow-always` or `deny`.
    pub decision: String,
    /// `operator`, `timeout` or `aborted`.
    pub reason: String,
    /// Who decided (the client's id, or `pincer`).
    pub by: String,
    pub ts: u64,
}

impl Decided {
    pub(crate) fn allows(&self) -> bool {
        self.decision != "deny"
    }

    /// The error result a denied call gets.
    pub(crate) fn denied(&self) -> ToolError {
        ToolError::failed(match self.reason.as_str() {
            "timeout" => {
                "Denied: the approval request timed out before anyone answered it; the command did not run.".to_owned()
            }
            "aborted" => "Denied: the run was aborted while this call waited for approval; it did not run.".to_owned(),
            _ => format!("Denied by {}: the command did not run.", self.by),
        })
    }
}

/// A request waiting for its decision.
pub struct Pending {
    /// As `exec.approval.list` lists it: `{id, request, createdAtMs, expiresAtMs}`.
    pub record: Value,
    pub id: String,
    pub(crate) session: SessionRef,
    pub(crate) run_id: String,
    pub(crate) tool_call_id: String,
    pub(crate) tool: String,
    pub(crate) expires_at: u64,
    /// Held while a decision is written, so the first answer wins.
    pub(crate) decided: tokio::sync::Mutex<Option<Decided>>,
    pub(crate) tx: tokio::sync::watch::Sender<Option<Decided>>,
}

/// An allow-always entry: this agent may run this command of this tool in this directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Allowed {
    pub(crate) agent_id: String,
    pub(crate) tool: String,
    pub(crate) command: String,
    pub(crate) cwd: String,
    pub(crate) approval_id: String,
    pub(crate) created_at_ms: u64,
}

#[derive(Debug, Default, serde::Serialize, Deserialize)]
struct AllowFile {
    pub(crate) version: u32,
    pub(crate) allow: Vec<Allowed>,
}

/// The gateway's approvals: the requests waiting here, the ones decided lately and the
/// allow-always list.
pub struct Approvals {
    pub(crate) pending: Mutex<HashMap<String, Arc<Pending>>>,
    pub(crate) decided: Mutex<VecDeque<(String, Decided)>>,
    allowed: Mutex<Vec<Allowed>>,
    path: PathBuf,
}

impl Approvals {
    /// The file of the allow-always list in `state_dir`.
    pub fn file(state_dir: &Path) -> PathBuf {
        state_dir.join("approvals.json")
    }

    /// Reads the allow-always list of `state_dir` (none yet: empty). A file that does not parse
    /// stops the startup with its path: it is never overwritten.
    pub fn load(state_dir: &Path) -> Result<Approvals, String> {
        let path = Self::file(state_dir);
        let allowed = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice::<AllowFile>(&bytes).map_err(|e| format!("{}: {e}", path.display()))?.allow
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Ok(Approvals { pending: Mutex::default(), decided: Mutex::default(), allowed: Mutex::new(allowed), path })
    }

    /// Whether `agent` may run `command` of `tool` in `cwd` without asking (allow-always).
    pub(crate) fn is_allowed(&self, agent: &str, tool: &str, command: &str, cwd: &str) -> bool {
        lock(&self.allowed)
            .iter()
            .any(|a| a.agent_id == agent && a.tool == tool && a.command == command && a.cwd == cwd)
    }

    /// Adds the command of `record` (a request as listed) to the allow-always list and writes the
    /// file (atomically).
    pub(crate) fn allow_always(&self, record: &Value) -> std::io::Result<()> {
        let req = &record["request"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let entry = Allowed {
            agent_id: s(&req["agentId"]),
            tool: s(&req["toolName"]),
            command: s(&req["command"]),
            cwd: s(&req["cwd"]),
            approval_id: s(&record["id"]),
            created_at_ms: pincer_pi::now_ms(),
        };
        let mut allowed = lock(&self.allowed);
        if !allowed.iter().any(|a| a.agent_id == entry.agent_id && a.command == entry.command && a.cwd == entry.cwd) {
            let mut next = allowed.clone();
            next.push(entry);
            let bytes = serde_json::to_vec_pretty(&AllowFile { version: 1, allow: next.clone() })
                .map_err(std::io::Error::other)?;
            pincer_store::files::write_approvals(&self.path, &bytes)?;
            *allowed = next;
        }
        Ok(())
    }

    /// The requests waiting here, as [`list`] lists them (unordered).
    pub(crate) fn local(&self) -> Vec<Value> {
        let now = pincer_pi::now_ms();
        let pending = lock(&self.pending);
        pending
            .values()
            .filter(|p| p.expires_at > now)
            .map(|p| {
                let mut r = p.record.clone();
                r["approvalKind"] = json!("exec");
                r
            })
            .collect()
    }

    /// The request waiting here under `id`, or under the one id `id` starts (OpenClaw's short
    /// code, the first [`SLUG_CHARS`] characters, as the pending message gives it).
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Pending>> {
        let id = id.trim();
        let pending = lock(&self.pending);
        if let Some(p) = pending.get(id) {
            return Some(p.clone());
        }
        if id.len() < SLUG_CHARS {
            return None;
        }
        let mut hits = pending.values().filter(|p| p.id.starts_with(id));
        match (hits.next(), hits.next()) {
            (Some(p), None) => Some(p.clone()),
            _ => None,
        }
    }

    pub(crate) fn remembered(&self, id: &str) -> Option<Decided> {
        let id = id.trim();
        let slug = id.len() >= SLUG_CHARS;
        let decided = lock(&self.decided);
        decided.iter().rev().find(|(i, _)| i == id || (slug && i.starts_with(id))).map(|(_, d)| d.clone())
    }

    /// True when a run of session `key` waits here for a decision.
    pub fn waiting_in(&self, key: &str) -> bool {
        lock(&self.pending).values().any(|p| p.session.key == key)
    }

    /// The requests of run `run_id` waiting now.
    pub(crate) fn of_run(&self, run_id: &str) -> Vec<Arc<Pending>> {
        lock(&self.pending).values().filter(|p| p.run_id == run_id).cloned().collect()
    }
}
