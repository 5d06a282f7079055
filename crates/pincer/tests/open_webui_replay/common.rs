//! What `open_webui_replay.rs` and `open_webui_replay_external.rs` share: the recorded requests,
//! their replay against a gateway, and reading its transcripts.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::GatewayProcess;
use pincer_testkit::probe::{read_rows, session_index, sessions_dir};
use serde_json::Value;
use std::path::Path;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/open-webui-0.12.4");

/// The key Open WebUI's connection was given in the recording (the README's example key).
pub const API_KEY: &str = "owui-3f9a1c77b2e04d55a8c1";

/// The recorded requests, in order, their bodies as sent (the built-in tools put back).
pub fn recorded() -> Vec<Value> {
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect(name)).expect(name)
    };
    let tools = read("tools.json");
    let mut requests: Vec<Value> = serde_json::from_value(read("requests.json")).expect("a list");
    for r in &mut requests {
        if r["body"]["tools"] == "tools.json" {
            r["body"]["tools"] = tools.clone();
        }
    }
    requests
}

pub async fn start(state: &Path, fake: &FakeOpenAi) -> GatewayProcess {
    let config = format!("{}[gateway.openai_api]\nenabled = true\napi_keys = [\"{API_KEY}\"]\n", fake.gateway_toml());
    let state = state.to_path_buf();
    tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &config)).await.expect("start")
}

/// Sends one recorded request with its recorded headers; (status, body, session key header).
pub async fn replay(addr: &str, r: &Value, forwarded: bool) -> (u16, String, Option<String>) {
    pincer_agent::install_crypto_provider();
    let url = format!("http://{addr}{}", r["path"].as_str().expect("path"));
    let client = reqwest::Client::new();
    let mut req = match r["method"].as_str().expect("method") {
        "GET" => client.get(url),
        "POST" => client.post(url).body(serde_json::to_vec(&r["body"]).expect("body")),
        m => panic!("unexpected method {m}"),
    };
    let headers = r["headers"].as_array().expect("headers").iter();
    for h in headers.filter(|h| forwarded || !h[0].as_str().expect("name").starts_with("X-OpenWebUI-")) {
        req = req.header(h[0].as_str().expect("name"), h[1].as_str().expect("value"));
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let session = resp.headers().get("x-pincer-session-key").map(|v| v.to_str().expect("ascii").to_owned());
    (status, resp.text().await.expect("body"), session)
}

pub fn messages(rows: &[Value]) -> Vec<&Value> {
    rows.iter().filter(|e| e["type"] == "message").collect()
}

pub fn transcript(state: &Path, key: &str) -> Vec<Value> {
    let id = session_index(state, "main")[key]["sessionId"].as_str().expect("session id").to_owned();
    read_rows(&sessions_dir(state, "main").join(format!("{id}.jsonl")))
}

pub fn last_user(body: &Value) -> String {
    let mut users = body["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "user");
    users.next_back().map(|m| m["content"].as_str().unwrap_or_default().to_owned()).unwrap_or_default()
}
