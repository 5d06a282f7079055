//! The OpenAI-compatible endpoint against the real `pincer gateway` process and the fake provider
//! (the part of `openai_api.rs` that needs the Pi oracle on Node and the official SDKs, so it
//! builds only with the `external` feature): stateless resends of a growing history land in one
//! session, each turn once and chained, read identically by the real Pi library; an edited earlier
//! message (in a named session) becomes a branch whose Pi context is what the provider received;
//! streaming in OpenAI's chunk format with the fake's usage; errors in OpenAI's shape; retries
//! deduped across a restart; and the official SDKs (Python `openai` in the venv scripts/test makes,
//! npm `openai` in tests/openai-sdk) as clients.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::TOKEN;
use pincer_testkit::oracle_context;
use pincer_testkit::probe::{message_text as text, read_rows, session_index, sessions_dir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[path = "openai_api/common.rs"]
mod common;
use common::*;

fn reply(said: &str) -> String {
    format!("Fake reply: you said \"{said}\"")
}

async fn complete(addr: &str, messages: &Value) -> (Value, String) {
    complete_in(addr, messages, &[]).await
}

async fn complete_in(addr: &str, messages: &Value, headers: &[(&str, &str)]) -> (Value, String) {
    let (status, body, session) = post(addr, TOKEN, &json!({"model": "pincer", "messages": messages}), headers).await;
    assert_eq!(status, 200, "{body}");
    (serde_json::from_str(&body).expect("json"), session.expect("the session is named"))
}

fn transcript(state: &Path, key: &str) -> PathBuf {
    let index = session_index(state, "main");
    sessions_dir(state, "main").join(format!("{}.jsonl", index[key]["sessionId"].as_str().expect("session id")))
}

fn api_sessions(state: &Path) -> Vec<String> {
    let index = session_index(state, "main");
    index.as_object().expect("index").keys().filter(|k| k.starts_with("agent:main:openai:")).cloned().collect()
}

fn messages(rows: &[Value]) -> Vec<&Value> {
    rows.iter().filter(|e| e["type"] == "message").collect()
}

/// (role, text) of each message, for comparing contexts and requests.
fn said(list: &[Value]) -> Vec<(String, String)> {
    list.iter().map(|m| (m["role"].as_str().unwrap_or_default().to_owned(), text(m))).collect()
}

/// The message entries of a file are `expected` (role, text), each once, each the child of the last.
fn assert_one_chain(file: &Path, expected: &[(&str, String)]) {
    let rows = read_rows(file);
    let msgs = messages(&rows);
    let got: Vec<(String, String)> =
        msgs.iter().map(|e| (e["message"]["role"].as_str().expect("role").to_owned(), text(&e["message"]))).collect();
    let want: Vec<(String, String)> = expected.iter().map(|(r, t)| (r.to_string(), t.clone())).collect();
    assert_eq!(got, want, "{}", file.display());
    for pair in msgs.windows(2) {
        assert_eq!(pair[1]["parentId"], pair[0]["id"], "chained: {}", pair[1]);
    }
    assert!(rows.iter().all(|e| e["type"] != "leaf"), "no leaf moves on a straight resend: {rows:?}");
    // The real Pi library reads the same conversation from the file.
    let pi = oracle_context(file, None);
    let pi_said = said(pi["context"]["messages"].as_array().expect("Pi's context"));
    assert_eq!(pi_said, want, "Pi's context of {}", file.display());
    assert_eq!(pi["leafId"], msgs.last().expect("a message")["id"]);
}

fn usage_of(fake: &Value) -> Value {
    json!({"prompt_tokens": fake["prompt_tokens"], "completion_tokens": fake["completion_tokens"],
        "total_tokens": fake["total_tokens"]})
}

fn core_usage(u: &Value) -> Value {
    json!({"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"], "total_tokens": u["total_tokens"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_histories_make_one_session_and_an_edit_branches_from_the_first_reply() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, config(&fake, true)).await;

    // Open WebUI's way: the whole conversation, growing, every turn.
    let mut history = vec![json!({"role": "system", "content": "Answer like a pirate."})];
    let mut expected: Vec<(&str, String)> = Vec::new();
    let mut key = None;
    for n in 1..=3 {
        let said = format!("resend turn {n}");
        history.push(json!({"role": "user", "content": said}));
        let (r, session) = complete(&gw.addr, &json!(history)).await;
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["choices"][0]["message"], json!({"role": "assistant", "content": reply(&said), "refusal": null}));
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
        assert_eq!(core_usage(&r["usage"]), usage_of(fake.usages().last().expect("a usage")), "the fake's usage");
        assert_eq!(*key.get_or_insert(session.clone()), session, "every turn in one session");
        history.push(json!({"role": "assistant", "content": reply(&said)}));
        expected.push(("user", said.clone()));
        expected.push(("assistant", reply(&said)));
    }
    let key = key.expect("key");
    assert_eq!(api_sessions(&state), vec![key.clone()], "exactly one session");
    let file = transcript(&state, &key);
    assert_one_chain(&file, &expected);
    // The system message is the session's system prompt: recorded once, and sent to the model.
    let rows = read_rows(&file);
    let prompts: Vec<&Value> = rows.iter().filter(|e| e["customType"] == "pincer.system-prompt").collect();
    assert_eq!(prompts.len(), 1, "recorded once: {prompts:?}");
    assert_eq!(prompts[0]["data"]["systemPrompt"], "Answer like a pirate.");
    assert!(fake
        .requests()
        .iter()
        .all(|r| r["messages"][0] == json!({"role": "system", "content": "Answer like a pirate."})));

    // The same history with its second user message edited, in the session the client names: a
    // branch from the first reply. (Without a name the edit would be a new session: a history
    // joins a session it names nobody's only where it continues the active branch.)
    let named = [("x-pincer-session-key", key.as_str())];
    let edited = vec![
        history[0].clone(),
        history[1].clone(),
        history[2].clone(),
        json!({"role": "user", "content": "resend turn 2, edited"}),
    ];
    let (r, session) = complete_in(&gw.addr, &json!(edited), &named).await;
    assert_eq!(session, key, "the edit stays in the session");
    assert_eq!(r["choices"][0]["message"]["content"], reply("resend turn 2, edited"));
    let rows = read_rows(&file);
    let first_reply = rows.iter().find(|e| e["message"]["role"] == "assistant").expect("first reply");
    let new_user = rows.iter().rev().find(|e| e["message"]["role"] == "user").expect("edit");
    assert_eq!(text(&new_user["message"]), "resend turn 2, edited");
    let leaf_move = rows.iter().rev().find(|e| e["type"] == "leaf").expect("the leaf moved");
    assert_eq!(leaf_move["targetId"], first_reply["id"]);
    assert_eq!(new_user["parentId"], first_reply["id"], "the edit is a sibling of the second user message");
    // Pi's context at the edit's user row is exactly what the model was sent for it.
    let pi = oracle_context(&file, new_user["id"].as_str());
    let got_by_fake: Vec<Value> = pincer_testkit::wire::conversation(fake.requests().last().expect("request"));
    assert_eq!(
        said(pi["context"]["messages"].as_array().expect("context")),
        said(&got_by_fake),
        "Pi's context = the request"
    );
    assert_eq!(said(&got_by_fake).len(), 3, "first turn, its reply, the edit");
    // Resending the older branch continues it again (no new session, no duplicate rows).
    let before = fake.requests().len();
    let mut old = history.clone();
    old.push(json!({"role": "user", "content": "back on the first branch"}));
    let (_, session) = complete_in(&gw.addr, &json!(old), &named).await;
    assert_eq!(session, key);
    let sent = fake.requests()[before]["messages"].as_array().expect("messages").len();
    assert_eq!(sent, 1 + 6 + 1, "the model saw the whole first branch");
    assert_eq!(api_sessions(&state).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_errors_keys_and_retries_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let mut gw = start(&state, config(&fake, true)).await;
    let one = json!({"model": "fake/fake-model", "messages": [{"role": "user", "content": "stream me"}],
        "stream": true, "stream_options": {"include_usage": true}});

    // Streaming: role chunk, content, finish, the usage chunk, [DONE].
    let (status, body, _) = post(&gw.addr, TOKEN, &one, &[]).await;
    assert_eq!(status, 200, "{body}");
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("chunk")).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, reply("stream me"));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!((finish["choices"][0]["finish_reason"].as_str(), &finish["usage"]), (Some("stop"), &Value::Null));
    let last = chunks.last().expect("usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(core_usage(&last["usage"]), usage_of(&fake.usages()[0]), "usage in the final chunk = the fake's");

    // Errors in OpenAI's shape; nothing written for them.
    let sessions_before = api_sessions(&state).len();
    let (status, body, _) = post(&gw.addr, "wrong-token", &one, &[]).await;
    assert_eq!(status, 401);
    let e: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (e["error"]["type"].as_str(), e["error"]["code"].as_str()),
        (Some("invalid_request_error"), Some("invalid_api_key"))
    );
    assert!(e["error"]["message"].is_string());
    let bad = [
        (json!({"model": "pincer", "messages": []}), 400, "messages must not be empty"),
        (json!({"model": "nope/none", "messages": [{"role": "user", "content": "x"}]}), 404, "does not exist"),
        (
            json!({"model": "pincer", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            400,
            "tools",
        ),
        (
            json!({"model": "pincer", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}),
            400,
            "last message must be a user message",
        ),
    ];
    for (req, want_status, want_text) in bad {
        let (status, body, _) = post(&gw.addr, TOKEN, &req, &[]).await;
        assert_eq!(status, want_status, "{req} → {body}");
        let e: Value = serde_json::from_str(&body).expect("json");
        assert!(e["error"]["message"].as_str().expect("message").contains(want_text), "{body}");
        assert!(e["error"]["type"].is_string() && e["error"].get("code").is_some(), "{body}");
    }
    assert_eq!(api_sessions(&state).len(), sessions_before, "nothing written for refused requests");
    // A provider error passes through with its status.
    let (status, body, _) =
        post(&gw.addr, TOKEN, &json!({"messages": [{"role": "user", "content": "please [fail]"}]}), &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("The fake provider was told to fail"), "{body}");
    assert_eq!(api_sessions(&state).len(), sessions_before + 1, "the failed turn's session");

    // An explicit session key: a script sending only its new message continues that session.
    let hdr = [("x-openclaw-session-key", "agent:main:scripted")];
    for said in ["first scripted", "second scripted"] {
        let (status, body, session) =
            post(&gw.addr, TOKEN, &json!({"messages": [{"role": "user", "content": said}]}), &hdr).await;
        assert_eq!((status, session.as_deref()), (200, Some("agent:main:scripted")), "{body}");
    }
    let scripted = transcript(&state, "agent:main:scripted");
    assert_one_chain(
        &scripted,
        &[
            ("user", "first scripted".into()),
            ("assistant", reply("first scripted")),
            ("user", "second scripted".into()),
            ("assistant", reply("second scripted")),
        ],
    );

    // A retried request (same x-request-id) is answered from the transcript, also after a restart.
    let ask = json!({"messages": [{"role": "user", "content": "only once"}]});
    let id = [("x-request-id", "req-42")];
    let (status, first, _) = post(&gw.addr, TOKEN, &ask, &id).await;
    assert_eq!(status, 200, "{first}");
    let calls = fake.requests().len();
    gw = tokio::task::spawn_blocking(move || {
        gw.restart(); // SIGKILL, then a new process on the same state
        gw
    })
    .await
    .expect("restart");
    let (status, again, _) = post(&gw.addr, TOKEN, &ask, &id).await;
    assert_eq!(status, 200, "{again}");
    let (a, b): (Value, Value) =
        (serde_json::from_str(&first).expect("json"), serde_json::from_str(&again).expect("json"));
    assert_eq!((&a["id"], &a["choices"]), (&b["id"], &b["choices"]), "the same answer");
    assert_eq!(fake.requests().len(), calls, "the model was not called again");
    let once: Vec<String> = api_sessions(&state)
        .iter()
        .flat_map(|k| read_rows(&transcript(&state, k)))
        .filter(|e| e["message"]["role"] == "user" && text(&e["message"]) == "only once")
        .map(|e| e["id"].to_string())
        .collect();
    assert_eq!(once.len(), 1, "one user row for the retried request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_and_node_sdks_are_clients() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, config(&fake, true)).await;
    for (prefix, program, script) in pincer_testkit::sdk_scripts("sdk_test") {
        let before = fake.usages().len();
        let report = pincer_testkit::sdk_report(&gw.addr, prefix, &program, &script).await;
        let replies = report["replies"].as_array().expect("replies");
        let usages = fake.usages()[before..].to_vec();
        assert_eq!(replies.len(), 4);
        assert_eq!(usages.len(), 4 + 2, "one model call per turn, and the client tool round trip's two");
        for (r, u) in replies.iter().zip(&usages) {
            assert_eq!(core_usage(&r["usage"]), usage_of(u), "{prefix}: the SDK saw the fake's usage");
        }
        // One session holding each turn once, chained, as Pi reads it.
        let sessions: Vec<String> = api_sessions(&state)
            .into_iter()
            .filter(|k| {
                read_rows(&transcript(&state, k)).iter().any(|e| text(&e["message"]) == format!("{prefix} turn 1"))
            })
            .collect();
        assert_eq!(sessions.len(), 1, "{prefix}: one session");
        let mut expected = Vec::new();
        for said in ["turn 1", "turn 2", "turn 3", "streamed"].map(|t| format!("{prefix} {t}")) {
            expected.push(("assistant", reply(&said)));
            expected.insert(expected.len() - 1, ("user", said));
        }
        assert_one_chain(&transcript(&state, &sessions[0]), &expected);
        // The client tool round trip: one session, the call's assistant row, the client's result under
        // it, the reply; what the model was sent is Pi's context of the file each time.
        let asked = format!("{prefix} tools [call:lookup]");
        let tooled: Vec<String> = api_sessions(&state)
            .into_iter()
            .filter(|k| read_rows(&transcript(&state, k)).iter().any(|e| text(&e["message"]) == asked))
            .collect();
        assert_eq!(tooled.len(), 1, "{prefix}: one session for the tool conversation");
        let file = transcript(&state, &tooled[0]);
        let rows = read_rows(&file);
        let msgs = messages(&rows);
        let got: Vec<(&str, String)> =
            msgs.iter().map(|e| (e["message"]["role"].as_str().expect("role"), text(&e["message"]))).collect();
        let result = format!("{prefix} looked up");
        assert_eq!(
            got,
            [
                ("user", asked.clone()),
                ("assistant", String::new()),
                ("toolResult", result),
                ("assistant", reply(&asked))
            ]
        );
        assert_eq!(msgs[2]["message"]["toolCallId"], report["tool_call"]);
        for pair in msgs.windows(2) {
            assert_eq!(pair[1]["parentId"], pair[0]["id"], "chained: {}", pair[1]);
        }
        let bodies = fake.requests();
        for (body, nth) in [(&bodies[bodies.len() - 2], 0), (&bodies[bodies.len() - 1], 1)] {
            let assistants: Vec<usize> =
                rows.iter().enumerate().filter(|(_, r)| r["message"]["role"] == "assistant").map(|(i, _)| i).collect();
            let pi = oracle_context(&file, rows[assistants[nth] - 1]["id"].as_str());
            let want = pincer_testkit::wire::openai_messages(pi["context"]["messages"].as_array().expect("context"));
            let sent: Vec<Value> = pincer_testkit::wire::conversation(body);
            assert_eq!(sent, want, "{prefix}: request {nth} of the tool conversation = Pi's context");
        }
    }
    assert_eq!(api_sessions(&state).len(), 4, "one session per SDK conversation");
}
