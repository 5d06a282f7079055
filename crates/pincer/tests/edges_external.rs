//! The edge of `edges.rs` that is checked against the real Pi library (so it needs the Pi oracle on
//! Node and builds only with the `external` feature): messages acknowledged behind a turn cut by
//! SIGKILL are answered in order after the restart, without resends, and Pi reads the one
//! conversation.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::gateway::{Client, StartOptions};
use pincer_testkit::probe;
use pincer_testkit::probe::message_text as text;
use serde_json::json;
use std::time::Duration;

#[path = "edges/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01e_messages_acknowledged_behind_a_cut_turn_are_answered_in_order_after_a_restart_without_resends() {
    // Two messages sent while a reply streams are acknowledged ("started") but wait in the
    // session's queue: their user rows are not written yet. The gateway is SIGKILLed; nobody sends
    // anything again. After the restart the cut turn is resumed and the two waiting messages are
    // answered after it, in their order, each once; Pi reads the one conversation.
    let mut e = start("", StartOptions::default());
    let key = "agent:main:queued";
    let mut c = Client::connect(&e.gw.addr).await;
    let first = send(&mut c, key, "[slow] the turn that is cut", "Q-a").await.expect("send a");
    assert_eq!(first["status"], "started");
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == "Q-a" && f["payload"]["state"] == "delta").await;
    for (run, said) in [("Q-b", "the second message"), ("Q-c", "the third message")] {
        let ack = send(&mut c, key, said, run).await.expect("send");
        assert_eq!(ack["status"], "started", "{run} acknowledged while Q-a runs");
    }
    let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    assert_eq!(user_rows(&probe::read_rows(&file), "Q-b"), 0, "Q-b waits: its user row is not written yet");
    drop(c);
    restart(&mut e.gw);

    let rows = probe::poll_async(Duration::from_secs(60), Duration::from_millis(100), || {
        let rows = probe::read_rows(&file);
        async move { ["Q-a", "Q-b", "Q-c"].iter().all(|r| !replies(&rows, r).is_empty()).then_some(rows) }
    })
    .await
    .unwrap_or_else(|| {
        panic!("all three answered after the restart, without a resend:\n{}", outline(&probe::read_rows(&file), "Q-a"))
    });
    for run in ["Q-a", "Q-b", "Q-c"] {
        assert_eq!(user_rows(&rows, run), 1, "{run}: one user row\n{}", outline(&rows, "Q-a"));
        assert_eq!(replies(&rows, run).len(), 1, "{run}: one reply\n{}", outline(&rows, "Q-a"));
    }
    assert_chain(&rows, "queued");
    assert_verifies(&file);
    // The one conversation, in the order the messages were sent.
    let pi = pincer_testkit::oracle::context(&file, None);
    let said: Vec<String> = (pi["context"]["messages"].as_array().expect("Pi's messages").iter())
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or(""), text(m)))
        .collect();
    let slow: Vec<String> = (0..40).map(|i| format!("word{i}")).collect();
    assert_eq!(
        said,
        [
            "user: [slow] the turn that is cut".to_owned(),
            format!("assistant: {} ", slow.join(" ")),
            "user: the second message".into(),
            "assistant: Fake reply: you said \"the second message\"".into(),
            "user: the third message".into(),
            "assistant: Fake reply: you said \"the third message\"".into(),
        ],
        "{pi:#}"
    );
    // A resend of a key now finds its turn done; nothing more is written.
    let mut c = Client::connect(&e.gw.addr).await;
    let again = send(&mut c, key, "the second message", "Q-b").await.expect("resend");
    assert_eq!(again, json!({"runId": "Q-b", "status": "ok"}));
    assert_eq!(probe::read_rows(&file).len(), rows.len());
}
