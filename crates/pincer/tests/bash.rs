//! Pi's `bash` tool through the real gateway, sandboxed by bubblewrap: `chat.abort` kills the whole
//! process group of a running command; a gateway whose `bash` has no bubblewrap stops its startup
//! unless the sandbox is off; a crash storm during tool calls runs no call twice. The tests that
//! also need the Pi oracle (Node) are in `bash_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print timings

use pincer_testkit::fake_provider::{script, text, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::Client;
use pincer_testkit::probe::read_rows;
use pincer_testkit::wire::{result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[path = "bash/common.rs"]
mod common;
use common::*;

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let marker = format!("1000.{}", std::process::id());
    // A child, a grandchild in a new session, and the shell itself waiting.
    let cmd = format!("sleep {marker} & (setsid sleep {marker} &); sleep {marker}");
    fake.push(Reply::stream(script(f, &turn(vec![call("k1", json!({"command": cmd}))], (10, 5, 0)))));
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, None)).await;
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "sleep", "idempotencyKey": "r1"})).await.unwrap();
    let started = Instant::now();
    while processes_with(&marker).iter().filter(|p| p.contains("sleep 1000")).count() < 3 {
        assert!(started.elapsed() < Duration::from_secs(20), "the sleeps never started: {}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("running: {:#?}", processes_with(&marker));
    let r = c.request("chat.abort", json!({"sessionKey": "main"})).await.unwrap();
    assert_eq!(r["aborted"], true, "{r}");
    let aborted = Instant::now();
    while !processes_with(&marker).is_empty() {
        assert!(
            aborted.elapsed() < Duration::from_secs(30),
            "still running after abort: {:#?}",
            processes_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("every process of the command gone {} ms after chat.abort", aborted.elapsed().as_millis());
    assert_eq!(c.chat_end("r1").await["payload"]["state"], "aborted");
}

#[test]
fn without_bubblewrap_bash_stops_the_startup_unless_the_sandbox_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let run = |tools: &str| {
        std::fs::write(state.join("pincer.toml"), format!("[agents.defaults.tools]\n{tools}\n")).unwrap();
        let mut child = std::process::Command::new(BIN)
            .args(["gateway", "--bind", "127.0.0.1:0", "--state-dir"])
            .arg(&state)
            .env("PINCER_GATEWAY_TOKEN", "test-token")
            .env("PATH", dir.path()) // no bwrap on it
            .env_remove("PINCER_MODEL")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A gateway that starts keeps running: stop it after a moment and read what it said.
        std::thread::sleep(Duration::from_millis(1500));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = run("");
    assert!(code.is_some_and(|c| c != 0), "refused to start: {code:?} {stderr}");
    assert!(stderr.contains("the bash tool needs its sandbox: bubblewrap (bwrap) is not installed"), "{stderr}");
    let (code, stderr) = run("sandbox = \"off\"");
    assert_eq!(code, None, "started and was killed: {stderr}");
    assert!(stderr.contains("bash commands run unconfined"), "the warning: {stderr}");
    let (code, stderr) = run("deny = [\"bash\"]");
    assert_eq!(code, None, "started without bash: {stderr}");
}

/// A storm of SIGKILLs while turns run a `bash` command with an effect: the command appends the
/// call's stable key (`PINCER_TOOL_CALL_ID`) to a file of the workspace. No client ever sends a
/// message twice. Afterwards no call id is in that file twice, every call has exactly one result
/// row, a call that completed is in the file once, and a call cut by a kill carries the
/// interrupted error result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_storm_runs_no_tool_call_twice() {
    use pincer_testkit::fake_provider::Recorded;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const SESSIONS: usize = 2;
    const KILLS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let f = Format::OpenaiCompletions;
    let model = move |r: &Recorded, _n: usize| -> Option<Reply> {
        let messages = r.body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        let reply = if last["role"] == "user" {
            // The call id follows from the message, so a model call made again asks for the same one.
            let id = format!("call-{}", last["content"].as_str().unwrap_or("?").replace(' ', "-"));
            let cmd = json!({"command": "echo $PINCER_TOOL_CALL_ID >> calls.log; sleep 0.4"});
            turn(vec![call(&id, cmd)], (5, 5, 0))
        } else {
            turn(vec![text(&["done"])], (5, 5, 0))
        };
        Some(Reply::stream(script(f, &reply)))
    };
    let fake = FakeProvider::start_with(f, Default::default(), Box::new(model)).await;
    let state = dir.path().join("state");
    let cfg = format!("{}resume_attempts = 50\n", config(&fake, Some(&ws)));
    let gw = start(&state, cfg).await;
    let addr = Arc::new(Mutex::new(gw.addr.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let (addr, stop) = (addr.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sent = 0usize;
                let mut c: Option<Client> = None;
                while !stop.load(Ordering::Acquire) {
                    let Some(cl) = c.as_mut() else {
                        let a = addr.lock().unwrap().clone();
                        match Client::try_connect(&a, Duration::from_secs(5)).await {
                            Ok(cl) => c = Some(cl),
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                        continue;
                    };
                    let run = format!("s{i}-t{sent}");
                    let params = json!({"sessionKey": format!("storm{i}"), "message": format!("s{i} t{sent}"),
                        "idempotencyKey": run});
                    sent += 1; // sent once, whatever happens to it
                    let ended = match cl.try_request("chat.send", params, Duration::from_secs(10)).await {
                        Ok(Ok(_)) => cl.try_chat_end(&run, Duration::from_secs(20)).await.is_ok(),
                        _ => false,
                    };
                    if !ended {
                        c = None;
                    }
                }
                sent
            })
        })
        .collect();
    let killer = {
        let (addr, stop) = (addr.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let mut gw = gw;
            let mut seed = std::process::id() as u64 | 1;
            for _ in 0..KILLS {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                std::thread::sleep(Duration::from_millis(300 + seed % 900));
                gw.restart();
                *addr.lock().unwrap() = gw.addr.clone();
            }
            stop.store(true, Ordering::Release);
            gw
        })
    };
    let mut gw = killer.await.unwrap();
    let mut sent = 0;
    for c in clients {
        sent += c.await.unwrap();
    }
    // The gateway answers by itself what the last kill cut.
    let files: Vec<std::path::PathBuf> = (0..SESSIONS)
        .filter_map(|i| pincer_testkit::probe::transcript_path(&state, &format!("agent:main:storm{i}")))
        .collect();
    let settled = pincer_testkit::probe::poll_async(Duration::from_secs(120), Duration::from_millis(100), || {
        let open = files.iter().any(|file| {
            let rows = read_rows(file);
            let users = rows.iter().filter(|r| r["message"]["role"] == "user").count();
            let done = rows.iter().filter(|r| r["message"]["stopReason"] == "stop").count();
            users != done
        });
        async move { (!open).then_some(()) }
    })
    .await;
    assert!(settled.is_some(), "a turn never answered:\n{}", gw.log_text());
    assert!(tokio::task::block_in_place(|| gw.terminate()).success());
    let log = std::fs::read_to_string(ws.join("calls.log")).unwrap_or_default();
    let logged: Vec<&str> = log.lines().collect();
    let mut seen = std::collections::HashSet::new();
    for id in &logged {
        assert!(seen.insert(*id), "call {id} ran twice:\n{log}");
    }
    let (mut calls, mut cut) = (0, 0);
    for file in &files {
        let rows = read_rows(file);
        let results = tool_results(file);
        let asked: Vec<String> = rows
            .iter()
            .filter(|r| r["message"]["role"] == "assistant")
            .flat_map(|r| r["message"]["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "toolCall")
            .map(|b| b["id"].as_str().unwrap().to_owned())
            .collect();
        for id in &asked {
            let mine: Vec<&Value> = results.iter().filter(|m| m["toolCallId"] == id.as_str()).collect();
            assert_eq!(mine.len(), 1, "{id}: one result row");
            calls += 1;
            if mine[0]["isError"] == true {
                cut += 1;
                assert!(result_text(mine[0]).contains("interrupted"), "{}", mine[0]);
            } else {
                assert!(logged.contains(&id.as_str()), "{id} completed, so it ran (once)");
            }
        }
        // Every row chains to the one before it: nothing was dropped or doubled.
        let chained: Vec<&Value> = rows.iter().skip_while(|r| r["type"] != "message").collect();
        for pair in chained.windows(2) {
            assert_eq!(pair[1]["parentId"], pair[0]["id"], "chained: {}", pair[1]);
        }
    }
    println!(
        "{KILLS} kills, {sent} messages sent once each: {calls} tool calls, {} runs logged, {cut} cut and reported interrupted",
        logged.len()
    );
    assert!(calls >= SESSIONS * 3, "the storm ran only {calls} calls");
}
