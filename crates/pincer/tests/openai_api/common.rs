//! What `openai_api.rs` and `openai_api_external.rs` share: a gateway with the endpoint, and
//! posting to it.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::GatewayProcess;
use serde_json::Value;
use std::path::Path;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub fn config(fake: &FakeOpenAi, enabled: bool) -> String {
    format!("{}[gateway.openai_api]\nenabled = {enabled}\n", fake.gateway_toml())
}

pub async fn start(state: &Path, config: String) -> GatewayProcess {
    let state = state.to_path_buf();
    tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &config)).await.expect("start")
}

/// `POST /v1/chat/completions`: status, body (JSON, or the SSE text), and the session header.
pub async fn post(addr: &str, token: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String, Option<String>) {
    pincer_agent::install_crypto_provider(); // reqwest is built without one (see the workspace Cargo.toml)
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {token}"))
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let session = resp.headers().get("x-pincer-session-key").map(|v| v.to_str().expect("ascii").to_owned());
    (status, resp.text().await.expect("body"), session)
}
