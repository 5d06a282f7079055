//! The session tree over the protocol against the real `pincer gateway` process: OpenClaw's
//! `sessions.branches.list`/`switch`, `sessions.rewind`, `sessions.fork`, `chat.message.get`,
//! Pincer's `sessions.tree`, `sessions.label` and `chat.send {regenerateEntryId, expectedLeafEntryId}`,
//! with the JSONL read back after each step; and bad input (unknown session, unknown entry, an
//! entry of another session, an entry of the wrong kind) refused with an error naming it, with
//! nothing written.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::{message_text as text, read_rows};
use serde_json::{json, Value};
use std::path::PathBuf;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

struct Setup {
    _dir: tempfile::TempDir,
    gw: GatewayProcess,
    _fake: FakeOpenAi,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let config = fake.gateway_toml();
    let gw = GatewayProcess::start(BIN, &dir.path().join("state"), &config);
    Setup { _dir: dir, gw, _fake: fake }
}

fn transcript(s: &Setup, key: &str) -> PathBuf {
    let dir = s.gw.state_dir.join("agents/main/sessions");
    let index: Value = serde_json::from_slice(&std::fs::read(dir.join("sessions.json")).expect("index")).expect("json");
    dir.join(format!("{}.jsonl", index[key]["sessionId"].as_str().expect("session id")))
}

async fn turn(c: &mut Client, key: &str, params: Value, run: &str) {
    let mut p = json!({"sessionKey": key, "idempotencyKey": run});
    p.as_object_mut().expect("object").extend(params.as_object().expect("object").clone());
    c.request("chat.send", p).await.expect("chat.send");
    assert_eq!(c.chat_end(run).await["payload"]["state"], "final");
}

fn find<'a>(rows: &'a [Value], role: &str, said: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|e| e["type"] == "message" && e["message"]["role"] == role && text(&e["message"]) == said)
        .collect()
}

fn reply(said: &str) -> String {
    format!("Fake reply: you said \"{said}\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_regenerate_switch_fork_and_get_over_the_protocol() {
    let s = setup();
    let mut c = Client::connect(&s.gw.addr).await;
    turn(&mut c, "main", json!({"message": "one"}), "r1").await;
    turn(&mut c, "main", json!({"message": "two"}), "r2").await;
    let file = transcript(&s, "agent:main:main");
    let rows = read_rows(&file);
    let two = find(&rows, "user", "two")[0].clone();

    let list = c.request("sessions.branches.list", json!({"sessionKey": "main"})).await.expect("list");
    let b = list["branches"].as_array().expect("branches");
    assert_eq!(b.len(), 1);
    assert_eq!(b[0]["active"], true);
    assert_eq!(b[0]["messageCount"], 4);
    assert_eq!(b[0]["headline"], reply("two"));
    assert!(b[0]["updatedAt"].is_string());

    // Edit: rewind to the parent of "two" (its text comes back), then send with the guard.
    let r = c.request("sessions.rewind", json!({"sessionKey": "main", "entryId": two["id"]})).await.expect("rewind");
    assert_eq!(r, json!({"editorText": "two"}));
    let leaf = read_rows(&file).last().cloned().expect("row");
    assert_eq!(
        (leaf["type"].as_str(), &leaf["targetId"], &leaf["parentId"]),
        (Some("leaf"), &two["parentId"], &two["parentId"])
    );
    turn(&mut c, "main", json!({"message": "two, edited", "expectedLeafEntryId": two["parentId"]}), "r3").await;
    let rows = read_rows(&file);
    let edited = find(&rows, "user", "two, edited")[0].clone();
    assert_eq!(edited["parentId"], two["parentId"], "a sibling of the edited message");

    // A stale guard is refused and nothing is written.
    let before = std::fs::read(&file).expect("read");
    let e = c
        .request("chat.send", json!({"sessionKey": "main", "message": "x", "idempotencyKey": "r-stale", "expectedLeafEntryId": two["id"]}))
        .await
        .expect_err("stale");
    assert!(e["message"].as_str().expect("msg").contains("active branch of agent:main:main moved"), "{e}");
    assert_eq!(std::fs::read(&file).expect("read"), before);

    // Two tips now; switch back to the original one and the next turn's context is that branch.
    let list = c.request("sessions.branches.list", json!({"sessionKey": "main"})).await.expect("list");
    let b = list["branches"].as_array().expect("branches").clone();
    assert_eq!(b.len(), 2);
    assert_eq!((b[0]["active"].as_bool(), b[1]["active"].as_bool()), (Some(true), Some(false)), "the active one first");
    assert_eq!(b[1]["headline"], reply("two"));
    let old_tip = b[1]["leafEntryId"].clone();
    let r = c
        .request("sessions.branches.switch", json!({"sessionKey": "main", "leafEntryId": old_tip}))
        .await
        .expect("switch");
    assert_eq!(r, json!({}));
    let last = read_rows(&file).last().cloned().expect("row");
    assert_eq!((last["type"].as_str(), &last["targetId"], &last["parentId"]), (Some("leaf"), &old_tip, &old_tip));
    let e = c
        .request("sessions.branches.switch", json!({"sessionKey": "main", "leafEntryId": old_tip}))
        .await
        .expect_err("again");
    assert_eq!(e["message"], format!("branch is already active: {}", old_tip.as_str().expect("id")));
    let h = c.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    let texts: Vec<String> = h["messages"].as_array().expect("messages").iter().map(text).collect();
    assert_eq!(texts, ["one", &reply("one"), "two", &reply("two")]);

    // Regenerate: a sibling reply under "two", no new user row.
    turn(&mut c, "main", json!({"message": "", "regenerateEntryId": two["id"]}), "r4").await;
    let rows = read_rows(&file);
    assert_eq!(find(&rows, "user", "two").len(), 1);
    let replies: Vec<&Value> = rows.iter().filter(|e| e["parentId"] == two["id"] && e["type"] == "message").collect();
    assert_eq!(replies.len(), 2, "two replies under one user row");

    // sessions.tree: siblings and tips for the navigator.
    let t = c.request("sessions.tree", json!({"sessionKey": "main"})).await.expect("tree");
    let nodes = t["nodes"].as_array().expect("nodes");
    let users_under = nodes.iter().filter(|n| n["parentId"] == two["parentId"] && n["role"] == "user").count();
    assert_eq!(users_under, 2);
    assert!(nodes.iter().all(|n| n["tipId"].is_string()));

    // chat.message.get: the entry in full; unknown ids are not_found.
    let long = "z".repeat(9000);
    turn(&mut c, "main", json!({"message": long}), "r5").await;
    let id = find(&read_rows(&file), "user", &long)[0]["id"].clone();
    let h = c.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    assert!(h["messages"].as_array().expect("m").iter().any(|m| text(m).ends_with("...(truncated)...")));
    let g = c.request("chat.message.get", json!({"sessionKey": "main", "messageId": id})).await.expect("get");
    assert_eq!(g["ok"], true);
    assert_eq!(text(&g["message"]), long);
    assert_eq!(g["message"]["__openclaw"]["id"], id);
    let g = c.request("chat.message.get", json!({"sessionKey": "main", "messageId": "nope"})).await.expect("get");
    assert_eq!(g, json!({"ok": false, "unavailableReason": "not_found"}));

    // Labels.
    let l = c
        .request("sessions.label", json!({"sessionKey": "main", "entryId": id, "label": "the long one"}))
        .await
        .expect("label");
    assert_eq!(l["targetId"], id);
    let t = c.request("sessions.tree", json!({"sessionKey": "main"})).await.expect("tree");
    assert_eq!(t["labels"][id.as_str().expect("id")], "the long one");

    // Fork before "two": a new session holding "one" and its reply.
    let f = c.request("sessions.fork", json!({"sessionKey": "main", "entryId": two["id"]})).await.expect("fork");
    assert_eq!(f["editorText"], "two");
    let key = f["sessionKey"].as_str().expect("key").to_owned();
    assert!(key.starts_with("agent:main:dashboard:"));
    let forked = read_rows(&transcript(&s, &key));
    let texts: Vec<String> = forked.iter().filter(|e| e["type"] == "message").map(|e| text(&e["message"])).collect();
    assert_eq!(texts, ["one", &reply("one")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tree_input_names_what_is_wrong_and_writes_nothing() {
    let s = setup();
    let mut c = Client::connect(&s.gw.addr).await;
    turn(&mut c, "main", json!({"message": "one"}), "r1").await;
    c.request("sessions.create", json!({"key": "other"})).await.expect("create");
    turn(&mut c, "other", json!({"message": "elsewhere"}), "r2").await;
    let main = transcript(&s, "agent:main:main");
    let other = transcript(&s, "agent:main:other");
    let rows = read_rows(&main);
    let user = find(&rows, "user", "one")[0]["id"].as_str().expect("id").to_owned();
    let answer = find(&rows, "assistant", &reply("one"))[0]["id"].as_str().expect("id").to_owned();
    let foreign = find(&read_rows(&other), "user", "elsewhere")[0]["id"].as_str().expect("id").to_owned();
    let before = (std::fs::read(&main).expect("main"), std::fs::read(&other).expect("other"));

    let cases: Vec<(&str, Value, String)> = vec![
        (
            "sessions.branches.switch",
            json!({"sessionKey": "ghost", "leafEntryId": answer}),
            "session not found: ghost".into(),
        ),
        (
            "sessions.branches.switch",
            json!({"sessionKey": "main"}),
            "invalid sessions.branches.switch params: missing field `leafEntryId`".into(),
        ),
        (
            "sessions.branches.switch",
            json!({"sessionKey": "main", "leafEntryId": "nope"}),
            "branch entry not found: nope".into(),
        ),
        (
            "sessions.branches.switch",
            json!({"sessionKey": "main", "leafEntryId": foreign}),
            format!("branch entry not found: {foreign}"),
        ),
        (
            "sessions.branches.switch",
            json!({"sessionKey": "main", "leafEntryId": user}),
            format!("entry is not a branch tip: {user}"),
        ),
        (
            "sessions.branches.switch",
            json!({"sessionKey": "main", "leafEntryId": answer}),
            format!("branch is already active: {answer}"),
        ),
        ("sessions.rewind", json!({"sessionKey": "ghost", "entryId": user}), "session not found: ghost".into()),
        (
            "sessions.rewind",
            json!({"sessionKey": "main"}),
            "invalid sessions.rewind params: missing field `entryId`".into(),
        ),
        (
            "sessions.branches.switch",
            json!({"sessionKey": "main", "leafEntryId": " "}),
            "invalid sessions.branches.switch params: at /leafEntryId: must not be empty".into(),
        ),
        (
            "sessions.tree",
            json!({"sessionKey": 7}),
            "invalid sessions.tree params: at /sessionKey: invalid type".into(),
        ),
        ("sessions.rewind", json!({"sessionKey": "main", "entryId": "nope"}), "message entry not found: nope".into()),
        (
            "sessions.rewind",
            json!({"sessionKey": "main", "entryId": foreign}),
            format!("message entry not found: {foreign}"),
        ),
        (
            "sessions.rewind",
            json!({"sessionKey": "main", "entryId": answer}),
            format!("entry is not a user message: {answer}"),
        ),
        (
            "sessions.fork",
            json!({"sessionKey": "main", "entryId": foreign}),
            format!("message entry not found: {foreign}"),
        ),
        ("sessions.fork", json!({"sessionKey": "ghost", "entryId": user}), "session not found: ghost".into()),
        (
            "sessions.label",
            json!({"sessionKey": "main", "entryId": foreign, "label": "x"}),
            format!("entry not found: {foreign}"),
        ),
        ("sessions.tree", json!({"sessionKey": "ghost"}), "session not found: ghost".into()),
        (
            "chat.send",
            json!({"sessionKey": "main", "message": "", "idempotencyKey": "g1", "regenerateEntryId": foreign}),
            format!("regenerateEntryId {foreign} is not an entry of session agent:main:main"),
        ),
        (
            "chat.send",
            json!({"sessionKey": "main", "message": "", "idempotencyKey": "g2", "regenerateEntryId": answer}),
            format!("regenerateEntryId {answer} is not a user message"),
        ),
        (
            "sessions.branches.list",
            json!({"sessionKey": "main", "agentId": "ops"}),
            "agentId \"ops\" does not match sessionKey \"main\"".into(),
        ),
        // The session methods' params, typed: the method and the field are named, nothing is written.
        (
            "sessions.patch",
            json!({"key": "other", "label": "x".repeat(257)}),
            "invalid sessions.patch params: at /label: must be at most 256 characters".into(),
        ),
        (
            "sessions.patch",
            json!({"key": "other", "displayName": "a\u{0}b"}),
            "invalid sessions.patch params: at /displayName: must not contain control characters or null bytes".into(),
        ),
        (
            "sessions.patch",
            json!({"key": "other", "sendPolicy": "maybe"}),
            "invalid sessions.patch params: at /sendPolicy: unknown variant `maybe`, expected `allow` or `deny`".into(),
        ),
        (
            "sessions.patch",
            json!({"key": "other", "unread": "yes"}),
            "invalid sessions.patch params: at /unread: invalid type: string \"yes\", expected a boolean".into(),
        ),
        ("sessions.patch", json!({"label": "x"}), "invalid sessions.patch params: missing field `key`".into()),
        (
            "sessions.list",
            json!({"limit": 0}),
            "invalid sessions.list params: at /limit: must be an integer from 1 to 4294967295".into(),
        ),
        (
            "sessions.list",
            json!({"includeArchived": "yes"}),
            "invalid sessions.list params: at /includeArchived: invalid type: string \"yes\", expected a boolean"
                .into(),
        ),
        (
            "sessions.create",
            json!({"key": "fresh", "label": 5}),
            "invalid sessions.create params: at /label: invalid type: integer `5`, expected a string".into(),
        ),
        ("sessions.create", json!({"key": "fresh", "model": "ghost/model"}), "ghost".into()),
        (
            "chat.history",
            json!({"sessionKey": "main", "maxChars": 0}),
            "invalid chat.history params: at /maxChars: must be an integer from 1 to 500000".into(),
        ),
        ("sessions.compact", json!({}), "invalid sessions.compact params: missing field `key`".into()),
        (
            "sessions.reset",
            json!({"key": "other", "reason": "wipe"}),
            "invalid sessions.reset params: at /reason: unknown variant `wipe`, expected `new` or `reset`".into(),
        ),
        ("sessions.archives.get", json!({}), "invalid sessions.archives.get params: missing field `file`".into()),
    ];
    for (method, params, want) in cases {
        let e = c.request(method, params.clone()).await.expect_err(method);
        assert_eq!(e["code"], "INVALID_REQUEST", "{method} {params}: {e}");
        assert!(e["message"].as_str().expect("msg").contains(&want), "{method} {params}: {e} (wanted {want:?})");
    }
    let g = c.request("chat.message.get", json!({"sessionKey": "main", "messageId": foreign})).await.expect("get");
    assert_eq!(g["unavailableReason"], "not_found", "another session's entry is not found here");
    let g = c.request("chat.message.get", json!({"sessionKey": "ghost", "messageId": user})).await.expect("get");
    assert_eq!(g["unavailableReason"], "not_found");
    assert_eq!(
        (std::fs::read(&main).expect("main"), std::fs::read(&other).expect("other")),
        before,
        "nothing was written"
    );
    let dir = s.gw.state_dir.join("agents/main/sessions");
    let index: Value = serde_json::from_slice(&std::fs::read(dir.join("sessions.json")).expect("index")).expect("json");
    assert_eq!(index.as_object().expect("index").len(), 2, "no session was created: {index}");

    // Archive is real: hidden from sessions.list, listed with includeArchived, restorable.
    c.request("sessions.patch", json!({"key": "other", "archived": true})).await.expect("archive");
    let l = c.request("sessions.list", json!({})).await.expect("list");
    assert!(!l["sessions"].as_array().expect("s").iter().any(|r| r["key"] == "agent:main:other"));
    let l =
        c.request("sessions.list", json!({"includeArchived": true, "includeDerivedTitles": true})).await.expect("list");
    let row =
        l["sessions"].as_array().expect("s").iter().find(|r| r["key"] == "agent:main:other").cloned().expect("row");
    assert!(row["archivedAt"].is_number());
    assert_eq!((row["derivedTitle"].as_str(), row["messageCount"].as_u64()), (Some("elsewhere"), Some(2)));
    let e =
        c.request("sessions.rewind", json!({"sessionKey": "other", "entryId": foreign})).await.expect_err("archived");
    assert_eq!(e["message"], "Rewind is unavailable for archived sessions.");
    let e = c.request("sessions.patch", json!({"key": "other", "archived": "yes"})).await.expect_err("bad");
    assert_eq!(
        e["message"],
        "invalid sessions.patch params: at /archived: invalid type: string \"yes\", expected a boolean"
    );
    c.request("sessions.patch", json!({"key": "other", "archived": false})).await.expect("restore");
    let l = c.request("sessions.list", json!({})).await.expect("list");
    assert!(l["sessions"]
        .as_array()
        .expect("s")
        .iter()
        .any(|r| r["key"] == "agent:main:other" && r.get("archivedAt").is_none()));
    // Archived transcripts: names from the listing only.
    c.request("sessions.delete", json!({"key": "other"})).await.expect("delete");
    let a = c.request("sessions.archives.list", json!({})).await.expect("archives");
    let file = a["archives"][0]["file"].as_str().expect("file").to_owned();
    assert_eq!(
        (a["archives"][0]["reason"].as_str(), a["archives"][0]["title"].as_str()),
        (Some("deleted"), Some("elsewhere"))
    );
    let g = c.request("sessions.archives.get", json!({"file": file})).await.expect("get");
    assert_eq!(text(&g["messages"][0]), "elsewhere");
    let e = c.request("sessions.archives.get", json!({"file": "../sessions.json"})).await.expect_err("path");
    assert_eq!(e["message"], "archived transcript not found: ../sessions.json");
}

/// Work queued behind a session's turn (a compaction, a branch move, a label) checks, when its
/// turn comes, that its session was not reset meanwhile; a reset of *another* session is not one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_of_another_session_does_not_fail_work_queued_behind_a_turn() {
    let s = setup();
    let mut c = Client::connect(&s.gw.addr).await;
    turn(&mut c, "main", json!({"message": "one"}), "q1").await;
    turn(&mut c, "other", json!({"message": "elsewhere"}), "q2").await;
    let file = transcript(&s, "agent:main:main");

    // A slow turn holds main's queue; a compaction of main (keep the last 3 lines) waits behind it.
    c.request("chat.send", json!({"sessionKey": "main", "message": "[slow] two", "idempotencyKey": "q3"}))
        .await
        .expect("chat.send");
    let mut k = Client::connect(&s.gw.addr).await;
    let compact =
        tokio::spawn(async move { k.request("sessions.compact", json!({"key": "main", "maxLines": 3})).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!compact.is_finished(), "the compaction waits for the turn");
    let mut r = Client::connect(&s.gw.addr).await;
    r.request("sessions.reset", json!({"key": "other"})).await.expect("reset other");
    assert_eq!(c.chat_end("q3").await["payload"]["state"], "final");

    let done = compact.await.expect("compact task").expect("a compaction of main, whose transcript is where it was");
    assert_eq!((&done["ok"], &done["compacted"]), (&json!(true), &json!(true)), "{done}");
    let rows = read_rows(&file);
    assert_eq!(rows.len(), 3, "the header and the last two lines: {rows:?}");
    assert_eq!((text(&rows[1]["message"]).as_str(), &rows[2]["message"]["role"]), ("[slow] two", &json!("assistant")));
}
