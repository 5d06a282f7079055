//! What `approvals.rs` and `approvals_external.rs` share: the binary and sending a message.

use pincer_testkit::gateway::Client;
use serde_json::json;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub async fn send(c: &mut Client, text: &str, key: &str) {
    c.request("chat.send", json!({"sessionKey": "main", "message": text, "idempotencyKey": key})).await.unwrap();
}
