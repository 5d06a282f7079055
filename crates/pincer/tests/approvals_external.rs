//! Approvals across PostgreSQL replicas (the part of `approvals.rs` that needs PostgreSQL, so it
//! builds only with the `external` feature): a waiting call is seen and allowed on another replica,
//! and a dead replica's waiting call is taken over by a survivor and runs once.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly, print timings

use pincer_testkit::gateway::Client;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

#[path = "approvals/common.rs"]
mod common;
use common::*;

/// On PostgreSQL: a request waiting on replica A is listed and allowed by a client of replica B
/// (A sees the decision and runs the call; a later answer on A is refused); then a request is
/// made on A, A is SIGKILLed, the survivor B takes the turn over with the request still waiting
/// (same id), a client of B allows it. Each command runs exactly once (in the workspace the
/// replicas share) and each turn ends `final`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_dead_replicas_waiting_call_is_allowed_on_a_survivor_and_runs_once() {
    use pincer_testkit::postgres::Postgres;
    let pg = Postgres::shared();
    let url = pg.database("approvals");
    let fake = pincer_testkit::fake_openai::FakeOpenAi::start_in_thread();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let config = format!(
        "{}workspace = \"{}\"\n[store]\nbackend = \"postgres\"\nurl = \"{url}\"\n",
        fake.gateway_toml(),
        ws.display()
    );
    let (bin, d, cfg) = (BIN.to_owned(), dir.path().to_owned(), config.clone());
    let mut replicas =
        tokio::task::spawn_blocking(move || pincer_testkit::postgres::start_replicas(&bin, &d, &cfg, 2)).await.unwrap();
    let count = |ws: &Path| std::fs::read_to_string(ws.join("approved.log")).map(|s| s.lines().count()).unwrap_or(0);
    let mut a = Client::connect(&replicas[0].addr).await;
    let mut b = Client::connect(&replicas[1].addr).await;
    // B's client has the session open: it sees the wait on A live, and its end.
    send(&mut a, "hello", "pg-h").await;
    a.chat_end("pg-h").await;
    b.request("sessions.messages.subscribe", json!({"key": "agent:main:main"})).await.unwrap();
    send(&mut a, "first [approve]", "pg-0").await;
    let ev = a.event(|f| f["event"] == "exec.approval.requested").await;
    let id = ev["payload"]["id"].as_str().unwrap().to_owned();
    let on_b = b.event(|f| f["event"] == "exec.approval.requested").await;
    for k in ["id", "request", "createdAtMs", "expiresAtMs"] {
        assert_eq!(on_b["payload"][k], ev["payload"][k], "{k}: the same request on B as on A");
    }
    let listed = b.request("exec.approval.list", json!({})).await.unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!((&listed[0]["id"], &listed[0]["expiresAtMs"]), (&json!(id), &ev["payload"]["expiresAtMs"]));
    b.request("exec.approval.resolve", json!({"id": id, "decision": "allow-once"})).await.unwrap();
    let resolved = b.event(|f| f["event"] == "exec.approval.resolved").await;
    assert_eq!((&resolved["payload"]["id"], &resolved["payload"]["decision"]), (&json!(id), &json!("allow-once")));
    assert_eq!(a.chat_end("pg-0").await["payload"]["state"], "final");
    assert_eq!(count(&ws), 1, "ran once, on A");
    let late = a.request("exec.approval.resolve", json!({"id": id, "decision": "deny"})).await.unwrap_err();
    assert!(late["message"].as_str().unwrap().contains("already decided (allow-once"), "{late}");
    assert_eq!(b.request("exec.approval.list", json!({})).await.unwrap(), json!([]));

    send(&mut a, "run it [approve]", "pg-1").await;
    let ev = a.event(|f| f["event"] == "exec.approval.requested").await;
    let id = ev["payload"]["id"].as_str().unwrap().to_owned();
    assert_eq!(ev["payload"]["request"]["command"], "echo approved >> approved.log");
    let on_disk = "SELECT count(*) FROM entries WHERE type = 'custom' AND line LIKE '%pincer.approval-request%'";
    assert_eq!(pg.psql(&url, on_disk), "2", "the request is in the database before it is announced");
    b.request("chat.history", json!({"sessionKey": "main"})).await.unwrap();
    replicas[0].kill9();
    let b_addr = replicas[1].addr.clone();
    let listed = pincer_testkit::probe::poll_async(Duration::from_secs(30), Duration::from_millis(100), || {
        let addr = b_addr.clone();
        async move {
            let mut c = Client::connect(&addr).await;
            let l = c.request("exec.approval.list", json!({})).await.unwrap();
            (l.as_array().is_some_and(|a| !a.is_empty())).then_some(l)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the survivor did not take the wait up:\n{}", replicas[1].log_text()));
    assert_eq!(listed[0]["id"], id.as_str(), "the same request, under its id");
    assert_eq!(count(&ws), 1, "nothing ran while it waits");
    b.request("exec.approval.resolve", json!({"id": id, "decision": "allow-once"})).await.unwrap();
    let fin = b.chat_end("pg-1").await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}");
    assert_eq!(count(&ws), 2, "the command ran exactly once");
    let decided = "SELECT count(*) FROM entries WHERE type = 'custom' AND line LIKE '%pincer.approval-decision%' \
                   AND line LIKE '%allow-once%'";
    assert_eq!(pg.psql(&url, decided), "2");
}
