//! The CLI as a user meets it, through real processes: `pincer sessions list` and `pincer
//! transcript history` print tables (titles, local dates, counts; snapshot-tested) with `--table`
//! or on a terminal, fitted to its width, and JSON with `--json` or into a pipe; a closed pipe ends
//! a command quietly; every transcript command takes `--session KEY`, and the read-only ones need
//! no provider key; unknown message roles are refused by `append` and flagged by `verify`. The
//! state dir is a fixture with fixed ids and times; TZ=UTC.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const T0: i64 = 1_764_600_000_000; // 2025-12-01T14:40:00Z

fn row(id: &str, parent: Option<&str>, message: Value) -> Value {
    json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2025-12-01T14:40:00.000Z", "message": message})
}

fn write_transcript(path: &Path, session_id: &str, rows: &[Value]) {
    let mut text = json!({"type": "session", "version": 3, "id": session_id, "timestamp": "2025-12-01T14:40:00.000Z", "cwd": "/tmp"})
        .to_string();
    for r in rows {
        text.push('\n');
        text.push_str(&r.to_string());
    }
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let usage = json!({"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}});
    let reply = |text: &str, ts: i64| {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}], "api": "openai-completions",
            "provider": "local", "model": "llama3.2", "usage": usage, "stopReason": "stop", "timestamp": ts})
    };
    write_transcript(
        &sessions.join("11111111-1111-4111-8111-111111111111.jsonl"),
        "11111111-1111-4111-8111-111111111111",
        &[
            row(
                "a1",
                None,
                json!({"role": "user", "content": "What is in notes.txt?\nPlease   look.", "timestamp": T0}),
            ),
            row(
                "a2",
                Some("a1"),
                json!({"role": "assistant", "content": [
                {"type": "text", "text": "Let me read it."},
                {"type": "toolCall", "id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}],
                "api": "openai-completions", "provider": "local", "model": "llama3.2", "usage": usage,
                "stopReason": "toolUse", "timestamp": T0 + 1000}),
            ),
            row(
                "a3",
                Some("a2"),
                json!({"role": "toolResult", "toolCallId": "c1", "toolName": "read_file",
                "content": [{"type": "text", "text": "buy milk"}], "isError": false, "timestamp": T0 + 1500}),
            ),
            row("a4", Some("a3"), reply("It says: buy milk.", T0 + 2000)),
        ],
    );
    write_transcript(
        &sessions.join("22222222-2222-4222-8222-222222222222.jsonl"),
        "22222222-2222-4222-8222-222222222222",
        &[
            row(
                "b1",
                None,
                json!({"role": "user", "content": "Plan a trip to Lisbon in three days, with a long list of museums to see", "timestamp": T0 + 3_600_000}),
            ),
            row("b2", Some("b1"), reply("Day 1: Belém.", T0 + 3_601_000)),
        ],
    );
    let index = json!({
        "agent:main:main": {"sessionId": "11111111-1111-4111-8111-111111111111", "updatedAt": T0 + 2000},
        "agent:main:trip": {"sessionId": "22222222-2222-4222-8222-222222222222", "updatedAt": T0 + 3_601_000, "label": "Lisbon"},
        "agent:main:old": {"sessionId": "33333333-3333-4333-8333-333333333333", "updatedAt": T0 - 86_400_000, "archivedAt": T0},
    });
    std::fs::write(sessions.join("sessions.json"), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    dir
}

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env("TZ", "UTC").env_remove("PINCER_STATE_DIR").env_remove("COLUMNS");
    c
}

fn run(args: &[&str]) -> Output {
    command(args).output().unwrap()
}

fn pincer(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.success(), "pincer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `args` with stdout a pipe nobody reads: closed at once, or after the first line as `| head -1`
/// does. Returns the exit code and stderr.
fn into_closed_pipe(args: &[&str], read_first_line: bool) -> (Option<i32>, String) {
    use std::io::BufRead;
    let mut child = command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    if read_first_line {
        let mut first = String::new();
        std::io::BufReader::new(stdout).read_line(&mut first).unwrap();
        assert!(!first.is_empty(), "pincer {args:?} printed nothing");
    } else {
        drop(stdout);
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

const MAIN_FILE: &str = "agents/main/sessions/11111111-1111-4111-8111-111111111111.jsonl";

#[test]
fn sessions_list_prints_a_table_or_json() {
    let dir = state_dir();
    let state = dir.path().to_str().unwrap();
    insta::assert_snapshot!("sessions_list_table", pincer(&["sessions", "list", "--table", "--state-dir", state]));
    // Into a pipe without a flag, and with --json: JSON with every field of the index row.
    for args in [&["sessions", "list", "--state-dir", state][..], &["sessions", "list", "--json", "--state-dir", state]]
    {
        let v: Value = serde_json::from_str(&pincer(args)).unwrap();
        let keys: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
        assert_eq!(keys, ["agent:main:trip", "agent:main:main", "agent:main:old"]);
        assert_eq!(v[0]["label"], "Lisbon");
        assert!(v[0]["path"].as_str().unwrap().ends_with("22222222-2222-4222-8222-222222222222.jsonl"));
    }
}

#[test]
fn transcript_history_prints_a_table_or_json() {
    let dir = state_dir();
    let file = dir.path().join("agents/main/sessions/11111111-1111-4111-8111-111111111111.jsonl");
    let file = file.to_str().unwrap();
    insta::assert_snapshot!("transcript_history_table", pincer(&["transcript", "history", file, "--table"]));
    let v: Value = serde_json::from_str(&pincer(&["transcript", "history", file])).unwrap();
    assert_eq!(v["sessionId"], "11111111-1111-4111-8111-111111111111");
    assert_eq!(v["messages"].as_array().unwrap().len(), 4);
    let json: Value = serde_json::from_str(&pincer(&["transcript", "history", file, "--json"])).unwrap();
    assert_eq!(json, v);
}

#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    let dir = state_dir();
    let state = dir.path().to_str().unwrap();
    // Enough sessions that the listing is far larger than a pipe's buffer.
    let index: serde_json::Map<String, Value> = (0..3000)
        .map(|i| {
            (
                format!("agent:main:s{i:04}"),
                json!({"sessionId": format!("{i:08}-0000-4000-8000-000000000000"), "updatedAt": T0 + i}),
            )
        })
        .collect();
    std::fs::write(dir.path().join("agents/main/sessions/sessions.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let big = dir.path().join("big.jsonl");
    let rows: Vec<Value> = (0..2000)
        .map(|i| {
            let parent = (i > 0).then(|| format!("m{}", i - 1));
            row(
                &format!("m{i}"),
                parent.as_deref(),
                json!({"role": "user", "content": "milk ".repeat(40), "timestamp": T0 + i}),
            )
        })
        .collect();
    write_transcript(&big, "44444444-4444-4444-8444-444444444444", &rows);
    let big = big.to_str().unwrap();
    let cases: [&[&str]; 6] = [
        &["sessions", "list", "--state-dir", state],
        &["sessions", "list", "--table", "--state-dir", state],
        &["sessions", "search", "milk", "--state-dir", state],
        &["transcript", "export", big, "--format", "jsonl"],
        &["transcript", "history", big, "--limit", "1000"],
        &["transcript", "context", big],
    ];
    for args in cases {
        for read_first_line in [false, true] {
            let (code, stderr) = into_closed_pipe(args, read_first_line);
            assert_eq!((code, stderr.as_str()), (Some(0), ""), "pincer {args:?} (first line read: {read_first_line})");
        }
    }
}

#[test]
fn every_transcript_command_takes_a_session_key_and_read_only_ones_need_no_provider_key() {
    let dir = state_dir();
    let state = dir.path().to_str().unwrap();
    // A provider whose key is not in the environment: the gateway refuses to start without it.
    std::fs::write(
        dir.path().join("pincer.toml"),
        "[models.providers.cloud]\napi = \"openai-completions\"\nbase_url = \"https://api.example.com/v1\"\n\
         api_key_env = \"PINCER_CLI_TEST_UNSET_KEY\"\nmodels = [{ id = \"big\" }]\n",
    )
    .unwrap();
    let refused = run(&["gateway", "--print-url", "--state-dir", state]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("PINCER_CLI_TEST_UNSET_KEY"), "{refused:?}");
    let file = dir.path().join(MAIN_FILE);
    let bytes = std::fs::read(&file).unwrap();
    let session = |cmd: &str, rest: &[&str]| {
        let mut args = vec!["transcript", cmd, "--session", "main", "--state-dir", state];
        args.extend_from_slice(rest);
        pincer(&args)
    };
    assert_eq!(session("export", &[]).as_bytes(), &bytes[..], "export --session gives the file as JSONL");
    assert!(session("export", &["--format", "md"]).contains("It says: buy milk."));
    let history: Value = serde_json::from_str(&session("history", &[])).unwrap();
    assert_eq!(history["messages"].as_array().unwrap().len(), 4);
    assert_eq!(
        history,
        serde_json::from_str::<Value>(&pincer(&["transcript", "history", file.to_str().unwrap()])).unwrap()
    );
    let context: Value = serde_json::from_str(&session("context", &[])).unwrap();
    assert_eq!(context["leafId"], "a4");
    let verify: Value = serde_json::from_str(&session("verify", &["--json"])).unwrap();
    assert_eq!(verify["healthy"], true, "{verify}");
    assert!(session("repair", &[]).contains("nothing to repair"));
    // The full key works as well as the short one; --config names the file explicitly.
    let config = dir.path().join("pincer.toml");
    let full = pincer(&[
        "transcript",
        "export",
        "--session",
        "agent:main:trip",
        "--config",
        config.to_str().unwrap(),
        "--state-dir",
        state,
    ]);
    assert!(full.contains("Day 1: Belém."));
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "read-only commands changed the transcript");
    // An unknown key: the cause first, then where to look.
    let unknown = run(&["transcript", "history", "--session", "nope", "--state-dir", state]);
    assert_eq!(unknown.status.code(), Some(2));
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(err.starts_with("pincer: no session \"nope\""), "{err}");
    assert!(err.contains("pincer sessions list"), "{err}");
    // FILE and --session exclude each other.
    assert_eq!(run(&["transcript", "verify", file.to_str().unwrap(), "--session", "main"]).status.code(), Some(2));
}

#[test]
fn append_refuses_an_unknown_role_and_verify_flags_one() {
    let dir = state_dir();
    let file = dir.path().join(MAIN_FILE);
    let path = file.to_str().unwrap();
    let before = std::fs::read(&file).unwrap();
    let out = run(&["transcript", "append", path, "--message", r#"{"role":"robot","content":"beep","timestamp":0}"#]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("pincer: unknown role \"robot\""), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "nothing may be written");
    // Each role Pi knows is accepted (here through --session).
    let state = dir.path().to_str().unwrap();
    let ok = pincer(&[
        "transcript",
        "append",
        "--session",
        "main",
        "--state-dir",
        state,
        "--message",
        r#"{"role":"user","content":"hi","timestamp":0}"#,
    ]);
    assert_eq!(serde_json::from_str::<Value>(&ok).unwrap()["parentId"], "a4");
    // A file written by something else with such a role: verify says so and exits 1.
    let mut text = std::fs::read_to_string(&file).unwrap();
    let id = serde_json::from_str::<Value>(&ok).unwrap()["id"].as_str().unwrap().to_owned();
    text.push_str(&row("r1", Some(&id), json!({"role": "robot", "content": "beep", "timestamp": 0})).to_string());
    text.push('\n');
    std::fs::write(&file, text).unwrap();
    let verify = run(&["transcript", "verify", path]);
    assert_eq!(verify.status.code(), Some(1), "{verify:?}");
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(report.contains("line 7: [unknown-role] message role \"robot\""), "{report}");
    let json: Value = serde_json::from_slice(&run(&["transcript", "verify", path, "--json"]).stdout).unwrap();
    assert_eq!(json["problems"][0]["kind"], "unknown-role", "{json}");
}

#[test]
fn an_unknown_log_format_is_refused_by_name() {
    let out =
        command(&["sessions", "list", "--state-dir", "/nonexistent"]).env("PINCER_LOG_FORMAT", "xml").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("pincer: PINCER_LOG_FORMAT=\"xml\" is not `text` or `json`"), "{err}");
}

#[test]
fn tables_fit_the_terminal_width() {
    let dir = state_dir();
    let state = dir.path().to_str().unwrap();
    let file = dir.path().join(MAIN_FILE);
    for (args, width) in [
        (vec!["sessions", "list", "--table", "--state-dir", state], 100),
        (vec!["transcript", "history", file.to_str().unwrap(), "--table"], 60),
    ] {
        let wide = pincer(&args);
        assert!(wide.lines().any(|l| l.chars().count() > width), "the fixture must be wider than {width}:\n{wide}");
        let out = command(&args).env("COLUMNS", width.to_string()).output().unwrap();
        let narrow = String::from_utf8(out.stdout).unwrap();
        assert!(narrow.lines().all(|l| l.chars().count() <= width), "wider than {width}:\n{narrow}");
        assert!(narrow.contains('…'), "{narrow}");
        assert_eq!(narrow.lines().count(), wide.lines().count());
    }
}

#[test]
fn doctor_checks_the_config_providers_hook_state_dir_and_store() {
    use std::os::unix::fs::PermissionsExt;
    let dir = state_dir();
    let state = dir.path().to_str().unwrap();
    let fake = pincer_testkit::fake_openai::FakeOpenAi::start_in_thread();
    let config = dir.path().join("pincer.toml");
    let doctor = |toml: &str| {
        std::fs::write(&config, toml).unwrap();
        let out = run(&["doctor", "--state-dir", state]);
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };
    // A reachable provider, one that is down, and a hook whose program is missing.
    let down = "[models.providers.down]\napi = \"openai-completions\"\nbase_url = \"http://127.0.0.1:9/v1\"\n";
    let hook = |program: &str| format!("[hooks.before_agent_run]\ncommand = [\"{program}\"]\n");
    let (code, text) = doctor(&format!("{}{down}{}", fake.gateway_toml(), hook("/nonexistent/my-policy")));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("ok    provider fake: openai-completions at http://"), "{text}");
    assert!(text.contains("FAIL  provider down: http://127.0.0.1:9/v1 is unreachable"), "{text}");
    assert!(text.contains("FAIL  hook: hooks.before_agent_run: /nonexistent/my-policy does not exist"), "{text}");
    assert!(text.contains(&format!("ok    state dir: {state} (writable)")), "{text}");
    assert!(text.contains("ok    store: JSONL files in") && text.contains(": 3 session(s)"), "{text}");
    // All well: a hook that exists and is executable.
    let policy = dir.path().join("policy");
    std::fs::write(&policy, "#!/bin/sh\necho '{}'\n").unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, text) = doctor(&format!("{}{}", fake.gateway_toml(), hook(policy.to_str().unwrap())));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ok    hook:") && text.contains("ok    model: fake/fake-model"), "{text}");
    // A key that is not in the environment: said, and the other checks still run.
    let (code, text) = doctor(
        "[models.providers.cloud]\napi = \"openai-completions\"\nbase_url = \"https://api.example.com/v1\"\n\
         api_key_env = \"PINCER_CLI_TEST_UNSET_KEY\"\n",
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL  providers:") && text.contains("PINCER_CLI_TEST_UNSET_KEY"), "{text}");
    assert!(text.contains("ok    store:"), "{text}");
}
