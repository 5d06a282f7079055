//! What `bash.rs` and `bash_external.rs` share: the gateway's config and start, and calling a tool
//! through it.

use pincer_testkit::fake_provider::{tool_call, FakeProvider};
use pincer_testkit::gateway::GatewayProcess;
use serde_json::Value;
use std::path::Path;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// A config for the fake provider; the workspace is the default `<state>/workspace` unless given.
pub fn config(fake: &FakeProvider, workspace: Option<&Path>) -> String {
    let ws = workspace.map(|w| format!("workspace = \"{}\"\n", w.display())).unwrap_or_default();
    format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\ntools.approval = \"allow\"\n{ws}",
        fake.base_url(),
    )
}

pub fn call(id: &str, args: Value) -> pincer_testkit::fake_provider::Part {
    tool_call(id, "bash", &[&args.to_string()])
}

pub async fn start(state: &Path, cfg: String) -> GatewayProcess {
    let state = state.to_path_buf();
    tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &cfg)).await.unwrap()
}
