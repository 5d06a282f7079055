//! What `edges.rs` and `edges_external.rs` share: a gateway over the fake provider, sending,
//! restarting, and reading turns, replies and chains out of a transcript.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess, StartOptions};
use pincer_testkit::probe;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub struct Env {
    pub gw: GatewayProcess,
    #[allow(dead_code)] // read by tests of edges.rs, not by those of edges_external.rs
    pub fake: FakeOpenAi,
    pub _dir: tempfile::TempDir,
}

pub fn config(fake: &FakeOpenAi, extra: &str) -> String {
    format!("{}{extra}", fake.gateway_toml())
}

pub fn start(extra: &str, options: StartOptions) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start_with(BIN, &dir.path().join("state"), &config(&fake, extra), &options);
    Env { gw, fake, _dir: dir }
}

pub async fn send(c: &mut Client, key: &str, message: &str, run_id: &str) -> Result<Value, Value> {
    c.request("chat.send", json!({"sessionKey": key, "message": message, "idempotencyKey": run_id})).await
}

/// Which turn (idempotency key without `:user`) each row belongs to: a keyed user row starts a
/// turn, every other row belongs to its parent's turn.
pub fn turns_of(rows: &[Value]) -> HashMap<String, String> {
    let mut turn: HashMap<String, String> = HashMap::new();
    for r in rows {
        let Some(id) = r["id"].as_str() else { continue };
        let own = (r["message"]["role"] == "user")
            .then(|| r["message"]["idempotencyKey"].as_str().and_then(|k| k.strip_suffix(":user")))
            .flatten();
        let t = match own {
            Some(k) => Some(k.to_owned()),
            None => r["parentId"].as_str().and_then(|p| turn.get(p).cloned()),
        };
        if let Some(t) = t {
            turn.insert(id.to_owned(), t);
        }
    }
    turn
}

pub fn user_rows(rows: &[Value], run: &str) -> usize {
    let k = format!("{run}:user");
    rows.iter().filter(|r| r["message"]["idempotencyKey"] == k.as_str()).count()
}

/// Assistant messages that end turn `run` (tool steps excluded).
pub fn replies(rows: &[Value], run: &str) -> Vec<Value> {
    let turns = turns_of(rows);
    rows.iter()
        .filter(|r| {
            r["message"]["role"] == "assistant"
                && r["message"]["stopReason"] != "toolUse"
                && r["id"].as_str().and_then(|id| turns.get(id)).is_some_and(|t| t == run)
        })
        .cloned()
        .collect()
}

/// The rows from turn `run`'s user row on, one line each (id, parent, what it is, when written).
pub fn outline(rows: &[Value], run: &str) -> String {
    let k = format!("{run}:user");
    let from = rows.iter().position(|r| r["message"]["idempotencyKey"] == k.as_str()).unwrap_or(0);
    let short = |v: &Value| v.as_str().map(|s| s.chars().take(8).collect::<String>()).unwrap_or_else(|| "-".into());
    rows[from..]
        .iter()
        .map(|r| {
            let what = match r["type"].as_str() {
                Some("message") => format!("{} {}", r["message"]["role"], r["message"]["idempotencyKey"]),
                Some("custom") => format!("{} {}", r["customType"], r["data"]["runId"]),
                other => format!("{other:?}"),
            };
            format!("  {} <- {} {what} at {}", short(&r["id"]), short(&r["parentId"]), r["timestamp"])
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `parentId` names an earlier row; ids are unique.
pub fn assert_chain(rows: &[Value], what: &str) {
    let mut seen = HashSet::new();
    for (i, r) in rows.iter().enumerate().skip(1) {
        let id = r["id"].as_str().unwrap_or_else(|| panic!("{what}: row {i} has no id: {r}"));
        if let Some(p) = r["parentId"].as_str() {
            assert!(seen.contains(p), "{what}: row {i} ({id}) has parentId {p} that is no earlier row");
        }
        assert!(seen.insert(id.to_owned()), "{what}: id {id} appears twice");
    }
}

pub fn assert_verifies(file: &Path) {
    let (code, out) = probe::verify(BIN, file);
    assert_eq!(code, Some(0), "pincer transcript verify {}: {out}", file.display());
}

pub fn restart(gw: &mut GatewayProcess) {
    tokio::task::block_in_place(|| gw.restart());
}
