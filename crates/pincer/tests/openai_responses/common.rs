//! What `openai_responses.rs` and `openai_responses_external.rs` share: a gateway with the
//! endpoint, its replies and sessions.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::GatewayProcess;
use pincer_testkit::probe::{session_index, sessions_dir};
use std::path::{Path, PathBuf};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub async fn start(state: &Path, config: String) -> GatewayProcess {
    let state = state.to_path_buf();
    tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &config)).await.expect("start")
}

pub fn config(fake: &FakeOpenAi, extra: &str) -> String {
    format!("{}[gateway.openai_api]\nenabled = true\n{extra}", fake.gateway_toml())
}

pub fn reply(said: &str) -> String {
    format!("Fake reply: you said \"{said}\"")
}

pub fn transcript(state: &Path, key: &str) -> PathBuf {
    let index = session_index(state, "main");
    sessions_dir(state, "main").join(format!("{}.jsonl", index[key]["sessionId"].as_str().expect("session id")))
}

pub fn session_keys(state: &Path) -> Vec<String> {
    session_index(state, "main").as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
}
