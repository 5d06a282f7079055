//! Pi's `bash` tool through the real gateway against Pi's own (the part of `bash.rs` that needs the
//! Pi oracle on Node, so it builds only with the `external` feature): a 5 MB output comes back as
//! Pi's last-50-KB result with the whole output in `details.fullOutputPath`; two `sleep 1` calls of
//! one message run at the same time and are persisted in source order; from `bash`, writing outside
//! the workspace, reading the gateway token or `pincer.toml` and opening a network connection fail;
//! a turn cut mid-tool resumes by itself and runs no effect twice. The results equal what Pi's own
//! `bash` tool (the oracle's copy, run by Node) returns for the same commands, and the rows are
//! checked against the real Pi library's context, as `tools_external.rs` does.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print timings

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::Client;
use pincer_testkit::probe::read_rows;
use pincer_testkit::wire::{check_request_against_pi, result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

#[path = "bash/common.rs"]
mod common;
use common::*;

/// What Pi's own `bash` tool (the oracle's copy, run by Node, unsandboxed) returns for `args`:
/// `Ok(result)` or `Err(the error's message)`.
fn pi_bash(args: &Value) -> Result<Value, String> {
    let bash_js =
        pincer_testkit::oracle_dir().join("node_modules/@mariozechner/pi-coding-agent/dist/core/tools/bash.js");
    let cwd = tempfile::tempdir().unwrap();
    let script = "const [bashJs, cwd, args] = process.argv.slice(1);\n\
        const { createBashToolDefinition } = await import(bashJs);\n\
        try { console.log(JSON.stringify({ok: await createBashToolDefinition(cwd).execute('x', JSON.parse(args))})); }\n\
        catch (e) { console.log(JSON.stringify({err: e.message})); }";
    let out = std::process::Command::new("node")
        .args(["--input-type=module", "-e", script])
        .arg(&bash_js)
        .arg(cwd.path())
        .arg(args.to_string())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("Pi's bash: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    match v.get("err") {
        Some(e) => Err(e.as_str().unwrap().to_owned()),
        None => Ok(v["ok"].clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_caps_its_output_saves_it_whole_and_runs_calls_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    // 52,000 lines of 101 bytes: 5.25 MB.
    let t1 = turn(vec![call("b1", json!({"command": "seq -f '%0100g' 1 52000"}))], (10, 5, 0));
    let t2 = turn(
        vec![
            text(&["Two at once."]),
            call("s1", json!({"command": "sleep 1; echo first"})),
            call("s2", json!({"command": "sleep 1; echo second; exit 3"})),
        ],
        (20, 5, 0),
    );
    let t3 = turn(vec![text(&["Done."])], (30, 2, 0));
    for t in [&t1, &t2, &t3] {
        fake.push(Reply::stream(script(f, t)));
    }
    let state = dir.path().join("state");
    let gw = start(&state, config(&fake, None)).await;
    let mut c = Client::connect(&gw.addr).await;
    let info = c.request("pincer.info", json!({})).await.unwrap();
    assert_eq!(info["tools"], json!(["bash", "edit", "find", "grep", "ls", "read", "write"]), "the coding profile");
    c.request("chat.send", json!({"sessionKey": "main", "message": "go", "idempotencyKey": "r1"})).await.unwrap();
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());

    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    let ids: Vec<&str> = results.iter().map(|m| m["toolCallId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["b1", "s1", "s2"], "source order");

    // The big output: the last lines within 50 KB, Pi's notice, the whole output in the file.
    let b1 = &results[0];
    assert_eq!(b1["isError"], false);
    let full: String = (1..=52000).map(|i| format!("{i:0100}\n")).collect();
    let path = b1["details"]["fullOutputPath"].as_str().expect("fullOutputPath");
    assert_eq!(std::fs::read_to_string(path).unwrap(), full, "the full output file holds all of it");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(path).unwrap().permissions().mode() & 0o777, 0o600);
    let t = &b1["details"]["truncation"];
    let kept = t["outputLines"].as_u64().unwrap() as usize;
    // 507 lines of 101 bytes, the last empty line after the final newline included.
    assert_eq!(
        (kept, &t["truncatedBy"], &t["totalLines"], &t["totalBytes"]),
        (507, &json!("bytes"), &json!(52001), &json!(full.len()))
    );
    let tail: String = (52000 - 505..=52000).map(|i| format!("{i:0100}\n")).collect();
    assert_eq!(
        result_text(b1),
        format!("{tail}\n\n[Showing lines 51495-52001 of 52001 (50.0KB limit). Full output: {path}]")
    );
    assert!(result_text(b1).len() <= 51200 + 200, "{}", result_text(b1).len());
    // Exactly what Pi's own tool returns, but for the file's name.
    let pi = pi_bash(&json!({"command": "seq -f '%0100g' 1 52000"})).unwrap();
    let pi_path = pi["details"]["fullOutputPath"].as_str().unwrap().to_owned();
    assert_eq!(std::fs::read_to_string(&pi_path).unwrap(), full);
    let pi = serde_json::to_string(&pi).unwrap().replace(&pi_path, path);
    let _ = std::fs::remove_file(&pi_path);
    let ours = json!({"content": b1["content"], "details": b1["details"]});
    assert_eq!(serde_json::from_str::<Value>(&pi).unwrap(), ours, "Pi's bash result");
    std::fs::remove_file(path).unwrap();

    // The two sleeps: run together, each result as Pi words it (a non-zero exit is an error).
    assert_eq!((result_text(&results[1]), &results[1]["isError"]), ("first\n", &json!(false)));
    assert_eq!(
        (result_text(&results[2]), &results[2]["isError"]),
        ("second\n\n\nCommand exited with code 3", &json!(true))
    );
    for (m, args) in [
        (&results[1], json!({"command": "sleep 1; echo first"})),
        (&results[2], json!({"command": "sleep 1; echo second; exit 3"})),
    ] {
        let pi = pi_bash(&args).map(|r| r["content"][0]["text"].as_str().unwrap().to_owned());
        let ours = if m["isError"] == true { Err(result_text(m).to_owned()) } else { Ok(result_text(m).to_owned()) };
        assert_eq!(ours, pi, "Pi's bash on {args}");
    }
    let rows = read_rows(&file);
    let ts = |pick: &dyn Fn(&Value) -> bool| {
        rows.iter().find(|r| pick(&r["message"])).unwrap()["message"]["timestamp"].as_i64().unwrap()
    };
    let asked = ts(&|m| m["role"] == "assistant" && m["content"].to_string().contains("\"s1\""));
    let answered = ts(&|m| m["toolCallId"] == "s2");
    println!("two `sleep 1` calls: {} ms from the assistant message to the last result", answered - asked);

    assert_eq!(fake.bodies().len(), 3);
    check_request_against_pi(&file, &fake, 1);
    check_request_against_pi(&file, &fake, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_cannot_leave_its_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let state = dir.path().join("state");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("gateway.token"), "token-from-the-file").unwrap();
    let port = fake.base_url().split(':').nth(2).unwrap().split('/').next().unwrap().to_owned();
    let s = state.display();
    let host_tmp = format!("/tmp/pincer-bash-test-{}", std::process::id());
    let etc_file = format!("/etc/pincer-pwned-{}", std::process::id());
    let t1 = turn(
        vec![
            call("w1", json!({"command": format!("echo pwned > {}/pwned.txt", outside.display())})),
            call("w2", json!({"command": format!("echo pwned > {etc_file}")})),
            call("w3", json!({"command": "mkdir -p sub && echo kept > sub/in.txt && cat sub/in.txt"})),
            call("r1", json!({"command": format!("cat {s}/gateway.token")})),
            call("r2", json!({"command": format!("cat {s}/pincer.toml")})),
            call("r3", json!({"command": "echo \"token=[$PINCER_GATEWAY_TOKEN]\""})),
            call("n1", json!({"command": format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo CONNECTED")})),
            call("t1", json!({"command": format!("echo private > {host_tmp} && cat {host_tmp}")})),
        ],
        (10, 5, 0),
    );
    let t2 = turn(vec![text(&["Done."])], (20, 2, 0));
    for t in [&t1, &t2] {
        fake.push(Reply::stream(script(f, t)));
    }
    let gw = start(&state, config(&fake, None)).await;
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "escape", "idempotencyKey": "r1"})).await.unwrap();
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    let by_id = |id: &str| results.iter().find(|m| m["toolCallId"] == id).unwrap();
    for id in ["w1", "w2", "r1", "r2", "n1"] {
        assert_eq!(by_id(id)["isError"], true, "{id}: {}", by_id(id));
        println!("{id}: {}", result_text(by_id(id)));
    }
    assert!(!outside.join("pwned.txt").exists());
    assert!(!Path::new(&etc_file).exists());
    assert!(result_text(by_id("w2")).contains("Read-only file system"), "{}", by_id("w2"));
    // The workspace (the default, inside the state directory) is writable; nothing else of the state is there.
    assert_eq!((result_text(by_id("w3")), &by_id("w3")["isError"]), ("kept\n", &json!(false)));
    assert_eq!(std::fs::read_to_string(state.join("workspace/main/sub/in.txt")).unwrap(), "kept\n");
    assert!(result_text(by_id("r1")).contains("No such file or directory"), "{}", by_id("r1"));
    assert!(result_text(by_id("r2")).contains("No such file or directory"), "{}", by_id("r2"));
    assert_eq!(result_text(by_id("r3")), "token=[]\n", "the gateway's environment is not passed");
    assert!(!result_text(by_id("n1")).contains("CONNECTED"));
    // /tmp is private.
    assert_eq!(result_text(by_id("t1")), "private\n");
    assert!(!Path::new(&host_tmp).exists());
    check_request_against_pi(&file, &fake, 1);
}

/// A turn cut by SIGKILL while its tools run is taken up by the restarted gateway itself (no
/// resend): the `bash` call that was running is never run again — it gets an `isError` result
/// saying it was interrupted — while the read-only `read` cut with it runs again; the model then
/// answers. A turn that keeps being cut is given up after `resume_attempts`, with a chained
/// `pincer.turn-interrupted` marker, and the session takes the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cut_mid_tool_resumes_by_itself_and_runs_no_effect_twice() {
    use pincer_testkit::fake_provider::{Recorded, Step};
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "contents of a").unwrap();
    let f = Format::OpenaiCompletions;
    let model = move |r: &Recorded, _n: usize| -> Option<Reply> {
        let messages = r.body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        let first_user = messages.iter().rev().find(|m| m["role"] == "user").map(|m| m["content"].to_string());
        let asked = |s: &str| first_user.as_deref().is_some_and(|u| u.contains(s));
        let reply = if asked("stall please") {
            // A reply that never ends: each attempt is cut by the next SIGKILL.
            let events = script(f, &turn(vec![text(&["thinking about it"])], (5, 5, 0)));
            let upto = events.iter().position(|e| e.contains("thinking about it")).map_or(0, |i| i + 1);
            let mut steps: Vec<Step> = events.into_iter().take(upto).map(Step::Send).collect();
            steps.push(Step::Stall);
            return Some(Reply::Stream(steps, pincer_testkit::fake_provider::Framing::Chunked));
        } else if asked("run the tools") && last["role"] == "user" {
            turn(
                vec![
                    call("b1", json!({"command": "echo ran >> calls.log; sleep 30"})),
                    tool_call("r1", "read", &[&json!({"path": "a.txt"}).to_string()]),
                ],
                (5, 5, 0),
            )
        } else if asked("run the tools") {
            turn(vec![text(&["Both calls are settled."])], (5, 5, 0))
        } else {
            turn(vec![text(&["hi"])], (5, 5, 0))
        };
        Some(Reply::stream(script(f, &reply)))
    };
    let fake = FakeProvider::start_with(f, Default::default(), Box::new(model)).await;
    let state = dir.path().join("state");
    let cfg = format!("{}resume_attempts = 1\n", config(&fake, Some(&ws)));
    let mut gw = start(&state, cfg).await;
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "run the tools", "idempotencyKey": "t1"}))
        .await
        .unwrap();
    let log = ws.join("calls.log");
    pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(20), || {
        let ran = std::fs::read_to_string(&log).is_ok_and(|s| s == "ran\n");
        async move { ran.then_some(()) }
    })
    .await
    .expect("bash started");
    drop(c);
    tokio::task::block_in_place(|| gw.restart()); // SIGKILL mid-call, then a new process
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let rows = pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(50), || {
        let rows = read_rows(&file);
        let done = rows.iter().any(|r| r["message"]["stopReason"] == "stop");
        async move { done.then_some(rows) }
    })
    .await
    .unwrap_or_else(|| panic!("no reply after the restart:\n{}", gw.log_text()));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "ran\n", "the cut bash call never ran again");
    let results = tool_results(&file);
    let ids: Vec<&str> = results.iter().map(|m| m["toolCallId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["b1", "r1"], "one result per call, in the message's order");
    assert_eq!(results[0]["isError"], true);
    assert!(result_text(&results[0]).contains("interrupted"), "{}", results[0]);
    assert_eq!((result_text(&results[1]), &results[1]["isError"]), ("contents of a", &json!(false)), "read ran again");
    let resumed: Vec<&Value> = rows.iter().filter(|r| r["customType"] == "pincer.turn-resumed").collect();
    assert_eq!(resumed.len(), 1);
    let roles: Vec<String> = rows
        .iter()
        .filter_map(|r| match r["type"].as_str() {
            Some("message") => r["message"]["role"].as_str().map(str::to_owned),
            Some("custom") => r["customType"].as_str().map(str::to_owned),
            _ => None,
        })
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "pincer.turn-resumed", "toolResult", "toolResult", "assistant"],
        "chained as the turn happened"
    );
    check_request_against_pi(&file, &fake, 1);

    // A turn cut again on its one allowed resume is given up; the session goes on.
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "stall please", "idempotencyKey": "t2"}))
        .await
        .unwrap();
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == "t2" && f["payload"]["state"] == "delta").await;
    drop(c);
    tokio::task::block_in_place(|| gw.restart()); // cut; the restarted gateway resumes it (attempt 1 of 1)
    let attempt = || read_rows(&file).iter().filter(|r| r["customType"] == "pincer.turn-resumed").count();
    pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(50), || {
        let n = attempt();
        async move { (n == 2).then_some(()) }
    })
    .await
    .expect("t2 resumed once");
    let stalls = || fake.bodies().iter().filter(|b| b.to_string().contains("stall please")).count();
    pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(20), || {
        let n = stalls();
        async move { (n == 2).then_some(()) }
    })
    .await
    .expect("the resumed attempt reached the model");
    tokio::task::block_in_place(|| gw.restart()); // cut again: out of attempts
    let marked = pincer_testkit::probe::poll_async(Duration::from_secs(20), Duration::from_millis(50), || {
        let rows = read_rows(&file);
        let m = rows.iter().find(|r| r["customType"] == "pincer.turn-interrupted").cloned();
        async move { m }
    })
    .await
    .unwrap_or_else(|| panic!("t2 never given up:\n{}", gw.log_text()));
    assert_eq!(marked["data"]["runId"], "t2");
    assert!(
        marked["data"]["reason"].as_str().unwrap().contains("could not be completed after 1 attempt(s)"),
        "{marked}"
    );
    assert_eq!(attempt(), 2, "no third attempt");
    let mut c = Client::connect(&gw.addr).await;
    let again = c
        .request("chat.send", json!({"sessionKey": "main", "message": "stall please", "idempotencyKey": "t2"}))
        .await
        .unwrap();
    assert_eq!(again["status"], "interrupted", "{again}");
    c.request("chat.send", json!({"sessionKey": "main", "message": "hello again", "idempotencyKey": "t3"}))
        .await
        .unwrap();
    assert_eq!(c.chat_end("t3").await["payload"]["state"], "final", "the session takes the next message");
}
