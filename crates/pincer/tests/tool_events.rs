//! Tool activity on the `agent` event stream, in OpenClaw 2026.9.6's shapes: a scripted fake asks
//! for two tools (one fails); each call is announced with `stream:"tool"`, `phase:"start"` (name,
//! toolCallId, args) and, once its toolResult row is on disk, `phase:"result"` (name, toolCallId,
//! isError, result as written): the fields OpenClaw's Control UI reads to draw its tool cards. The
//! tests that also need the Pi oracle (Node) are in `tool_events_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print timings

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::read_rows;
use pretty_assertions::assert_eq;
use serde_json::json;

#[path = "tool_events/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_announced_in_openclaw_shapes_after_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let t1 = turn(
        vec![
            text(&["Looking."]),
            tool_call("c1", "ls", &[&json!({"path": "src"}).to_string()]),
            tool_call("c2", "read", &[&json!({"path": "missing.txt"}).to_string()]),
        ],
        (10, 5, 0),
    );
    let t2 = turn(vec![text(&["Done."])], (20, 2, 0));
    for t in [&t1, &t2] {
        fake.push(Reply::stream(script(f, t)));
    }
    let state = dir.path().join("state");
    let cfg = config(&fake, &ws);
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    c.request("sessions.messages.subscribe", json!({"key": "main"})).await.expect("subscribe");
    c.request("chat.send", json!({"sessionKey": "main", "message": "look", "idempotencyKey": "r1"})).await.unwrap();

    // Each result: the row is on disk when the event arrives, and the event carries what was written.
    let mut file = None;
    for (id, name, error) in [("c1", "ls", false), ("c2", "read", true)] {
        let ev = c.event(|f| is_tool(f, "result", id)).await;
        let path = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
        let row = read_rows(&path)
            .into_iter()
            .find(|r| r["message"]["role"] == "toolResult" && r["message"]["toolCallId"] == id)
            .unwrap_or_else(|| panic!("{id}: announced before its row was written"));
        file = Some(path);
        let p = &ev["payload"];
        assert_eq!((&p["runId"], &p["sessionKey"]), (&json!("r1"), &json!("agent:main:main")), "{ev}");
        assert!(p["seq"].is_u64() && p["ts"].is_u64() && p["agentId"].is_string(), "{ev}");
        let d = &p["data"];
        assert_eq!((&d["name"], &d["isError"]), (&json!(name), &json!(error)), "{ev}");
        assert_eq!(d["result"]["content"], row["message"]["content"], "the result as written: {ev}");
        // The session.message of the row went out before the announcement.
        let row_at = c
            .events
            .iter()
            .position(|f| f["event"] == "session.message" && f["payload"]["message"]["toolCallId"] == id);
        assert!(row_at.is_some(), "{id}: the row's session.message came after the tool result");
    }
    // Each start came before its result, with the name and the arguments.
    for (id, name, args) in [("c1", "ls", json!({"path": "src"})), ("c2", "read", json!({"path": "missing.txt"}))] {
        let ev = c.event(|f| is_tool(f, "start", id)).await;
        let d = &ev["payload"]["data"];
        assert_eq!((&d["name"], &d["args"]), (&json!(name), &args), "{ev}");
        assert_eq!(ev["payload"]["stream"], "tool");
    }
    assert!(file.is_some());
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
}
