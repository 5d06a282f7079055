//! The README's SDK snippets run with the official SDKs (Python `openai` in the venv scripts/test
//! makes, npm `openai` in tests/openai-sdk) against a gateway configured by the endpoint block: the
//! part of `readme.rs` that needs them, so it builds only with the `external` feature.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_testkit::gateway::GatewayProcess;
use std::process::Command;

#[path = "readme/common.rs"]
mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_snippets_run_against_a_gateway_configured_by_the_endpoint_block() {
    let python = of_lang("python").pop().expect("a python snippet");
    let js = of_lang("js").pop().expect("a js snippet");
    let endpoint =
        of_lang("toml").into_iter().find(|t| t.contains("[gateway.openai_api]")).expect("the endpoint block");
    for snippet in [&python, &js] {
        let key = snippet.split("owui-").nth(1).and_then(|k| k.split('"').next()).expect("a key in the snippet");
        assert!(endpoint.contains(&format!("\"owui-{key}\"")), "the snippet's key is the block's:\n{endpoint}");
    }
    let dir = tempfile::tempdir().unwrap();
    let gw = tokio::task::spawn_blocking({
        let state = dir.path().join("state");
        move || GatewayProcess::start(BIN, &state, &endpoint)
    })
    .await
    .unwrap();
    // The official SDKs (installed by scripts/test), the snippets as they are but for the port.
    let at = |snippet: &str| snippet.replace("127.0.0.1:18789", &gw.addr);
    let py = dir.path().join("snippet.py");
    std::fs::write(&py, at(&python)).unwrap();
    let out = ok(&Command::new(pincer_testkit::sdk_python()).arg(&py).output().unwrap(), "the Python snippet");
    assert!(out.contains("Hello") && out.contains(pincer_agent::ECHO_PREFIX.trim()), "{out}");
    // Node finds the package through a node_modules beside the script.
    let js_dir = dir.path().join("js");
    std::fs::create_dir(&js_dir).unwrap();
    std::os::unix::fs::symlink(pincer_testkit::sdk_dir().join("node_modules"), js_dir.join("node_modules")).unwrap();
    std::fs::write(js_dir.join("snippet.mjs"), at(&js)).unwrap();
    let out = ok(&Command::new("node").arg(js_dir.join("snippet.mjs")).output().unwrap(), "the JavaScript snippet");
    assert!(out.contains("Hello") && out.contains(pincer_agent::ECHO_PREFIX.trim()), "{out}");
}
