//! `pincer store import --from-openclaw STATE_DIR`: brings the sessions of OpenClaw 2026.9 (which
//! keeps them in SQLite, `agents/<agent>/agent/openclaw-agent.sqlite`) into Pincer's store (the
//! JSONL state directory, or PostgreSQL with `--to`). Each database is opened read-only and never
//! written. Every session (`session_nodes`) becomes an index row of the same key (OpenClaw's own
//! `entry_json`, unknown fields kept, with its label and model) and its current transcript
//! (`transcript_events` of `current_session_id`, in order) a Pi v3 file: the same entries, ids and
//! parents. OpenClaw's `leaf` entries (a branch switch or rewind) are rechained to their target as
//! Pincer writes them, so the real Pi library (whose leaf is the file's last entry) builds the same
//! branch OpenClaw shows. Messages are redacted as the store redacts on write. A session whose key
//! or transcript is already here is skipped (running the import again changes nothing). Prints
//! `{"sessions","skipped","problems"}`; exit 1 when a session could not be imported.

use crate::Failure;
use pincer_store::redact::Redactor;
use pincer_store::{Transcripts, TranscriptsExt};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// One OpenClaw session read from its database, ready to be written.
struct Session {
    key: String,
    id: String,
    row: Map<String, Value>,
    bytes: Vec<u8>,
}

/// What one import did.
#[derive(Default)]
struct Report {
    sessions: Vec<String>,
    skipped: Vec<Value>,
    problems: Vec<String>,
}

/// Imports every agent database under `from` into `store` (its index and transcripts under
/// `state_dir`, as the gateway on that state directory finds them).
pub fn import(from: &Path, store: &dyn Transcripts, state_dir: &Path, redactor: &dyn Redactor) -> Result<u8, Failure> {
    let agents_dir = from.join("agents");
    let mut dbs: Vec<(String, PathBuf)> = std::fs::read_dir(&agents_dir)
        .map_err(|e| Failure::usage(format!("--from-openclaw {}: {e}", agents_dir.display())))?
        .flatten()
        .filter_map(|e| {
            let agent = e.file_name().to_str()?.to_owned();
            let db = e.path().join("agent/openclaw-agent.sqlite");
            db.is_file().then_some((agent, db))
        })
        .collect();
    if dbs.is_empty() {
        return Err(Failure::usage(format!(
            "--from-openclaw {}: no agents/<agent>/agent/openclaw-agent.sqlite (not an OpenClaw 2026.9 state \
             directory; an older one keeps JSONL files Pincer reads as they are)",
            from.display()
        )));
    }
    dbs.sort();
    let mut report = Report::default();
    for (agent, db) in dbs {
        match read_agent(&db, redactor) {
            Ok(sessions) => write_agent(store, state_dir, &agent, sessions, &mut report),
            Err(e) => report.problems.push(format!("{}: {e}", db.display())),
        }
    }
    let out = json!({"sessions": report.sessions, "skipped": report.skipped, "problems": report.problems});
    crate::out::line(&out.to_string())?;
    Ok(if report.problems.is_empty() { 0 } else { 1 })
}

/// Opens an OpenClaw agent database read-only (WAL content included; nothing is written to it).
fn open(db: &Path) -> Result<Connection, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = Connection::open_with_flags(db, flags).map_err(|e| e.to_string())?;
    let version: Option<(i64, Option<String>)> = c
        .query_row("SELECT schema_version, app_version FROM schema_meta WHERE role = 'agent' LIMIT 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| format!("not an OpenClaw agent database (schema_meta: {e})"))?;
    if version.is_none() {
        return Err("not an OpenClaw agent database (no agent row in schema_meta)".into());
    }
    Ok(c)
}

/// Every session of one agent database: its index row and its transcript, or the error naming it.
fn read_agent(db: &Path, redactor: &dyn Redactor) -> Result<Vec<Result<Session, String>>, String> {
    let c = open(db)?;
    let mut q = c
        .prepare(
            "SELECT n.session_key, n.current_session_id, n.entry_json, n.label, n.display_name, w.model_provider, \
             w.model FROM session_nodes n LEFT JOIN session_windows w ON w.session_id = n.current_session_id \
             ORDER BY n.session_key",
        )
        .map_err(|e| e.to_string())?;
    type Node = (String, String, String, Option<String>, Option<String>, Option<String>, Option<String>);
    let nodes: Vec<Node> = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)))
        .and_then(|rows| rows.collect())
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (key, id, entry_json, label, display_name, provider, model) in nodes {
        let named = |e: String| format!("session {key:?} (transcript {id}): {e}");
        let session = (|| {
            let Ok(Value::Object(mut row)) = serde_json::from_str::<Value>(&entry_json) else {
                return Err("its entry_json is not a JSON object".to_owned());
            };
            if !pincer_store::valid_session_id(&id) {
                return Err("the session id cannot name a Pincer transcript file".to_owned());
            }
            row.insert("sessionId".into(), json!(id));
            // A path on OpenClaw's side means nothing here: the transcript is found by its id.
            row.remove("sessionFile");
            for (field, value) in
                [("label", label), ("displayName", display_name), ("modelProvider", provider), ("model", model)]
            {
                if let Some(v) = value.filter(|_| !row.contains_key(field)) {
                    row.insert(field.into(), json!(v));
                }
            }
            let bytes = transcript(&c, &id, redactor)?;
            Ok(Session { key: key.clone(), id: id.clone(), row, bytes })
        })()
        .map_err(named);
        out.push(session);
    }
    Ok(out)
}

/// The transcript of session `id` as a Pi v3 file.
fn transcript(c: &Connection, id: &str, redactor: &dyn Redactor) -> Result<Vec<u8>, String> {
    let mut q = c
        .prepare("SELECT seq, event_json FROM transcript_events WHERE session_id = ?1 ORDER BY seq")
        .map_err(|e| e.to_string())?;
    let rows: Vec<(i64, Option<String>)> =
        q.query_map([id], |r| Ok((r.get(0)?, r.get(1)?))).and_then(|rows| rows.collect()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (i, (seq, event)) in rows.into_iter().enumerate() {
        // OpenClaw's schema: an event without `event_json` is stored zstd-compressed.
        let Some(text) = event else {
            return Err(format!(
                "event {seq} is zstd-compressed (event_zstd), which this import does not read; nothing of this \
                 session was written"
            ));
        };
        let Ok(Value::Object(mut entry)) = serde_json::from_str::<Value>(&text) else {
            return Err(format!("event {seq} is not a JSON object"));
        };
        let kind = entry.get("type").and_then(Value::as_str).unwrap_or_default().to_owned();
        if i == 0 {
            if kind != "session" {
                return Err(format!("event {seq} is a {kind:?} entry, not the session header"));
            }
            // OpenClaw 2026.9 numbers its header 4 for its `leaf` entries; rechained below, the
            // file is Pi's v3.
            entry.insert("version".into(), json!(3));
        } else if kind == "leaf" {
            // Pincer's (and Pi's) reading: the leaf entry hangs from its target.
            let target = entry.get("targetId").cloned().unwrap_or(Value::Null);
            entry.insert("parentId".into(), target);
        }
        pincer_store::redact_entry(&mut entry, redactor);
        serde_json::to_writer(&mut out, &entry).map_err(|e| format!("event {seq}: {e}"))?;
        out.push(b'\n');
    }
    if out.is_empty() {
        return Err("no transcript events".into());
    }
    Ok(out)
}

/// Writes an agent's sessions: each transcript first (never over a file), then its index row,
/// under the index's lock; a key or transcript already here is skipped.
fn write_agent(
    store: &dyn Transcripts,
    state_dir: &Path,
    agent: &str,
    sessions: Vec<Result<Session, String>>,
    report: &mut Report,
) {
    let dir = state_dir.join("agents").join(agent).join("sessions");
    let index = dir.join("sessions.json");
    let fail = |report: &mut Report, e: String| report.problems.push(format!("{}: {e}", index.display()));
    if let Err(e) = pincer_store::files::create_dir_for(&index) {
        return fail(report, e.to_string());
    }
    let _held = match store.lock(&index) {
        Ok(h) => h,
        Err(e) => return fail(report, e.to_string()),
    };
    let mut map: Map<String, Value> = match store.read_index(&index) {
        Ok(None) => Map::new(),
        Ok(Some(b)) => match serde_json::from_slice(&b) {
            Ok(Value::Object(m)) => m,
            _ => return fail(report, "not a JSON object; nothing imported for this agent".into()),
        },
        Err(e) => return fail(report, e.to_string()),
    };
    let mut added = false;
    for s in sessions {
        let s = match s {
            Ok(s) => s,
            Err(e) => {
                report.problems.push(e);
                continue;
            }
        };
        let path = dir.join(format!("{}.jsonl", s.id));
        if let Some(row) = map.get(&s.key) {
            let same = row.get("sessionId").and_then(Value::as_str) == Some(s.id.as_str());
            let why = if same { "already imported" } else { "a session of this key is already here (kept)" };
            report.skipped.push(json!({"key": s.key, "reason": why}));
            continue;
        }
        match store.exists(&path) {
            Ok(false) => {}
            Ok(true) => {
                report
                    .skipped
                    .push(json!({"key": s.key, "reason": format!("{} is already here (kept)", path.display())}));
                continue;
            }
            Err(e) => {
                report.problems.push(format!("session {:?}: {e}", s.key));
                continue;
            }
        }
        if let Err(e) = store.import_transcript(&path, &s.bytes) {
            report.problems.push(format!("session {:?}: cannot write: {e}", s.key));
            continue;
        }
        map.insert(s.key.clone(), Value::Object(s.row));
        report.sessions.push(s.key);
        added = true;
    }
    if added {
        let written = serde_json::to_vec(&map).map_err(|e| e.to_string());
        if let Err(e) = written.and_then(|b| store.write_index(&index, &b).map_err(|e| e.to_string())) {
            fail(report, e);
        }
    }
}
