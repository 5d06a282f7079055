//! The OpenAI-compatible endpoint against the real `pincer gateway` process: it is off unless
//! enabled. The tests that need the Pi oracle (Node) or the official SDKs are in
//! `openai_api_external.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::TOKEN;
use serde_json::{json, Value};

#[path = "openai_api/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_is_off_unless_enabled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start().await;
    let gw = start(&dir.path().join("state"), config(&fake, false)).await;
    let (status, body, _) = post(&gw.addr, TOKEN, &json!({"messages": [{"role": "user", "content": "x"}]}), &[]).await;
    assert_eq!(status, 404, "{body}");
    let e: Value = serde_json::from_str(&body).expect("json");
    assert!(e["error"]["message"].as_str().expect("message").contains("[gateway.openai_api] enabled = true"));
    assert!(fake.requests().is_empty());
}

/// A session whose queue is full answers the OpenAI endpoint with a rate limit (429,
/// `rate_limit_error`, code `session_busy`) a client retries after, not a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_session_queue_is_a_rate_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start().await;
    let gw = start(&dir.path().join("state"), config(&fake, true)).await;
    let key = "agent:main:busy";
    let mut c = pincer_testkit::gateway::Client::connect(&gw.addr).await;
    let mut accepted = 0;
    for i in 0..40 {
        let params =
            json!({"sessionKey": key, "message": format!("[slow] queued {i}"), "idempotencyKey": format!("Q{i}")});
        if c.request("chat.send", params).await.is_ok() {
            accepted += 1;
        }
    }
    assert!(accepted < 40, "40 sends on one session were all accepted");
    let body = json!({"messages": [{"role": "user", "content": "one more"}]});
    let (status, body, _) = post(&gw.addr, TOKEN, &body, &[("x-pincer-session-key", key)]).await;
    assert_eq!(status, 429, "{body}");
    let e: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(e["error"]["type"], "rate_limit_error", "{e}");
    assert_eq!(e["error"]["code"], "session_busy", "{e}");
    assert!(e["error"]["message"].as_str().expect("message").contains(key), "{e}");
    c.request("chat.abort", json!({"sessionKey": key})).await.expect("abort");
}
