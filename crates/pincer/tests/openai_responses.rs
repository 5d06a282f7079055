//! `/v1/responses`, the OpenAI Responses API, against the real `pincer gateway` process and the
//! fake provider: retrieval by id scoped to the API key and surviving a restart; bad input and
//! unknown ids refused with nothing written. The tests that also need the official SDKs, the Codex
//! CLI or the Pi oracle are in `openai_responses_external.rs`.
#![allow(clippy::disallowed_methods)] // the test writes Codex's config file directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::probe::read_rows;
use serde_json::{json, Value};

#[path = "openai_responses/common.rs"]
mod common;
use common::*;

/// `POST /v1/responses` (or `GET` a response when `body` is null): status and JSON body.
async fn call(addr: &str, key: &str, body: &Value, get: Option<&str>) -> (u16, Value) {
    pincer_agent::install_crypto_provider();
    let client = reqwest::Client::new();
    let req = match get {
        Some(id) => client.get(format!("http://{addr}/v1/responses/{id}")),
        None => client.post(format!("http://{addr}/v1/responses")).json(body),
    };
    let resp = req.header("authorization", format!("Bearer {key}")).send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text})))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_scoped_to_their_key_kept_across_restarts_and_bad_input_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let (key_a, key_b) = ("client-a-0123456789abcdef", "client-b-0123456789abcdef");
    let mut gw = start(&state, config(&fake, &format!("api_keys = [\"{key_a}\", \"{key_b}\"]\n"))).await;

    let (status, r1) = call(&gw.addr, key_a, &json!({"model": "pincer", "input": "hello from a"}), None).await;
    assert_eq!(status, 200, "{r1}");
    let id = r1["id"].as_str().expect("id").to_owned();
    assert_eq!(r1["output"][0]["content"][0]["text"], reply("hello from a"));
    let on_disk = || -> (Vec<String>, usize) {
        let keys = session_keys(&state);
        let rows = keys.iter().map(|k| read_rows(&transcript(&state, k)).len()).sum();
        (keys, rows)
    };
    let before = on_disk();
    let requests = fake.requests().len();

    // Another key's response is not there; nor is continuing it.
    let (status, e) = call(&gw.addr, key_b, &Value::Null, Some(&id)).await;
    assert_eq!(status, 404, "{e}");
    let body = json!({"model": "pincer", "input": "from b", "previous_response_id": id});
    let (status, e) = call(&gw.addr, key_b, &body, None).await;
    assert_eq!(status, 404, "{e}");
    assert!(e["error"]["message"].as_str().expect("message").starts_with("previous_response_id"), "{e}");
    // Bad input, each naming its field; nothing written, no model call.
    let bad = [
        (json!({"input": 5}), "input must be"),
        (json!({"input": []}), "input must not be empty"),
        (
            json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_audio"}]}]}),
            "input[0].content[0]",
        ),
        (json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}), "function_call_output"),
        (json!({"input": "x", "tools": [{"type": "function"}]}), "tools[0].name"),
        (json!({"input": "x", "store": "no"}), "store must be a boolean"),
        (json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}), "tool_choice"),
        (json!({"input": "x", "previous_response_id": id, "store": false}), "previous_response_id"),
        (json!({"input": "x", "previous_response_id": "resp_nothing"}), "previous_response_id"),
    ];
    for (body, says) in bad {
        let (status, e) = call(&gw.addr, key_a, &body, None).await;
        assert!(status == 400 || status == 404, "{body}: {status} {e}");
        let message = e["error"]["message"].as_str().expect("message");
        assert!(message.contains(says), "{body}: {message}");
    }
    assert_eq!(on_disk(), before, "nothing written");
    assert_eq!(fake.requests().len(), requests, "no model call");

    // A restart: the response is read from the transcript, and continued from.
    tokio::task::block_in_place(|| gw.restart());
    let (status, got) = call(&gw.addr, key_a, &Value::Null, Some(&id)).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        (got["id"].as_str(), &got["output"][0]["content"][0]["text"]),
        (Some(id.as_str()), &json!(reply("hello from a")))
    );
    assert_eq!(got["status"], "completed");
    let body = json!({"model": "pincer", "input": "again", "previous_response_id": id});
    let (status, r2) = call(&gw.addr, key_a, &body, None).await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], json!(id));
    let (keys, rows) = on_disk();
    assert_eq!(keys, before.0, "the same session");

    // A retry (the same Idempotency-Key and body) is the same response, its turn written once.
    let keyed = json!({"model": "pincer", "input": "keyed", "previous_response_id": r2["id"]});
    let mut ids = Vec::new();
    for _ in 0..2 {
        pincer_agent::install_crypto_provider();
        let resp = reqwest::Client::new()
            .post(format!("http://{}/v1/responses", gw.addr))
            .header("authorization", format!("Bearer {key_a}"))
            .header("idempotency-key", "retry-me-1")
            .json(&keyed)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status().as_u16(), 200);
        let r: Value = resp.json().await.expect("json");
        assert_eq!(r["output"][0]["content"][0]["text"], reply("keyed"), "{r}");
        ids.push(r["id"].clone());
    }
    assert_eq!(ids[0], ids[1], "the same response");
    assert_eq!(on_disk().1, rows + 2, "one user row and one reply");
}
