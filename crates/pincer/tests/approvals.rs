//! Approvals through the real gateway (a spawned `pincer`, a scripted fake model, `bash` in
//! bubblewrap): a `bash` call under the default `ask` policy waits, its request is a transcript
//! entry announced as OpenClaw's `exec.approval.requested`; the wait survives a SIGKILL and is
//! answered from another connection after the restart, and the command runs exactly once. Deny,
//! expiry, `/approve` in the chat, `chat.abort` during a wait, allow-always and the `deny` policy.
//! The tests that also need PostgreSQL (approvals across replicas) are in `approvals_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print timings

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Recorded, Reply};
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::read_rows;
use pincer_testkit::wire::{result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "approvals/common.rs"]
mod common;
use common::*;

/// A model that calls `bash` with `echo ran >> calls.log` (once per user message) and answers
/// "done" once it has the result.
async fn model() -> FakeProvider {
    let f = Format::OpenaiCompletions;
    let reply = move |r: &Recorded, _n: usize| -> Option<Reply> {
        let messages = r.body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        let t = if last["role"] == "user" {
            turn(vec![tool_call("b1", "bash", &[&json!({"command": "echo ran >> calls.log"}).to_string()])], (5, 5, 0))
        } else {
            turn(vec![text(&["done"])], (5, 5, 0))
        };
        Some(Reply::stream(script(f, &t)))
    };
    FakeProvider::start_with(f, Default::default(), Box::new(reply)).await
}

struct Setup {
    _dir: tempfile::TempDir,
    state: PathBuf,
    ws: PathBuf,
    gw: GatewayProcess,
    cfg: String,
    _fake: FakeProvider,
}

/// A gateway over the fake model with `extra` added to `[agents.defaults.tools]`.
async fn setup(extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = model().await;
    let cfg = format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\n[agents.defaults.tools]\n{extra}",
        fake.base_url(),
        ws.display()
    );
    let state = dir.path().join("state");
    let (st, c) = (state.clone(), cfg.clone());
    let gw = tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &st, &c)).await.unwrap();
    Setup { _dir: dir, state, ws, gw, cfg, _fake: fake }
}

fn runs(ws: &Path) -> usize {
    std::fs::read_to_string(ws.join("calls.log")).map(|s| s.lines().count()).unwrap_or(0)
}

fn customs(file: &Path, kind: &str) -> Vec<Value> {
    read_rows(file).into_iter().filter(|r| r["customType"] == kind).collect()
}

/// The `exec.approval.requested` event, checked against OpenClaw's shape.
async fn requested(c: &mut Client) -> Value {
    let ev = c.event(|f| f["event"] == "exec.approval.requested").await;
    let p = ev["payload"].clone();
    assert!(p["id"].as_str().is_some_and(|id| !id.is_empty()), "{p}");
    assert_eq!(p["request"]["command"], "echo ran >> calls.log");
    assert_eq!(p["request"]["sessionKey"], "agent:main:main");
    assert_eq!(p["request"]["agentId"], "main");
    assert_eq!(p["request"]["toolCallId"], "b1");
    assert_eq!(p["request"]["allowedDecisions"], json!(["allow-once", "allow-always", "deny"]));
    assert!(p["request"]["cwd"].as_str().is_some_and(|c| !c.is_empty()), "{p}");
    let (created, expires) = (p["createdAtMs"].as_u64().unwrap(), p["expiresAtMs"].as_u64().unwrap());
    assert!(expires > created, "{p}");
    p
}

async fn wait_rows(file: &Path, gw: &GatewayProcess, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    pincer_testkit::probe::poll_async(Duration::from_secs(30), Duration::from_millis(50), || {
        let rows = read_rows(file);
        let ok = done(&rows);
        async move { ok.then_some(rows) }
    })
    .await
    .unwrap_or_else(|| panic!("{what}:\n{:#?}\n{}", read_rows(file), gw.log_text()))
}

fn finished(rows: &[Value]) -> bool {
    rows.iter().any(|r| r["message"]["role"] == "assistant" && r["message"]["stopReason"] == "stop")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_survives_a_sigkill_and_runs_once_when_allowed_from_another_connection() {
    let mut s = setup("").await;
    let mut c = Client::connect(&s.gw.addr).await;
    send(&mut c, "run it", "t1").await;
    let p = requested(&mut c).await;
    let id = p["id"].as_str().unwrap().to_owned();
    // The call's card says what it waits for (OpenClaw's words, for clients without an approval
    // view): an `update` of the call, after its `start`.
    let tool = |f: &Value, phase: &str| {
        f["event"] == "agent" && f["payload"]["stream"] == "tool" && f["payload"]["data"]["phase"] == phase
    };
    let seen = c.events_until(|f| tool(f, "update"), Duration::from_secs(30)).await;
    assert!(seen.iter().any(|f| tool(f, "start")), "the update came after the call's start: {seen:#?}");
    let text = seen.last().unwrap()["payload"]["data"]["partialResult"]["content"][0]["text"].clone();
    let text = text.as_str().unwrap_or_default();
    assert!(text.starts_with(&format!("Approval required (id {}, full {id})", &id[..8])), "{text}");
    assert!(text.ends_with(&format!("Reply with: /approve {} allow-once|allow-always|deny", &id[..8])), "{text}");
    let file = pincer_testkit::probe::transcript_path(&s.state, "agent:main:main").unwrap();
    let req = customs(&file, "pincer.approval-request");
    assert_eq!(req.len(), 1, "the request is on disk before it is announced");
    assert_eq!(req[0]["data"]["id"], id.as_str());
    assert_eq!(runs(&s.ws), 0, "nothing ran while it waits");
    let listed = c.request("exec.approval.list", json!({})).await.unwrap();
    assert_eq!(listed[0]["id"], id.as_str(), "{listed}");
    // The run shows as waiting for a human, not as streaming.
    let row = main_row(&mut c).await;
    assert_eq!(
        (&row["status"], &row["waitingForApproval"], &row["hasActiveRun"]),
        (&json!("running"), &json!(true), &json!(true)),
        "{row}"
    );
    drop(c);

    tokio::task::block_in_place(|| s.gw.restart()); // SIGKILL while waiting, then a new process
    let mut other = Client::connect(&s.gw.addr).await;
    let listed = pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(50), || {
        let addr = s.gw.addr.clone();
        async move {
            let mut c = Client::connect(&addr).await;
            let l = c.request("exec.approval.list", json!({})).await.unwrap();
            (l.as_array().is_some_and(|a| !a.is_empty())).then_some(l)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the wait was not taken up after the restart:\n{}", s.gw.log_text()));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["id"], id.as_str(), "the same request, under its id");
    assert_eq!(listed[0]["expiresAtMs"], p["expiresAtMs"], "and its expiry");
    assert_eq!(listed[0]["request"]["command"], "echo ran >> calls.log");
    assert_eq!(runs(&s.ws), 0);
    assert_eq!(main_row(&mut other).await["waitingForApproval"], true, "still waiting after the restart");
    let got = other.request("exec.approval.get", json!({"id": id})).await.unwrap();
    assert_eq!(got["commandText"], "echo ran >> calls.log");

    let ok = other.request("exec.approval.resolve", json!({"id": id, "decision": "allow-once"})).await.unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    let resolved = other.event(|f| f["event"] == "exec.approval.resolved").await;
    assert_eq!((&resolved["payload"]["id"], &resolved["payload"]["decision"]), (&json!(id), &json!("allow-once")));
    let again = other.request("exec.approval.resolve", json!({"id": id, "decision": "deny"})).await.unwrap_err();
    assert!(again["message"].as_str().unwrap().contains("already decided"), "{again}");

    let rows = wait_rows(&file, &s.gw, "no final after the approval", finished).await;
    assert_eq!(runs(&s.ws), 1, "the command ran exactly once");
    let results = tool_results(&file);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["isError"], false, "{}", results[0]);
    let kinds: Vec<String> = rows
        .iter()
        .filter_map(|r| match r["type"].as_str() {
            Some("message") => r["message"]["role"].as_str().map(str::to_owned),
            Some("custom") => r["customType"].as_str().map(str::to_owned),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "assistant",
            "pincer.approval-request",
            "pincer.turn-resumed",
            "pincer.approval-decision",
            "toolResult",
            "assistant"
        ],
        "the decision is written before the call runs"
    );
    let d = customs(&file, "pincer.approval-decision");
    assert_eq!((&d[0]["data"]["decision"], &d[0]["data"]["reason"]), (&json!("allow-once"), &json!("operator")));
    assert_eq!(other.request("exec.approval.list", json!({})).await.unwrap(), json!([]));
    let row = pincer_testkit::probe::poll_async(Duration::from_secs(10), Duration::from_millis(50), || {
        let addr = s.gw.addr.clone();
        async move {
            let row = main_row(&mut Client::connect(&addr).await).await;
            (row["status"] == "done").then_some(row)
        }
    })
    .await
    .expect("the row done once the turn ended");
    assert_eq!(row["waitingForApproval"], false, "{row}");
}

/// The `sessions.list` row of the main session.
async fn main_row(c: &mut Client) -> Value {
    let list = c.request("sessions.list", json!({})).await.unwrap();
    let rows = list["sessions"].as_array().expect("sessions");
    rows.iter().find(|r| r["key"] == "agent:main:main").cloned().unwrap_or_else(|| panic!("no main row: {list}"))
}

/// A graceful stop (SIGTERM) does not deny a waiting call: it is still waiting, under its id, when
/// the gateway is started again, and runs once when allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_leaves_the_call_waiting() {
    let mut s = setup("").await;
    let mut c = Client::connect(&s.gw.addr).await;
    send(&mut c, "run it", "g1").await;
    let id = requested(&mut c).await["id"].as_str().unwrap().to_owned();
    drop(c);
    let status = tokio::task::block_in_place(|| s.gw.terminate());
    assert!(status.success(), "{status:?}");
    let file = pincer_testkit::probe::transcript_path(&s.state, "agent:main:main").unwrap();
    assert!(customs(&file, "pincer.approval-decision").is_empty(), "the stop decided nothing");
    let (st, cfg) = (s.state.clone(), s.cfg.clone());
    s.gw = tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &st, &cfg)).await.unwrap();
    let addr = s.gw.addr.clone();
    let listed = pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(50), || {
        let addr = addr.clone();
        async move {
            let mut c = Client::connect(&addr).await;
            let l = c.request("exec.approval.list", json!({})).await.unwrap();
            (l.as_array().is_some_and(|a| !a.is_empty())).then_some(l)
        }
    })
    .await
    .unwrap_or_else(|| panic!("not waiting after the restart:\n{}", s.gw.log_text()));
    assert_eq!(listed[0]["id"], id.as_str());
    let mut c = Client::connect(&s.gw.addr).await;
    c.request("exec.approval.resolve", json!({"id": id, "decision": "allow-once"})).await.unwrap();
    wait_rows(&file, &s.gw, "no final after the approval", finished).await;
    assert_eq!(runs(&s.ws), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_expiry_chat_approve_abort_allow_always_and_the_deny_policy() {
    // Deny: the call gets a denied result, the model answers, the turn ends `final`.
    let s = setup("").await;
    let mut c = Client::connect(&s.gw.addr).await;
    let file = || pincer_testkit::probe::transcript_path(&s.state, "agent:main:main").unwrap();
    send(&mut c, "one", "d1").await;
    let id = requested(&mut c).await["id"].as_str().unwrap().to_owned();
    let mut other = Client::connect(&s.gw.addr).await;
    other.request("approval.resolve", json!({"id": id, "kind": "exec", "decision": "deny"})).await.unwrap();
    assert_eq!(c.chat_end("d1").await["payload"]["state"], "final");
    let results = tool_results(&file());
    assert_eq!(results[0]["isError"], true);
    assert!(result_text(&results[0]).starts_with("Denied by"), "{}", results[0]);
    assert_eq!(runs(&s.ws), 0);
    let late = other.request("exec.approval.resolve", json!({"id": id, "decision": "allow-once"})).await.unwrap_err();
    assert!(late["message"].as_str().unwrap().contains("already decided (deny"), "{late}");

    // `/approve <id> allow-once` in the chat, from another connection.
    send(&mut c, "two", "a1").await;
    let id = requested(&mut c).await["id"].as_str().unwrap().to_owned();
    let r = other
        .request(
            "chat.send",
            json!({"sessionKey": "main", "message": format!("/approve {id} allow-once"),
            "idempotencyKey": "cmd1"}),
        )
        .await
        .unwrap();
    assert_eq!(r["approval"]["decision"], "allow-once", "{r}");
    assert_eq!(c.chat_end("a1").await["payload"]["state"], "final");
    assert_eq!(runs(&s.ws), 1);
    let bad = other
        .request("chat.send", json!({"sessionKey": "main", "message": "/approve nope maybe", "idempotencyKey": "cmd2"}))
        .await
        .unwrap_err();
    assert!(bad["message"].as_str().unwrap().contains("invalid decision"), "{bad}");

    // `chat.abort` during a wait: a denied result and an aborted marker; nothing ran.
    send(&mut c, "three", "x1").await;
    requested(&mut c).await;
    c.request("chat.abort", json!({"sessionKey": "main", "runId": "x1"})).await.unwrap();
    assert_eq!(c.chat_end("x1").await["payload"]["state"], "aborted");
    let d = customs(&file(), "pincer.approval-decision");
    assert_eq!(
        (&d.last().unwrap()["data"]["decision"], &d.last().unwrap()["data"]["reason"]),
        (&json!("deny"), &json!("aborted"))
    );
    let results = tool_results(&file());
    assert!(result_text(results.last().unwrap()).contains("aborted"), "{}", results.last().unwrap());
    assert_eq!(runs(&s.ws), 1);
    assert_eq!(c.request("exec.approval.list", json!({})).await.unwrap(), json!([]));

    // allow-always: written to the state dir; the same command in the same directory then runs
    // without asking.
    send(&mut c, "four", "w1").await;
    let id = requested(&mut c).await["id"].as_str().unwrap().to_owned();
    other.request("exec.approval.resolve", json!({"id": id, "decision": "allow-always"})).await.unwrap();
    assert_eq!(c.chat_end("w1").await["payload"]["state"], "final");
    let list: Value = serde_json::from_str(&std::fs::read_to_string(s.state.join("approvals.json")).unwrap()).unwrap();
    assert_eq!(list["allow"][0]["command"], "echo ran >> calls.log", "{list}");
    let asked_before = customs(&file(), "pincer.approval-request").len();
    send(&mut c, "five", "w2").await;
    assert_eq!(c.chat_end("w2").await["payload"]["state"], "final");
    assert_eq!(customs(&file(), "pincer.approval-request").len(), asked_before, "not asked again");
    assert_eq!(runs(&s.ws), 3);
    drop(s);

    // Expiry: no answer within `approval_timeout` → a denied-by-timeout result.
    let s = setup("approval_timeout = 1\n").await;
    let mut c = Client::connect(&s.gw.addr).await;
    send(&mut c, "six", "e1").await;
    requested(&mut c).await;
    assert_eq!(c.chat_end("e1").await["payload"]["state"], "final");
    let f = pincer_testkit::probe::transcript_path(&s.state, "agent:main:main").unwrap();
    assert!(result_text(&tool_results(&f)[0]).contains("timed out"), "{}", tool_results(&f)[0]);
    assert_eq!(customs(&f, "pincer.approval-decision")[0]["data"]["reason"], "timeout");
    assert_eq!(runs(&s.ws), 0);
    drop(s);

    // `deny` policy: never runs, nobody is asked; `allow`: runs, nobody is asked.
    let s = setup("approval = { bash = \"deny\" }\n").await;
    let mut c = Client::connect(&s.gw.addr).await;
    send(&mut c, "seven", "p1").await;
    assert_eq!(c.chat_end("p1").await["payload"]["state"], "final");
    let f = pincer_testkit::probe::transcript_path(&s.state, "agent:main:main").unwrap();
    assert!(result_text(&tool_results(&f)[0]).contains("policy denies bash"), "{}", tool_results(&f)[0]);
    assert!(customs(&f, "pincer.approval-request").is_empty());
    assert_eq!(runs(&s.ws), 0);
    drop(s);
    let s = setup("approval = \"allow\"\n").await;
    let mut c = Client::connect(&s.gw.addr).await;
    send(&mut c, "eight", "p2").await;
    assert_eq!(c.chat_end("p2").await["payload"]["state"], "final");
    assert_eq!(runs(&s.ws), 1);
}
