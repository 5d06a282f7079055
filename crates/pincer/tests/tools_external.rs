//! Pi's file tools through the real gateway, checked against the real Pi library (the part of
//! `tools.rs` that needs the Pi oracle on Node, so it builds only with the `external` feature): a
//! scripted OpenAI-compatible fake asks for `read`, `write`, `edit`, `ls`, `find` and `grep` with
//! Pi's parameter shapes, several in one assistant message. The rows on disk have Pi's shapes and
//! are chained in the message's call order; the files in the workspace change as the calls say (and
//! not when a call is refused: an `edit` whose `oldText` is not unique, a path leading outside the
//! workspace); and Pi's context of the file, in OpenAI's wire form, is exactly what the provider
//! received on its next call.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_provider::{script, text, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::wire::{check_request_against_pi, result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::json;

#[path = "tools/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_with_pi_shapes_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, outside) = fixture(dir.path());
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    // One message with many calls, run concurrently (none depends on another's effect).
    let t1 = turn(
        vec![
            text(&["Looking around."]),
            call("c1", "read", json!({"path": "big.txt"})),
            call("c2", "read", json!({"path": "src/main.rs", "offset": 2, "limit": 1})),
            call("c3", "ls", json!({"path": "src"})),
            call("c4", "find", json!({"pattern": "*.rs"})),
            call("c5", "grep", json!({"pattern": "fn main"})),
            call("c6", "edit", json!({"path": "dup.txt", "edits": [{"oldText": "x = 1", "newText": "x = 2"}]})),
            call("c7", "read", json!({"path": "../outside/secret.txt"})),
            call("c8", "write", json!({"path": "link/pwned.txt", "content": "pwned"})),
            call("c9", "read", json!({"path": outside.join("secret.txt").display().to_string()})),
            call("c10", "write", json!({"path": "notes/todo.md", "content": "- buy milk\n"})),
        ],
        (50, 30, 0),
    );
    let t2 = turn(
        vec![
            call(
                "d1",
                "edit",
                json!({"path": "src/lib.rs", "edits": [{"oldText": "\"hello\"", "newText": "\"bye\""},
                    {"oldText": "pub fn greet()", "newText": "pub fn greeting()"}]}),
            ),
            call("d2", "grep", json!({"pattern": "MILK", "ignoreCase": true, "context": 1})),
        ],
        (80, 20, 0),
    );
    let t3 = turn(vec![text(&["Done."])], (120, 4, 0));
    for t in [&t1, &t2, &t3] {
        fake.push(Reply::stream(script(f, t)));
    }
    let state = dir.path().join("state");
    let cfg = config(&fake, &ws, "[agents.defaults.tools]\napproval = \"allow\"\n");
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    let info = c.request("pincer.info", json!({})).await.unwrap();
    assert_eq!(info["tools"], json!(["bash", "edit", "find", "grep", "ls", "read", "write"]), "the coding profile");
    c.request("chat.send", json!({"sessionKey": "main", "message": "tidy up", "idempotencyKey": "r1"})).await.unwrap();
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());

    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    let ids: Vec<&str> = results.iter().map(|m| m["toolCallId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "d1", "d2"], "source order");
    for m in &results {
        let keys: Vec<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
        let want: &[&str] = if m.get("details").is_some() {
            &["role", "toolCallId", "toolName", "content", "details", "isError", "timestamp"]
        } else {
            &["role", "toolCallId", "toolName", "content", "isError", "timestamp"]
        };
        assert_eq!(keys, want, "Pi's toolResult keys: {m}");
    }
    let by_id = |id: &str| results.iter().find(|m| m["toolCallId"] == id).unwrap();

    // read: the first 2,000 lines, Pi's notice and details.truncation.
    let r = by_id("c1");
    let body: String = (1..=2000).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n");
    assert_eq!(result_text(r), format!("{body}\n\n[Showing lines 1-2000 of 3001. Use offset=2001 to continue.]"));
    let t = &r["details"]["truncation"];
    assert_eq!(
        (&t["truncated"], &t["truncatedBy"], &t["totalLines"], &t["outputLines"], &t["maxLines"], &t["maxBytes"]),
        (&json!(true), &json!("lines"), &json!(3001), &json!(2000), &json!(2000), &json!(51200))
    );
    assert_eq!(
        result_text(by_id("c2")),
        "    println!(\"hello\");\n\n[2 more lines in file. Use offset=3 to continue.]"
    );
    assert_eq!(result_text(by_id("c3")), "lib.rs\nmain.rs");
    assert_eq!(result_text(by_id("c4")), "src/lib.rs\nsrc/main.rs", "ignored/ is .gitignore'd");
    assert_eq!(result_text(by_id("c5")), "src/main.rs:1: fn main() {");
    // edit with a repeated oldText: an error result, the file unchanged.
    assert_eq!(by_id("c6")["isError"], true);
    assert_eq!(
        result_text(by_id("c6")),
        "Found 2 occurrences of the text in dup.txt. The text must be unique. Please provide more context to make it unique."
    );
    assert_eq!(std::fs::read_to_string(ws.join("dup.txt")).unwrap(), "x = 1\nx = 1\n");
    // Escapes: refused, named, nothing read or written outside.
    assert_eq!(result_text(by_id("c7")), "../outside/secret.txt: refused, it resolves outside the workspace");
    assert_eq!(result_text(by_id("c8")), "link/pwned.txt: refused, it resolves outside the workspace");
    let abs = outside.join("secret.txt").display().to_string();
    assert_eq!(
        result_text(by_id("c9")),
        format!("{abs}: absolute paths are refused; give a path relative to the workspace")
    );
    for id in ["c7", "c8", "c9"] {
        assert_eq!(by_id(id)["isError"], true, "{id}");
    }
    assert!(!outside.join("pwned.txt").exists());
    // write: Pi's text, the file with its parent directory.
    assert_eq!(result_text(by_id("c10")), "Successfully wrote 11 bytes to notes/todo.md");
    assert_eq!(std::fs::read_to_string(ws.join("notes/todo.md")).unwrap(), "- buy milk\n");
    // edit with two disjoint edits: Pi's text, diff and first changed line.
    let d1 = by_id("d1");
    assert_eq!(result_text(d1), "Successfully replaced 2 block(s) in src/lib.rs.");
    assert_eq!(
        d1["details"],
        json!({"diff": "-1 pub fn greet() -> &'static str {\n-2     \"hello\"\n+1 pub fn greeting() -> &'static str {\n+2     \"bye\"\n 3 }", "firstChangedLine": 1})
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("src/lib.rs")).unwrap(),
        "pub fn greeting() -> &'static str {\n    \"bye\"\n}\n"
    );
    // grep with ignoreCase and context, over the file written in the message before.
    assert_eq!(result_text(by_id("d2")), "notes/todo.md:1: - buy milk\nnotes/todo.md-2- ");
    for id in ["c1", "c2", "c3", "c4", "c5", "c10", "d1", "d2"] {
        assert_eq!(by_id(id)["isError"], false, "{id}");
    }

    // What the provider received after each tool round is Pi's context of the file.
    assert_eq!(fake.bodies().len(), 3);
    check_request_against_pi(&file, &fake, 1);
    check_request_against_pi(&file, &fake, 2);
    assert_eq!(offered(&fake), ["bash", "edit", "find", "grep", "ls", "read", "write"]);
}
