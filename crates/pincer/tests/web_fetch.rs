//! `web_fetch`'s settings: a misspelt one stops the startup, naming it. The fetches through the
//! gateway are in `web_fetch_external.rs` (they are checked against the Pi oracle, on Node).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

#[test]
fn a_misspelt_web_fetch_setting_stops_the_startup() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let stderr =
        pincer_testkit::gateway::refused_startup(BIN, &state, "[agents.defaults.tools]\nweb_fetch_private = true\n");
    assert!(stderr.contains("unknown field `web_fetch_private`"), "{stderr}");
}
