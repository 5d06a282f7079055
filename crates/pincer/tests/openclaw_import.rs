//! `pincer store import --from-openclaw` on a small database in OpenClaw 2026.9's layout: sessions
//! it cannot read are named and nothing of them is written; a directory that is not OpenClaw's is a
//! usage error. The import of what OpenClaw itself wrote is in `openclaw_import_external.rs` (it
//! needs OpenClaw's CLI on Node, PostgreSQL and the Pi oracle).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests read their files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;

#[path = "openclaw_import/common.rs"]
mod common;
use common::*;

/// A small database in OpenClaw 2026.9's layout (the tables and columns the import reads), with
/// one readable session and two it must refuse: an event stored zstd-compressed, and a session
/// entry that is not a JSON object.
fn edge_database(state: &Path) -> std::path::PathBuf {
    let db = state.join("agents/main/agent/openclaw-agent.sqlite");
    std::fs::create_dir_all(db.parent().expect("dir")).expect("dir");
    let c = rusqlite::Connection::open(&db).expect("create");
    c.execute_batch(
        "CREATE TABLE schema_meta (meta_key TEXT PRIMARY KEY, role TEXT, schema_version INTEGER, agent_id TEXT,
           app_version TEXT, created_at INTEGER, updated_at INTEGER);
         INSERT INTO schema_meta VALUES ('primary', 'agent', 23, 'main', '2026.9.6', 0, 0);
         CREATE TABLE session_nodes (session_key TEXT PRIMARY KEY, current_session_id TEXT, entry_json TEXT,
           label TEXT, display_name TEXT);
         CREATE TABLE session_windows (session_id TEXT PRIMARY KEY, session_key TEXT, model_provider TEXT, model TEXT);
         CREATE TABLE transcript_events (session_id TEXT, seq INTEGER, event_json TEXT, event_zstd BLOB,
           PRIMARY KEY (session_id, seq));
         INSERT INTO session_nodes VALUES ('agent:main:good', 'good-1', '{\"sessionId\":\"good-1\",\"custom\":7}', 'Good', NULL);
         INSERT INTO session_nodes VALUES ('agent:main:packed', 'packed-1', '{\"sessionId\":\"packed-1\"}', NULL, NULL);
         INSERT INTO session_nodes VALUES ('agent:main:broken', 'broken-1', '[1]', NULL, NULL);
         INSERT INTO session_windows VALUES ('good-1', 'agent:main:good', 'fake', 'fake-model');
         INSERT INTO transcript_events VALUES ('good-1', 0,
           '{\"type\":\"session\",\"version\":4,\"id\":\"good-1\",\"timestamp\":\"2026-12-01T00:00:00.000Z\",\"cwd\":\"/\"}', NULL);
         INSERT INTO transcript_events VALUES ('good-1', 1,
           '{\"type\":\"message\",\"id\":\"u1\",\"parentId\":null,\"timestamp\":\"2026-12-01T00:00:01.000Z\",\"message\":{\"role\":\"user\",\"content\":\"my key is sk-abcdefghijklmnopqrstuvwxyz0123456789\",\"timestamp\":1}}', NULL);
         INSERT INTO transcript_events VALUES ('packed-1', 0,
           '{\"type\":\"session\",\"version\":4,\"id\":\"packed-1\",\"timestamp\":\"2026-12-01T00:00:00.000Z\",\"cwd\":\"/\"}', NULL);
         INSERT INTO transcript_events VALUES ('packed-1', 1, NULL, x'28b52ffd');",
    )
    .expect("fixture");
    db
}

#[test]
fn sessions_it_cannot_read_are_named_and_nothing_of_them_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("openclaw");
    let db = edge_database(&state);
    let bytes = std::fs::read(&db).expect("db");
    let to = dir.path().join("pincer");
    let (code, report) = import(&state, &to, None);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["sessions"], json!(["agent:main:good"]), "{report:#}");
    let problems: Vec<&str> =
        report["problems"].as_array().expect("problems").iter().filter_map(Value::as_str).collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems.iter().any(|p| p.contains("\"agent:main:broken\"") && p.contains("entry_json")), "{problems:#?}");
    assert!(
        problems.iter().any(|p| p.contains("\"agent:main:packed\"") && p.contains("event 1 is zstd")),
        "{problems:#?}"
    );
    let sessions = to.join("agents/main/sessions");
    assert!(!sessions.join("packed-1.jsonl").exists() && !sessions.join("broken-1.jsonl").exists());
    let index: Value =
        serde_json::from_slice(&std::fs::read(sessions.join("sessions.json")).expect("index")).expect("json");
    assert_eq!(index.as_object().expect("index").keys().collect::<Vec<_>>(), ["agent:main:good"]);
    // Unknown fields kept; label and model from their columns; the secret redacted; a v3 header.
    let row = &index["agent:main:good"];
    assert_eq!(
        (row["custom"].as_u64(), row["label"].as_str(), row["model"].as_str()),
        (Some(7), Some("Good"), Some("fake-model"))
    );
    let file = std::fs::read_to_string(sessions.join("good-1.jsonl")).expect("transcript");
    assert!(file.starts_with(r#"{"type":"session","version":3,"id":"good-1""#), "{file}");
    assert!(file.contains("my key is sk-") && !file.contains("abcdefghijklmnopqrstuvwxyz0123456789"), "{file}");
    assert_eq!(std::fs::read(&db).expect("db"), bytes, "the import changed the database");

    // Not an OpenClaw 2026.9 state directory: a usage error naming what is missing, nothing written.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("agents/main/sessions")).expect("dir");
    let out = std::process::Command::new(BIN)
        .args(["store", "import", "--from-openclaw"])
        .arg(&empty)
        .arg("--state-dir")
        .arg(dir.path().join("untouched"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("openclaw-agent.sqlite"), "{stderr}");
    assert!(!dir.path().join("untouched").exists());
}
