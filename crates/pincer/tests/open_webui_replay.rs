//! Open WebUI 0.12.4's own requests, recorded from a real Open WebUI run against a real `pincer
//! gateway` (tests/fixtures/open-webui-0.12.4, its README says how), replayed byte for byte
//! (headers, bodies, order) against the real gateway process and the fake provider, here without
//! the headers that forward the chat id: its title/tags/follow-up task requests are answered but
//! never kept, and chats follow the history rules. The tests that also need the Pi oracle (Node)
//! are in `open_webui_replay_external.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::probe::{message_text as text, session_index};

#[path = "open_webui_replay/common.rs"]
mod common;
use common::*;

/// Open WebUI's default, `ENABLE_FORWARD_USER_INFO_HEADERS` off: the same requests without its
/// `X-OpenWebUI-*` headers (it sends nothing else differently). The tasks are still recognised and
/// never kept; the chats are matched by their history, as the README says: the regenerate of chat
/// 1's lone first message starts a session of its own (two conversations may open alike), so chat
/// 1 lands in two sessions, and chat 2 in a third. Never a duplicated user row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_forwarded_headers_tasks_are_never_kept_and_chats_follow_the_history_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, &fake).await;
    let mut turns = Vec::new();
    for r in &recorded() {
        let (status, body, session) = replay(&gw.addr, r, false).await;
        let what = format!("#{} {}", r["seq"], r["step"]);
        assert_eq!(status, 200, "{what}: {body}");
        let task = last_user(&r["body"]).starts_with("### Task:");
        assert_eq!(session.is_some(), r["body"]["tools"].is_array(), "{what}: a session for turns only");
        assert!(!task || r["body"]["tools"].is_null(), "{what}");
        turns.extend(session.map(|s| (r["seq"].as_u64().expect("seq"), s)));
    }
    let of = |seq: u64| turns.iter().find(|(s, _)| *s == seq).map(|(_, k)| k.clone()).expect("a turn");
    assert_ne!(of(6), of(3), "the regenerate of a lone first message: a session of its own");
    assert_eq!(of(11), of(10), "the tool results continue the call's session");
    assert!([of(3), of(6)].contains(&of(10)) && [of(3), of(6)].contains(&of(13)), "{turns:?}");
    assert!(![of(3), of(6)].contains(&of(17)), "chat 2 is its own");
    let mut keys: Vec<String> = session_index(&state, "main").as_object().expect("index").keys().cloned().collect();
    keys.sort();
    let mut expected = vec![of(3), of(6), of(17)];
    expected.sort();
    assert_eq!(keys, expected, "no session for a task");
    for key in &keys {
        let rows = transcript(&state, key);
        assert!(messages(&rows).iter().all(|e| !text(&e["message"]).contains("### Task:")), "{key}: {rows:?}");
        let users: Vec<(String, String)> = messages(&rows)
            .iter()
            .filter(|e| e["message"]["role"] == "user")
            .map(|e| (e["parentId"].to_string(), text(&e["message"])))
            .collect();
        let mut unique = users.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), users.len(), "{key}: no user row twice: {rows:?}");
    }
}
