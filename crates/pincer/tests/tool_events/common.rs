//! What `tool_events.rs` and `tool_events_external.rs` share: the gateway's config and telling tool
//! events apart.

use pincer_testkit::fake_provider::FakeProvider;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// The fake provider's config over workspace `ws`; tools run without asking (approvals have their own tests).
pub fn config(fake: &FakeProvider, ws: &std::path::Path) -> String {
    format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\ntools.approval = \"allow\"\n",
        fake.base_url(),
        ws.display()
    )
}

pub fn is_tool(f: &Value, phase: &str, id: &str) -> bool {
    f["event"] == "agent"
        && f["payload"]["stream"] == "tool"
        && f["payload"]["data"]["phase"] == phase
        && f["payload"]["data"]["toolCallId"] == id
}
