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
