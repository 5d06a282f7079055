//! OpenClaw 2026.9.6's own CLI against the real `pincer gateway`, on a loopback-only network
//! namespace (see `pincer_testkit::openclaw`): `openclaw agent -m hi --json` prints the fake
//! provider's reply and the turn is on disk, chained; `openclaw gateway call status`, `openclaw
//! logs` (Pincer's log ring) and `openclaw sessions archive KEY` succeed.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{GatewayProcess, TOKEN};
use pincer_testkit::openclaw;
use pincer_testkit::probe::{message_text as text, read_rows, transcript_path};
use pretty_assertions::assert_eq;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

fn start(dir: &tempfile::TempDir, fake: &FakeOpenAi) -> GatewayProcess {
    let config = fake.gateway_toml();
    GatewayProcess::start(BIN, &dir.path().join("state"), &config)
}

fn stdout_json(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openclaw exited {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status.code());
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}\nstderr:\n{stderr}"))
}

#[test]
fn openclaw_agent_prints_the_reply_and_the_turn_is_on_disk_chained() {
    if !openclaw::in_loopback_namespace("openclaw_agent_prints_the_reply_and_the_turn_is_on_disk_chained") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let home = dir.path().join("home");
    let out = openclaw::run(&home, &gw.addr, TOKEN, &["agent", "-m", "hi", "--json", "--agent", "main"]);
    let v = stdout_json(&out);
    assert_eq!(v["status"], "ok", "{v:#}");
    assert_eq!(v["result"]["payloads"][0]["text"], "Fake reply: you said \"hi\"", "{v:#}");

    let file = transcript_path(&gw.state_dir, "agent:main:main").expect("transcript");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert_eq!(text(&rows[1]["message"]), "hi");
    assert_eq!(rows[2]["parentId"], rows[1]["id"]);
    assert_eq!(text(&rows[2]["message"]), "Fake reply: you said \"hi\"");

    // A second run chains after the first reply.
    let out =
        openclaw::run(&home, &gw.addr, TOKEN, &["agent", "-m", "again", "--json", "--session-key", "agent:main:main"]);
    let v = stdout_json(&out);
    assert_eq!(v["result"]["payloads"][0]["text"], "Fake reply: you said \"again\"", "{v:#}");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), 5, "{rows:#?}");
    assert_eq!(rows[3]["parentId"], rows[2]["id"]);
}

fn run_ok(home: &std::path::Path, gw: &GatewayProcess, args: &[&str]) -> String {
    let out = openclaw::run(home, &gw.addr, TOKEN, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openclaw {args:?} exited {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status.code()
    );
    stdout
}

#[test]
fn openclaw_gateway_call_status_logs_and_sessions_archive_succeed() {
    if !openclaw::in_loopback_namespace("openclaw_gateway_call_status_logs_and_sessions_archive_succeed") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let home = dir.path().join("home");

    let status = run_ok(&home, &gw, &["gateway", "call", "status", "--json"]);
    let v: Value = serde_json::from_str(status.trim()).unwrap_or_else(|e| panic!("{e}: {status}"));
    assert_eq!(v["server"]["name"], "pincer", "{v:#}");

    let logs = run_ok(&home, &gw, &["logs", "--json", "--limit", "50"]);
    // Pincer's own lines, from its ring (not a local file of OpenClaw's), never the token.
    assert!(logs.contains(r#""file":"pincer://gateway-log""#) && logs.contains("Pincer gateway listening"), "{logs}");
    assert!(!logs.contains(TOKEN), "{logs}");

    // A session to archive: made by a turn, then archived by OpenClaw's CLI and gone from the list.
    run_ok(&home, &gw, &["agent", "-m", "to archive", "--json", "--session-key", "agent:main:side"]);
    run_ok(&home, &gw, &["sessions", "archive", "agent:main:side"]);
    let index: Value = serde_json::from_slice(
        &std::fs::read(gw.state_dir.join("agents/main/sessions/sessions.json")).expect("sessions.json"),
    )
    .expect("index");
    assert!(index["agent:main:side"]["archivedAt"].is_u64(), "{index:#}");
    let list = run_ok(&home, &gw, &["gateway", "call", "sessions.list", "--json"]);
    let v: Value = serde_json::from_str(list.trim()).unwrap_or_else(|e| panic!("{e}: {list}"));
    let keys: Vec<&str> =
        v["sessions"].as_array().expect("sessions").iter().filter_map(|s| s["key"].as_str()).collect();
    assert!(!keys.contains(&"agent:main:side"), "{keys:?}");
}
