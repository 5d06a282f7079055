//! What `gateway.rs` and `gateway_external.rs` share: a gateway over the fake provider, sending,
//! and reading its transcripts.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub struct Setup {
    pub _dir: tempfile::TempDir,
    pub gw: GatewayProcess,
    pub fake: FakeOpenAi,
}

pub fn setup_with(extra: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let config = format!("{}{extra}", fake.gateway_toml());
    let gw = GatewayProcess::start(BIN, &dir.path().join("state"), &config);
    Setup { _dir: dir, gw, fake }
}

pub fn setup() -> Setup {
    setup_with("")
}

pub fn sessions_dir(s: &Setup) -> PathBuf {
    s.gw.state_dir.join("agents/main/sessions")
}

/// The transcript of the main session.
pub fn transcript(s: &Setup) -> PathBuf {
    let index: Value =
        serde_json::from_slice(&std::fs::read(sessions_dir(s).join("sessions.json")).expect("sessions.json"))
            .expect("json");
    let id = index["agent:main:main"]["sessionId"].as_str().expect("session id").to_owned();
    sessions_dir(s).join(format!("{id}.jsonl"))
}

pub fn lines(path: &Path) -> Vec<Value> {
    pincer_testkit::probe::read_rows(path)
}

pub async fn send(c: &mut Client, key: &str, message: &str, run_id: &str) -> Value {
    c.request("chat.send", json!({"sessionKey": key, "message": message, "idempotencyKey": run_id}))
        .await
        .expect("chat.send")
}
