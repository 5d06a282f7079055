//! A turn through the real gateway checked against the real Pi library (the part of `gateway.rs`
//! that needs the Pi oracle on Node, so it builds only with the `external` feature): it is written
//! once, chained, and announced as written.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use pincer_testkit::gateway::Client;
use pincer_testkit::probe::message_text as text;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

#[path = "gateway/common.rs"]
mod common;
use common::*;

/// The message part of an event or history row, without the `__openclaw` block.
fn bare(msg: &Value) -> Value {
    let mut m = msg.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("__openclaw");
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_written_once_chained_and_announced_as_written() {
    let s = setup();
    let mut a = Client::connect(&s.gw.addr).await;
    let mut b = Client::connect(&s.gw.addr).await; // a second device
    for c in [&mut a, &mut b] {
        c.request("sessions.messages.subscribe", json!({"key": "main"})).await.expect("subscribe");
    }
    let ack = send(&mut a, "main", "hello there", "run-1").await;
    assert_eq!(ack, json!({"runId": "run-1", "status": "started"}));
    let fin = a.chat_end("run-1").await;
    assert_eq!(fin["payload"]["state"], "final");
    assert_eq!(text(&fin["payload"]["message"]), "Fake reply: you said \"hello there\"");

    let file = transcript(&s);
    let l = lines(&file);
    assert_eq!(l.len(), 3, "header, user, assistant: {l:#?}");
    assert_eq!(l[0]["type"], "session");
    assert_eq!(l[1]["parentId"], Value::Null);
    assert_eq!(l[1]["message"]["role"], "user");
    assert_eq!(l[1]["message"]["content"], "hello there");
    assert_eq!(l[1]["message"]["idempotencyKey"], "run-1:user");
    assert_eq!(l[2]["parentId"], l[1]["id"]);
    assert_eq!(l[2]["message"]["role"], "assistant");
    assert_eq!(l[2]["message"]["provider"], "fake");
    assert_eq!(bare(&fin["payload"]["message"]), l[2]["message"]);

    // Both devices saw the user turn and the reply live, with the very value on disk.
    for c in [&mut a, &mut b] {
        let user = c.event(|f| f["event"] == "session.message" && f["payload"]["message"]["role"] == "user").await;
        assert_eq!(user["payload"]["messageId"], l[1]["id"]);
        assert_eq!(bare(&user["payload"]["message"]), l[1]["message"]);
        assert_eq!(user.get("seq"), None, "targeted events carry no seq");
        let reply =
            c.event(|f| f["event"] == "session.message" && f["payload"]["message"]["role"] == "assistant").await;
        assert_eq!(bare(&reply["payload"]["message"]), l[2]["message"]);
    }
    let fin_b = b.chat_end("run-1").await;
    assert_eq!(fin_b["payload"]["message"], fin["payload"]["message"]);

    // A second send chains to the first reply.
    send(&mut a, "main", "and again", "run-2").await;
    a.chat_end("run-2").await;
    let l = lines(&file);
    assert_eq!(l.len(), 5);
    assert_eq!(l[3]["parentId"], l[2]["id"]);
    assert_eq!(l[4]["parentId"], l[3]["id"]);

    // After reconnecting, history returns both turns.
    drop(a);
    let mut c = Client::connect(&s.gw.addr).await;
    let h = c.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    let got: Vec<String> = h["messages"].as_array().expect("messages").iter().map(text).collect();
    assert_eq!(
        got,
        vec!["hello there", "Fake reply: you said \"hello there\"", "and again", "Fake reply: you said \"and again\""]
    );
    assert_eq!(h["messages"][0]["idempotencyKey"], "run-1:user");
    assert_eq!(h["messages"][0]["__openclaw"]["id"], l[1]["id"]);

    // The real Pi library reads the gateway's file as Pincer does.
    let pi = pincer_testkit::oracle_context(&file, None);
    let ours = pincer_store::context_report(
        &pincer_store::Session::parse(std::fs::read(&file).expect("read")),
        &pincer_store::LeafArg::Default,
    )
    .expect("context")
    .to_value();
    assert_eq!(pincer_testkit::comparable(&pi), pincer_testkit::comparable(&ours));
    assert_eq!(pi["context"]["messages"].as_array().map(Vec::len), Some(4));

    // The second request carried the whole first turn (context kept in step with the appends).
    let texts = |req: &Value| -> Vec<String> {
        req["messages"].as_array().expect("messages").iter().filter(|m| m["role"] != "system").map(text).collect()
    };
    let reqs = s.fake.requests();
    assert_eq!(texts(&reqs[1]), vec!["hello there", "Fake reply: you said \"hello there\"", "and again"]);
    // Another process appends between turns: the next request sees it too.
    let note = json!({"role": "user", "content": "a note from another process", "timestamp": 1}).to_string();
    let ok =
        std::process::Command::new(BIN).args(["transcript", "append"]).arg(&file).args(["--message", &note]).status();
    assert!(ok.expect("append").success());
    send(&mut c, "main", "third", "run-3").await;
    c.chat_end("run-3").await;
    let last = texts(s.fake.requests().last().expect("request"));
    assert_eq!(last[last.len() - 2..], ["a note from another process".to_string(), "third".to_string()]);
}
