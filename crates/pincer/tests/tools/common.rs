//! What `tools.rs` and `tools_external.rs` share: the gateway's config, the fixtures, calling a
//! tool and the tools offered to the model.

use pincer_testkit::fake_provider::{tool_call, FakeProvider};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// A 1x1 PNG.
pub const PNG: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4, 0x89, 0x00, 0x00, 0x00, 0x0D, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x00, 0x01, 0x00, 0x00, 0x05, 0x00, 0x01, 0x0D, 0x0A, 0x2D, 0xB4, 0x00, 0x00,
    0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

pub fn config(fake: &FakeProvider, workspace: &Path, tools: &str) -> String {
    format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\n{tools}",
        fake.base_url(),
        workspace.display()
    )
}

/// A tool call part with its arguments as one JSON chunk.
pub fn call(id: &str, name: &str, args: Value) -> pincer_testkit::fake_provider::Part {
    tool_call(id, name, &[&args.to_string()])
}

/// The workspace: source files, a `.gitignore`d directory, a 3,000-line file, a file with a repeated
/// line, an image; a secret outside it and a symlink leading there.
pub fn fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let ws = dir.join("ws");
    let outside = dir.join("outside");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::create_dir_all(ws.join("ignored")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
    std::fs::write(ws.join(".gitignore"), "ignored/\n").unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {\n    println!(\"hello\");\n}\n").unwrap();
    std::fs::write(ws.join("src/lib.rs"), "pub fn greet() -> &'static str {\n    \"hello\"\n}\n").unwrap();
    std::fs::write(ws.join("ignored/main.rs"), "fn main() {}\n").unwrap();
    let big: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(ws.join("big.txt"), big).unwrap();
    std::fs::write(ws.join("dup.txt"), "x = 1\nx = 1\n").unwrap();
    std::fs::write(ws.join("pixel.png"), PNG).unwrap();
    (ws, outside)
}

/// The `toolResult` messages of the file, in chain order.
/// The names of the tools offered in the provider's first request.
pub fn offered(fake: &FakeProvider) -> Vec<String> {
    fake.bodies()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}
