//! `pincer store import --from-openclaw` of what OpenClaw itself wrote (the part of
//! `openclaw_import.rs` that needs OpenClaw's CLI on Node, PostgreSQL and the Pi oracle, so it
//! builds only with the `external` feature): OpenClaw 2026.9.6 (its gateway and CLI, on a
//! loopback-only network namespace, against the fake provider) writes two sessions into its SQLite
//! store, one with a branch (a rewind, then a new turn) and one rewound as its last act, and labels
//! one; the import brings them into a Pincer state directory without touching the database (into a
//! JSONL state directory, and into PostgreSQL); Pincer's `chat.history` and the real Pi library
//! then show what OpenClaw's own `chat.history` shows; a second import changes nothing.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests read their files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::GatewayProcess;
use pincer_testkit::openclaw::{self, OwnGateway};
use pincer_testkit::postgres::Postgres;
use pincer_testkit::probe::{message_text as text, transcript_path};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;

#[path = "openclaw_import/common.rs"]
mod common;
use common::*;

/// A history as both sides must agree on it: each message's role, text and entry id.
fn said(messages: &Value) -> Vec<(String, String, String)> {
    (messages.as_array().expect("messages").iter())
        .map(|m| {
            let id = m["__openclaw"]["id"].as_str().unwrap_or_default().to_owned();
            (m["role"].as_str().unwrap_or_default().to_owned(), text(m), id)
        })
        .collect()
}

/// The messages of a history without their `__openclaw` blocks (each side's own bookkeeping: ids,
/// sequence numbers, positions in its store): every other field, as stored, must be the same.
fn stored(messages: &Value) -> Vec<Value> {
    (messages.as_array().expect("messages").iter())
        .map(|m| {
            let mut m = m.clone();
            m.as_object_mut().expect("message").remove("__openclaw");
            m
        })
        .collect()
}

/// Every file of OpenClaw's agent database (the database, its WAL and index), by name.
fn database_files(state: &Path) -> Vec<(String, Vec<u8>)> {
    let dir = state.join("agents/main/agent");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("agent dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("openclaw-agent.sqlite") && !n.ends_with("-shm"))
        .map(|n| (n.clone(), std::fs::read(dir.join(&n)).expect("read")))
        .collect();
    files.sort();
    files
}

#[test]
fn sessions_openclaw_2026_9_wrote_to_sqlite_import_with_their_branches() {
    if !openclaw::in_loopback_namespace("sessions_openclaw_2026_9_wrote_to_sqlite_import_with_their_branches") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let home = dir.path().join("home");
    let state = home.join(".openclaw");
    std::fs::create_dir_all(&state).expect("state");
    std::fs::write(state.join("openclaw.json"), openclaw::fake_model_config(&fake.base_url()).to_string())
        .expect("config");

    // The PostgreSQL cluster the second import goes to starts meanwhile (it is needed only then).
    let pg = std::thread::spawn(|| Postgres::shared().database("ocimport"));

    // OpenClaw 2026.9.6 writes the sessions, through its own gateway.
    let oc = OwnGateway::start(&home, 18799);
    let turn = |key: &str, m: &str| {
        let out = oc.run_ok(&home, &["agent", "-m", m, "--session-key", key, "--json"]);
        assert!(out.contains("Fake reply"), "{out}");
    };
    let history = |key: &str| oc.call(&home, "chat.history", json!({"sessionKey": key}));
    let user_entry = |key: &str, n: usize| {
        let h = history(key);
        let users: Vec<&Value> =
            h["messages"].as_array().expect("messages").iter().filter(|m| m["role"] == "user").collect();
        users[n]["__openclaw"]["id"].as_str().expect("entry id").to_owned()
    };
    let (main, side) = ("agent:main:main", "agent:main:side");
    turn(main, "hello one");
    turn(main, "hello two");
    // A branch: rewound to before the second question, which is asked again differently.
    let second = user_entry(main, 1);
    oc.call(&home, "sessions.rewind", json!({"sessionKey": main, "entryId": second}));
    turn(main, "hello two, again");
    oc.call(&home, "sessions.patch", json!({"key": main, "label": "Imported chat"}));
    // A session whose last act is a rewind: its leaf is an OpenClaw `leaf` entry.
    turn(side, "side one");
    turn(side, "side two");
    let second = user_entry(side, 1);
    oc.call(&home, "sessions.rewind", json!({"sessionKey": side, "entryId": second}));
    let theirs: Vec<(String, Value)> = [main, side].iter().map(|k| (k.to_string(), history(k))).collect();
    oc.stop();
    let main_said = said(&theirs[0].1["messages"]);
    assert_eq!(
        main_said.iter().map(|s| s.1.as_str()).filter(|t| !t.starts_with("Fake")).collect::<Vec<_>>(),
        ["hello one", "hello two, again"],
        "{main_said:#?}"
    );
    // The side session shows its first turn only (the rewind dropped the second from its branch).
    let side_said = said(&theirs[1].1["messages"]);
    assert_eq!(side_said.iter().map(|s| s.1.as_str()).next(), Some("side one"), "{side_said:#?}");
    assert_eq!(side_said.len(), 2, "{side_said:#?}");
    assert!(main_said.iter().chain(&side_said).all(|s| !s.2.is_empty()), "every message names its entry");

    // The import, twice; the database is left byte for byte as it was.
    let before = database_files(&state);
    assert!(!before.is_empty());
    let pincer_state = dir.path().join("pincer");
    let pg = pg.join().expect("the PostgreSQL cluster");
    let pg_state = dir.path().join("pincer-pg");
    let skipped = json!([{"key": main, "reason": "already imported"}, {"key": side, "reason": "already imported"}]);
    for (to, url) in [(&pincer_state, None), (&pg_state, Some(pg.as_str()))] {
        let (code, report) = import(&state, to, url);
        assert_eq!(code, Some(0), "{url:?}: {report:#}");
        assert_eq!(report, json!({"sessions": [main, side], "skipped": [], "problems": []}), "{url:?}");
        let (code, again) = import(&state, to, url);
        assert_eq!(code, Some(0), "{url:?}: {again:#}");
        assert_eq!(again, json!({"sessions": [], "skipped": skipped, "problems": []}), "{url:?}");
    }
    assert!(database_files(&state) == before, "the import changed OpenClaw's database");

    // Pincer serves them, from its files and from PostgreSQL: the same histories as OpenClaw's,
    // the label and the model in the list.
    let pg_config = format!("{}\n[store]\nbackend = \"postgres\"\nurl = \"{pg}\"\n", fake.gateway_toml());
    for (to, config) in [(&pincer_state, fake.gateway_toml()), (&pg_state, pg_config)] {
        let gw = GatewayProcess::start(BIN, to, &config);
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let (ours, list) = rt.block_on(async {
            let mut c = pincer_testkit::gateway::Client::connect(&gw.addr).await;
            let mut ours = Vec::new();
            for (key, _) in &theirs {
                ours.push(c.request("chat.history", json!({"sessionKey": key})).await.expect("chat.history"));
            }
            (ours, c.request("sessions.list", json!({})).await.expect("sessions.list"))
        });
        for ((key, theirs), ours) in theirs.iter().zip(&ours) {
            assert_eq!(said(&ours["messages"]), said(&theirs["messages"]), "{key} in {}", to.display());
            assert_eq!(stored(&ours["messages"]), stored(&theirs["messages"]), "{key} in {}", to.display());
        }
        let row = (list["sessions"].as_array().expect("sessions").iter())
            .find(|s| s["key"] == main)
            .unwrap_or_else(|| panic!("{list:#}"));
        let got = (row["label"].as_str(), row["model"].as_str());
        assert_eq!(got, (Some("Imported chat"), Some("fake-model")), "{row:#}");
    }

    // The real Pi library reads each file to the same conversation.
    for (key, theirs) in &theirs {
        let file = transcript_path(&pincer_state, key).expect("transcript");
        let pi = pincer_testkit::oracle::context(&file, None);
        let pi_said: Vec<(String, String)> = (pi["context"]["messages"].as_array().expect("messages").iter())
            .map(|m| (m["role"].as_str().unwrap_or_default().to_owned(), text(m)))
            .collect();
        let want: Vec<(String, String)> = said(&theirs["messages"]).into_iter().map(|(r, t, _)| (r, t)).collect();
        assert_eq!(pi_said, want, "{key}: {pi:#}");
    }
}
