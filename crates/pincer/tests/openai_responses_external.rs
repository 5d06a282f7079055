//! `/v1/responses` with real clients (the part of `openai_responses.rs` that needs the official
//! SDKs, the Codex CLI and the Pi oracle, so it builds only with the `external` feature): the
//! official Python and Node SDKs' `responses.create` (plain, streamed, chained with
//! `previous_response_id`, a branch from an older response, a client function tool round trip) with
//! the rows chained on disk and read back by the real Pi library; and the Codex CLI (npm
//! `@openai/codex`, installed by scripts/test in tests/codex) completing a task with its shell tool
//! run client-side, in a network namespace where only loopback is up.
#![allow(clippy::disallowed_methods)] // the test writes Codex's config file directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::TOKEN;
use pincer_testkit::oracle_context;
use pincer_testkit::probe::{message_text as text, read_rows, session_index};
use serde_json::{json, Value};
use std::path::Path;

#[path = "openai_responses/common.rs"]
mod common;
use common::*;

/// The sessions whose transcript holds a message saying `said`.
fn sessions_saying(state: &Path, said: &str) -> Vec<String> {
    session_keys(state)
        .into_iter()
        .filter(|k| read_rows(&transcript(state, k)).iter().any(|e| text(&e["message"]) == said))
        .collect()
}

fn messages(rows: &[Value]) -> Vec<&Value> {
    rows.iter().filter(|e| e["type"] == "message").collect()
}

/// The message a row's parent chain reaches first, skipping system prompt changes and leaf moves.
fn parent_message<'a>(rows: &'a [Value], row: &Value) -> Option<&'a Value> {
    let mut parent = row["parentId"].clone();
    loop {
        let p = rows.iter().find(|e| e["id"] == parent)?;
        if p["type"] == "message" {
            return Some(p);
        }
        parent = p["parentId"].clone();
    }
}

fn row_saying<'a>(rows: &'a [Value], role: &str, said: &str) -> &'a Value {
    let found: Vec<&Value> =
        messages(rows).into_iter().filter(|e| e["message"]["role"] == role && text(&e["message"]) == said).collect();
    assert_eq!(found.len(), 1, "one {role} row saying {said:?}: {rows:?}");
    found[0]
}

/// (role, text) of Pi's context of `file` at `leaf`.
fn pi_said(file: &Path, leaf: Option<&str>) -> Vec<(String, String)> {
    let pi = oracle_context(file, leaf);
    let list = pi["context"]["messages"].as_array().expect("Pi's context").clone();
    list.iter().map(|m| (m["role"].as_str().unwrap_or_default().to_owned(), text(m))).collect()
}

fn pairs(list: &[(&str, String)]) -> Vec<(String, String)> {
    list.iter().map(|(r, t)| (r.to_string(), t.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_chain_branch_and_retrieve_responses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, config(&fake, "")).await;
    for (prefix, program, script) in pincer_testkit::sdk_scripts("responses_test") {
        let report = pincer_testkit::sdk_report(&gw.addr, prefix, &program, &script).await;
        let said = |t: &str| format!("{prefix} {t}");

        // One session: one → two → three, and a branch from one's reply.
        let sessions = sessions_saying(&state, &said("one"));
        assert_eq!(sessions.len(), 1, "{prefix}: one session");
        let file = transcript(&state, &sessions[0]);
        let sid = session_index(&state, "main")[&sessions[0]]["sessionId"].as_str().expect("id").to_owned();
        assert!(report["r1"].as_str().expect("id").starts_with(&format!("resp_{sid}_")), "{report}");
        let rows = read_rows(&file);
        assert_eq!(messages(&rows).len(), 8, "each turn once: {rows:?}");
        let r1 = row_saying(&rows, "assistant", &reply(&said("one")));
        let r2 = row_saying(&rows, "assistant", &reply(&said("two")));
        let r3 = row_saying(&rows, "assistant", &reply(&said("three")));
        let r4 = row_saying(&rows, "assistant", &reply(&said("branch")));
        let parent = |row: &Value| parent_message(&rows, row).expect("a parent")["id"].clone();
        assert_eq!(parent(row_saying(&rows, "user", &said("two"))), r1["id"]);
        assert_eq!(parent(r2), row_saying(&rows, "user", &said("two"))["id"]);
        assert_eq!(parent(row_saying(&rows, "user", &said("three"))), r2["id"]);
        assert_eq!(parent(row_saying(&rows, "user", &said("branch"))), r1["id"], "the branch is a child of r1");
        assert_eq!(parent(r4), row_saying(&rows, "user", &said("branch"))["id"]);
        let whole = |list: &[&str]| -> Vec<(String, String)> {
            let mut v = Vec::new();
            for t in list {
                v.push(("user", said(t)));
                v.push(("assistant", reply(&said(t))));
            }
            pairs(&v)
        };
        // The real Pi library reads both branches, the active one being the last response's.
        assert_eq!(pi_said(&file, None), whole(&["one", "branch"]), "{prefix}: the active branch");
        assert_eq!(pi_said(&file, r3["id"].as_str()), whole(&["one", "two", "three"]), "{prefix}: the older branch");
        assert_eq!(oracle_context(&file, None)["leafId"], r4["id"]);
        // What the model was sent for each turn is Pi's context of the file at that turn's user row:
        // the branch's request holds "one" and its reply, not the other branch.
        for t in ["one", "two", "three", "branch"] {
            let user = row_saying(&rows, "user", &said(t));
            let pi = oracle_context(&file, user["id"].as_str());
            let want = pincer_testkit::wire::openai_messages(pi["context"]["messages"].as_array().expect("context"));
            let bodies = fake.requests();
            let sent = bodies
                .iter()
                .find(|b| pincer_testkit::fake_openai::last_user_text(b) == said(t))
                .expect("the turn's model call");
            // `instructions` is that response's system prompt only, as at OpenAI.
            let brief = sent["messages"][0]["role"] == "system" && text(&sent["messages"][0]) == "Be brief.";
            assert_eq!(brief, t == "one", "{prefix}: the system prompt of {t:?}: {sent}");
            let sent: Vec<Value> = pincer_testkit::wire::conversation(sent);
            assert_eq!(sent, want, "{prefix}: the model call of {t:?} = Pi's context");
        }

        // The tool conversation: the call's row, the client's output under it, the reply.
        let asked = said("tools [call:lookup]");
        let tooled = sessions_saying(&state, &asked);
        assert_eq!(tooled.len(), 1, "{prefix}: one session for the tool conversation");
        let file = transcript(&state, &tooled[0]);
        let rows = read_rows(&file);
        let msgs = messages(&rows);
        let got: Vec<(&str, String)> =
            msgs.iter().map(|e| (e["message"]["role"].as_str().expect("role"), text(&e["message"]))).collect();
        let want = [
            ("user", asked.clone()),
            ("assistant", String::new()),
            ("toolResult", said("looked up")),
            ("assistant", reply(&asked)),
        ];
        assert_eq!(got, want);
        assert_eq!(msgs[1]["message"]["clientToolCalls"], json!([report["call_id"]]));
        assert_eq!(msgs[2]["message"]["toolCallId"], report["call_id"]);
        assert_eq!(msgs[2]["message"]["toolName"], "lookup");
        for pair in msgs.windows(2) {
            assert_eq!(parent_message(&rows, pair[1]).expect("parent")["id"], pair[0]["id"], "chained: {}", pair[1]);
        }
        assert_eq!(pi_said(&file, None), pairs(&want));

        // store: false was answered and kept nowhere.
        assert!(sessions_saying(&state, &said("unstored")).is_empty(), "{prefix}: nothing of an unstored response");
        assert!(fake.requests().iter().any(|r| r.to_string().contains(&said("unstored"))));
    }
    assert_eq!(session_keys(&state).len(), 4, "one session per SDK conversation");
}

/// Codex's config for Pincer as a custom model provider speaking the Responses API: the README's
/// ```` ```toml codex ```` block as it is, but for the gateway's address (so the README cannot drift).
fn codex_config(addr: &str) -> String {
    let readme = std::fs::read_to_string(pincer_testkit::repo_root().join("README.md")).expect("README");
    let block = readme.split("```toml codex\n").nth(1).and_then(|b| b.split("```").next()).expect("the Codex block");
    assert!(block.contains("wire_api = \"responses\"") && block.contains("127.0.0.1:18789"), "{block}");
    block.replace("127.0.0.1:18789", addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_codex_cli_completes_a_task_with_its_shell_tool_run_client_side() {
    let codex = pincer_testkit::codex_bin();
    // Codex runs without any network but loopback (no login, no update check, no model list).
    let name = "the_codex_cli_completes_a_task_with_its_shell_tool_run_client_side";
    if !tokio::task::block_in_place(|| pincer_testkit::netns::run_inside(name, &[])) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let (home, work) = (dir.path().join("codex-home"), dir.path().join("work"));
    std::fs::create_dir_all(&home).expect("codex home");
    std::fs::create_dir_all(&work).expect("work dir");
    let fake = FakeOpenAi::start().await;
    let gw = start(&state, config(&fake, "")).await;
    std::fs::write(home.join("config.toml"), codex_config(&gw.addr)).expect("codex config");

    let task = "Write codex.txt here [exec]";
    let out = tokio::process::Command::new(&codex)
        .args(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", task])
        .current_dir(&work)
        .env("CODEX_HOME", &home)
        .env("PINCER_API_KEY", TOKEN)
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run codex");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "codex exec: {stdout}\n{stderr}\n{}", gw.log_text());
    // Codex ran the command the model asked for, in its working directory, and printed the answer.
    assert_eq!(std::fs::read_to_string(work.join("codex.txt")).expect("codex.txt written"), "made by codex");
    assert!(stdout.contains(&reply(task)), "the final answer: {stdout}\n{stderr}");

    // The session holds the task, the shell call, its output under it and the answer, chained.
    let sessions = sessions_saying(&state, task);
    assert_eq!(sessions.len(), 1, "one session: {:?}", session_keys(&state));
    let file = transcript(&state, &sessions[0]);
    let rows = read_rows(&file);
    let msgs = messages(&rows);
    let roles: Vec<&str> = msgs.iter().map(|e| e["message"]["role"].as_str().expect("role")).collect();
    assert_eq!(roles, ["user", "user", "assistant", "toolResult", "assistant"], "{rows:?}");
    let call = &msgs[2]["message"];
    assert_eq!(call["clientToolCalls"], json!(["call_exec"]), "{call}");
    let block = call["content"].as_array().expect("blocks").iter().find(|b| b["type"] == "toolCall").expect("call");
    assert_eq!(
        (&block["name"], &block["arguments"]["cmd"]),
        (&json!("exec_command"), &json!(pincer_testkit::fake_openai::EXEC_COMMAND))
    );
    let result = &msgs[3]["message"];
    assert_eq!(result["toolCallId"], "call_exec");
    assert!(text(result).contains("wrote codex.txt"), "the command's output: {result}");
    assert_eq!(text(&msgs[4]["message"]), reply(task));
    for pair in msgs.windows(2) {
        assert_eq!(parent_message(&rows, pair[1]).expect("parent")["id"], pair[0]["id"], "chained: {}", pair[1]);
    }
    // The real Pi library reads the same conversation.
    let pi = pi_said(&file, None);
    assert_eq!(pi.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(), roles);
    // Codex's own tools were offered to the model as the client's.
    let offered = fake.requests()[0]["tools"].to_string();
    assert!(offered.contains("\"exec_command\""), "{offered}");
}
