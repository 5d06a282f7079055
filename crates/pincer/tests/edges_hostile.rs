//! The gateway's edges under hostile input (issue 34, items 7, 8, 12, 13 and 14), with real
//! processes: the `pincer gateway` binary as a child process, real sockets and frames written by
//! hand, real files in its state directory. Each test attacks one bound — a frame JavaScript can
//! send but Rust cannot decode, search queries that expand without limit or hold the reader,
//! transcripts whose tree is costly to list, history lines other JSON writers wrote, temp files a
//! killed rewrite left behind — and checks the answer names what was wrong.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use futures::{SinkExt, StreamExt};
use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{connect_params, Client, GatewayProcess, Ws};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// The next text frame as sent (not decoded: it may hold what `serde_json` refuses).
async fn raw_frame(ws: &mut Ws) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await.expect("a frame within 30 s") {
            Some(Ok(Message::Text(t))) => return t.to_string(),
            Some(Ok(Message::Close(f))) => panic!("closed: {f:?}"),
            Some(Ok(_)) => continue,
            other => panic!("no frame: {other:?}"),
        }
    }
}

/// The next response frame, as sent.
async fn raw_response(ws: &mut Ws) -> String {
    loop {
        let t = raw_frame(ws).await;
        if t.starts_with(r#"{"type":"res""#) {
            return t;
        }
    }
}

/// Issue 34, item 13: a frame holding a lone surrogate escape (JavaScript's `JSON.stringify` writes
/// one for a string cut inside a character) is answered with the request's own id and an error
/// naming the escape, so the client's request settles; the connection keeps working. Before, the
/// answer had id "unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_a_lone_surrogate_is_answered_with_its_own_id() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start(BIN, &dir.path().join("state"), &fake.gateway_toml());

    // The handshake: the connect frame's own id, then the close.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/", gw.addr)).await.unwrap();
    let challenge = raw_frame(&mut ws).await;
    assert!(challenge.contains("connect.challenge"), "{challenge}");
    let mut params = connect_params(pincer_testkit::gateway::TOKEN);
    params["client"]["displayName"] = json!("PLACEHOLDER");
    let connect = json!({"type": "req", "id": "hello-1", "method": "connect", "params": params})
        .to_string()
        .replace("PLACEHOLDER", r"half \ud83d");
    ws.send(Message::Text(connect.into())).await.unwrap();
    let res: Value = serde_json::from_str(&raw_response(&mut ws).await).unwrap();
    assert_eq!(res["id"], "hello-1", "{res}");
    assert!(res["error"]["message"].as_str().unwrap().contains(r"\ud83d at byte"), "{res}");

    // Connected: a chat.send whose message ends inside a character.
    let mut c = Client::connect(&gw.addr).await;
    c.send_raw(
        r#"{"type":"req","id":"send-1","method":"chat.send","params":{"sessionKey":"main","message":"cut \ud83d","idempotencyKey":"k1"}}"#,
    )
    .await;
    let mut ws = c.into_ws();
    let text = raw_response(&mut ws).await;
    let res: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((res["id"].as_str(), res["ok"].as_bool()), (Some("send-1"), Some(false)), "{res}");
    let message = res["error"]["message"].as_str().unwrap();
    assert!(message.contains(r"\ud83d at byte") && message.contains("lone surrogate"), "{res}");
    assert_eq!(res["error"]["code"], "INVALID_REQUEST");

    // An id that itself holds one comes back exactly as sent.
    ws.send(Message::Text(r#"{"type":"req","id":"odd-\udc00","method":"health"}"#.into())).await.unwrap();
    let text = raw_response(&mut ws).await;
    assert!(text.starts_with(r#"{"type":"res","id":"odd-\udc00","ok":false"#), "{text}");

    // The connection still works, and nothing was written for the refused send.
    ws.send(Message::Text(r#"{"type":"req","id":"h2","method":"health"}"#.into())).await.unwrap();
    let res: Value = serde_json::from_str(&raw_response(&mut ws).await).unwrap();
    assert_eq!((res["id"].as_str(), res["ok"].as_bool()), (Some("h2"), Some(true)), "{res}");
    assert!(fake.requests().is_empty(), "no turn ran");
}
