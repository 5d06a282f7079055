//! The OpenAI-compatible endpoint as real clients use it, checked against the real Pi library (the
//! part of `openai_clients.rs` that needs the Pi oracle on Node, so it builds only with the
//! `external` feature): client-side tools (LangChain's `bind_tools`, the Agents SDK) go to the
//! model and their calls come back to the client; agent tools run in the gateway beside them; a
//! resent identical body is a regenerate and only an explicit key dedupes; each Open WebUI chat is
//! one session (its native function calling offers its built-in tools with every turn) and a new
//! conversation never moves another's leaf.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::oracle_context;
use pincer_testkit::probe::{message_text as text, read_rows};
use pincer_testkit::wire::check_request_against_pi;
use serde_json::{json, Value};

#[path = "openai_clients/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tools_go_to_the_model_and_their_calls_come_back_to_the_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, &fake).await;

    // Open WebUI's turn with its built-in tools: the model asks for one of them.
    let ask = "what is new in Rust? [call:search_web]";
    let user = json!({"role": "user", "content": ask});
    let (status, body, session) = post(&gw.addr, &open_webui_chat(std::slice::from_ref(&user)), &[]).await;
    assert_eq!(status, 200, "{body}");
    let key = session.expect("the session is named");
    let (content, calls, finish) = assemble(&body);
    assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"), "{body}");
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(calls[0]["function"]["name"], "search_web");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().expect("args")).expect("json");
    assert_eq!(args, json!({"query": "search_web"}));
    // The model was offered the client's tools beside the agent's own.
    let offered: Vec<String> = fake.requests()[0]["tools"]
        .as_array()
        .expect("tools offered")
        .iter()
        .map(|t| t["function"]["name"].as_str().expect("name").to_owned())
        .collect();
    for name in ["search_web", "fetch_url", "get_current_timestamp", "ls", "read"] {
        assert!(offered.iter().any(|o| o == name), "{name} offered: {offered:?}");
    }
    // The assistant row is on disk before the answer, its call not run.
    let file = transcript(&state, &key);
    let rows = read_rows(&file);
    let msgs = messages(&rows);
    assert_eq!(msgs.len(), 2, "{rows:?}");
    assert_eq!(msgs[1]["message"]["stopReason"], "toolUse");
    assert_chained(&rows);

    // The client runs the tool and sends its result: one toolResult row, and the turn goes on.
    let assistant = json!({"role": "assistant", "content": "", "tool_calls": calls});
    let result = json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "Rust 1.95 is out."});
    let (status, body, session) =
        post(&gw.addr, &open_webui_chat(&[user.clone(), assistant.clone(), result.clone()]), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(session.as_deref(), Some(key.as_str()), "the same session");
    let (content, calls2, finish) = assemble(&body);
    assert_eq!((content, calls2.len(), finish.as_str()), (reply(ask), 0, "stop"));
    let rows = read_rows(&file);
    let msgs = messages(&rows);
    let roles: Vec<&str> = msgs.iter().map(|m| m["message"]["role"].as_str().expect("role")).collect();
    assert_eq!(roles, ["user", "assistant", "toolResult", "assistant"], "{rows:?}");
    assert_eq!(text(&msgs[2]["message"]), "Rust 1.95 is out.");
    assert_eq!(msgs[2]["message"]["toolCallId"], calls[0]["id"]);
    assert_eq!(msgs[2]["message"]["toolName"], "search_web");
    assert_chained(&rows);
    assert!(rows.iter().all(|e| e["type"] != "leaf"), "no leaf moves: {rows:?}");
    // What the provider got is Pi's context of the file, each time.
    check_request_against_pi(&file, fake.provider(), 0);
    check_request_against_pi(&file, fake.provider(), 1);
    let pi = oracle_context(&file, None);
    assert_eq!(pi["context"]["messages"].as_array().expect("context").len(), 4);

    // The same results again (a retry without a key, or a regenerate of the reply after them): the
    // run goes on from the result already written, as a sibling reply; nothing is written twice.
    let (status, body, session) =
        post(&gw.addr, &open_webui_chat(&[user.clone(), assistant.clone(), result.clone()]), &[]).await;
    assert_eq!((status, session.as_deref()), (200, Some(key.as_str())), "{body}");
    assert_eq!(assemble(&body).0, reply(ask));
    let rows = read_rows(&file);
    let msgs = messages(&rows);
    let roles: Vec<&str> = msgs.iter().map(|m| m["message"]["role"].as_str().expect("role")).collect();
    assert_eq!(roles, ["user", "assistant", "toolResult", "assistant", "assistant"], "{rows:?}");
    assert_eq!(msgs[4]["parentId"], msgs[2]["id"], "a sibling of the first reply");
    assert_eq!(oracle_context(&file, None)["leafId"], msgs[4]["id"]);

    // The next user turn (non-streamed) carries the whole history: it continues the same branch.
    let done = json!({"role": "assistant", "content": reply(ask)});
    let next = json!({"role": "user", "content": "thanks"});
    let mut body = open_webui_chat(&[user, assistant, result, done, next]);
    body["stream"] = json!(false);
    let (status, answer, session) = post(&gw.addr, &body, &[]).await;
    assert_eq!((status, session.as_deref()), (200, Some(key.as_str())), "{answer}");
    let msgs_now = read_rows(&file);
    assert_eq!(messages(&msgs_now).len(), 7, "two rows more, nothing written twice: {msgs_now:?}");
    let last = messages(&msgs_now);
    assert_eq!(last[5]["parentId"], last[4]["id"], "after the reply the client saw last");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_tools_run_in_the_gateway_beside_client_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, &fake).await;
    // One message calls the agent's `ls` and the client's `fetch_url`: `ls` runs here, `fetch_url`
    // is handed back (non-streamed this time, as LangChain's invoke asks).
    let ask = "look around [call:ls,fetch_url]";
    let user = json!({"role": "user", "content": ask});
    let mut body = open_webui_chat(std::slice::from_ref(&user));
    body["stream"] = json!(false);
    let (status, answer, session) = post(&gw.addr, &body, &[]).await;
    assert_eq!(status, 200, "{answer}");
    let r: Value = serde_json::from_str(&answer).expect("json");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert_eq!(choice["message"]["content"], Value::Null);
    let calls = choice["message"]["tool_calls"].as_array().expect("tool_calls").clone();
    assert_eq!(calls.len(), 1, "only the client's call: {answer}");
    assert_eq!(
        (calls[0]["function"]["name"].as_str(), calls[0]["type"].as_str()),
        (Some("fetch_url"), Some("function"))
    );
    let file = transcript(&state, &session.clone().expect("session"));
    let rows = read_rows(&file);
    let roles: Vec<&str> = messages(&rows).iter().map(|m| m["message"]["role"].as_str().expect("role")).collect();
    assert_eq!(roles, ["user", "assistant", "toolResult"], "the agent's ls ran: {rows:?}");
    assert_eq!(messages(&rows)[2]["message"]["toolName"], "ls");

    let assistant = json!({"role": "assistant", "content": null, "tool_calls": calls});
    let result = json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "<html>page</html>"});
    let mut body = open_webui_chat(&[user, assistant, result]);
    body["stream"] = json!(false);
    let (status, answer, session2) = post(&gw.addr, &body, &[]).await;
    assert_eq!((status, &session2), (200, &session), "{answer}");
    let r: Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(r["choices"][0]["message"]["content"], reply(ask));
    let rows = read_rows(&file);
    let msgs = messages(&rows);
    let roles: Vec<&str> = msgs.iter().map(|m| m["message"]["role"].as_str().expect("role")).collect();
    assert_eq!(roles, ["user", "assistant", "toolResult", "toolResult", "assistant"], "{rows:?}");
    assert_chained(&rows);
    check_request_against_pi(&file, fake.provider(), 1);
}

/// The message rows of a file whose text is `said`.
fn rows_saying<'a>(rows: &'a [Value], role: &str, said: &str) -> Vec<&'a Value> {
    messages(rows).into_iter().filter(|e| e["message"]["role"] == role && text(&e["message"]) == said).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_identical_body_is_a_regenerate_and_only_an_explicit_key_dedupes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, &fake).await;
    let (first, key) = owui_turn(&gw.addr, &[user("hello")], &[]).await;
    let second = [user("hello"), assistant(&first), user("tell me more")];
    let (_, key2) = owui_turn(&gw.addr, &second, &[]).await;
    assert_eq!(key2, key);

    // Open WebUI's regenerate: the identical body again, at once. The model is asked again and the
    // reply is a sibling under the same user row.
    let calls = fake.requests().len();
    let (again, key3) = owui_turn(&gw.addr, &second, &[]).await;
    assert_eq!((key3.as_str(), again.as_str()), (key.as_str(), reply("tell me more").as_str()));
    assert_eq!(fake.requests().len(), calls + 1, "the model was asked again");
    let file = transcript(&state, &key);
    let rows = read_rows(&file);
    let asked = rows_saying(&rows, "user", "tell me more");
    assert_eq!(asked.len(), 1, "no second user row: {rows:?}");
    let replies: Vec<&Value> = messages(&rows).into_iter().filter(|e| e["parentId"] == asked[0]["id"]).collect();
    assert_eq!(replies.len(), 2, "two sibling replies under it: {rows:?}");
    // Pi reads the new reply as the active branch, and the model was sent Pi's context for it.
    let pi = oracle_context(&file, None);
    assert_eq!(pi["leafId"], replies[1]["id"]);
    assert_eq!(pi["context"]["messages"].as_array().expect("context").len(), 4);
    let sent: Vec<Value> = fake.requests()[calls]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| json!([m["role"], m["content"]]))
        .collect();
    assert_eq!(sent, [json!(["user", "hello"]), json!(["assistant", first]), json!(["user", "tell me more"])]);

    // The next turn continues from the regenerated reply.
    let third = [user("hello"), assistant(&first), user("tell me more"), assistant(&again), user("and then?")];
    let (_, key4) = owui_turn(&gw.addr, &third, &[]).await;
    assert_eq!(key4, key);
    let rows = read_rows(&file);
    let then = rows_saying(&rows, "user", "and then?");
    assert_eq!(then[0]["parentId"], replies[1]["id"]);

    // A retry carrying an explicit key (Idempotency-Key, as the official SDKs' retries may; or
    // x-request-id) is answered from the transcript: once.
    let ask = [user("count the retries")];
    for (header, value) in [("Idempotency-Key", "retry-7"), ("x-request-id", "retry-8")] {
        let id = [(header, value)];
        let calls = fake.requests().len();
        let (a, ka) = owui_turn(&gw.addr, &ask, &id).await;
        let (b, kb) = owui_turn(&gw.addr, &ask, &id).await;
        assert_eq!((a, ka.as_str()), (b, kb.as_str()), "{header}: the same answer, the same session");
        assert_eq!(fake.requests().len(), calls + 1, "{header}: the model was asked once");
        let rows = read_rows(&transcript(&state, &ka));
        assert_eq!(rows_saying(&rows, "user", "count the retries").len(), 1, "{header}: {rows:?}");
    }
}

fn leaf_moves(rows: &[Value]) -> usize {
    rows.iter().filter(|e| e["type"] == "leaf").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_open_webui_chat_is_one_session_and_a_new_conversation_never_moves_another_leaf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, &fake).await;
    let chat_a = "3f0d2b9e-8c4a-4d7b-9e1f-5a6c7d8e9f00";
    let a = forwarded(chat_a);
    let (r1, key) = owui_turn(&gw.addr, &[user("plan a trip")], &a).await;
    assert_eq!(key, format!("agent:main:openwebui:{chat_a}"));
    // A regenerate of the very first message: a sibling, in the chat's session.
    let (_, k) = owui_turn(&gw.addr, &[user("plan a trip")], &a).await;
    assert_eq!(k, key);
    let file = transcript(&state, &key);
    let rows = read_rows(&file);
    assert_eq!(rows_saying(&rows, "user", "plan a trip").len(), 1, "{rows:?}");
    assert_eq!(rows_saying(&rows, "assistant", &r1).len(), 2, "two sibling replies: {rows:?}");
    let (_, k) = owui_turn(&gw.addr, &[user("plan a trip"), assistant(&r1), user("to Lisbon")], &a).await;
    assert_eq!(k, key);
    // An edit of the second message: a branch in the same session.
    let (_, k) = owui_turn(&gw.addr, &[user("plan a trip"), assistant(&r1), user("to Porto")], &a).await;
    assert_eq!(k, key);
    let rows = read_rows(&file);
    let (lisbon, porto) = (rows_saying(&rows, "user", "to Lisbon"), rows_saying(&rows, "user", "to Porto"));
    assert_eq!((lisbon.len(), porto.len()), (1, 1), "{rows:?}");
    assert_eq!(lisbon[0]["parentId"], porto[0]["parentId"], "siblings");
    assert_eq!(oracle_context(&file, None)["context"]["messages"].as_array().expect("ctx").len(), 4);

    // Another chat opening alike (its own chat id): its own session, chat A untouched.
    let before = read_rows(&file);
    let chat_b = "temporary:9a8b7c6d-0000-4e1f-8a2b-3c4d5e6f7a8b";
    let (_, kb) = owui_turn(&gw.addr, &[user("plan a trip")], &forwarded(chat_b)).await;
    let (_, kb2) =
        owui_turn(&gw.addr, &[user("plan a trip"), assistant(&r1), user("to Lisbon")], &forwarded(chat_b)).await;
    assert_eq!((kb.as_str(), kb2.as_str()), (format!("agent:main:openwebui:{chat_b}").as_str(), kb.as_str()));
    assert_eq!(read_rows(&file), before, "chat A's file is as it was");

    // Without any id: a conversation whose first exchange equals chat A's, with another second
    // message, is a new session; chat A's leaf does not move.
    let (_, kn) = owui_turn(&gw.addr, &[user("plan a trip"), assistant(&r1), user("to Faro")], &[]).await;
    assert!(kn != key && kn != kb, "a new session: {kn}");
    assert_eq!(read_rows(&file), before, "chat A's file is as it was");
    let other = read_rows(&transcript(&state, &kn));
    assert_eq!(leaf_moves(&other), 0);
    let said: Vec<String> = messages(&other).iter().map(|e| text(&e["message"])).collect();
    assert_eq!(said, ["plan a trip".to_string(), r1.clone(), "to Faro".into(), reply("to Faro")]);
    assert_chained(&other);
    // It continues itself when resent (its active branch).
    let (_, kn2) = owui_turn(
        &gw.addr,
        &[user("plan a trip"), assistant(&r1), user("to Faro"), assistant(&reply("to Faro")), user("by train")],
        &[],
    )
    .await;
    assert_eq!(kn2, kn);
}
