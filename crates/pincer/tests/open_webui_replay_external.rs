//! Open WebUI 0.12.4's recorded requests replayed with the chat id forwarded, checked against the
//! real Pi library (the part of `open_webui_replay.rs` that needs the Pi oracle on Node, so it
//! builds only with the `external` feature): each Open WebUI chat is one session, its regenerate a
//! sibling reply the model was asked for, its edit a branch, its built-in tools offered to the
//! model and a call of one handed back and continued, and its task requests never kept (not in the
//! index, `sessions.list` or search).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::Client;
use pincer_testkit::oracle_context;
use pincer_testkit::probe::{message_text as text, session_index, sessions_dir};
use serde_json::{json, Value};

#[path = "open_webui_replay/common.rs"]
mod common;
use common::*;

const CHAT_1: &str = "agent:main:openwebui:0d7f2618-cf86-4131-95ee-050c271c74ff";

const CHAT_2: &str = "agent:main:openwebui:ecd165bb-cf87-40d8-adfd-f6e5f25f2dae";

/// A streamed answer's text and finish reason (tool call deltas counted by name).
fn streamed(sse: &str) -> (String, Vec<String>, String) {
    let data: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{sse}");
    let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), String::new());
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).expect("chunk");
        let choice = &c["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            calls.extend(call["function"]["name"].as_str().map(str::to_owned));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (content, calls, finish)
}

fn saying<'a>(rows: &'a [Value], role: &str, said: &str) -> Vec<&'a Value> {
    messages(rows).into_iter().filter(|e| e["message"]["role"] == role && text(&e["message"]) == said).collect()
}

fn children<'a>(rows: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    messages(rows).into_iter().filter(|e| e["parentId"] == parent["id"]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_webui_recorded_requests_make_one_session_per_chat_with_siblings_branches_and_no_task_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, &fake).await;

    let requests = recorded();
    let client_tools: Vec<String> = requests
        .iter()
        .find_map(|r| r["body"]["tools"].as_array())
        .expect("chat requests carry tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(client_tools.len(), 36, "Open WebUI 0.12.4's built-in tools");
    let mut posts = 0;
    for r in &requests {
        let (status, body, session) = replay(&gw.addr, r, true).await;
        let what = format!("#{} {} ({})", r["seq"], r["step"], r["path"]);
        assert_eq!(status, 200, "{what}: {body}");
        // The same session as in the recording: the chat's for chat turns, none for tasks.
        assert_eq!(session.as_deref(), r["recorded"]["x-pincer-session-key"].as_str(), "{what}");
        if r["method"] != "POST" {
            continue;
        }
        posts += 1;
        let chat_id = r["headers"].as_array().expect("headers").iter().find(|h| h[0] == "X-OpenWebUI-Chat-Id");
        let chat_id = chat_id.and_then(|h| h[1].as_str()).expect("Open WebUI forwards the chat id");
        if r["body"]["tools"].is_array() {
            assert_eq!(session, Some(format!("agent:main:openwebui:{chat_id}")), "{what}");
            let (content, calls, finish) = streamed(&body);
            if last_user(&r["body"]).contains("[call:search_chats]") && r["body"]["messages"][4].is_null() {
                assert_eq!((calls, finish.as_str()), (vec!["search_chats".to_string()], "tool_calls"), "{what}");
            } else {
                assert_eq!(finish, "stop", "{what}: {body}");
                assert!(content.starts_with("Fake reply: you said"), "{what}: {content}");
            }
        } else {
            // A task: answered whole, and not named a session.
            let answer: Value = serde_json::from_str(&body).expect("json");
            assert!(last_user(&r["body"]).starts_with("### Task:"), "{what}");
            assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{what}: {body}");
            assert_eq!(
                answer["choices"][0]["message"]["content"],
                format!("Fake reply: you said \"{}\"", last_user(&r["body"]))
            );
        }
    }
    assert_eq!(posts, 17);

    // Every request reached the model once: chat turns with the built-in tools beside the agent's,
    // tasks with none. The regenerate asked the model again.
    let sent = fake.requests();
    assert_eq!(sent.len(), posts, "each answered by the model");
    let offered = |b: &Value| -> Vec<String> {
        b["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (tasks, turns): (Vec<&Value>, Vec<&Value>) = sent.iter().partition(|b| last_user(b).starts_with("### Task:"));
    assert_eq!((tasks.len(), turns.len()), (11, 6));
    for b in &turns {
        let names = offered(b);
        assert!(client_tools.iter().all(|t| names.contains(t)), "the built-in tools reach the model: {names:?}");
        assert!(names.len() > client_tools.len(), "beside the agent's own");
    }
    assert!(tasks.iter().all(|b| offered(b).is_empty()), "a task offers no tools");
    assert_eq!(
        turns.iter().filter(|b| last_user(b) == "Plan a trip to Lisbon").count(),
        2,
        "the regenerate reached the model"
    );

    // One session per chat, and nothing else: in the index, on disk, in sessions.list.
    let mut keys: Vec<String> = session_index(&state, "main").as_object().expect("index").keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, [CHAT_1, CHAT_2]);
    let files = std::fs::read_dir(sessions_dir(&state, "main")).expect("dir").filter_map(Result::ok);
    assert_eq!(files.filter(|e| e.path().extension().is_some_and(|x| x == "jsonl")).count(), 2, "no task transcripts");
    let mut ws = Client::connect(&gw.addr).await;
    let list = ws.request("sessions.list", json!({})).await.expect("sessions.list");
    let mut listed: Vec<&str> =
        list["sessions"].as_array().expect("sessions").iter().filter_map(|s| s["key"].as_str()).collect();
    listed.sort_unstable();
    assert_eq!(listed, [CHAT_1, CHAT_2], "{list}");

    // Chat 1's tree: the regenerate a sibling reply under the one user row, the tool call and its
    // result chained, the edit a branch beside the message it replaced.
    let rows = transcript(&state, CHAT_1);
    let first = saying(&rows, "user", "Plan a trip to Lisbon");
    assert_eq!(first.len(), 1, "no second user row: {rows:?}");
    let replies = children(&rows, first[0]);
    assert_eq!(replies.len(), 2, "two sibling replies: {rows:?}");
    let asked = saying(&rows, "user", "Find my old chats about Portugal [call:search_chats]");
    let edited = saying(&rows, "user", "Plan the trip for two weeks");
    assert_eq!((asked.len(), edited.len()), (1, 1), "{rows:?}");
    assert_eq!(asked[0]["parentId"], edited[0]["parentId"], "the edit branches beside the message");
    assert_eq!(asked[0]["parentId"], replies[1]["id"], "under the regenerated reply, Open WebUI's active one");
    let call = children(&rows, asked[0]);
    assert_eq!(call.len(), 1);
    let content = call[0]["message"]["content"].as_array().expect("content");
    assert!(content.iter().any(|c| c["type"] == "toolCall" && c["name"] == "search_chats"), "{}", call[0]);
    let result = children(&rows, call[0]);
    assert_eq!((result.len(), result[0]["message"]["role"].as_str()), (1, Some("toolResult")));
    let answer = children(&rows, result[0]);
    assert_eq!(
        text(&answer[0]["message"]),
        "Fake reply: you said \"Find my old chats about Portugal [call:search_chats]\""
    );
    // Pi reads the edit's branch as the active one.
    let file = sessions_dir(&state, "main")
        .join(format!("{}.jsonl", session_index(&state, "main")[CHAT_1]["sessionId"].as_str().expect("id")));
    let pi = oracle_context(&file, None);
    let said: Vec<String> = pi["context"]["messages"].as_array().expect("context").iter().map(text).collect();
    assert_eq!(
        said,
        [
            "Plan a trip to Lisbon",
            "Fake reply: you said \"Plan a trip to Lisbon\"",
            "Plan the trip for two weeks",
            "Fake reply: you said \"Plan the trip for two weeks\""
        ]
    );
    let rows2 = transcript(&state, CHAT_2);
    let said2: Vec<String> = messages(&rows2).iter().map(|e| text(&e["message"])).collect();
    assert_eq!(said2, ["How do tides work?", "Fake reply: you said \"How do tides work?\""]);

    // Search finds the chats, never the tasks' prompts or answers.
    let found = |r: &Value| r["results"].as_array().map_or(0, Vec::len);
    loop {
        let r = ws.request("sessions.search", json!({"query": "Lisbon"})).await.expect("search");
        if r.get("indexing").is_none() && found(&r) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for word in ["categorizing", "concise", "Predict"] {
        let r = ws.request("sessions.search", json!({"query": word})).await.expect("search");
        assert_eq!(found(&r), 0, "{word}: {r}");
    }
}
