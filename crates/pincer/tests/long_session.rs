//! A long session through the real gateway, checked against the real Pi library: a 3,000-entry
//! transcript with tool calls, a failed turn, a branch (with its branch summary) and a compaction in
//! the middle; then turns that hit the gateway's in-memory context, a compaction by the gateway,
//! and turns after it. For every turn, the request the provider received must be exactly the
//! OpenAI wire form of the context Pi's `buildSessionContext` gives at that turn's user row, so
//! the shared, cached context can never drift from the file. A second test moves the file under
//! the gateway's cached context between turns (another writer appends, the leaf switches to the
//! abandoned branch and back) and checks every request against Pi the same way.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::oracle_context;
use pincer_testkit::probe::read_rows;
use pincer_testkit::wire::openai_messages;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const KEY: &str = "agent:main:long";
const SESSION_ID: &str = "long-session-1";

fn id(i: usize) -> String {
    format!("{:08x}", i + 1)
}

fn line(out: &mut String, id: &str, parent: Option<&str>, body: Value) {
    let mut e = json!({"id": id, "parentId": parent, "timestamp": "2026-12-01T00:00:00.000Z"});
    for (k, v) in body.as_object().expect("object") {
        e[k] = v.clone();
    }
    let _ = writeln!(out, "{e}");
}

fn assistant(content: Value, stop: &str) -> Value {
    json!({"type": "message", "message": {"role": "assistant", "content": content, "api": "openai-completions",
        "provider": "fake", "model": "fake-model", "stopReason": stop,
        "usage": {"input": 10, "output": 10, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 20,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}, "timestamp": 1}})
}

/// Writes the transcript: user/assistant pairs; every 50th pair is a tool round (call, result,
/// answer); at entry 1,000 a compaction keeps from entry 900 on; at entry 2,000 the chain goes back
/// to entry 1,700 through a branch summary; entry 2,503 is a failed reply (`stopReason: error`,
/// never sent); the tool call of entry 2,701 never got its result (an error result is sent).
fn prefill(state: &Path) -> usize {
    let sessions = state.join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).expect("dir");
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"{{"type":"session","version":3,"id":"{SESSION_ID}","timestamp":"2026-12-01T00:00:00.000Z","cwd":"/"}}"#
    );
    let filler = "lorem ipsum dolor sit amet ".repeat(6);
    let mut parent: Option<String> = None;
    let mut i = 0;
    while i < 3000 {
        let me = id(i);
        let p = parent.clone();
        let body = if i == 2000 {
            // Back to entry 1,700 with a summary of the abandoned branch.
            line(
                &mut out,
                &me,
                Some(&id(1700)),
                json!({"type": "branch_summary", "fromId": id(1999),
                "summary": "Tried another approach on the abandoned branch."}),
            );
            parent = Some(me);
            i += 1;
            continue;
        } else if i == 1000 {
            json!({"type": "compaction", "summary": "## Goal\nThe long conversation so far.", "firstKeptEntryId": id(900),
                "tokensBefore": 123_456})
        } else if i % 100 == 1 {
            assistant(
                json!([{"type": "toolCall", "id": format!("call-{i}"), "name": "current_time", "arguments": {"tz": "UTC"}}]),
                "toolUse",
            )
        } else if i == 2503 {
            assistant(json!([{"type": "text", "text": "half an answer"}]), "error")
        } else if i % 100 == 2 && i != 2702 {
            json!({"type": "message", "message": {"role": "toolResult", "toolCallId": format!("call-{}", i - 1),
                "toolName": "current_time", "content": [{"type": "text", "text": format!("12:{i:02} UTC")}], "isError": false, "timestamp": 1}})
        } else if i % 2 == 0 {
            json!({"type": "message", "message": {"role": "user", "content": format!("question {i}: {filler}"), "timestamp": 1}})
        } else {
            assistant(
                json!([{"type": "thinking", "thinking": "hmm", "thinkingSignature": ""}, {"type": "text", "text": format!("answer {i}: {filler}")}]),
                "stop",
            )
        };
        line(&mut out, &me, p.as_deref(), body);
        parent = Some(me);
        i += 1;
    }
    std::fs::write(sessions.join(format!("{SESSION_ID}.jsonl")), out).expect("write");
    let index = json!({KEY: {"sessionId": SESSION_ID, "updatedAt": 1, "sessionStartedAt": 1}});
    std::fs::write(sessions.join("sessions.json"), index.to_string()).expect("index");
    3000
}

fn transcript(state: &Path) -> std::path::PathBuf {
    state.join(format!("agents/main/sessions/{SESSION_ID}.jsonl"))
}

/// The chat requests the fake received (not summarization calls), in order.
fn chat_requests(fake: &FakeOpenAi) -> Vec<Value> {
    fake.requests().into_iter().filter(|r| !r.to_string().contains("context summarization assistant")).collect()
}

/// Checks one turn: the provider's request equals the wire form of Pi's context at the turn's user row.
fn check_turn(state: &Path, request: &Value, said: &str) -> usize {
    let file = transcript(state);
    let rows = read_rows(&file);
    let user = rows
        .iter()
        .rev()
        .find(|e| e["message"]["role"] == "user" && e["message"]["content"].to_string().contains(said))
        .unwrap_or_else(|| panic!("no user row for {said:?}"));
    let pi = oracle_context(&file, user["id"].as_str());
    let context = pi["context"]["messages"].as_array().expect("Pi's context messages");
    let expected = openai_messages(context);
    let got: Vec<Value> = pincer_testkit::wire::conversation(request);
    if let Some(i) = (0..got.len().max(expected.len())).find(|&i| got.get(i) != expected.get(i)) {
        panic!(
            "turn {said:?}: request message {i} of {} differs from Pi's context ({} messages):\n got: {}\nwant: {}",
            got.len(),
            expected.len(),
            got.get(i).map(Value::to_string).unwrap_or_default(),
            expected.get(i).map(Value::to_string).unwrap_or_default()
        );
    }
    assert!(expected.len() > 100, "turn {said:?}: the context is long ({} messages)", expected.len());
    expected.len()
}

/// The gateway on the prefilled state dir with a window no turn reaches (no automatic compaction:
/// any compaction is the test's), and a client of it.
async fn start_on(state: &Path, fake: &FakeOpenAi) -> (GatewayProcess, Client) {
    start_with(state, fake, "").await
}

/// [`start_on`] with `gateway` as the config's `[gateway]` section.
async fn start_with(state: &Path, fake: &FakeOpenAi, gateway: &str) -> (GatewayProcess, Client) {
    let config = format!("[gateway]\n{gateway}\n{}", fake.gateway_toml_window(100_000_000));
    let state = state.to_path_buf();
    let gw = tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &config)).await.expect("start");
    let c = Client::connect(&gw.addr).await;
    (gw, c)
}

/// Sends one turn to the session and waits for its final.
async fn send_turn(c: &mut Client, text: &str, run: &str) {
    c.request("chat.send", json!({"sessionKey": KEY, "message": text, "idempotencyKey": run})).await.expect("send");
    let end = c.chat_end(run).await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_long_branched_compacted_session_is_what_pi_builds_from_the_file() {
    long_branched_compacted_session("").await;
}

/// The same with no context kept in memory: every turn reads the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_context_cache_off_every_request_is_still_what_pi_builds() {
    long_branched_compacted_session("context_cache_mb = 0").await;
}

async fn long_branched_compacted_session(gateway: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    prefill(&state);
    let fake = FakeOpenAi::start().await;
    let (mut gw, mut c) = start_with(&state, &fake, gateway).await;
    let mut said = Vec::new();
    for n in 1..=4 {
        if n == 3 {
            let compacted = c.request("sessions.compact", json!({"key": KEY})).await.expect("compact");
            assert_eq!(compacted["compacted"], true, "{compacted}");
        }
        let text = format!("long-turn-{n}");
        send_turn(&mut c, &text, &format!("long-run-{n}")).await;
        said.push(text);
    }
    assert!(gw.terminate().success());
    let requests = chat_requests(&fake);
    assert_eq!(requests.len(), 4, "one model call per turn");
    let lengths: Vec<usize> = requests.iter().zip(&said).map(|(r, text)| check_turn(&state, r, text)).collect();
    assert!(lengths[0] > 1000 && lengths[1] == lengths[0] + 2, "before the gateway's compaction: {lengths:?}");
    let first = requests[0].to_string();
    for (what, needle) in [
        ("the fixture's compaction summary", "The long conversation so far."),
        ("the branch summary", "Tried another approach"),
        ("the error result of the orphaned call", "No result provided"),
        ("a kept tool result", "12:2102 UTC"),
    ] {
        assert!(first.contains(needle), "the first request carries {what}");
    }
    for (what, needle) in [
        ("the failed reply", "half an answer"),
        ("the abandoned branch", "answer 1803:"),
        ("compacted turns", "answer 803:"),
    ] {
        assert!(!first.contains(needle), "the first request leaves out {what}");
    }
    assert!(lengths[2] < lengths[1] && lengths[3] == lengths[2] + 2, "after it: {lengths:?}");
    let rows = read_rows(&transcript(&state));
    assert_eq!(rows.iter().filter(|e| e["type"] == "compaction").count(), 2, "the fixture's and the gateway's");
}

/// The id of the newest row whose message has `role` and mentions `text`.
fn row_id(state: &Path, role: &str, text: &str) -> String {
    read_rows(&transcript(state))
        .iter()
        .rev()
        .find(|e| e["message"]["role"] == role && e["message"]["content"].to_string().contains(text))
        .and_then(|e| e["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no {role} row mentioning {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_follow_the_file_when_it_moves_under_the_cached_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    prefill(&state);
    let fake = FakeOpenAi::start().await;
    let (mut gw, mut c) = start_on(&state, &fake).await;
    let turn = |n: usize| (format!("moved-turn-{n}"), format!("moved-run-{n}"));
    let mut said = Vec::new();
    for n in 1..=4 {
        match n {
            2 => {
                // Another writer continues the branch behind the gateway (through the store, with its lock).
                let file = transcript(&state);
                tokio::task::spawn_blocking(move || {
                    let store = pincer_store::Store::new(pincer_store::StoreOptions::default());
                    let user = json!({"role": "user", "content": "written by another writer", "timestamp": 2});
                    store.append(&file, pincer_store::NewEntry::message(user)).expect("append user");
                    let reply = assistant(json!([{"type": "text", "text": "an answer from elsewhere"}]), "stop");
                    store
                        .append(&file, pincer_store::NewEntry::message(reply["message"].clone()))
                        .expect("append reply");
                    store.close();
                })
                .await
                .expect("other writer");
            }
            3 => {
                // To the abandoned branch's tip (entry 1,999), then back to where the turns were.
                let r =
                    c.request("sessions.branches.switch", json!({"sessionKey": KEY, "leafEntryId": id(1999)})).await;
                r.expect("switch to the abandoned branch");
            }
            4 => {
                let tip = row_id(&state, "assistant", "moved-turn-2");
                let r = c.request("sessions.branches.switch", json!({"sessionKey": KEY, "leafEntryId": tip})).await;
                r.expect("switch back");
            }
            _ => {}
        }
        let (text, run) = turn(n);
        send_turn(&mut c, &text, &run).await;
        said.push(text);
    }
    assert!(gw.terminate().success());
    let requests = chat_requests(&fake);
    assert_eq!(requests.len(), 4, "one model call per turn");
    let lengths: Vec<usize> = requests.iter().zip(&said).map(|(r, text)| check_turn(&state, r, text)).collect();
    let body: Vec<String> = requests.iter().map(Value::to_string).collect();
    assert!(
        body[1].contains("written by another writer") && body[1].contains("moved-turn-1"),
        "turn 2 sees the other writer"
    );
    assert_eq!(lengths[1], lengths[0] + 4, "turn 1's pair and the other writer's pair: {lengths:?}");
    assert!(body[2].contains("answer 1803:") && !body[2].contains("moved-turn-1"), "turn 3 is on the abandoned branch");
    assert!(!body[2].contains("Tried another approach"), "the abandoned branch has no branch summary");
    assert!(body[3].contains("written by another writer") && !body[3].contains("moved-turn-3"), "turn 4 is back");
    assert_eq!(lengths[3], lengths[1] + 2, "turn 2's reply and turn 4's user row: {lengths:?}");
}
