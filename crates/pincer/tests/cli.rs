//! The CLI's human-readable output, snapshot-tested: `pincer sessions list` and `pincer transcript
//! history` print tables (titles, local dates, counts) with `--table` or on a terminal, and JSON
//! with `--json` or into a pipe. The state dir is a fixture with fixed ids and times; TZ=UTC.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const T0: i64 = 1_764_600_000_000; // 2025-12-01T14:40:00Z

fn row(id: &str, parent: Option<&str>, message: Value) -> Value {
    json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2025-12-01T14:40:00.000Z", "message": message})
}

fn write_transcript(path: &Path, session_id: &str, rows: &[Value]) {
    let mut text = json!({"type": "session", "version": 3, "id": session_id, "timestamp": "2025-12-01T14:40:00.000Z", "cwd": "/tmp"})
        .to_string();
    for r in rows {
        text.push('\n');
        text.push_str(&r.to_string());
    }
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let usage = json!({"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}});
    let reply = |text: &str, ts: i64| {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}], "api": "openai-completions",
            "provider": "local", "model": "llama3.2", "usage": usage, "stopReason": "stop", "timestamp": ts})
    };
    write_transcript(
        &sessions.join("11111111-1111-4111-8111-111111111111.jsonl"),
        "11111111-1111-4111-8111-111111111111",
        &[
            row(
                "a1",
                None,
                json!({"role": "user", "content": "What is in notes.txt?\nPlease   look.", "timestamp": T0}),
            ),
            row(
                "a2",
                Some("a1"),
                json!({"role": "assistant", "content": [
                {"type": "text", "text": "Let me read it."},
                {"type": "toolCall", "id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}],
                "api": "openai-completions", "provider": "local", "model": "llama3.2", "usage": usage,
                "stopReason": "toolUse", "timestamp": T0 + 1000}),
            ),
            row(
                "a3",
                Some("a2"),
                json!({"role": "toolResult", "toolCallId": "c1", "toolName": "read_file",
                "content": [{"type": "text", "text": "buy milk"}], "isError": false, "timestamp": T0 + 1500}),
            ),
            row("a4", Some("a3"), reply("It says: buy milk.", T0 + 2000)),
        ],
    );
    write_transcript(
        &sessions.join("22222222-2222-4222-8222-222222222222.jsonl"),
        "22222222-2222-4222-8222-222222222222",
        &[
            row(
                "b1",
                None,
                json!({"role": "user", "content": "Plan a trip to Lisbon in three days, with a long list of museums to see", "timestamp": T0 + 3_600_000}),
            ),
            row("b2", Some("b1"), reply("Day 1: Belém.", T0 + 3_601_000)),
        ],
    );
    let index = json!({
        "agent:main:main": {"sessionId": "11111111-1111-4111-8111-111111111111", "updatedAt": T0 + 2000},
        "agent:main:trip": {"sessionId": "22222222-2222-4222-8222-222222222222", "updatedAt": T0 + 3_601_000, "label": "Lisbon"},
        "agent:main:old": {"sessionId": "33333333-3333-4333-8333-333333333333", "updatedAt": T0 - 86_400_000, "archivedAt": T0},
    });
    std::fs::write(sessions.join("sessions.json"), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    dir
}

fn pincer(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).env("TZ", "UTC").env_remove("PINCER_STATE_DIR").output().unwrap();
    assert!(out.status.success(), "pincer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn sessions_list_prints_a_table_or_json() {
    let dir = state_dir();
    let state = dir.path().to_str().unwrap();
    insta::assert_snapshot!("sessions_list_table", pincer(&["sessions", "list", "--table", "--state-dir", state]));
    // Into a pipe without a flag, and with --json: JSON with every field of the index row.
    for args in [&["sessions", "list", "--state-dir", state][..], &["sessions", "list", "--json", "--state-dir", state]]
    {
        let v: Value = serde_json::from_str(&pincer(args)).unwrap();
        let keys: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
        assert_eq!(keys, ["agent:main:trip", "agent:main:main", "agent:main:old"]);
        assert_eq!(v[0]["label"], "Lisbon");
        assert!(v[0]["path"].as_str().unwrap().ends_with("22222222-2222-4222-8222-222222222222.jsonl"));
    }
}

#[test]
fn transcript_history_prints_a_table_or_json() {
    let dir = state_dir();
    let file = dir.path().join("agents/main/sessions/11111111-1111-4111-8111-111111111111.jsonl");
    let file = file.to_str().unwrap();
    insta::assert_snapshot!("transcript_history_table", pincer(&["transcript", "history", file, "--table"]));
    let v: Value = serde_json::from_str(&pincer(&["transcript", "history", file])).unwrap();
    assert_eq!(v["sessionId"], "11111111-1111-4111-8111-111111111111");
    assert_eq!(v["messages"].as_array().unwrap().len(), 4);
    let json: Value = serde_json::from_str(&pincer(&["transcript", "history", file, "--json"])).unwrap();
    assert_eq!(json, v);
}
