//! MCP servers in the gateway's config: a bad `[mcp.servers]` section stops the startup, naming
//! what is wrong. The tests with real MCP servers (npm's reference servers, which need Node) are in
//! `mcp_external.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly
#![allow(clippy::disallowed_methods)] // the workspace file the filesystem server reads

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

#[test]
fn a_bad_server_section_stops_the_startup_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    for (config, want) in [
        (
            "[mcp.servers.a__b]\ncommand = \"node\"\n",
            "[mcp.servers.a__b]: the name \"a__b\" must be letters, digits, - and _ (no \"__\")",
        ),
        (
            "[mcp.servers.x]\ncommand = \"node\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
            "[mcp.servers.x]: set command (a stdio server) or url (an HTTP one), not both",
        ),
        (
            "[mcp.servers.x]\nurl = \"http://127.0.0.1:9/mcp\"\nbearer_token_env = \"PINCER_TEST_NO_SUCH_VAR\"\n",
            "[mcp.servers.x]: bearer_token_env names PINCER_TEST_NO_SUCH_VAR, which is not set",
        ),
        (
            "[mcp.servers.x]\nurl = \"ftp://h/mcp\"\n",
            "[mcp.servers.x]: url \"ftp://h/mcp\" is not an http:// or https:// URL",
        ),
        (
            "[agents.w.mcp.servers.y]\nargs = [\"a\"]\n",
            "[agents.w.mcp.servers.y]: set command (a stdio server) or url (a streamable HTTP one)",
        ),
        ("[mcp.servers.x]\ncomand = \"node\"\n", "unknown field `comand`"),
    ] {
        let stderr = pincer_testkit::gateway::refused_startup(BIN, &state, config);
        assert!(stderr.contains(want), "{config}: {stderr}");
    }
}
