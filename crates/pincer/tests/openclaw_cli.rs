//! OpenClaw 2026.9.6's own CLI against the real `pincer gateway`, on a loopback-only network
//! namespace (see `pincer_testkit::openclaw`): `openclaw agent -m hi --json` prints the fake
//! provider's reply and the turn is on disk, chained; `openclaw gateway call status`, `openclaw
//! logs` (Pincer's log ring) and `openclaw sessions archive KEY` succeed; `openclaw tui` streams a
//! reply, aborts one, and shows a running `bash` call's card with its output growing, then its result;
//! a `bash` call waiting for approval shows OpenClaw's approval-pending text, and `/approve <code>`
//! typed in the TUI runs it once; the TUI is idle after each instant reply even when it reads late.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print the pane

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{GatewayProcess, TOKEN};
use pincer_testkit::late_reader::LateReader;
use pincer_testkit::openclaw;
use pincer_testkit::probe::{message_text as text, read_rows, transcript_path};
use pretty_assertions::assert_eq;
use serde_json::Value;
use std::time::Duration;

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

    // The CLI's other views of a gateway: each answers from Pincer (not a local fallback), as JSON.
    let url = format!("ws://{}", gw.addr);
    let probe = run_ok(&home, &gw, &["gateway", "probe", "--url", &url, "--token", TOKEN, "--json"]);
    let v: Value = serde_json::from_str(probe.trim()).unwrap_or_else(|e| panic!("{e}: {probe}"));
    assert_eq!((v["ok"].as_bool(), v["targets"][0]["connect"]["rpcOk"].as_bool()), (Some(true), Some(true)), "{v:#}");
    for (args, key) in [
        (&["devices", "list", "--json"][..], "paired"),
        (&["nodes", "status", "--json"][..], "nodes"),
        (&["cron", "list", "--json"][..], "jobs"),
        (&["channels", "status", "--json"][..], "channels"),
    ] {
        let out = run_ok(&home, &gw, args);
        let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
        assert!(v.get(key).is_some(), "{args:?}: {v:#}");
    }
    let presence = run_ok(&home, &gw, &["system", "presence", "--json"]);
    assert!(presence.contains("pincer"), "{presence}");

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

/// The status line's token gauge, e.g. `tokens 182/32k (1%)`.
fn token_gauge(screen: &str) -> String {
    let at = screen.find("tokens ").unwrap_or_else(|| panic!("no token gauge on the screen:\n{screen}"));
    screen[at..].split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

#[test]
fn openclaw_tui_streams_a_reply_aborts_and_shows_no_error() {
    if !openclaw::in_loopback_namespace("openclaw_tui_streams_a_reply_aborts_and_shows_no_error") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let tui = openclaw::Tui::start(&dir.path().join("home"), &gw.addr, TOKEN, "main");
    tui.wait_for("gateway connected");

    tui.send(&["hello tui", "Enter"]);
    let screen = tui.wait_for("Fake reply: you said \"hello tui\"");
    let file = transcript_path(&gw.state_dir, "agent:main:main").expect("transcript");
    let rows = read_rows(&file);
    assert_eq!((text(&rows[1]["message"]), text(&rows[2]["message"])), ("hello tui".into(), screen_line(&screen)));
    assert_eq!(rows[2]["parentId"], rows[1]["id"]);
    // Once the TUI is idle again (it refuses a new message while busy), the gauge shows the context
    // the provider reported, against the model's window (it reads `?/32k` until the row is refreshed).
    let gauge = tui.wait_until("idle with a token count", |s| {
        s.contains("| idle") && s.contains("/32k") && !token_gauge(s).contains('?')
    });
    let tokens = token_gauge(&gauge);
    assert!(!tokens.starts_with("tokens 0/"), "{tokens}");

    // A long reply streams word by word; Esc aborts it; the partial is kept, chained.
    tui.send(&["a long one [slow]", "Enter"]);
    tui.wait_for("word3 ");
    tui.send(&["Escape"]);
    let screen = tui.wait_for("run aborted");
    let rows = read_rows(&file);
    let partial = rows.last().expect("rows");
    // Kept as OpenClaw keeps an aborted run's partial: an injected assistant message marked aborted.
    assert_eq!(partial["message"]["openclawAbort"]["aborted"], true, "{partial:#}");
    assert!(text(&partial["message"]).starts_with("word0 word1 word2 word3"), "{partial:#}");
    assert_eq!(partial["parentId"], rows[rows.len() - 2]["id"]);
    assert_eq!(text(&rows[rows.len() - 2]["message"]), "a long one [slow]");
    // Nothing on the screen reports a failure, and the gauge still shows the last complete turn.
    let lower = screen.to_lowercase();
    for bad in ["error", "failed", "unknown method", "disconnected"] {
        assert!(!lower.contains(bad), "the TUI shows {bad:?}:\n{screen}");
    }
    assert_eq!(token_gauge(&screen), tokens, "{screen}");
}

#[test]
fn openclaw_tui_shows_bash_output_while_it_runs_then_the_result() {
    if !openclaw::in_loopback_namespace("openclaw_tui_shows_bash_output_while_it_runs_then_the_result") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    // bash runs without asking (approvals have their own tests).
    let gw = GatewayProcess::start(
        BIN,
        &dir.path().join("state"),
        &format!("{}tools.approval = \"allow\"\n", fake.gateway_toml()),
    );
    let tui = openclaw::Tui::start(&dir.path().join("home"), &gw.addr, TOKEN, "main");
    tui.wait_for("gateway connected");
    verbose_full(&tui);

    // The fake asks for `bash` printing line-1 … line-5, 0.4 s apart (its `[bash]` marker).
    tui.send(&["count for me [bash]", "Enter"]);
    let running = tui.wait_until("the bash card running with its first output", |s| {
        s.contains("(running)") && s.contains("line-1") && !s.contains("line-5")
    });
    println!("the pane while bash runs:\n{running}");
    let done = tui.wait_for("Fake reply: you said \"count for me [bash]\"");
    println!("the pane after the reply:\n{done}");
    assert!(!done.contains("(running)"), "the card still runs:\n{done}");
    let card: Vec<&str> = done.lines().filter(|l| l.trim_start().starts_with("line-")).map(str::trim).collect();
    assert_eq!(card, ["line-1", "line-2", "line-3", "line-4", "line-5"], "{done}");
    let lower = done.to_lowercase();
    for bad in ["error", "failed", "unknown method", "disconnected"] {
        assert!(!lower.contains(bad), "the TUI shows {bad:?}:\n{done}");
    }
}

#[test]
fn openclaw_tui_shows_a_waiting_bash_call_and_approve_from_it_runs_the_command_once() {
    if !openclaw::in_loopback_namespace(
        "openclaw_tui_shows_a_waiting_bash_call_and_approve_from_it_runs_the_command_once",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    // `bash` under the default policy: `ask`.
    let gw = GatewayProcess::start(BIN, &dir.path().join("state"), &fake.gateway_toml());
    let tui = openclaw::Tui::start(&dir.path().join("home"), &gw.addr, TOKEN, "main");
    tui.wait_for("gateway connected");
    verbose_full(&tui);

    // The fake asks for `bash` running `echo approved >> approved.log` (its `[approve]` marker).
    tui.send(&["write it down [approve]", "Enter"]);
    let waiting = tui.wait_for("Reply with: /approve ");
    println!("the pane while the call waits:\n{waiting}");
    assert!(waiting.contains("Approval required (id "), "{waiting}");
    assert!(waiting.contains("echo approved >> approved.log"), "{waiting}");
    let ws = dir.path().join("state/workspace/main");
    assert!(!ws.join("approved.log").exists(), "nothing ran while it waits");
    let slug = waiting
        .split("Reply with: /approve ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the short code")
        .to_owned();
    assert_eq!(slug.len(), 8, "{waiting}");

    // Answered from the TUI's own composer, with the short code it showed.
    let approve = format!("/approve {slug} allow-once");
    tui.send(&[&approve]);
    // Enter once the editor shows the whole command (its slash-command completion reads what was
    // typed; an Enter racing the typing on a loaded machine was taken before the text).
    tui.wait_until("the command typed in the editor", |s| s.lines().any(|l| l.trim() == approve));
    tui.send(&["Enter"]);
    let done = tui.wait_for("Fake reply: you said \"write it down [approve]\"");
    println!("the pane after the reply:\n{done}");
    assert_eq!(std::fs::read_to_string(ws.join("approved.log")).expect("the command ran"), "approved\n", "once");
    let file = transcript_path(&dir.path().join("state"), "agent:main:main").expect("transcript");
    let rows = read_rows(&file);
    let results: Vec<&Value> = rows.iter().filter(|r| r["message"]["role"] == "toolResult").collect();
    assert_eq!(results.len(), 1, "{rows:#?}");
    assert_eq!(results[0]["message"]["isError"], false, "{}", results[0]);
    let decision = rows.iter().find(|r| r["customType"] == "pincer.approval-decision").expect("the decision on disk");
    assert_eq!(decision["data"]["decision"], "allow-once");
    let lower = done.to_lowercase();
    for bad in ["unknown or expired", "failed", "unknown method", "disconnected"] {
        assert!(!lower.contains(bad), "the TUI shows {bad:?}:\n{done}");
    }
}

/// OpenClaw's TUI takes a run's events as its own once it has handled the `chat.send` ack. It reads
/// what arrived together in one go and handles every frame before its code after the awaited ack
/// resumes: given the ack and an instant reply's whole run in one read, it handled the final first,
/// then waited ("twiddling thumbs…") for a run that had ended, and refused the next message. Here a
/// proxy holds what the gateway sends for a moment after its first byte, as a busy machine would,
/// and the model answers at once: each of three messages must be answered and the TUI idle again.
#[test]
fn openclaw_tui_is_idle_after_each_instant_reply_when_it_reads_late() {
    if !openclaw::in_loopback_namespace("openclaw_tui_is_idle_after_each_instant_reply_when_it_reads_late") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let late = LateReader::start(&gw.addr, Duration::from_millis(300));
    let tui = openclaw::Tui::start(&dir.path().join("home"), &late.addr, TOKEN, "main");
    tui.wait_for("gateway connected");
    for word in ["first", "second", "third"] {
        tui.send(&[word]);
        tui.wait_until("the message typed in the editor", |s| s.lines().any(|l| l.trim() == word));
        tui.send(&["Enter"]);
        let reply = format!("Fake reply: you said \"{word}\"");
        tui.wait_until(&format!("the reply to {word:?}, then idle"), |s| s.contains(&reply) && s.contains("| idle"));
    }
    let file = transcript_path(&gw.state_dir, "agent:main:main").expect("transcript");
    let rows = read_rows(&file);
    let texts: Vec<String> = rows[1..].iter().map(|r| text(&r["message"])).collect();
    let said = |w: &str| format!("Fake reply: you said \"{w}\"");
    assert_eq!(
        texts,
        ["first".to_owned(), said("first"), "second".into(), said("second"), "third".into(), said("third")]
    );
    for pair in rows[1..].windows(2) {
        assert_eq!(pair[1]["parentId"], pair[0]["id"], "{rows:#?}");
    }
}

/// A first turn, then `/verbose full`: OpenClaw's TUI shows tool output at verbose `full`, a setting
/// of the session (patched through the gateway once the session exists: Pincer's `sessions.patch`
/// refuses an unknown one).
fn verbose_full(tui: &openclaw::Tui) {
    tui.send(&["hello", "Enter"]);
    tui.wait_until("the first reply, idle", |s| s.contains("Fake reply: you said \"hello\"") && s.contains("| idle"));
    tui.send(&["/verbose full"]);
    tui.wait_for("/verbose full"); // typed in full before Enter (see the /approve test)
    tui.send(&["Enter"]);
    tui.wait_for("| verbose full |"); // the status line
}

/// The line of `screen` that holds the fake's first reply.
fn screen_line(screen: &str) -> String {
    screen.lines().find(|l| l.starts_with("Fake reply")).map(|l| l.trim_end().to_owned()).unwrap_or_default()
}

#[test]
fn a_state_dir_written_by_openclaw_2026_5_28_continues_on_pincer() {
    if !openclaw::in_loopback_namespace("a_state_dir_written_by_openclaw_2026_5_28_continues_on_pincer") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let home = dir.path().join("home");
    let state = home.join(".openclaw");
    std::fs::create_dir_all(&state).expect("state");
    std::fs::write(state.join("openclaw.json"), openclaw::fake_model_config(&fake.base_url()).to_string())
        .expect("config");

    // OpenClaw 2026.5.28's own embedded run writes the session: its transcript and its index entry.
    let out =
        openclaw::run_2026_5_28(&home, &["agent", "--local", "--agent", "main", "-m", "hello from 5.28", "--json"]);
    let v = stdout_json(&out);
    assert_eq!(v["payloads"][0]["text"], "Fake reply: you said \"hello from 5.28\"", "{v:#}");
    let index: Value =
        serde_json::from_slice(&std::fs::read(state.join("agents/main/sessions/sessions.json")).expect("index"))
            .expect("sessions.json");
    let entry = &index["agent:main:main"];
    // OpenClaw's shape: a bare model id and its provider apart.
    assert_eq!((entry["model"].as_str(), entry["modelProvider"].as_str()), (Some("fake-model"), Some("fake")));
    let file = transcript_path(&state, "agent:main:main").expect("transcript");
    let written = std::fs::read(&file).expect("transcript");
    let before = read_rows(&file);
    let leaf = before.last().expect("rows")["id"].as_str().expect("leaf id").to_owned();

    // Pincer on that state dir: chat.send continues the session, chained after OpenClaw's leaf.
    let gw = GatewayProcess::start(BIN, &state, &fake.gateway_toml());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let end = rt.block_on(async {
        let mut c = pincer_testkit::gateway::Client::connect(&gw.addr).await;
        let r = c
            .request(
                "chat.send",
                serde_json::json!({"sessionKey": "main", "message": "and now on Pincer", "idempotencyKey": "p1"}),
            )
            .await
            .expect("chat.send");
        c.chat_end(r["runId"].as_str().expect("runId")).await
    });
    assert_eq!(end["payload"]["state"], "final", "{end:#}");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), before.len() + 2, "{rows:#?}");
    let (user, reply) = (&rows[before.len()], &rows[before.len() + 1]);
    assert_eq!((user["parentId"].as_str(), text(&user["message"])), (Some(leaf.as_str()), "and now on Pincer".into()));
    assert_eq!(reply["parentId"], user["id"]);
    assert_eq!(text(&reply["message"]), "Fake reply: you said \"and now on Pincer\"");
    // OpenClaw's lines are kept byte for byte; the request carried OpenClaw's turn as context.
    assert_eq!(&std::fs::read(&file).expect("transcript")[..written.len()], &written[..]);
    let request = fake.requests().last().cloned().expect("a request");
    let said: Vec<String> = (request["messages"].as_array().expect("messages").iter())
        .filter(|m| m["role"] != "system")
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or(""), text(m)))
        .collect();
    assert_eq!(
        said,
        ["user: hello from 5.28", "assistant: Fake reply: you said \"hello from 5.28\"", "user: and now on Pincer"],
        "{request:#}"
    );
    // The real Pi library opens the file both programs wrote, without rewriting it, and its leaf
    // is Pincer's reply.
    let pi = pincer_testkit::oracle::context(&file, None);
    assert_eq!((pi["leafId"].as_str(), pi["extra"]["rewrittenOnOpen"].as_bool()), (reply["id"].as_str(), Some(false)));
    let pi_said: Vec<String> = (pi["context"]["messages"].as_array().expect("messages").iter())
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or(""), text(m)))
        .collect();
    assert_eq!(pi_said[..3], said[..], "{pi:#}");
    assert_eq!(pi_said.len(), 4, "{pi_said:?}");
}
