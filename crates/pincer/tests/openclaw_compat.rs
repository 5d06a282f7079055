//! OpenClaw's own clients' calls against the real `pincer gateway` (fake provider, real files):
//! `agent` (accepted, then the final on the same request id, the turn on disk and chained),
//! sessions OpenClaw wrote itself (a bare `model` beside `modelProvider`) continuing on Pincer, the
//! discovery methods, run events' numbering, read-only clients, unread marks, rate limits and an
//! in-flight run's history. The tests that need OpenClaw's own code (its result schemas, on Node)
//! or the Pi oracle are in `openclaw_compat_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::Client;
use pincer_testkit::probe::{message_text as text, read_rows, transcript_path};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

#[path = "openclaw_compat/common.rs"]
mod common;
use common::*;

/// Sends a request frame and returns every response frame with its id up to the one that is not
/// `accepted` (OpenClaw's `expectFinal`).
async fn call_until_final(c: &mut Client, id: &str, method: &str, params: Value) -> Vec<Value> {
    let frame = json!({"type": "req", "id": id, "method": method, "params": params});
    c.send_raw(&frame.to_string()).await;
    let mut out = Vec::new();
    loop {
        let r = c.response().await;
        assert_eq!(r["id"], id, "{r}");
        let accepted = r["ok"] == true && r["payload"]["status"] == "accepted";
        out.push(r);
        if !accepted {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_is_accepted_then_answered_with_the_reply_written_and_chained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;

    let params = json!({"message": "hi", "agentId": "main", "idempotencyKey": "agent-run-1", "deliver": false,
        "timeout": 600, "channel": "last"});
    let frames = call_until_final(&mut c, "a1", "agent", params).await;
    assert_eq!(frames.len(), 2, "accepted, then the final: {frames:#?}");
    let accepted = &frames[0]["payload"];
    assert_eq!(
        (&accepted["runId"], &accepted["sessionKey"], &accepted["agentId"]),
        (&json!("agent-run-1"), &json!("agent:main:main"), &json!("main"))
    );
    let fin = &frames[1];
    assert_eq!(fin["ok"], true, "{fin}");
    let p = &fin["payload"];
    assert_eq!((&p["runId"], &p["status"], &p["summary"]), (&json!("agent-run-1"), &json!("ok"), &json!("completed")));
    assert_eq!(p["result"]["payloads"], json!([{"text": "Fake reply: you said \"hi\""}]));
    assert_eq!(p["result"]["meta"]["agentMeta"]["provider"], "fake");
    assert_eq!(p["result"]["meta"]["agentMeta"]["model"], "fake-model");

    // On disk: the user row and the reply, chained, with the run's keys; the final's session id is the file's.
    let file = transcript_path(&gw.state_dir, "agent:main:main").expect("transcript");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert_eq!(rows[0]["id"], p["result"]["meta"]["agentMeta"]["sessionId"]);
    assert_eq!((rows[1]["message"]["role"].as_str(), text(&rows[1]["message"]).as_str()), (Some("user"), "hi"));
    assert_eq!(rows[1]["message"]["idempotencyKey"], "agent-run-1:user");
    assert_eq!(rows[2]["parentId"], rows[1]["id"]);
    assert_eq!(text(&rows[2]["message"]), "Fake reply: you said \"hi\"");

    // The same key again is the same run: answered from the transcript, nothing new written.
    let again = json!({"message": "hi", "sessionKey": "main", "idempotencyKey": "agent-run-1"});
    let frames = call_until_final(&mut c, "a2", "agent", again).await;
    assert_eq!(frames.last().expect("final")["payload"]["result"]["payloads"], p["result"]["payloads"]);
    assert_eq!(read_rows(&file).len(), 3);

    // A second run chains after the first reply; agent.wait knows how it ended.
    let next = json!({"message": "more", "sessionKey": "agent:main:main", "idempotencyKey": "agent-run-2"});
    let frames = call_until_final(&mut c, "a3", "agent", next).await;
    assert_eq!(frames.last().expect("final")["payload"]["status"], "ok");
    let rows = read_rows(&file);
    assert_eq!(rows[3]["parentId"], rows[2]["id"]);
    let waited = c.request("agent.wait", json!({"runId": "agent-run-2", "timeoutMs": 1000})).await.expect("wait");
    assert_eq!(waited["status"], "ok", "{waited}");
    // Asked after the run ended, it still says when the run started (as while it ran).
    let (started, ended) = (waited["startedAt"].as_u64(), waited["endedAt"].as_u64());
    assert!(started.is_some_and(|s| ended.is_some_and(|e| s <= e)), "{waited}");

    // Bad input: named, and nothing written.
    let err = c.request("agent", json!({"message": " ", "idempotencyKey": "x"})).await.expect_err("blank");
    assert_eq!(err["message"], "invalid agent params: at /message: must not be empty");
    let err = c.request("agent", json!({"message": "hi"})).await.expect_err("no key");
    assert_eq!(err["message"], "invalid agent params: missing field `idempotencyKey`");
    let err = c
        .request("agent", json!({"message": "hi", "idempotencyKey": "y", "model": "nope/none"}))
        .await
        .expect_err("model");
    assert!(err["message"].as_str().expect("message").starts_with("invalid agent params: at /model:"), "{err}");
    assert_eq!(read_rows(&file).len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_openclaw_wrote_with_a_bare_model_and_its_provider_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    // OpenClaw's own files: a transcript with one turn, and its session entry (bare model + provider).
    let sessions = dir.path().join("state/agents/main/sessions");
    std::fs::create_dir_all(&sessions).expect("mkdir");
    let sid = "0f0e0d0c-0b0a-4908-8706-050403020100";
    let file = sessions.join(format!("{sid}.jsonl"));
    let lines = [
        json!({"type": "session", "version": 3, "id": sid, "timestamp": "2026-05-28T10:00:00.000Z", "cwd": "/tmp"}),
        json!({"type": "message", "id": "aaaa0001", "parentId": null, "timestamp": "2026-05-28T10:00:01.000Z",
            "message": {"role": "user", "content": [{"type": "text", "text": "first"}], "timestamp": 1}}),
        json!({"type": "message", "id": "aaaa0002", "parentId": "aaaa0001", "timestamp": "2026-05-28T10:00:02.000Z",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "first reply"}],
                "api": "openai-completions", "provider": "fake", "model": "fake-model",
                "usage": {"input": 3, "output": 2, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 5,
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                "stopReason": "stop", "timestamp": 2}}),
    ];
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, body).expect("transcript");
    let index = json!({"agent:main:main": {"sessionId": sid, "updatedAt": 1_780_000_000_000u64,
        "sessionFile": file.display().to_string(), "model": "fake-model", "modelProvider": "fake",
        "contextTokens": 128000, "chatType": "direct", "systemSent": true}});
    std::fs::write(sessions.join("sessions.json"), index.to_string()).expect("index");

    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    let h = c.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    assert_eq!(
        (&h["sessionInfo"]["modelProvider"], &h["sessionInfo"]["model"]),
        (&json!("fake"), &json!("fake-model"))
    );
    let fin = turn(&mut c, "second", "oc-1").await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), 5, "{rows:#?}");
    assert_eq!(rows[3]["parentId"], "aaaa0002", "chained after OpenClaw's leaf");
    assert_eq!(rows[4]["parentId"], rows[3]["id"]);
    assert_eq!(rows[4]["message"]["model"], "fake-model");
    let sent = fake.requests();
    assert_eq!(sent.last().expect("request")["model"], "fake-model");

    // Patching a `provider/model` replaces OpenClaw's pair (it cannot override the new choice).
    let p = c.request("sessions.patch", json!({"key": "main", "model": "fake/fake-model"})).await.expect("patch");
    assert_eq!(p["entry"].get("modelProvider"), None, "{p}");
    assert_eq!(p["resolved"], json!({"modelProvider": "fake", "model": "fake-model"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_discovery_and_empty_feature_methods_answer_in_openclaws_shapes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    let methods: Vec<String> = serde_json::from_value(c.hello["features"]["methods"].clone()).expect("methods");
    turn(&mut c, "count me", "u-1").await;

    // Every method these clients call without params answers ok, and hello-ok lists it.
    let no_params = [
        "status",
        "system-presence",
        "logs.tail",
        "commands.list",
        "sessions.usage",
        "usage.status",
        "chat.metadata",
        "models.authStatus",
        "config.get",
        "themes.list",
        "update.status",
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
        "last-heartbeat",
        "diagnostics.lanes",
        "exec.approval.list",
        "plugin.approval.list",
        "openclaw.approval.list",
        "sessions.observer.visibility",
        "sessions.companion.state",
        "talk.catalog",
        "device.pair.list",
        "node.list",
    ];
    let mut got = std::collections::HashMap::new();
    for m in no_params {
        assert!(methods.iter().any(|x| x == m), "hello-ok lists {m}");
        let r = c.request(m, json!({})).await.unwrap_or_else(|e| panic!("{m} failed: {e}"));
        got.insert(m, r);
    }
    assert_eq!(got["status"]["server"]["name"], "pincer");
    assert_eq!(got["status"]["sessions"]["count"], 1);
    assert_eq!(got["system-presence"][0]["mode"], "gateway");
    assert!(got["logs.tail"]["lines"].as_array().expect("lines").iter().any(|l| l
        .as_str()
        .unwrap_or("")
        .contains("listening")
        || !l.as_str().unwrap_or("").is_empty()));
    let names: Vec<&str> = got["commands.list"]["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["stop", "new", "compact", "status", "help"]);
    assert_eq!(got["question.list"], json!({"questions": []}));
    assert_eq!(got["progressCard.get"], json!({"card": null}));
    let config = got["config.get"].to_string();
    assert!(!config.contains(pincer_testkit::gateway::TOKEN), "config.get never shows the token: {config}");

    // Usage is the transcript's: the reply's recorded usage, per session and in total.
    let file = transcript_path(&gw.state_dir, "agent:main:main").expect("transcript");
    let recorded = read_rows(&file)[2]["message"]["usage"].clone();
    let u = &got["sessions.usage"];
    assert_eq!(u["totals"]["input"], recorded["input"], "{u:#}");
    assert_eq!(u["totals"]["output"], recorded["output"]);
    assert_eq!(u["sessions"][0]["key"], "agent:main:main");
    assert_eq!(u["sessions"][0]["usage"]["messageCounts"]["total"], 2);

    // Session rows say what the Control UI and the TUI show: status and token counts.
    let d = c.request("sessions.describe", json!({"key": "main"})).await.expect("describe");
    assert_eq!(d["session"]["status"], "done", "{d:#}");
    assert_eq!(d["session"]["inputTokens"], recorded["input"]);
    assert_eq!(d["session"]["messageCount"], 2);
    let list = c.request("sessions.list", json!({})).await.expect("list");
    assert_eq!(list["sessions"][0]["status"], "done");
    assert_eq!(list["sessions"][0]["inputTokens"], recorded["input"]);
    assert_eq!((&list["totalCount"], &list["hasMore"]), (&json!(1), &json!(false)));
    c.request("sessions.create", json!({"key": "agent:main:second"})).await.expect("create");
    let page = c.request("sessions.list", json!({"limit": 1})).await.expect("list");
    assert_eq!((&page["count"], &page["totalCount"], &page["hasMore"]), (&json!(1), &json!(2), &json!(true)));
    let second = c.request("sessions.describe", json!({"key": "agent:main:second"})).await.expect("describe");
    assert_eq!((&second["session"]["status"], &second["session"]["messageCount"]), (&json!("idle"), &json!(0)));
    let unused = c.request("sessions.describe", json!({"key": "agent:main:later"})).await.expect("describe");
    assert_eq!((&unused["session"]["status"], &unused["session"]["messageCount"]), (&json!("idle"), &json!(0)));
    assert!(transcript_path(&gw.state_dir, "agent:main:later").is_none(), "describing writes nothing");
    let err = c.request("sessions.describe", json!({})).await.expect_err("no key");
    assert_eq!(err["message"], "invalid sessions.describe params: missing field `key`");
    let err = c.request("logs.tail", json!({"limit": 0})).await.expect_err("limit");
    assert_eq!(err["message"], "invalid logs.tail params: at /limit: must be from 1 to 5000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_events_are_numbered_and_ordered_as_openclaw_sends_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    let fin = turn(&mut c, "number these", "seq-1").await;
    // Everything of the run that came before the final, in order.
    let before: Vec<Value> = c.events.iter().filter(|f| f["payload"]["runId"] == "seq-1").cloned().collect();
    let deltas: Vec<&Value> =
        before.iter().filter(|f| f["event"] == "chat" && f["payload"]["state"] == "delta").collect();
    let last_delta = deltas.last().expect("the fake streams deltas");
    assert_eq!(fin["payload"]["seq"], last_delta["payload"]["seq"], "the final repeats the last delta's seq");
    let agent: Vec<&Value> = before.iter().filter(|f| f["event"] == "agent").collect();
    let phases: Vec<&str> = agent
        .iter()
        .filter(|f| f["payload"]["stream"] == "lifecycle")
        .filter_map(|f| f["payload"]["data"]["phase"].as_str())
        .collect();
    assert_eq!(phases, ["start", "end"], "lifecycle end comes before the final");
    let seqs: Vec<u64> = agent.iter().filter_map(|f| f["payload"]["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=agent.len() as u64).collect::<Vec<_>>(), "agent events carry the run's seq");
    let session_id =
        read_rows(&transcript_path(&gw.state_dir, "agent:main:main").expect("transcript"))[0]["id"].clone();
    for f in &agent {
        assert_eq!((&f["payload"]["agentId"], &f["payload"]["sessionId"]), (&json!("main"), &session_id), "{f}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asked_for_read_only_cannot_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut params = pincer_testkit::gateway::connect_params(pincer_testkit::gateway::TOKEN);
    params["scopes"] = json!(["operator.read"]);
    let mut c = Client::connect_with(&gw.addr, params).await.expect("connect");
    assert_eq!(c.hello["auth"]["scopes"], json!(["operator.read"]));
    c.request("sessions.list", json!({})).await.expect("reads are allowed");
    for (method, p) in [
        ("chat.send", json!({"sessionKey": "main", "message": "hi", "idempotencyKey": "ro-1"})),
        ("agent", json!({"message": "hi", "idempotencyKey": "ro-2"})),
        ("sessions.create", json!({"key": "agent:main:ro"})),
    ] {
        let err = c.request(method, p).await.expect_err(method);
        assert!(err["message"].as_str().expect("message").starts_with("missing scope: operator.write"), "{err}");
    }
    assert!(transcript_path(&gw.state_dir, "agent:main:main").is_none(), "nothing written");
    assert!(fake.requests().is_empty(), "no run");
    // Asking for nothing still grants read and write (clients that send no scopes keep working).
    let mut params = pincer_testkit::gateway::connect_params(pincer_testkit::gateway::TOKEN);
    params.as_object_mut().expect("params").remove("scopes");
    let c = Client::connect_with(&gw.addr, params).await.expect("connect");
    assert_eq!(c.hello["auth"]["scopes"], json!(["operator.read", "operator.write"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_marks_follow_openclaws_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    async fn row(c: &mut Client) -> Value {
        let l = c.request("sessions.list", json!({})).await.expect("list");
        l["sessions"].as_array().expect("rows").iter().find(|r| r["key"] == "agent:main:main").cloned().expect("row")
    }
    turn(&mut c, "u-1", "u-1").await;
    assert_eq!(row(&mut c).await["unread"], false, "never read: not flagged by activity alone");
    c.request("sessions.patch", json!({"key": "main", "unread": true})).await.expect("mark");
    let marked = row(&mut c).await;
    assert_eq!((marked["unread"].as_bool(), marked["markedUnreadAt"].is_u64()), (Some(true), true), "{marked}");
    c.request("sessions.patch", json!({"key": "main", "unread": true})).await.expect("mark again");
    let again = row(&mut c).await;
    assert!(again["markedUnreadAt"].as_u64() > marked["markedUnreadAt"].as_u64(), "each mark is later: {again}");
    c.request("sessions.patch", json!({"key": "main", "unread": false})).await.expect("read");
    let read = row(&mut c).await;
    assert_eq!((read["unread"].as_bool(), read.get("markedUnreadAt")), (Some(false), None), "{read}");
    let read_at = read["lastReadAt"].as_u64().expect("lastReadAt");
    // A reply after the read makes it unread again (once the clock has passed the read's millisecond).
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    while now() <= read_at {
        tokio::task::yield_now().await;
    }
    turn(&mut c, "u-2", "u-2").await;
    assert_eq!(row(&mut c).await["unread"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_model_call_is_announced_as_openclaw_does_and_then_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    let said = "slow down [ratelimit]";
    let end = turn(&mut c, said, "r-1").await;
    assert_eq!(text(&end["payload"]["message"]), format!("Fake reply: you said \"{said}\""), "{end:#}");
    let statuses: Vec<Value> = (c.events.iter())
        .filter(|e| e["event"] == "chat" && e["payload"]["state"] == "status")
        .map(|e| json!({"phase": e["payload"]["phase"], "retry": e["payload"]["retry"]}))
        .collect();
    assert_eq!(
        statuses,
        [
            json!({"phase": "preparing_context", "retry": null}),
            json!({"phase": "starting_model", "retry": null}),
            json!({"phase": "starting_model", "retry": {"attempt": 1, "maxAttempts": 2, "reason": "rate_limit"}}),
        ]
    );
    assert_eq!(fake.requests().len(), 2, "refused once, then answered");
    let rows = read_rows(&transcript_path(&gw.state_dir, "agent:main:main").expect("transcript"));
    assert_eq!(rows.len(), 3, "one user row, one reply: the retry wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_history_in_the_middle_of_a_run_gives_it_as_openclaws_in_flight_run() {
    // OpenClaw's Control UI reloads the history at each run's start: the run in flight comes with
    // it (id, text so far, start), as OpenClaw's own gateway gives it, and goes once it ended.
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeOpenAi::start().await;
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    let ack = c
        .request("chat.send", json!({"sessionKey": "main", "message": "[slow] tell", "idempotencyKey": "fl-1"}))
        .await
        .expect("chat.send");
    assert_eq!(ack["status"], "started");
    c.event(|f| {
        f["event"] == "chat" && f["payload"]["state"] == "delta" && text(&f["payload"]["message"]).contains("word1")
    })
    .await;
    let h = c.request("chat.history", json!({"sessionKey": "main", "inputRunIds": ["fl-1"]})).await.expect("history");
    let run = &h["inFlightRun"];
    assert_eq!(run["runId"], "fl-1", "{h:#}");
    assert!(run["text"].as_str().is_some_and(|t| t.starts_with("word0 word1 ")), "the text so far: {run}");
    assert!(run["startedAt"].as_u64().is_some_and(|t| t > 0), "{run}");
    assert_eq!(h["sessionInfo"]["activeRunIds"], json!(["fl-1"]));
    c.request("chat.abort", json!({"sessionKey": "main", "runId": "fl-1"})).await.expect("abort");
    c.chat_end("fl-1").await;
    let h = c.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    assert!(h.get("inFlightRun").is_none(), "no run in flight after the end: {h:#}");
}
