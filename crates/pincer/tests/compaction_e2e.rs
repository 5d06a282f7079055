//! Compaction end to end, by hand: `/compact` and the CLI (`pincer transcript compact`) against a
//! gateway with a fake provider, and failures that leave the file alone. The tests that also need
//! the Pi oracle (Node) are in `compaction_e2e_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::read_rows as entries;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;

#[path = "compaction_e2e/common.rs"]
mod common;
use common::*;

/// `pincer transcript compact FILE --state-dir STATE`.
fn cli_compact(file: &Path, state: &Path) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(["transcript", "compact"])
        .arg(file)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("run pincer transcript compact")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_compaction_by_command_and_cli_and_failures_leave_the_file_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start().await;
    let config = format!("{}{COMPACTION}", fake.gateway_toml());
    let state = dir.path().join("state");
    let gw = tokio::task::spawn_blocking({
        let (state, config) = (state.clone(), config.clone());
        move || GatewayProcess::start(BIN, &state, &config)
    })
    .await
    .expect("start");
    let mut c = Client::connect(&gw.addr).await;
    for n in 1..=3 {
        let run = format!("m-{n}");
        c.request("chat.send", json!({"sessionKey": "main", "message": message(n), "idempotencyKey": run}))
            .await
            .expect("send");
        c.chat_end(&run).await;
    }
    c.request(
        "chat.send",
        json!({"sessionKey": "main", "message": "/compact focus on module names", "idempotencyKey": "m-c"}),
    )
    .await
    .expect("send");
    let fin = c.chat_end("m-c").await;
    let text = fin["payload"]["message"]["content"][0]["text"].as_str().expect("text").to_owned();
    assert!(text.starts_with("Compacted:"), "{text}");
    let req = fake.requests().last().cloned().expect("summary request").to_string();
    assert!(req.contains("Additional focus: focus on module names"), "custom instructions reach the prompt");
    let file = transcript(&state);
    assert_eq!(entries(&file).iter().filter(|e| e["type"] == "compaction").count(), 1);

    // A compaction whose summary call fails writes nothing.
    let before = std::fs::read(&file).expect("read");
    drop(gw);
    let broken = config.replace(&fake.base_url(), "http://127.0.0.1:9/v1");
    std::fs::write(state.join("pincer.toml"), &broken).expect("config");
    let out = cli_compact(&file, &state);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("transcript was not changed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&file).expect("read"), before, "byte-identical after a failed compaction");

    // The CLI compacts with a working provider (after another turn, so there is something new).
    std::fs::write(state.join("pincer.toml"), &config).expect("config");
    let msg = json!({"role": "user", "content": message(9), "timestamp": 1}).to_string();
    let ok = std::process::Command::new(BIN)
        .args(["transcript", "append"])
        .arg(&file)
        .args(["--message", &msg])
        .status()
        .expect("append");
    assert!(ok.success());
    let out = cli_compact(&file, &state);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(result["compacted"], true);
    let last = entries(&file).last().cloned().expect("last");
    assert_eq!(last["type"], "compaction");
    assert_eq!(last["id"], result["id"]);
}
