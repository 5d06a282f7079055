//! OpenClaw's calls checked by OpenClaw's own code and the real Pi library (the part of
//! `openclaw_compat.rs` that needs OpenClaw's CLI on Node and the Pi oracle, so it builds only with
//! the `external` feature): `hello-ok` and the answers pass OpenClaw's own result schemas;
//! `sessions.compact` with `maxLines` keeps the last lines and the whole old file.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::Client;
use pincer_testkit::probe::{message_text as text, read_rows, transcript_path};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

#[path = "openclaw_compat/common.rs"]
mod common;
use common::*;

/// Checks `(what, schema name, value)` against OpenClaw 2026.9.6's own TypeBox schemas
/// (`tests/openclaw-cli/schemas.mjs`); returns the failures as readable lines.
fn openclaw_schema_failures(checks: &[(String, &str, Value)]) -> Vec<String> {
    use std::io::Write;
    let (node, _) = pincer_testkit::openclaw::cli();
    let script = pincer_testkit::repo_root().join("tests/openclaw-cli/schemas.mjs");
    let input = json!({"checks": checks.iter().map(|(what, name, value)| json!({"what": what, "name": name, "value": value})).collect::<Vec<_>>()});
    let mut child = std::process::Command::new(node)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node schemas.mjs");
    child.stdin.take().expect("stdin").write_all(input.to_string().as_bytes()).expect("write checks");
    let out = child.wait_with_output().expect("schemas.mjs");
    assert!(out.status.success(), "schemas.mjs failed: {}", String::from_utf8_lossy(&out.stdout));
    let v: Value = serde_json::from_slice(&out.stdout).expect("schemas.mjs JSON");
    let mut failures = Vec::new();
    for r in v["results"].as_array().expect("results") {
        if r["found"] != true {
            failures.push(format!("{}: OpenClaw has no {}", r["what"], r["name"]));
        }
        for e in r["errors"].as_array().into_iter().flatten() {
            failures.push(format!("{} ({}): {}", r["what"], r["name"], e.as_str().unwrap_or("")));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_ok_and_the_answers_pass_openclaws_own_result_schemas() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    let first_final = turn(&mut c, "one", "s-1").await;
    let rows = read_rows(&transcript_path(&gw.state_dir, "agent:main:main").expect("transcript"));
    let (user, reply) = (rows[1]["id"].clone(), rows[2]["id"].clone());

    // The optional hello-ok fields OpenClaw's clients read are there (the schema checks their shapes).
    let h = &c.hello;
    assert!(h["server"]["bootId"].as_str().is_some_and(|b| b.len() == 36), "{h:#}");
    assert_eq!(
        (h["auth"]["method"].as_str(), h["features"]["capabilities"].as_array().map(Vec::len)),
        (Some("token"), Some(0))
    );
    assert!(h["policy"]["attachments"]["maxImageBytes"].as_u64().is_some_and(|n| n > 0), "{h:#}");
    let mut checks = vec![("hello-ok".to_owned(), "HelloOkSchema", c.hello.clone())];
    // Rewinding before the first turn and sending again makes a second branch to list and switch.
    let params = json!({"sessionKey": "main", "entryId": user});
    let r = c.request("sessions.rewind", params.clone()).await.expect("rewind");
    checks.push((format!("sessions.rewind {params}"), "SessionsRewindResultSchema", r));
    turn(&mut c, "two", "s-2").await;
    // Each method with the params a client sends, and the schema OpenClaw checks its answer with.
    let calls = [
        ("agents.list", "AgentsListResultSchema", json!({})),
        ("agent.identity.get", "AgentIdentityResultSchema", json!({})),
        ("sessions.create", "SessionsCreateResultSchema", json!({"key": "schema-check", "label": "Checked"})),
        ("sessions.branches.list", "SessionsBranchesListResultSchema", json!({"sessionKey": "main"})),
        (
            "sessions.branches.switch",
            "SessionsBranchesSwitchResultSchema",
            json!({"sessionKey": "main", "leafEntryId": reply}),
        ),
        ("sessions.fork", "SessionsForkResultSchema", json!({"sessionKey": "main", "entryId": user})),
        ("logs.tail", "LogsTailResultSchema", json!({})),
        ("commands.list", "CommandsListResultSchema", json!({})),
        ("update.status", "UpdateStatusResultSchema", json!({})),
        ("channels.status", "ChannelsStatusResultSchema", json!({})),
        ("channels.pairing.list", "ChannelsPairingListResultSchema", json!({})),
        ("skills.search", "SkillsSearchResultSchema", json!({})),
        ("plugins.list", "PluginsListResultSchema", json!({})),
        ("tasks.list", "TasksListResultSchema", json!({})),
        ("question.list", "QuestionListResultSchema", json!({})),
        ("progressCard.get", "ProgressCardGetResultSchema", json!({})),
        ("sessions.observer.visibility", "SessionsObserverVisibilityResultSchema", json!({})),
        ("sessions.companion.state", "SessionsCompanionStateResultSchema", json!({})),
        ("talk.catalog", "TalkCatalogResultSchema", json!({})),
        ("sessions.delete", "SessionsDeleteResultSchema", json!({"key": "schema-check"})),
    ];
    for (method, schema, params) in calls {
        let r = c.request(method, params.clone()).await.unwrap_or_else(|e| panic!("{method} {params}: {e}"));
        checks.push((format!("{method} {params}"), schema, r));
    }
    // The live events of those turns, in OpenClaw's event schemas.
    let mut events = vec![first_final];
    events.append(&mut c.events);
    let mut kinds = std::collections::BTreeSet::new();
    // OpenClaw's startup phases come before the reply streams (its Control UI shows them).
    let run_states: Vec<String> = (events.iter())
        .filter(|e| e["event"] == "chat" && e["payload"]["runId"] == "s-2")
        .map(|e| {
            format!(
                "{}{}",
                e["payload"]["state"].as_str().unwrap_or(""),
                e["payload"]["phase"].as_str().map(|p| format!(":{p}")).unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(run_states[..2], ["status:preparing_context", "status:starting_model"], "{run_states:?}");
    assert!(run_states[2..].iter().all(|s| s == "delta"), "then the reply streams: {run_states:?}");
    for e in events {
        let schema = match e["event"].as_str() {
            Some("chat") => "ChatEventSchema",
            Some("agent") => "AgentEventSchema",
            Some("tick") => "TickEventSchema",
            _ => continue,
        };
        kinds.insert(e["event"].as_str().unwrap_or_default().to_owned());
        let mut payload = e["payload"].clone();
        if schema == "AgentEventSchema" {
            // OpenClaw's gateway adds `sessionKey` and `agentId` to the schema's event when it
            // broadcasts it (server-chat: `{...eventForClients, sessionKey, agentId}`); Pincer also
            // names the `sessionId`, which the TUI matches its scope against.
            for k in ["sessionKey", "agentId", "sessionId"] {
                payload.as_object_mut().map(|p| p.remove(k));
            }
        }
        checks.push((format!("event {}", e["event"]), schema, payload));
    }
    assert!(kinds.contains("chat") && kinds.contains("agent"), "chat and agent events were seen: {kinds:?}");
    let failures = openclaw_schema_failures(&checks);
    assert!(failures.is_empty(), "answers OpenClaw's schemas refuse:\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_compact_with_max_lines_keeps_the_last_lines_and_the_whole_old_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let gw = start(&dir, &fake);
    let mut c = Client::connect(&gw.addr).await;
    for (i, said) in ["first", "second", "third"].iter().enumerate() {
        turn(&mut c, said, &format!("t-{i}")).await;
    }
    let file = transcript_path(&gw.state_dir, "agent:main:main").expect("transcript");
    let original = std::fs::read(&file).expect("file");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), 7, "header + three turns");

    // More lines allowed than there are: nothing changes.
    let r = c.request("sessions.compact", json!({"key": "main", "maxLines": 7})).await.expect("compact");
    assert_eq!((r["compacted"].as_bool(), r["kept"].as_u64()), (Some(false), Some(7)), "{r}");
    assert_eq!(std::fs::read(&file).expect("file"), original);
    let e = c.request("sessions.compact", json!({"key": "main", "maxLines": 0})).await.expect_err("zero");
    assert_eq!(e["message"], "invalid sessions.compact params: at /maxLines: must be an integer from 1 to 4294967295");

    // Four lines: the header and the last three entries; the first kept is re-rooted; no model call.
    let calls = fake.requests().len();
    let r = c.request("sessions.compact", json!({"key": "main", "maxLines": 4})).await.expect("compact");
    assert_eq!((r["compacted"].as_bool(), r["kept"].as_u64()), (Some(true), Some(4)), "{r}");
    assert_eq!(fake.requests().len(), calls, "no summary was asked of the model");
    let kept = read_rows(&file);
    assert_eq!(kept.len(), 4);
    assert_eq!((&kept[0], &kept[2], &kept[3]), (&rows[0], &rows[5], &rows[6]));
    assert_eq!((kept[1]["id"].clone(), kept[1]["parentId"].clone()), (rows[4]["id"].clone(), Value::Null));
    let backup = std::path::PathBuf::from(r["backup"].as_str().expect("backup"));
    assert_eq!(std::fs::read(&backup).expect("backup"), original, "the whole old file is kept");
    // Pi opens the trimmed file as it is.
    let pi = pincer_testkit::oracle::context(&file, None);
    assert_eq!(
        (pi["leafId"].as_str(), pi["extra"]["rewrittenOnOpen"].as_bool()),
        (rows[6]["id"].as_str(), Some(false))
    );

    // The next turn chains after the leaf and sends only what was kept.
    turn(&mut c, "fourth", "t-4").await;
    let after = read_rows(&file);
    assert_eq!(after[4]["parentId"], rows[6]["id"]);
    let request = fake.requests().last().cloned().expect("request");
    let said: Vec<String> =
        (request["messages"].as_array().expect("messages").iter()).filter(|m| m["role"] == "user").map(text).collect();
    assert_eq!(said, ["third", "fourth"], "{request:#}");
}
