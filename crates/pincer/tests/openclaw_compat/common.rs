//! What `openclaw_compat.rs` and `openclaw_compat_external.rs` share: a gateway over the fake
//! provider and a turn through it.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub fn start(dir: &tempfile::TempDir, fake: &FakeOpenAi) -> GatewayProcess {
    let config = fake.gateway_toml();
    GatewayProcess::start(BIN, &dir.path().join("state"), &config)
}

/// Sends `message` to the main session as run `key` (it must start) and returns the run's end frame.
pub async fn turn(c: &mut Client, message: &str, key: &str) -> Value {
    let ack = c
        .request("chat.send", json!({"sessionKey": "main", "message": message, "idempotencyKey": key}))
        .await
        .expect("chat.send");
    assert_eq!(ack["status"], "started", "{ack}");
    c.chat_end(key).await
}
