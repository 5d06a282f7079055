//! A running `bash` call on the `agent` event stream, checked against Pi's own `bash` (the part of
//! `tool_events.rs` that needs the Pi oracle on Node, so it builds only with the `external`
//! feature): it is announced with `phase:"update"` (name, toolCallId, partialResult: the output so
//! far, as Pi's own `bash` reports it), bounded for a 5 MB output, never written to the transcript.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print timings

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::read_rows;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

#[path = "tool_events/common.rs"]
mod common;
use common::*;

/// The partial results Pi's own `bash` tool (the oracle's copy, run by Node) reports through
/// `onUpdate` for `args`, in order.
fn pi_bash_partials(args: &Value) -> Vec<Value> {
    let bash_js =
        pincer_testkit::oracle_dir().join("node_modules/@mariozechner/pi-coding-agent/dist/core/tools/bash.js");
    let cwd = tempfile::tempdir().unwrap();
    let script = "const [bashJs, cwd, args] = process.argv.slice(1);\n\
        const { createBashToolDefinition } = await import(bashJs);\n\
        const partials = [];\n\
        await createBashToolDefinition(cwd).execute('x', JSON.parse(args), undefined, (p) => partials.push(JSON.parse(JSON.stringify(p))));\n\
        console.log(JSON.stringify(partials));";
    let out = std::process::Command::new("node")
        .args(["--input-type=module", "-e", script])
        .arg(&bash_js)
        .arg(cwd.path())
        .arg(args.to_string())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("Pi's bash: {e}: {}", String::from_utf8_lossy(&out.stderr)))
}

fn partial_text(update: &Value) -> &str {
    update["payload"]["data"]["partialResult"]["content"][0]["text"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_bash_streams_bounded_updates_that_are_never_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let lines = json!({"command": "for i in 1 2 3 4; do echo line-$i; sleep 0.3; done"});
    // 5 MB in 50 pieces of 1,000 lines, with pauses so that it is watched while it grows.
    let big = json!({"command": "for i in $(seq 1 50); do head -c 100000 /dev/zero | tr '\\0' a | fold -w 99; sleep 0.02; done"});
    let t1 = turn(
        vec![tool_call("c1", "bash", &[&lines.to_string()]), tool_call("c2", "bash", &[&big.to_string()])],
        (10, 5, 0),
    );
    let t2 = turn(vec![text(&["Done."])], (20, 2, 0));
    for t in [&t1, &t2] {
        fake.push(Reply::stream(script(f, t)));
    }
    let state = dir.path().join("state");
    let cfg = config(&fake, &ws);
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    c.request("sessions.messages.subscribe", json!({"key": "main"})).await.expect("subscribe");
    let sent = std::time::Instant::now();
    c.request("chat.send", json!({"sessionKey": "main", "message": "run", "idempotencyKey": "r1"})).await.unwrap();
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    let events = std::mem::take(&mut c.events);
    let at = |phase: &str, id: &str| events.iter().position(|f| is_tool(f, phase, id));
    for (id, args) in [("c1", &lines), ("c2", &big)] {
        let (start, result) = (at("start", id).unwrap(), at("result", id).unwrap());
        let updates: Vec<&Value> = events.iter().filter(|f| is_tool(f, "update", id)).collect();
        let first = events.iter().position(|f| is_tool(f, "update", id)).unwrap_or(usize::MAX);
        let last = events.iter().rposition(|f| is_tool(f, "update", id)).unwrap_or(0);
        assert!(start < first && last < result, "{id}: updates between start ({start}) and result ({result})");
        for u in &updates {
            // OpenClaw's shape: exactly these fields.
            let d = &u["payload"]["data"];
            let mut keys: Vec<&String> = d.as_object().unwrap().keys().collect();
            keys.sort();
            assert_eq!(keys, ["name", "partialResult", "phase", "toolCallId"], "{u}");
            assert_eq!((&d["name"], &u["payload"]["runId"]), (&json!("bash"), &json!("r1")), "{u}");
        }
        let sizes: Vec<usize> =
            updates.iter().map(|u| u["payload"]["data"]["partialResult"].to_string().len()).collect();
        println!("{id}: {} updates of {sizes:?} bytes, {:?} after chat.send", updates.len(), sent.elapsed());
        // The output grows from update to update (each a tail of the output so far).
        let texts: Vec<&str> = updates.iter().map(|u| partial_text(u)).collect();
        let shown: Vec<&&str> = texts.iter().filter(|t| !t.is_empty()).collect();
        assert!(shown.len() >= 2, "{id}: fewer than two updates with output: {texts:?}");
        if id == "c1" {
            for w in texts.windows(2) {
                assert!(w[1].starts_with(w[0]) && w[1].len() > w[0].len(), "{id}: output not growing: {texts:?}");
            }
            // Each partial is one Pi's own bash reports for the same command.
            let pi = pi_bash_partials(args);
            for u in &updates {
                let p = &u["payload"]["data"]["partialResult"];
                assert!(pi.contains(p), "{id}: {p} is not one of Pi's partials {pi:?}");
            }
        } else {
            // Bounded: the tail (at most Pi's 50 KB) and its truncation record, never the 5 MB.
            for (u, size) in updates.iter().zip(&sizes) {
                assert!(*size < 3 * 50 * 1024, "{id}: an update of {size} bytes");
                assert!(partial_text(u).len() <= 50 * 1024, "{id}: {size}");
            }
            let last = updates.last().unwrap();
            let details = &last["payload"]["data"]["partialResult"]["details"];
            assert_eq!(details["truncation"]["truncated"], true, "{details}");
            assert!(details["fullOutputPath"].as_str().is_some_and(|p| p.contains("pi-bash-")), "{details}");
        }
    }
    // Nothing of the updates is in the transcript: the turn's rows are the messages, each result
    // the one record of its call.
    let path = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let rows = read_rows(&path);
    let kinds: Vec<String> =
        rows.iter().map(|r| format!("{}{}", r["type"], r["message"]["role"].as_str().unwrap_or(""))).collect();
    assert_eq!(
        kinds,
        [
            "\"session\"",
            "\"message\"user",
            "\"message\"assistant",
            "\"message\"toolResult",
            "\"message\"toolResult",
            "\"message\"assistant"
        ]
    );
    let raw = std::fs::read_to_string(&path).unwrap();
    assert!(!raw.contains("partialResult") && !raw.contains("\"update\""), "an update in the transcript");
    let c1 = rows.iter().find(|r| r["message"]["toolCallId"] == "c1").unwrap();
    assert!(
        c1["message"]["content"][0]["text"].as_str().unwrap().starts_with("line-1\nline-2\nline-3\nline-4"),
        "{c1}"
    );
}
