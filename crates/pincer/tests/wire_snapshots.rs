//! The wire, frozen by snapshots (issue 35's first step): the real `pincer gateway` process, driven
//! over the OpenClaw WebSocket protocol and its HTTP routes by scripted fake providers, and the JSON
//! it sends — the result or error of every RPC method of its table (the test fails when
//! `hello-ok` lists a method no case calls), every event in the order it arrives for a plain turn,
//! a tool turn (`read` and an unconfined `bash`), an aborted streaming turn, a provider error, a
//! threshold compaction, the session changes and the shutdown, and the OpenAI-compatible, SSE,
//! export, health and metrics routes — compared with the committed `.snap` files under
//! `tests/snapshots/`. Values that vary run to run go through the one [`Redactor`] (ids numbered by
//! first appearance, so links between them stay visible); keys stay in wire order. Replies are one
//! text chunk each, so delta throttling cannot make the event order vary. A deliberate change of
//! the wire is reviewed with `cargo insta review` (or `INSTA_UPDATE=always`) and committed with it.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use futures::StreamExt;
use pincer_testkit::fake_openai::{is_summarization, last_user_text, summary};
use pincer_testkit::fake_provider::{
    script, split_after_first_text, text, tool_call, turn, FakeProvider, Format, Recorded, Reply, Step,
};
use pincer_testkit::gateway::{connect_params, is_chat_end, Client, GatewayProcess, StartOptions, TOKEN};
use pincer_testkit::redact::Redactor;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const F: Format = Format::OpenaiCompletions;
const PATIENCE: Duration = Duration::from_secs(60);
const COMPACTION: &str =
    "[agents.defaults.compaction]\nreserve_tokens = 1000\nreserve_tokens_floor = 0\nkeep_recent_tokens = 400\n";

/// A gateway on a fresh state dir and workspace, its fake provider, and the redactor that knows
/// their paths and addresses.
struct Setup {
    dir: tempfile::TempDir,
    fake: FakeProvider,
    gw: GatewayProcess,
}

impl Setup {
    /// A gateway with `fake/gpt-test` (context window `window`), a workspace holding `notes.txt`,
    /// bash unconfined (the same output on every machine), the OpenAI-compatible API on, and `extra`
    /// config. Compaction requests get a summary; every other request the next pushed reply.
    async fn start(window: u64, extra: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("notes.txt"), "first line\nsecond line\n").unwrap();
        let fake = FakeProvider::start_with(
            F,
            pincer_testkit::fake_provider::Options { keep_alive: true, ..Default::default() },
            Box::new(|r: &Recorded, _| {
                is_summarization(&r.body).then(|| reply_of(&[&summary(&last_user_text(&r.body))]))
            }),
        )
        .await;
        let config = format!(
            "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
             [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = {window}\n\
             [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\n\
             [agents.defaults.tools]\nsandbox = \"off\"\napproval = \"allow\"\n[gateway.openai_api]\nenabled = true\n{extra}",
            fake.base_url(),
            ws.display()
        );
        let state = dir.path().join("state");
        // Run from `/`: transcripts record the working directory, and event positions (`messageSeq`)
        // are byte offsets after it, so the snapshots must not depend on where the checkout is.
        let options = StartOptions { cwd: Some("/".into()), ..StartOptions::default() };
        let gw = tokio::task::spawn_blocking(move || GatewayProcess::start_with(BIN, &state, &config, &options))
            .await
            .unwrap();
        Setup { dir, fake, gw }
    }

    fn redactor(&self) -> Redactor {
        Redactor::new()
            .literal(self.dir.path().display().to_string(), "<tmp>")
            .literal(self.gw.addr.clone(), "<gateway>")
            .literal(self.fake.addr.to_string(), "<provider>")
            .host()
    }

    /// Queues a one-chunk text reply.
    fn say(&self, words: &str) {
        self.fake.push(reply_of(&[words]));
    }
}

fn reply_of(chunks: &[&str]) -> Reply {
    Reply::stream(script(F, &turn(vec![text(chunks)], (10, 5, 0))))
}

/// The redacted JSON, pretty, keys in wire order.
fn pretty(r: &mut Redactor, v: &Value) -> String {
    serde_json::to_string_pretty(&r.value(v)).unwrap()
}

/// RPC calls and their answers, recorded for one snapshot.
struct Calls {
    list: Vec<Value>,
    called: BTreeSet<String>,
}

impl Calls {
    /// Calls `method` and records `{method, params, result}` or `{method, params, error}`.
    async fn call(&mut self, c: &mut Client, method: &str, params: Value) -> Result<Value, Value> {
        let answer = c.request(method, params.clone()).await;
        let (k, v) = match &answer {
            Ok(v) => ("result", v),
            Err(e) => ("error", e),
        };
        self.list.push(json!({"method": method, "params": params, k: v}));
        self.called.insert(method.to_owned());
        answer
    }

    /// Snapshots the calls so far under `name` and starts a new list.
    fn snap(&mut self, name: &str, r: &mut Redactor) {
        let all = Value::Array(std::mem::take(&mut self.list));
        insta::assert_snapshot!(name, pretty(r, &all));
    }
}

/// Events as one snapshot value, in arrival order. `tick` is a 30 s timer of the connection, not
/// part of any scenario: one that falls inside a slow scenario is left out. A running tool's
/// `update` events depend on how fast the command runs (none, or one and more): they are left out
/// too, and the sequence numbers after them (the connection's, and the run's in the payload) are
/// counted as if they had not been sent; their shape is checked by `tool_events.rs`.
fn stream(evs: Vec<Value>) -> Value {
    let is_update = |f: &Value| {
        f["event"] == "agent" && f["payload"]["stream"] == "tool" && f["payload"]["data"]["phase"] == "update"
    };
    let (mut dropped, mut dropped_by_run) = (0u64, std::collections::HashMap::<String, u64>::new());
    let mut out = Vec::new();
    for mut f in evs.into_iter().filter(|f| f["event"] != "tick") {
        let run = f["payload"]["runId"].as_str().unwrap_or_default().to_owned();
        if is_update(&f) {
            dropped += 1;
            *dropped_by_run.entry(run).or_default() += 1;
            continue;
        }
        if let Some(n) = f["seq"].as_u64() {
            f["seq"] = (n - dropped).into();
        }
        let by_run = dropped_by_run.get(&run).copied().unwrap_or(0);
        if let (Some(n), true) = (f["payload"]["seq"].as_u64(), f["event"] == "agent") {
            f["payload"]["seq"] = (n - by_run).into();
        }
        out.push(f);
    }
    Value::Array(out)
}

fn chat_end(run: &'static str) -> impl Fn(&Value) -> bool {
    move |f| is_chat_end(f, run)
}

/// A client that hears `key`'s `chat`, `agent` and `session.message` events and every `sessions.changed`.
async fn watcher(addr: &str, key: &str) -> Client {
    let mut w = Client::connect(addr).await;
    w.request("sessions.subscribe", json!({})).await.unwrap();
    w.request("sessions.messages.subscribe", json!({"key": key})).await.unwrap();
    w
}

/// The events `w` heard up to the one `until` matches, then whatever the run still sends before
/// `agent.wait` for it answers (the run is over then).
async fn heard(w: &mut Client, until: impl Fn(&Value) -> bool, run: &str) -> Vec<Value> {
    let mut evs = w.events_until(until, PATIENCE).await;
    w.request("agent.wait", json!({"runId": run, "timeoutMs": 30_000})).await.unwrap();
    w.request("health", json!({})).await.unwrap();
    evs.append(&mut w.events);
    evs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_answers_as_before() {
    let s = Setup::start(1_000_000, "").await;
    // The gateway log's size (logs.tail) follows the durations it logs.
    let mut r = s.redactor().size_key("cursor").size_key("size");
    let mut calls = Calls { list: vec![], called: BTreeSet::new() };

    // The handshake: hello-ok, a refused token, a bad first frame.
    let mut c = Client::connect(&s.gw.addr).await;
    let methods: Vec<String> =
        c.hello["features"]["methods"].as_array().unwrap().iter().map(|m| m.as_str().unwrap().to_owned()).collect();
    let refused = Client::connect_with(&s.gw.addr, connect_params("wrong-token")).await.err().unwrap();
    let bad_first =
        pincer_testkit::gateway::first_frame_answer(&s.gw.addr, r#"{"type":"req","id":"x","method":"health"}"#).await;
    let (mut raw, _) = tokio_tungstenite::connect_async(format!("ws://{}/", s.gw.addr)).await.unwrap();
    let challenge = match raw.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str::<Value>(&t).unwrap(),
        other => panic!("not a text frame: {other:?}"),
    };
    drop(raw);
    let handshake = json!({"challenge": challenge, "hello": c.hello, "refused": refused, "notConnectFirst": bad_first});
    insta::assert_snapshot!("connect", pretty(&mut s.redactor(), &handshake));
    calls.called.insert("connect".into());
    calls.call(&mut c, "connect", connect_params(TOKEN)).await.ok();

    // Discovery and status.
    for m in [
        "health",
        "status",
        "pincer.info",
        "models.list",
        "agents.list",
        "agent.identity.get",
        "commands.list",
        "chat.metadata",
        "models.authStatus",
        "config.get",
        "themes.list",
        "update.status",
        "usage.status",
        "system-presence",
        "last-heartbeat",
        "diagnostics.lanes",
    ] {
        calls.call(&mut c, m, json!({})).await.unwrap();
    }
    calls.call(&mut c, "tools.effective", json!({"sessionKey": "main"})).await.unwrap();
    calls.call(&mut c, "tools.effective", json!({"agentId": "other"})).await.ok();
    calls.call(&mut c, "chat.metadata", json!({"agentId": 7})).await.ok();
    calls.call(&mut c, "no.such.method", json!({})).await.ok();
    calls.call(&mut c, "health", json!([1])).await.ok();
    // A connection granted read only may not change state.
    let mut read_only = connect_params(TOKEN);
    read_only["scopes"] = json!(["operator.read"]);
    let mut ro = Client::connect_with(&s.gw.addr, read_only).await.unwrap();
    calls.call(&mut ro, "sessions.patch", json!({"key": "main", "label": "x"})).await.ok();
    calls.snap("rpc_discovery", &mut r);

    // The stubs OpenClaw's Control UI asks for.
    for m in [
        "cron.list",
        "cron.status",
        "cron.runs",
        "channels.status",
        "channels.pairing.list",
        "skills.status",
        "skills.search",
        "skills.library.list",
        "plugins.list",
        "tasks.list",
        "artifacts.list",
        "question.list",
        "progressCard.get",
        "exec.approval.list",
        "plugin.approval.list",
        "openclaw.approval.list",
        "sessions.observer.visibility",
        "sessions.companion.state",
        "talk.catalog",
        "device.pair.list",
        "node.list",
    ] {
        calls.call(&mut c, m, json!({})).await.unwrap();
    }
    calls.snap("rpc_stubs", &mut r);

    // Approvals (none waiting here): unknown ids, a bad decision, a connection without the scope.
    calls.call(&mut c, "exec.approval.get", json!({"id": "nope"})).await.unwrap_err();
    calls.call(&mut c, "exec.approval.resolve", json!({"id": "nope", "decision": "allow-once"})).await.unwrap_err();
    calls.call(&mut c, "exec.approval.resolve", json!({"id": "nope", "decision": "maybe"})).await.unwrap_err();
    calls
        .call(&mut c, "approval.resolve", json!({"id": "nope", "kind": "exec", "decision": "deny"}))
        .await
        .unwrap_err();
    calls.call(&mut ro, "exec.approval.list", json!({})).await.unwrap_err();
    calls.snap("rpc_approvals", &mut r);

    // chat.*: an empty session, a turn, its history whole and paged, inject, abort, message.get.
    calls.call(&mut c, "chat.history", json!({"sessionKey": "main"})).await.unwrap();
    s.say("Hello there.");
    calls
        .call(&mut c, "chat.send", json!({"sessionKey": "main", "message": "hi", "idempotencyKey": "r1"}))
        .await
        .unwrap();
    c.chat_end("r1").await;
    calls
        .call(&mut c, "chat.send", json!({"sessionKey": "main", "message": "hi", "idempotencyKey": "r1"}))
        .await
        .unwrap();
    calls.call(&mut c, "chat.send", json!({"sessionKey": "main", "message": "no key"})).await.ok();
    calls.call(&mut c, "chat.send", json!({"sessionKey": "", "message": "x", "idempotencyKey": "r0"})).await.ok();
    let h = calls.call(&mut c, "chat.history", json!({"sessionKey": "main"})).await.unwrap();
    let page = calls.call(&mut c, "chat.history", json!({"sessionKey": "main", "limit": 1})).await.unwrap();
    let oldest = page["messages"][0]["__openclaw"]["id"].as_str().unwrap().to_owned();
    calls
        .call(&mut c, "chat.history", json!({"sessionKey": "main", "limit": 1, "beforeEntryId": oldest}))
        .await
        .unwrap();
    calls.call(&mut c, "chat.history", json!({"sessionKey": "main", "limit": 0})).await.ok();
    calls.call(&mut c, "chat.history", json!({"sessionKey": "agent:main:nobody"})).await.unwrap();
    calls.call(&mut c, "chat.startup", json!({"sessionKey": "main", "limit": 1})).await.unwrap();
    let user_id = h["messages"][0]["__openclaw"]["id"].as_str().unwrap().to_owned();
    let reply_id = h["messages"][1]["__openclaw"]["id"].as_str().unwrap().to_owned();
    calls.call(&mut c, "chat.message.get", json!({"sessionKey": "main", "messageId": reply_id})).await.unwrap();
    calls.call(&mut c, "chat.message.get", json!({"sessionKey": "main", "messageId": "nope"})).await.ok();
    calls
        .call(&mut c, "chat.inject", json!({"sessionKey": "main", "message": "a note", "label": "note"}))
        .await
        .unwrap();
    calls.call(&mut c, "chat.inject", json!({"sessionKey": "main"})).await.ok();
    calls.call(&mut c, "chat.abort", json!({"sessionKey": "main"})).await.unwrap();
    calls.call(&mut c, "chat.abort", json!({"runId": "r1"})).await.ok();
    calls.snap("rpc_chat", &mut r);

    // The tree of a session.
    calls.call(&mut c, "sessions.tree", json!({"sessionKey": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.tree", json!({"sessionKey": "agent:main:nobody"})).await.ok();
    calls.call(&mut c, "sessions.branches.list", json!({"sessionKey": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.branches.list", json!({"sessionKey": "main", "agentId": "other"})).await.ok();
    calls
        .call(&mut c, "sessions.label", json!({"sessionKey": "main", "entryId": user_id, "label": "start"}))
        .await
        .unwrap();
    calls.call(&mut c, "sessions.label", json!({"sessionKey": "main", "entryId": "nope", "label": "x"})).await.ok();
    calls.call(&mut c, "sessions.fork", json!({"sessionKey": "main", "entryId": user_id})).await.unwrap();
    calls.call(&mut c, "sessions.fork", json!({"sessionKey": "main", "entryId": "nope"})).await.ok();
    let tips = calls.call(&mut c, "sessions.branches.list", json!({"sessionKey": "main"})).await.unwrap();
    let active = tips["branches"].as_array().unwrap().iter().find(|b| b["active"] == true).unwrap();
    let leaf = active["leafEntryId"].as_str().unwrap().to_owned();
    calls.call(&mut c, "sessions.rewind", json!({"sessionKey": "main", "entryId": user_id})).await.unwrap();
    calls.call(&mut c, "sessions.rewind", json!({"sessionKey": "main"})).await.ok();
    calls.call(&mut c, "sessions.branches.switch", json!({"sessionKey": "main", "leafEntryId": leaf})).await.unwrap();
    calls.call(&mut c, "sessions.branches.switch", json!({"sessionKey": "main", "leafEntryId": "nope"})).await.ok();
    calls.snap("rpc_tree", &mut r);

    // Sessions: list, create, patch, describe, usage, subscriptions, abort, compact, reset, delete.
    calls.call(&mut c, "sessions.list", json!({"includeDerivedTitles": true})).await.unwrap();
    calls.call(&mut c, "sessions.list", json!({"limit": 0})).await.ok();
    calls.call(&mut c, "sessions.create", json!({"key": "agent:main:second", "label": "Second"})).await.unwrap();
    calls.call(&mut c, "sessions.create", json!({"key": "agent:main:second"})).await.ok();
    calls
        .call(&mut c, "sessions.patch", json!({"key": "agent:main:second", "label": "Renamed", "unread": true}))
        .await
        .unwrap();
    calls.call(&mut c, "sessions.patch", json!({"key": "agent:main:second", "sendPolicy": "maybe"})).await.ok();
    calls.call(&mut c, "sessions.patch", json!({"key": "agent:main:second", "model": "nope/nothing"})).await.ok();
    calls.call(&mut c, "sessions.describe", json!({"key": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.describe", json!({"key": "agent:main:unused"})).await.unwrap();
    calls.call(&mut c, "sessions.describe", json!({})).await.ok();
    calls.call(&mut c, "sessions.usage", json!({})).await.unwrap();
    calls.call(&mut c, "sessions.usage", json!({"key": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.usage", json!({"limit": "ten"})).await.ok();
    calls.call(&mut c, "sessions.subscribe", json!({})).await.unwrap();
    calls.call(&mut c, "sessions.unsubscribe", json!({})).await.unwrap();
    calls.call(&mut c, "sessions.messages.subscribe", json!({"key": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.messages.subscribe", json!({"key": "main", "afterSeq": 0})).await.unwrap();
    calls.call(&mut c, "sessions.messages.subscribe", json!({})).await.ok();
    calls.call(&mut c, "sessions.messages.unsubscribe", json!({"key": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.messages.unsubscribe", json!({})).await.ok();
    calls.call(&mut c, "sessions.abort", json!({"key": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.abort", json!({})).await.ok();
    calls.call(&mut c, "sessions.compact", json!({"key": "main"})).await.unwrap();
    calls.call(&mut c, "sessions.compact", json!({"key": "main", "maxLines": 100})).await.unwrap();
    calls.call(&mut c, "sessions.compact", json!({"key": "agent:main:nobody"})).await.ok();
    calls.call(&mut c, "sessions.reset", json!({"key": "agent:main:second", "reason": "new"})).await.unwrap();
    calls.call(&mut c, "sessions.reset", json!({"key": "main", "reason": "because"})).await.ok();
    calls.call(&mut c, "sessions.delete", json!({"key": "agent:main:fork-target-none"})).await.unwrap();
    calls.call(&mut c, "sessions.delete", json!({})).await.ok();
    calls.snap("rpc_sessions", &mut r);

    // Search, export, and the archives of reset/deleted transcripts.
    calls.call(&mut c, "sessions.search", json!({"query": "hello"})).await.unwrap();
    calls.call(&mut c, "sessions.search", json!({"query": "hello", "limit": "x"})).await.ok();
    calls.call(&mut c, "sessions.export", json!({"sessionKey": "main", "format": "md"})).await.unwrap();
    calls.call(&mut c, "sessions.export", json!({"sessionKey": "main", "format": "pdf"})).await.ok();
    calls.call(&mut c, "sessions.export", json!({"sessionKey": "agent:main:nobody"})).await.ok();
    s.say("Reset soon.");
    calls
        .call(
            &mut c,
            "chat.send",
            json!({"sessionKey": "agent:main:third", "message": "archive me", "idempotencyKey": "r2"}),
        )
        .await
        .unwrap();
    c.chat_end("r2").await;
    calls.call(&mut c, "sessions.delete", json!({"key": "agent:main:third"})).await.unwrap();
    let list = calls.call(&mut c, "sessions.archives.list", json!({})).await.unwrap();
    let file = list["archives"].as_array().unwrap().iter().find(|a| a["reason"] == "deleted").unwrap()["file"].clone();
    // Archives are listed by file name, which starts with the session's (random) id: canonical order here.
    let listed = calls.list.last_mut().unwrap()["result"]["archives"].as_array_mut().unwrap();
    listed.sort_by_key(|a| a["reason"].as_str().unwrap().to_owned());
    calls.call(&mut c, "sessions.archives.list", json!({"agentId": "other"})).await.ok();
    calls.call(&mut c, "sessions.archives.get", json!({"file": file})).await.unwrap();
    calls.call(&mut c, "sessions.archives.get", json!({"file": "nope.jsonl.deleted.1"})).await.ok();
    calls.call(&mut c, "sessions.archives.restore", json!({"file": file})).await.unwrap();
    calls.call(&mut c, "sessions.archives.restore", json!({})).await.ok();
    calls.snap("rpc_search_export_archives", &mut r);

    // agent and agent.wait.
    s.say("Agent reply.");
    calls.call(&mut c, "agent", json!({"message": "run", "idempotencyKey": "a1", "sessionKey": "main"})).await.unwrap();
    calls.call(&mut c, "agent.wait", json!({"runId": "a1", "timeoutMs": 30_000})).await.unwrap();
    calls.call(&mut c, "agent.wait", json!({"runId": "never-started", "timeoutMs": 0})).await.ok();
    calls.call(&mut c, "agent.wait", json!({})).await.ok();
    calls.call(&mut c, "agent", json!({"idempotencyKey": "a2"})).await.ok();
    calls.call(&mut c, "logs.tail", json!({"limit": 1})).await.unwrap();
    calls.snap("rpc_agent", &mut r);

    // Every method the gateway announces has a case here.
    let missing: Vec<&String> = methods.iter().filter(|m| !calls.called.contains(*m)).collect();
    assert!(missing.is_empty(), "methods without a snapshot case: {missing:?}");
    println!("{} methods covered", methods.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_of_each_kind_of_turn_arrive_as_before() {
    let s = Setup::start(1_000_000, "").await;
    let mut c = Client::connect(&s.gw.addr).await;

    // A plain turn.
    let mut w = watcher(&s.gw.addr, "agent:main:plain").await;
    s.say("Hello there.");
    c.request("chat.send", json!({"sessionKey": "agent:main:plain", "message": "hi", "idempotencyKey": "p1"}))
        .await
        .unwrap();
    let evs = heard(&mut w, chat_end("p1"), "p1").await;
    insta::assert_snapshot!("events_plain_turn", pretty(&mut s.redactor(), &stream(evs)));

    // A turn with two tools: `read` of a workspace file, then `bash`.
    let mut w = watcher(&s.gw.addr, "agent:main:tools").await;
    let read = json!({"path": "notes.txt"}).to_string();
    let bash = json!({"command": "echo hi"}).to_string();
    for t in [
        turn(vec![tool_call("call_1", "read", &[&read])], (10, 5, 0)),
        turn(vec![tool_call("call_2", "bash", &[&bash])], (20, 5, 0)),
        turn(vec![text(&["Done."])], (30, 2, 0)),
    ] {
        s.fake.push(Reply::stream(script(F, &t)));
    }
    c.request("chat.send", json!({"sessionKey": "agent:main:tools", "message": "look", "idempotencyKey": "t1"}))
        .await
        .unwrap();
    let evs = heard(&mut w, chat_end("t1"), "t1").await;
    insta::assert_snapshot!("events_tool_turn", pretty(&mut s.redactor(), &stream(evs)));

    // A streaming turn aborted after its first delta.
    let mut w = watcher(&s.gw.addr, "agent:main:abort").await;
    let events = script(F, &turn(vec![text(&["Partial ", "never sent"])], (10, 5, 0)));
    let first = split_after_first_text(F, &events);
    let tx = s.fake.push_controlled();
    for e in &events[..first] {
        tx.send(Step::Send(e.clone())).unwrap();
    }
    c.request("chat.send", json!({"sessionKey": "agent:main:abort", "message": "go on", "idempotencyKey": "s1"}))
        .await
        .unwrap();
    let mut evs = w
        .events_until(
            |f| f["event"] == "chat" && f["payload"]["runId"] == "s1" && f["payload"]["state"] == "delta",
            PATIENCE,
        )
        .await;
    c.request("chat.abort", json!({"sessionKey": "agent:main:abort", "runId": "s1"})).await.unwrap();
    evs.extend(heard(&mut w, chat_end("s1"), "s1").await);
    drop(tx);
    insta::assert_snapshot!("events_aborted_turn", pretty(&mut s.redactor(), &stream(evs)));

    // The provider answers with an error.
    let mut w = watcher(&s.gw.addr, "agent:main:fail").await;
    s.fake.push(Reply::status(F, 400, "The fake provider was told to fail"));
    c.request("chat.send", json!({"sessionKey": "agent:main:fail", "message": "fail", "idempotencyKey": "e1"}))
        .await
        .unwrap();
    // A failed run's lifecycle `end` follows its `chat` error (and may follow `agent.wait`'s answer).
    let lifecycle_end =
        |f: &Value| f["event"] == "agent" && f["payload"]["runId"] == "e1" && f["payload"]["data"]["phase"] == "end";
    let evs = heard(&mut w, lifecycle_end, "e1").await;
    insta::assert_snapshot!("events_provider_error", pretty(&mut s.redactor(), &stream(evs)));

    // Session changes: patch, inject, trim, reset, delete, each with what it announces.
    let mut w = watcher(&s.gw.addr, "agent:main:plain").await;
    let mut evs = Vec::new();
    let changed =
        |reason: &'static str| move |f: &Value| f["event"] == "sessions.changed" && f["payload"]["reason"] == reason;
    c.request("sessions.patch", json!({"key": "agent:main:plain", "label": "Plain"})).await.unwrap();
    evs.extend(w.events_until(changed("patch"), PATIENCE).await);
    c.request("chat.inject", json!({"sessionKey": "agent:main:plain", "message": "a note"})).await.unwrap();
    evs.extend(w.events_until(|f| f["event"] == "session.message", PATIENCE).await);
    c.request("sessions.compact", json!({"key": "agent:main:plain", "maxLines": 2})).await.unwrap();
    evs.extend(w.events_until(changed("compact"), PATIENCE).await);
    c.request("sessions.reset", json!({"key": "agent:main:plain"})).await.unwrap();
    evs.extend(w.events_until(changed("reset"), PATIENCE).await);
    c.request("sessions.delete", json!({"key": "agent:main:plain"})).await.unwrap();
    evs.extend(w.events_until(changed("delete"), PATIENCE).await);
    w.request("health", json!({})).await.unwrap();
    evs.append(&mut w.events);
    insta::assert_snapshot!("events_session_changes", pretty(&mut s.redactor(), &stream(evs)));

    // The goodbye at shutdown, and the close code.
    let mut r = s.redactor();
    let Setup { dir: _dir, fake: _fake, gw } = s;
    let mut gw = gw;
    let stop = tokio::task::spawn_blocking(move || gw.terminate());
    let (frames, code) = w.frames_until_close(PATIENCE).await;
    assert!(stop.await.unwrap().success());
    insta::assert_snapshot!("events_shutdown", pretty(&mut r, &json!({"frames": frames, "closeCode": code})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_threshold_compaction_is_announced_as_before() {
    let s = Setup::start(3000, COMPACTION).await;
    let mut c = Client::connect(&s.gw.addr).await;
    let mut w = watcher(&s.gw.addr, "main").await;
    let long = |n: usize| format!("turn {n}: {}", "lorem ipsum dolor sit amet ".repeat(60));
    s.fake.push(Reply::stream(script(F, &turn(vec![text(&["First answer."])], (100, 5, 0)))));
    c.request("chat.send", json!({"sessionKey": "main", "message": long(1), "idempotencyKey": "k1"})).await.unwrap();
    heard(&mut w, chat_end("k1"), "k1").await;
    s.fake.push(Reply::stream(script(F, &turn(vec![text(&["Second answer."])], (2500, 5, 0)))));
    c.request("chat.send", json!({"sessionKey": "main", "message": long(2), "idempotencyKey": "k2"})).await.unwrap();
    let compaction_end = |f: &Value| {
        f["event"] == "agent" && f["payload"]["stream"] == "compaction" && f["payload"]["data"]["phase"] == "end"
    };
    let evs = heard(&mut w, compaction_end, "k2").await;
    insta::assert_snapshot!("events_threshold_compaction", pretty(&mut s.redactor(), &stream(evs)));
}

/// A request to the gateway's HTTP port: status, content type and body.
async fn http(
    method: &str,
    url: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, String, String) {
    pincer_agent::install_crypto_provider(); // reqwest is built without one (see the workspace Cargo.toml)
    let client = reqwest::Client::new();
    let mut req = if method == "POST" { client.post(url) } else { client.get(url) };
    req = req.header("authorization", format!("Bearer {token}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let kind = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, kind, resp.text().await.unwrap())
}

/// One SSE event block as JSON: `{event?, id?, data}` (`data` parsed when it is JSON).
fn sse_event(block: &str) -> Option<Value> {
    let mut ev = serde_json::Map::new();
    let mut data = Vec::new();
    for line in block.lines() {
        match line.split_once(':') {
            Some(("data", v)) => data.push(v.strip_prefix(' ').unwrap_or(v).to_owned()),
            Some((k @ ("event" | "id"), v)) => {
                ev.insert(k.into(), json!(v.trim()));
            }
            _ => {}
        }
    }
    if data.is_empty() && ev.is_empty() {
        return None; // a keep-alive comment
    }
    let data = data.join("\n");
    ev.insert("data".into(), serde_json::from_str(&data).unwrap_or(Value::String(data)));
    Some(Value::Object(ev))
}

/// Opens a session's SSE stream; once this returns, the gateway has subscribed it.
async fn sse_open(url: &str, last_event_id: Option<&str>) -> reqwest::Response {
    pincer_agent::install_crypto_provider();
    let mut req = reqwest::Client::new().get(url).header("authorization", format!("Bearer {TOKEN}"));
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp
}

/// The events of an SSE response until one matches `until` (the stream itself never ends).
async fn sse_until(mut resp: reqwest::Response, until: impl Fn(&Value) -> bool) -> Vec<Value> {
    let (mut buf, mut out) = (String::new(), Vec::new());
    loop {
        let chunk = tokio::time::timeout(PATIENCE, resp.chunk()).await.unwrap().unwrap().unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(at) = buf.find("\n\n") {
            let block: String = buf.drain(..at + 2).collect();
            if let Some(ev) = sse_event(&block) {
                let done = until(&ev);
                out.push(ev);
                if done {
                    return out;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_routes_answer_as_before() {
    let s = Setup::start(1_000_000, "").await;
    let mut r = s.redactor();
    let base = format!("http://{}", s.gw.addr);
    let mut c = Client::connect(&s.gw.addr).await;

    // The session's events as SSE, live: a turn from chat.send.
    let events_url = format!("{base}/api/sessions/main/events");
    let final_of = |run: &'static str| {
        move |e: &Value| {
            e["data"]["event"] == "chat"
                && e["data"]["payload"]["runId"] == run
                && e["data"]["payload"]["state"] == "final"
        }
    };
    let stream = sse_open(&events_url, None).await;
    s.say("Hello there.");
    c.request("chat.send", json!({"sessionKey": "main", "message": "hi", "idempotencyKey": "h1"})).await.unwrap();
    let live = sse_until(stream, final_of("h1")).await;
    c.chat_end("h1").await;
    let first_id = live.iter().find_map(|e| e["id"].as_str()).unwrap().to_owned();
    let caught_up = sse_until(sse_open(&events_url, Some(&first_id)).await, final_of("h1")).await;
    let reset = sse_until(sse_open(&events_url, Some("garbage")).await, |_| true).await;
    let (status, _, unauthorized) = http("GET", &events_url, "wrong-token", &[], None).await;
    let sse = json!({"live": live, "afterFirstId": caught_up, "badLastEventId": reset,
        "wrongToken": {"status": status, "body": unauthorized}});
    insta::assert_snapshot!("http_session_events", pretty(&mut r, &sse));

    // Export, health, metrics (names only: the values count what this test did).
    let mut out = Vec::new();
    for (name, url, token) in [
        ("export md", format!("{base}/api/sessions/main/export?format=md"), TOKEN),
        ("export bad format", format!("{base}/api/sessions/main/export?format=pdf"), TOKEN),
        ("export unknown session", format!("{base}/api/sessions/agent:main:nobody/export?format=md"), TOKEN),
        ("export wrong token", format!("{base}/api/sessions/main/export?format=md"), "wrong-token"),
        ("healthz", format!("{base}/healthz"), TOKEN),
    ] {
        let (status, kind, body) = http("GET", &url, token, &[], None).await;
        let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
        out.push(json!({"request": name, "status": status, "contentType": kind, "body": body}));
    }
    let (status, _, metrics) = http("GET", &format!("{base}/metrics"), TOKEN, &[], None).await;
    let names: BTreeSet<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    out.push(json!({"request": "metrics", "status": status, "names": names}));
    insta::assert_snapshot!("http_routes", pretty(&mut r, &Value::Array(out)));

    // The OpenAI-compatible API: models, a completion whole and streamed, and errors.
    let mut out = Vec::new();
    let completions = format!("{base}/v1/chat/completions");
    let ask = |stream: bool| json!({"model": "pincer", "stream": stream, "messages": [{"role": "user", "content": "hi there"}]});
    s.say("Whole answer.");
    let mut cases = vec![
        ("models", "GET", format!("{base}/v1/models"), TOKEN, None),
        ("model", "GET", format!("{base}/v1/models/pincer"), TOKEN, None),
        ("unknown model", "GET", format!("{base}/v1/models/nope"), TOKEN, None),
        ("completion", "POST", completions.clone(), TOKEN, Some(ask(false))),
    ];
    cases.push(("wrong token", "POST", completions.clone(), "wrong-token", Some(ask(false))));
    cases.push(("no messages", "POST", completions.clone(), TOKEN, Some(json!({"model": "pincer"}))));
    cases.push(("not json", "POST", completions.clone(), TOKEN, Some(json!("text"))));
    for (name, method, url, token, body) in cases {
        let (status, kind, text) = http(method, &url, token, &[], body.as_ref()).await;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        out.push(json!({"request": name, "status": status, "contentType": kind, "body": body}));
    }
    s.say("Streamed answer.");
    let (status, kind, text) = http(
        "POST",
        &completions,
        TOKEN,
        &[],
        Some(&json!({"model": "pincer", "stream": true,
        "messages": [{"role": "user", "content": "stream it"}]})),
    )
    .await;
    let chunks: Vec<Value> = text.split("\n\n").filter_map(sse_event).collect();
    out.push(json!({"request": "streamed completion", "status": status, "contentType": kind, "events": chunks}));
    s.fake.push(Reply::status(F, 400, "The fake provider was told to fail"));
    let (status, kind, text) = http(
        "POST",
        &completions,
        TOKEN,
        &[],
        Some(&json!({"model": "pincer",
        "messages": [{"role": "user", "content": "fail"}]})),
    )
    .await;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    out.push(json!({"request": "provider error", "status": status, "contentType": kind, "body": body}));
    insta::assert_snapshot!("http_openai", pretty(&mut r, &Value::Array(out)));
}
