//! MCP servers' tools through the real gateway, with the reference servers (npm
//! `@modelcontextprotocol/server-everything` and `server-filesystem`, pinned in tests/mcp and
//! installed by scripts/test; they need Node, so this target builds only with the `external`
//! feature): a scripted fake model calls `mcp__everything__echo`, `mcp__everything__get-sum`,
//! `mcp__everything__get-tiny-image` (an image) and the filesystem server's `read_file`; each
//! result is on disk in Pi's `toolResult` shape and the provider's next request is exactly the real
//! Pi library's context of the file. server-everything is reached over stdio and over streamable
//! HTTP; a server that cannot start, a server killed mid-call, progress notifications, approvals of
//! destructive tools, a call cut by a crash, and the MCP conformance suite's client scenarios.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly
#![allow(clippy::disallowed_methods)] // the workspace file the filesystem server reads

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::wire::{check_request_against_pi, result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

fn config(fake: &FakeProvider, workspace: &Path, rest: &str) -> String {
    format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\n[agents.defaults.tools]\nprofile = \"minimal\"\n{rest}",
        fake.base_url(),
        workspace.display()
    )
}

fn server_js(name: &str) -> PathBuf {
    pincer_testkit::mcp_servers_dir().join(name).join("dist/index.js")
}

fn stdio_servers(ws: &Path) -> String {
    format!(
        "[mcp.servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n\
         [mcp.servers.fs]\ncommand = \"node\"\nargs = [\"{}\", \"{}\"]\n",
        server_js("server-everything").display(),
        server_js("server-filesystem").display(),
        ws.display()
    )
}

async fn start(state: &Path, cfg: String) -> GatewayProcess {
    let state = state.to_path_buf();
    tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &cfg)).await.unwrap()
}

/// Sends `message` on `main` and waits for the run's end, which must be `final`.
async fn send(c: &mut Client, gw: &GatewayProcess, message: &str, key: &str) {
    c.request("chat.send", json!({"sessionKey": "main", "message": message, "idempotencyKey": key})).await.unwrap();
    let end = c.chat_end(key).await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());
}

fn offered(body: &Value) -> Vec<String> {
    body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_servers_tools_reach_the_model_and_their_results_the_next_request() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("notes.txt"), "hello from the filesystem server\nsecond line\n").unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let echo = json!({"message": "hi there"}).to_string();
    let sum = json!({"a": 2, "b": 3}).to_string();
    let read = json!({"path": ws.join("notes.txt")}).to_string();
    fake.push(Reply::stream(script(
        f,
        &turn(
            vec![
                tool_call("c1", "mcp__everything__echo", &[&echo]),
                tool_call("c2", "mcp__everything__get-sum", &[&sum]),
            ],
            (20, 10, 0),
        ),
    )));
    fake.push(Reply::stream(script(
        f,
        &turn(vec![tool_call("c3", "mcp__everything__get-tiny-image", &["{}"])], (30, 5, 0)),
    )));
    fake.push(Reply::stream(script(f, &turn(vec![tool_call("c4", "mcp__fs__read_file", &[&read])], (40, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["All done."])], (50, 3, 0)))));
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, &ws, &stdio_servers(&ws))).await;
    let mut c = Client::connect(&gw.addr).await;
    send(&mut c, &gw, "use the MCP tools", "r1").await;

    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    assert_eq!(results.len(), 4, "{results:?}");
    let by_id = |id: &str| results.iter().find(|r| r["toolCallId"] == id).unwrap().clone();
    let r = by_id("c1");
    assert_eq!((r["toolName"].as_str(), r["isError"].as_bool()), (Some("mcp__everything__echo"), Some(false)));
    assert_eq!(r["content"], json!([{"type": "text", "text": "Echo: hi there"}]));
    assert_eq!(result_text(&by_id("c2")), "The sum of 2 and 3 is 5.");
    let image = by_id("c3");
    let blocks = image["content"].as_array().unwrap();
    assert_eq!(blocks.iter().map(|b| b["type"].as_str().unwrap()).collect::<Vec<_>>(), ["text", "image", "text"]);
    assert_eq!(blocks[1]["mimeType"], "image/png");
    assert!(blocks[1]["data"].as_str().unwrap().starts_with("iVBOR"), "a PNG in base64: {}", blocks[1]);
    assert_eq!(result_text(&by_id("c4")), "hello from the filesystem server\nsecond line\n");

    // Each request after a result is the real Pi library's context of the file (images included).
    assert_eq!(fake.bodies().len(), 4);
    for n in 1..4 {
        check_request_against_pi(&file, &fake, n);
    }
    // The tools were offered under their namespaced names, with the servers' schemas as they are.
    let bodies = fake.bodies();
    let names = offered(&bodies[0]);
    for want in
        ["mcp__everything__echo", "mcp__everything__get-sum", "mcp__everything__get-tiny-image", "mcp__fs__read_file"]
    {
        assert!(names.iter().any(|n| n == want), "{want} offered: {names:?}");
    }
    let echo_spec =
        bodies[0]["tools"].as_array().unwrap().iter().find(|t| t["function"]["name"] == "mcp__everything__echo");
    let params = &echo_spec.unwrap()["function"]["parameters"];
    assert_eq!(
        (&params["properties"]["message"]["description"], &params["required"]),
        (&json!("Message to echo"), &json!(["message"]))
    );

    // The status shows both servers ready, and main's tools from them.
    let status = c.request("status", json!({})).await.unwrap();
    let servers = status["mcp"]["servers"].as_array().unwrap();
    assert_eq!(
        servers.iter().map(|s| (s["id"].as_str().unwrap(), s["state"].as_str().unwrap())).collect::<Vec<_>>(),
        [("everything", "ready"), ("fs", "ready")]
    );
    let main_tools = status["mcp"]["agents"]["main"]["tools"].as_array().unwrap();
    assert!(main_tools.contains(&json!("mcp__fs__read_file")), "{status}");
    // tools.effective lists them in a group of their own.
    let effective = c.request("tools.effective", json!({"sessionKey": "main"})).await.unwrap();
    let group = effective["groups"].as_array().unwrap().iter().find(|g| g["id"] == "mcp").unwrap().clone();
    assert!(group["tools"].as_array().unwrap().iter().any(|t| t["id"] == "mcp__everything__echo"), "{group}");
}

/// A free port on loopback (bound, then released for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process killed when the test ends, failed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// server-everything in its streamable HTTP mode on `port`, once it listens.
fn http_everything(port: u16) -> Killed {
    use std::io::BufRead;
    let mut child = std::process::Command::new("node")
        .arg(server_js("server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains("listening on port") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    Killed(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let port = free_port();
    let server = http_everything(port);
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let echo = json!({"message": "over http"}).to_string();
    fake.push(Reply::stream(script(f, &turn(vec![tool_call("h1", "mcp__everything__echo", &[&echo])], (20, 10, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Echoed."])], (30, 3, 0)))));
    let state = dir.path().join("state");
    let mcp = format!("[mcp.servers.everything]\nurl = \"http://127.0.0.1:{port}/mcp\"\n");
    let gw = start(&state, config(&fake, &ws, &mcp)).await;
    let mut c = Client::connect(&gw.addr).await;
    send(&mut c, &gw, "echo over http", "h").await;
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    assert_eq!(results.len(), 1);
    assert_eq!(
        (results[0]["content"].clone(), results[0]["isError"].clone()),
        (json!([{"type": "text", "text": "Echo: over http"}]), json!(false))
    );
    check_request_against_pi(&file, &fake, 1);
    let status = c.request("status", json!({})).await.unwrap();
    assert_eq!(status["mcp"]["servers"][0]["transport"], "http");
    drop(gw);
    drop(server);
}

/// `pincer mcp …` with the test gateway's token.
fn pincer_mcp(args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .arg("mcp")
        .args(args)
        .env("PINCER_GATEWAY_TOKEN", pincer_testkit::gateway::TOKEN)
        .env("PINCER_LOG", "warn")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_is_shown_with_its_reason_and_turns_go_on_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    fake.push(Reply::stream(script(Format::OpenaiCompletions, &turn(vec![text(&["Hello."])], (20, 3, 0)))));
    let broken = "[mcp.servers.broken]\ncommand = \"node\"\n\
                  args = [\"-e\", \"console.error('BROKEN_API_KEY is not set'); process.exit(3)\"]\n";
    let mcp = format!("{}{broken}", stdio_servers(&ws));
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, &ws, &mcp)).await;
    let mut c = Client::connect(&gw.addr).await;
    send(&mut c, &gw, "hi", "t1").await;
    // The turn ran with the other servers' tools and without the broken one's.
    let names = offered(&fake.bodies()[0]);
    assert!(names.iter().any(|n| n == "mcp__everything__echo"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("mcp__broken")), "{names:?}");
    let why = "the process exited (exit status: 3): BROKEN_API_KEY is not set";
    // The log says why, and so do the status and `pincer mcp list` (asking the running gateway).
    assert!(gw.log_text().contains(&format!("MCP server broken: {why}")), "{}", gw.log_text());
    let status = c.request("status", json!({})).await.unwrap();
    let b = status["mcp"]["servers"].as_array().unwrap().iter().find(|s| s["id"] == "broken").unwrap().clone();
    assert_eq!(b["state"], "failed");
    assert!(b["reason"].as_str().unwrap().starts_with(why), "{b}");
    let state_arg = state.display().to_string();
    let out = pincer_mcp(&["list", "--state-dir", &state_arg, "--bind", &gw.addr, "--table"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("broken      stdio      failed: {why}")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("everything") && l.contains("ready with 13 tools")), "{stdout}");
    assert!(stdout.contains("agent main: mcp__everything__echo,"), "{stdout}");
    let json_out = pincer_mcp(&["list", "--state-dir", &state_arg, "--bind", &gw.addr, "--json"]);
    let listed: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    let states = |servers: &Value| -> Vec<(Value, Value, Value)> {
        servers.as_array().unwrap().iter().map(|s| (s["id"].clone(), s["state"].clone(), s["reason"].clone())).collect()
    };
    assert_eq!(states(&listed["servers"]), states(&status["mcp"]["servers"]));
    // `probe` starts the server by itself and says the same; a ready one lists its tools.
    let out = pincer_mcp(&["probe", "broken", "--state-dir", &state_arg, "--table"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains(why), "{}", String::from_utf8_lossy(&out.stdout));
    let out = pincer_mcp(&["probe", "fs", "--state-dir", &state_arg, "--table"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("mcp__fs__read_file") && stdout.contains("mcp__fs__write_file"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("mcp__fs__write_file")
            && l.ends_with("idempotent, re-run on resume, may be destructive (approval: ask)")),
        "{stdout}"
    );
    let out = pincer_mcp(&["probe", "nope", "--state-dir", &state_arg]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no MCP server \"nope\" in the config (servers: broken, everything, fs)"));
}

/// The lines the tap (tests/mcp/tap.mjs) saw the client send, once `pred` holds for them.
async fn tapped(log: &Path, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    for _ in 0..600 {
        let lines: Vec<Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if pred(&lines) {
            return lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the tap never saw what was expected: {}", std::fs::read_to_string(log).unwrap_or_default());
}

fn long_calls(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["method"] == "tools/call" && l["params"]["name"] == "trigger-long-running-operation")
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_fails_the_call_and_comes_back_and_an_abort_cancels_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let tap_log = dir.path().join("tap.log");
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let long = json!({"duration": 120, "steps": 120}).to_string();
    let echo = json!({"message": "after the restart"}).to_string();
    fake.push(Reply::stream(script(
        f,
        &turn(vec![tool_call("k1", "mcp__everything__trigger-long-running-operation", &[&long])], (20, 5, 0)),
    )));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["The server died."])], (30, 3, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![tool_call("e1", "mcp__everything__echo", &[&echo])], (40, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Back."])], (50, 3, 0)))));
    fake.push(Reply::stream(script(
        f,
        &turn(vec![tool_call("k2", "mcp__everything__trigger-long-running-operation", &[&long])], (60, 5, 0)),
    )));
    let mcp = format!(
        "[mcp.servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"{}\", \"node\", \"{}\", \"stdio\"]\n",
        pincer_testkit::repo_root().join("tests/mcp/tap.mjs").display(),
        tap_log.display(),
        server_js("server-everything").display()
    );
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, &ws, &mcp)).await;
    let mut c = Client::connect(&gw.addr).await;

    // The server is killed while the call runs: an error result naming it, and the turn ends final;
    // clients are told it failed (`mcp.server`).
    let mut watcher = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "run it", "idempotencyKey": "r1"})).await.unwrap();
    let lines = tapped(&tap_log, |l| !long_calls(l).is_empty()).await;
    let pid = lines[0]["serverPid"].as_u64().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let k1 = tool_results(&file).into_iter().find(|r| r["toolCallId"] == "k1").unwrap();
    assert_eq!(k1["isError"], true, "{k1}");
    let text1 = result_text(&k1);
    assert!(
        text1.starts_with("MCP server everything stopped during the call to trigger-long-running-operation (the process exited (signal: 9 (SIGKILL))"),
        "{text1}"
    );
    check_request_against_pi(&file, &fake, 1);
    let failed = watcher.event(|e| e["event"] == "mcp.server" && e["payload"]["state"] == "failed").await;
    assert_eq!(failed["payload"]["id"], "everything");
    assert!(failed["payload"]["reason"].as_str().unwrap().contains("signal: 9"), "{failed}");

    // It is started again, and the next call works.
    for _ in 0..600 {
        let status = c.request("status", json!({})).await.unwrap();
        let s = &status["mcp"]["servers"][0];
        if s["state"] == "ready" && s["restarts"].as_u64() >= Some(1) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    send(&mut c, &gw, "again", "r2").await;
    let e1 = tool_results(&file).into_iter().find(|r| r["toolCallId"] == "e1").unwrap();
    assert_eq!((result_text(&e1), &e1["isError"]), ("Echo: after the restart", &json!(false)));
    check_request_against_pi(&file, &fake, 3);

    // An abort during a long call sends the server `notifications/cancelled` for that request.
    c.request("chat.send", json!({"sessionKey": "main", "message": "once more", "idempotencyKey": "r3"}))
        .await
        .unwrap();
    let before = long_calls(&tapped(&tap_log, |_| true).await).len();
    let lines = tapped(&tap_log, |l| long_calls(l).len() > before).await;
    let id = long_calls(&lines).last().unwrap()["id"].clone();
    c.request("chat.abort", json!({"sessionKey": "main", "runId": "r3"})).await.unwrap();
    let end = c.chat_end("r3").await;
    assert_eq!(end["payload"]["state"], "aborted", "{end}");
    let lines = tapped(&tap_log, |l| {
        l.iter().any(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == id)
    })
    .await;
    assert!(lines.iter().any(|m| m["method"] == "notifications/cancelled"));

    // A graceful stop ends the server's whole process group (the tap and the server under it),
    // though the server still runs the cancelled operation.
    let mut gw = gw;
    let status = tokio::task::spawn_blocking(move || gw.terminate()).await.unwrap();
    assert!(status.success(), "{status}");
    for pid in lines.iter().filter_map(|l| l["serverPid"].as_u64()) {
        // Gone, or a zombie waiting to be reaped (its parent, the tap, is gone too).
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        };
        for _ in 0..100 {
            if gone() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(gone(), "server {pid} outlived the gateway's stop");
    }
}

/// The official conformance suite (npm `@modelcontextprotocol/conformance`, pinned in tests/mcp) drives
/// Pincer's client (`pincer mcp`, through tests/mcp/conformance-client.sh) in its client scenarios
/// that need no OAuth: the handshake, a tool call, and an SSE stream closed mid-call that the client
/// must resume as the server's `retry` asks.
#[test]
fn the_conformance_suites_client_scenarios_pass() {
    // The suite needs Node 22 or later: the Node 24 scripts/test installs for OpenClaw's CLI.
    let node = pincer_testkit::repo_root().join("tests/openclaw-cli/node/node_modules/.bin/node");
    assert!(node.is_file(), "Node 24 is not installed at {}: run scripts/test", node.display());
    let suite = pincer_testkit::mcp_servers_dir().join("conformance/dist/index.js");
    let harness = pincer_testkit::repo_root().join("tests/mcp/conformance-client.sh");
    let dir = tempfile::tempdir().unwrap();
    for scenario in ["initialize", "tools_call", "sse-retry"] {
        let out = std::process::Command::new(&node)
            .arg(&suite)
            .args(["client", "--command", &format!("sh {}", harness.display()), "--scenario", scenario])
            .env("PINCER_BIN", BIN)
            .env("PINCER_LOG", "warn")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(said.contains("OVERALL: PASSED") && said.contains(" 0 failed, 0 warnings"), "{scenario}:\n{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_mcp_call_cut_by_a_crash_runs_again_when_the_turn_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let tap_log = dir.path().join("tap.log");
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    // readOnlyHint: true in server-everything: the resumed turn may run it again.
    let long = json!({"duration": 2, "steps": 2}).to_string();
    fake.push(Reply::stream(script(
        f,
        &turn(vec![tool_call("k1", "mcp__everything__trigger-long-running-operation", &[&long])], (20, 5, 0)),
    )));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Finished."])], (30, 3, 0)))));
    let mcp = format!(
        "[mcp.servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"{}\", \"node\", \"{}\", \"stdio\"]\n",
        pincer_testkit::repo_root().join("tests/mcp/tap.mjs").display(),
        tap_log.display(),
        server_js("server-everything").display()
    );
    let state = dir.path().join("state");
    let mut gw = start(&state, config(&fake, &ws, &mcp)).await;
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "run it", "idempotencyKey": "r1"})).await.unwrap();
    tapped(&tap_log, |l| !long_calls(l).is_empty()).await;
    drop(c);
    let gw = tokio::task::spawn_blocking(move || {
        gw.restart();
        gw
    })
    .await
    .unwrap();
    // The resumed turn calls the tool again (a second tools/call reaches the new server), and its
    // result is the one on disk.
    tapped(&tap_log, |l| long_calls(l).len() == 2).await;
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    for _ in 0..600 {
        if pincer_testkit::probe::read_rows(&file).iter().any(|r| r["message"]["stopReason"] == "stop") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let results = tool_results(&file);
    assert_eq!(results.len(), 1, "{results:?}\n{}", gw.log_text());
    assert_eq!(
        (result_text(&results[0]), &results[0]["isError"]),
        ("Long running operation completed. Duration: 2 seconds, Steps: 2.", &json!(false))
    );
    // The first server outlived the SIGKILLed gateway (server-everything does not exit when its
    // stdin closes; only a graceful stop ends a server's process group): end it here.
    for l in tapped(&tap_log, |_| true).await {
        if let Some(pid) = l["serverPid"].as_u64() {
            let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_extend_a_calls_timeout_and_silence_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let op = "mcp__everything__trigger-long-running-operation";
    // 4 s in all with a progress notification every 0.25 s: longer than the 2 s timeout, never silent.
    let chatty = json!({"duration": 4, "steps": 16}).to_string();
    // One step of 30 s: no progress before the timeout.
    let silent = json!({"duration": 30, "steps": 1}).to_string();
    fake.push(Reply::stream(script(f, &turn(vec![tool_call("p1", op, &[&chatty])], (20, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![tool_call("p2", op, &[&silent])], (30, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Done."])], (40, 3, 0)))));
    let mcp = format!(
        "[mcp.servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\ntimeout_secs = 2\n",
        server_js("server-everything").display()
    );
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, &ws, &mcp)).await;
    let mut c = Client::connect(&gw.addr).await;
    send(&mut c, &gw, "run both", "p").await;
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    let by_id = |id: &str| results.iter().find(|r| r["toolCallId"] == id).unwrap().clone();
    let p1 = by_id("p1");
    assert_eq!(
        (result_text(&p1), &p1["isError"]),
        ("Long running operation completed. Duration: 4 seconds, Steps: 16.", &json!(false))
    );
    let p2 = by_id("p2");
    assert_eq!(p2["isError"], true);
    assert_eq!(
        result_text(&p2),
        "MCP server everything: trigger-long-running-operation did not answer within 2 s of its last progress \
         (timeout_secs); the call was cancelled."
    );
    check_request_against_pi(&file, &fake, 2);
    // A graceful stop ends the server, which still runs the timed-out operation.
    let mut gw = gw;
    tokio::task::spawn_blocking(move || gw.terminate()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_may_be_destructive_waits_for_approval_and_a_read_only_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("notes.txt"), "kept\n").unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let read = json!({"path": ws.join("notes.txt")}).to_string();
    let write = json!({"path": ws.join("new.txt"), "content": "x"}).to_string();
    fake.push(Reply::stream(script(
        f,
        &turn(
            vec![tool_call("r1", "mcp__fs__read_file", &[&read]), tool_call("w1", "mcp__fs__write_file", &[&write])],
            (20, 5, 0),
        ),
    )));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Not written."])], (30, 3, 0)))));
    let mcp = format!(
        "[mcp.servers.fs]\ncommand = \"node\"\nargs = [\"{}\", \"{}\"]\n",
        server_js("server-filesystem").display(),
        ws.display()
    );
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, &ws, &mcp)).await;
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "write it", "idempotencyKey": "a1"})).await.unwrap();
    // write_file (destructiveHint) is asked about under the default policy; read_file is not.
    let ev = c.event(|e| e["event"] == "exec.approval.requested").await;
    let req = &ev["payload"]["request"];
    assert_eq!((&req["toolName"], &req["toolCallId"]), (&json!("mcp__fs__write_file"), &json!("w1")), "{ev}");
    let id = ev["payload"]["id"].as_str().unwrap().to_owned();
    c.request("exec.approval.resolve", json!({"id": id, "decision": "deny"})).await.unwrap();
    let end = c.chat_end("a1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    let by_id = |id: &str| results.iter().find(|r| r["toolCallId"] == id).unwrap().clone();
    assert_eq!(result_text(&by_id("r1")), "kept\n");
    let w1 = by_id("w1");
    assert_eq!(w1["isError"], true);
    assert!(result_text(&w1).starts_with("Denied by "), "{w1}");
    assert!(!ws.join("new.txt").exists(), "the denied call did not run");
    check_request_against_pi(&file, &fake, 1);
}
