//! Several `pincer gateway` processes on one PostgreSQL (`[store] backend = "postgres"`), each with
//! a state directory of its own, serving the same sessions: turns sent to one session through
//! three replicas at once make one chain with every turn once (checked in the database and in the
//! export, which the real Pi library reads identically), a resend of an acknowledged key to
//! another replica writes nothing, a client resumes its event stream on another replica by
//! durable ids, a dead replica's turn is resumed by a survivor once, even when a survivor dies in
//! the middle of taking it over, and a turn or a label that waited behind a reset through another
//! replica writes nothing under the archived transcript's name.
#![allow(clippy::disallowed_methods)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_store::{context_report, LeafArg, Session};
use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess, TOKEN};
use pincer_testkit::postgres::Postgres;
use pincer_testkit::probe::{poll_async, SseEvent, SseStream};
use pincer_testkit::{comparable, oracle_context};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
const PASSWORD: &str = "db-password-0123456789";

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    config: String,
    replicas: Vec<GatewayProcess>,
    _fake: FakeOpenAi,
}

fn cluster(n: usize) -> Cluster {
    cluster_on(Postgres::shared(), n)
}

fn cluster_on(pg: &Postgres, n: usize) -> Cluster {
    cluster_with(pg, n, |fake| fake.gateway_toml())
}

/// `n` replicas on a new database of `pg`, with the config `base` gives for the fake provider.
fn cluster_with(pg: &Postgres, n: usize, base: impl Fn(&FakeOpenAi) -> String) -> Cluster {
    let url = pg.database("replicas");
    let fake = FakeOpenAi::start_in_thread();
    let config = pg_config(&base(&fake), &url);
    let dir = tempfile::tempdir().expect("tempdir");
    let replicas = pincer_testkit::postgres::start_replicas(BIN, dir.path(), &config, n);
    Cluster { dir, url, config, replicas, _fake: fake }
}

/// The gateway config for the database at `url`. The cluster trusts local connections; the
/// password is there to show it is never logged.
fn pg_config(base: &str, url: &str) -> String {
    let with_password = url.replacen("postgres@", &format!("postgres:{PASSWORD}@"), 1);
    format!("{base}\n[store]\nbackend = \"postgres\"\nurl = \"{with_password}\"\npool_size = 8\n")
}

impl Cluster {
    /// `pincer transcript export --config … --session KEY` through replica 0's state dir.
    fn export(&self, key: &str) -> Vec<u8> {
        let config = self.dir.path().join("export.toml");
        std::fs::write(&config, &self.config).expect("config");
        let out = std::process::Command::new(BIN)
            .args(["transcript", "export", "--session", key, "--config"])
            .arg(&config)
            .arg("--state-dir")
            .arg(self.dir.path().join("r0"))
            .env("PINCER_LOG", "info") // the store's line, with its URL redacted
            .output()
            .expect("export");
        assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains("postgres:***@127.0.0.1") && !log.contains(PASSWORD), "{log}");
        out.stdout
    }

    fn sql(&self, q: &str) -> String {
        Postgres::shared().psql(&self.url, q)
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

fn text_of(v: &Value) -> String {
    pincer_testkit::probe::message_text(&v["message"])
}

fn key_of(v: &Value) -> Option<&str> {
    v["message"]["idempotencyKey"].as_str()
}

/// Sends turns `runs` to session `key` over one connection, each answered (`final`) before the next.
async fn turns_in_a_row(addr: &str, key: &str, runs: &[String], text: impl Fn(&str) -> String) {
    let mut client = Client::connect(addr).await;
    for run in runs {
        let ack = client
            .request("chat.send", json!({"sessionKey": key, "message": text(run), "idempotencyKey": run}))
            .await
            .expect("chat.send");
        assert_eq!(ack["status"], "started", "{ack}");
        let fin = client.chat_end(run).await;
        assert_eq!(fin["payload"]["state"], "final", "{fin}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_sending_to_one_session_at_once_make_one_chain_with_every_turn_once() {
    let c = cluster(3);
    let mut tasks = Vec::new();
    for (n, r) in c.replicas.iter().enumerate() {
        let addr = r.addr.clone();
        tasks.push(tokio::spawn(async move {
            let runs: Vec<String> = (0..4).map(|i| format!("r{n}-t{i}")).collect();
            turns_in_a_row(&addr, "main", &runs, |run| format!("{run} says hi")).await;
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }

    // The database: 24 message rows, seqs 1..=24, every turn's key once, no entry with two children.
    let counts = c.sql(
        "SELECT count(*), count(DISTINCT idempotency_key), count(idempotency_key), min(seq), max(seq) FROM entries \
         WHERE type = 'message'",
    );
    assert_eq!(counts, "24|12|12|1|24");
    let forks = c.sql(
        "SELECT count(*) FROM (SELECT parent_id FROM entries GROUP BY transcript, parent_id HAVING count(*) > 1) f",
    );
    assert_eq!(forks, "0", "no entry has two children");

    // The export: one chain, each turn's reply right after its user row, Pi reads it identically.
    let bytes = c.export("main");
    let s = Session::parse(bytes.clone());
    let rows: Vec<Value> = (0..s.entries.len()).map(|i| s.value(i).expect("entry")).collect();
    assert_eq!(rows.len(), 24);
    for (i, row) in rows.iter().enumerate() {
        let want = if i == 0 { Value::Null } else { rows[i - 1]["id"].clone() };
        assert_eq!(row["parentId"], want, "entry {i} chains to the one before it");
    }
    let mut runs = std::collections::HashSet::new();
    for pair in rows.chunks(2) {
        let run = key_of(&pair[0]).and_then(|k| k.strip_suffix(":user")).expect("a user row");
        assert!(runs.insert(run.to_owned()), "{run} once");
        assert_eq!(pair[1]["message"]["role"], "assistant", "a turn's reply follows its user row");
        assert!(text_of(&pair[1]).contains(&format!("{run} says hi")), "{}", pair[1]);
    }
    assert_eq!(runs.len(), 12);
    let file = write(c.dir.path(), "main.jsonl", &bytes);
    let mine = comparable(&context_report(&s, &LeafArg::Default).expect("context").to_value());
    assert_eq!(mine, comparable(&oracle_context(&file, None)));

    // A resend of an acknowledged key to another replica writes nothing.
    let mut other = Client::connect(&c.replicas[2].addr).await;
    let again = other
        .request("chat.send", json!({"sessionKey": "main", "message": "r0-t0 says hi", "idempotencyKey": "r0-t0"}))
        .await
        .expect("resend");
    assert_ne!(again["status"], "started", "{again}");
    assert_eq!(c.sql("SELECT count(*) FROM entries"), "24");
    // Every replica lists the session and reads the same history; none logged the password.
    for r in &c.replicas {
        assert!(!r.log_text().contains(PASSWORD) && r.log_text().contains("store: PostgreSQL"), "{}", r.log_text());
        let mut client = Client::connect(&r.addr).await;
        let h = client.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
        assert_eq!(h["messages"].as_array().map(Vec::len), Some(24), "{}", r.addr);
        let list = client.request("sessions.list", json!({"includeDerivedTitles": true})).await.expect("list");
        let main = list["sessions"].as_array().and_then(|l| l.iter().find(|s| s["key"] == "agent:main:main")).cloned();
        let main = main.unwrap_or_else(|| panic!("{list}"));
        assert_eq!(main["messageCount"], 24, "{main}");
        assert!(main["derivedTitle"].as_str().is_some_and(|t| t.ends_with("says hi")), "{main}");
        assert_eq!(main["status"], "done", "{main}");
    }
}

/// Many sessions at once on one replica, every turn answered. Nothing on an async thread may wait for
/// a lock held across a database call: the session index's was waited for by every turn's last step
/// (`Sessions::touch`), and with the store's tasks on the gateway's own runtime (tried, and measured
/// slower) every async thread waited there while the holder waited for them, and no turn ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_sessions_at_once_on_one_replica_all_get_their_answers() {
    let c = cluster(1);
    let mut tasks = Vec::new();
    for n in 0..30 {
        let addr = c.replicas[0].addr.clone();
        tasks.push(tokio::spawn(async move {
            let runs: Vec<String> = (0..5).map(|i| format!("s{n}-t{i}")).collect();
            turns_in_a_row(&addr, &format!("s{n}"), &runs, |_| "hi".into()).await;
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let counts = c.sql("SELECT count(*), count(DISTINCT transcript) FROM entries WHERE type = 'message'");
    assert_eq!(counts, "300|30", "every turn's message and reply, in 30 transcripts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonl_state_dir_moves_into_postgres_and_reads_the_same() {
    let fake = FakeOpenAi::start_in_thread();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = dir.path().join("files");
    let mut gw = GatewayProcess::start(BIN, &files, &fake.gateway_toml());
    let mut client = Client::connect(&gw.addr).await;
    for run in ["j1", "j2"] {
        client
            .request("chat.send", json!({"sessionKey": "main", "message": run, "idempotencyKey": run}))
            .await
            .expect("send");
        client.chat_end(run).await;
    }
    let before = client.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    drop(client);
    assert!(gw.terminate().success());

    let url = Postgres::shared().database("import");
    let import = |expect: Value| assert_eq!(pincer_testkit::postgres::import(Path::new(BIN), &files, &url), expect);
    import(json!({"transcripts": 1, "skipped": 0, "sessions": 1, "problems": []}));
    import(json!({"transcripts": 0, "skipped": 1, "sessions": 0, "problems": []}));

    let c = Cluster { config: pg_config(&fake.gateway_toml(), &url), replicas: vec![], url, dir, _fake: fake.clone() };
    let index: Value =
        serde_json::from_slice(&std::fs::read(files.join("agents/main/sessions/sessions.json")).expect("index"))
            .expect("json");
    let id = index["agent:main:main"]["sessionId"].as_str().expect("id");
    let on_disk = std::fs::read(files.join(format!("agents/main/sessions/{id}.jsonl"))).expect("transcript");
    assert_eq!(c.export("main"), on_disk, "the same bytes");

    let pg = GatewayProcess::start(BIN, &c.dir.path().join("r0"), &c.config);
    let mut client = Client::connect(&pg.addr).await;
    let after = client.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    assert_eq!(after["messages"], before["messages"]);
    assert_eq!(after["sessionId"], before["sessionId"]);
}

/// The next `session.message` or `chat` final of the client, within 10 s.
async fn next_live(c: &mut Client) -> Value {
    c.event_within(
        |f| f["event"] == "session.message" || (f["event"] == "chat" && f["payload"]["state"] == "final"),
        std::time::Duration::from_secs(10),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_another_replica_sees_each_turn_live_and_in_order() {
    let c = cluster(2);
    let mut watcher = Client::connect(&c.replicas[1].addr).await;
    watcher.request("sessions.messages.subscribe", json!({"key": "main"})).await.expect("subscribe");
    watcher.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    let mut sender = Client::connect(&c.replicas[0].addr).await;
    for i in 0..3 {
        let run = format!("live-{i}");
        sender
            .request(
                "chat.send",
                json!({"sessionKey": "main", "message": format!("{run} hello"), "idempotencyKey": run}),
            )
            .await
            .expect("send");
        sender.chat_end(&run).await;
        let started = std::time::Instant::now();
        let user = next_live(&mut watcher).await;
        assert_eq!(user["event"], "session.message", "{user}");
        assert_eq!(user["payload"]["message"]["role"], "user");
        assert_eq!(user["payload"]["message"]["idempotencyKey"], format!("{run}:user"));
        let reply = next_live(&mut watcher).await;
        assert_eq!(
            (reply["event"].as_str(), reply["payload"]["message"]["role"].as_str()),
            (Some("session.message"), Some("assistant"))
        );
        let fin = next_live(&mut watcher).await;
        assert_eq!(
            (fin["event"].as_str(), fin["payload"]["runId"].as_str()),
            (Some("chat"), Some(run.as_str())),
            "{fin}"
        );
        assert_eq!(fin["payload"]["message"]["__openclaw"]["id"], reply["payload"]["messageId"]);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "live, not by the poll alone: {:?}",
            started.elapsed()
        );
    }
    // The watcher's own replica does not announce rows twice.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    watcher.request("health", json!({})).await.expect("health"); // reads (and keeps) what came meanwhile
    assert!(!watcher.events.iter().any(|f| f["event"] == "session.message"), "nothing more: {:?}", watcher.events);
}

/// A client of the replica at `addr` whose `[slow]` turn `run` has streamed its first delta.
async fn streaming(addr: &str, run: &str) -> Client {
    streaming_in(addr, "main", run).await
}

/// [`streaming`] in session `key`.
async fn streaming_in(addr: &str, key: &str, run: &str) -> Client {
    let mut c = Client::connect(addr).await;
    c.request("chat.send", json!({"sessionKey": key, "message": "[slow] count", "idempotencyKey": run}))
        .await
        .expect("send");
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == run && f["payload"]["state"] == "delta").await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_abort_on_one_replica_stops_a_run_on_another() {
    let c = cluster(2);
    let mut a = streaming(&c.replicas[0].addr, "slow-1").await;
    let mut b = Client::connect(&c.replicas[1].addr).await;
    let started = std::time::Instant::now();
    let r = b.request("chat.abort", json!({"sessionKey": "main", "runId": "slow-1"})).await.expect("abort");
    assert_eq!(r, json!({"ok": true, "aborted": true, "runIds": ["slow-1"]}));
    let end = a.chat_end("slow-1").await;
    assert_eq!(end["payload"]["state"], "aborted", "{end}");
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_turn_is_resumed_by_a_survivor_once() {
    let mut c = cluster(2);
    let _a = streaming(&c.replicas[0].addr, "dead-1").await;
    let mut b = Client::connect(&c.replicas[1].addr).await;
    b.request("chat.history", json!({"sessionKey": "main"})).await.expect("watch the session");
    c.replicas[0].kill9();
    let killed = std::time::Instant::now();
    let resumed = "SELECT count(*) FROM entries WHERE type = 'custom' AND line LIKE '%pincer.turn-resumed%' \
                   AND line LIKE '%\"runId\":\"dead-1\"%'";
    while c.sql(resumed) != "1" {
        assert!(killed.elapsed() < std::time::Duration::from_secs(5), "not resumed within 5 s");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let took = killed.elapsed();
    // The survivor runs the turn again by itself; its watchers see the run end.
    let fin = b.chat_end("dead-1").await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}");
    // A resend of the key (the client coming back) gets the turn, not a second run.
    let ack = b
        .request("chat.send", json!({"sessionKey": "main", "message": "[slow] count", "idempotencyKey": "dead-1"}))
        .await
        .expect("resend");
    assert_eq!(ack["status"], "ok", "{ack}");
    assert_eq!(c.sql("SELECT count(*) FROM entries WHERE idempotency_key = 'dead-1:user'"), "1");
    assert_eq!(c.sql(resumed), "1");
    assert_eq!(c.sql("SELECT count(*) FROM entries WHERE line LIKE '%pincer.turn-interrupted%'"), "0");
    let replies = "SELECT count(*) FROM entries WHERE type = 'message' AND line LIKE '%\"role\":\"assistant\"%'";
    assert_eq!(c.sql(replies), "1", "one reply");
    // The run's row goes when it ends (or at the next heartbeat at the latest).
    let ended = std::time::Instant::now();
    while c.sql("SELECT count(*) FROM runs") != "0" {
        assert!(ended.elapsed() < std::time::Duration::from_secs(3), "a run left behind");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    eprintln!("resumed {took:?} after the SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_traffic_loses_nothing_acknowledged_and_service_resumes() {
    let pg = Postgres::start();
    let c = cluster_on(&pg, 2);
    let mut watcher = Client::connect(&c.replicas[1].addr).await;
    watcher.request("sessions.messages.subscribe", json!({"key": "main"})).await.expect("subscribe");
    watcher.request("chat.history", json!({"sessionKey": "main"})).await.expect("history");
    let mut sender = Client::connect(&c.replicas[0].addr).await;
    let mut finals = Vec::new();
    let mut failures = 0;
    for i in 0..40 {
        if i == 5 {
            pg.pg_stop();
        }
        if i == 8 {
            pg.pg_start();
        }
        let run = format!("pr-{i}");
        let ack = sender
            .try_request(
                "chat.send",
                json!({"sessionKey": "main", "message": run, "idempotencyKey": run}),
                std::time::Duration::from_secs(30),
            )
            .await
            .expect("an answer");
        match ack {
            Ok(a) if a["status"] == "started" => {
                let end = sender.chat_end(&run).await;
                if end["payload"]["state"] == "final" {
                    finals.push(run);
                } else {
                    failures += 1;
                }
            }
            _ => failures += 1,
        }
        if i >= 8 && finals.len() >= 8 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(failures > 0, "the outage was seen by the client");
    let n = |r: &String| r.trim_start_matches("pr-").parse::<u32>().expect("number");
    assert!(finals.iter().any(|r| n(r) >= 8), "service resumed: {finals:?}");
    for run in &finals {
        let q = format!("SELECT count(*) FROM entries WHERE idempotency_key = '{run}:user'");
        assert_eq!(pg.psql(&c.url, &q), "1", "{run} was acknowledged, so it is in the database");
    }
    // Live events resumed on the other replica after its listener reconnected.
    let last = finals.last().expect("a turn").clone();
    watcher
        .event_within(
            |f| f["event"] == "session.message" && f["payload"]["message"]["idempotencyKey"] == format!("{last}:user"),
            std::time::Duration::from_secs(10),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_on_the_postgres_store_gives_the_context_pi_builds() {
    const COMPACTION: &str =
        "[agents.defaults.compaction]\nreserve_tokens = 1000\nreserve_tokens_floor = 0\nkeep_recent_tokens = 400\n";
    let c = cluster_with(Postgres::shared(), 2, |fake| format!("{}{COMPACTION}", fake.gateway_toml_window(3000)));
    let mut clients = [Client::connect(&c.replicas[0].addr).await, Client::connect(&c.replicas[1].addr).await];
    // A threshold compaction runs after its turn's final went out, within the turn: a look right
    // after a final may come before it is written, and by the next look the next turn may have
    // compacted again. Any count but 0 says it ran.
    let compactions = || c.sql("SELECT count(*) FROM entries WHERE type = 'compaction'");
    let mut compacted = false;
    for n in 1..=8 {
        let run = format!("cmp-{n}");
        let text = format!("turn-{n}: please look at src/module_{n}.rs {}", "lorem ipsum dolor sit amet ".repeat(36));
        let client = &mut clients[n % 2];
        client
            .request("chat.send", json!({"sessionKey": "main", "message": text, "idempotencyKey": run}))
            .await
            .expect("send");
        let end = client.chat_end(&run).await;
        assert_eq!(end["payload"]["state"], "final", "{end}");
        if compactions() != "0" {
            compacted = true;
            break;
        }
    }
    if !compacted {
        let seen = poll_async(Duration::from_secs(10), Duration::from_millis(50), || async {
            (compactions() != "0").then_some(())
        });
        compacted = seen.await.is_some();
    }
    assert!(compacted, "compaction never triggered");
    // One more turn through the other replica, on top of the compaction.
    clients[0]
        .request("chat.send", json!({"sessionKey": "main", "message": "what next?", "idempotencyKey": "cmp-after"}))
        .await
        .expect("send");
    clients[0].chat_end("cmp-after").await;
    let bytes = c.export("main");
    let file = write(c.dir.path(), "compacted.jsonl", &bytes);
    let s = Session::parse(bytes);
    let ours = context_report(&s, &LeafArg::Default).expect("context").to_value();
    let pi = oracle_context(&file, None);
    assert_eq!(comparable(&ours), comparable(&pi));
    assert_eq!(pi["context"]["messages"][0]["role"], "compactionSummary");
}

/// The SSE ids the rows of the database's one transcript give, in seq order: `<sessionId>:<seq>`
/// for a message's `session.message`, `.1` after it for the `chat` event of a reply that ends its
/// turn or of an interrupted marker.
fn ids_from_rows(c: &Cluster) -> Vec<String> {
    let rows = c.sql(
        "SELECT t.session_id, e.seq, e.line FROM entries e JOIN transcripts t ON t.id = e.transcript ORDER BY e.seq",
    );
    let mut out = Vec::new();
    for row in rows.lines() {
        let mut parts = row.splitn(3, '|');
        let (sid, seq, line) = (parts.next().expect("sid"), parts.next().expect("seq"), parts.next().expect("line"));
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        let m = &v["message"];
        if v["type"] == "message" {
            out.push(format!("{sid}:{seq}"));
        }
        let ends = v["type"] == "message" && m["role"] == "assistant" && m["stopReason"] != "toolUse";
        if ends || v["customType"] == "pincer.turn-interrupted" {
            out.push(format!("{sid}:{seq}.1"));
        }
    }
    out
}

const EVENTS: &str = "/api/sessions/main/events";

/// The SSE events of `stream` up to and including the first one `last` accepts (10 s each at most).
async fn sse_until(stream: &mut SseStream, last: impl Fn(&SseEvent) -> bool) -> Vec<SseEvent> {
    let mut out = Vec::new();
    loop {
        let ev = stream.next(Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no event after {out:?}"));
        let done = last(&ev);
        out.push(ev);
        if done {
            return out;
        }
    }
}

fn ids(evs: &[SseEvent]) -> Vec<String> {
    evs.iter().filter_map(|e| e.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_its_event_stream_on_another_replica_after_the_streaming_one_is_killed() {
    let mut c = cluster(2);
    let (a, b) = (c.replicas[0].addr.clone(), c.replicas[1].addr.clone());
    let auth = format!("Bearer {TOKEN}");
    let mut on_a = SseStream::open(&a, EVENTS, &[("Authorization", &auth)]).await.expect("SSE on A");
    let mut sender = Client::connect(&a).await;
    sender
        .request("chat.send", json!({"sessionKey": "main", "message": "first", "idempotencyKey": "sse-1"}))
        .await
        .expect("send");
    sender.chat_end("sse-1").await;
    let _streaming = streaming(&a, "sse-dead").await;
    let seen = sse_until(&mut on_a, |e| e.data.contains("\"state\":\"delta\"") && e.data.contains("sse-dead")).await;
    c.replicas[0].kill9();
    let killed = std::time::Instant::now();
    let seen = ids(&seen);
    assert_eq!(seen.len(), 4, "turn 1's three events and the user row of the streaming turn: {seen:?}");
    let last = seen.last().expect("an id").clone();

    // Back on B with the last id: exactly what was not seen, the survivor's resumed run among it.
    let headers = [("Authorization", auth.as_str()), ("Last-Event-ID", last.as_str())];
    let mut on_b = SseStream::open(&b, EVENTS, &headers).await.expect("SSE on B");
    let marker = sse_until(&mut on_b, |e| e.data.contains("\"state\":\"final\"") && e.data.contains("sse-dead")).await;
    eprintln!("the resumed turn ended {:?} after the SIGKILL", killed.elapsed());
    assert!(on_b.head.starts_with("HTTP/1.1 200"), "{}", on_b.head);
    // Then live, with no gap: a turn through B.
    let mut client = Client::connect(&b).await;
    client
        .request("chat.send", json!({"sessionKey": "main", "message": "after", "idempotencyKey": "sse-after"}))
        .await
        .expect("send");
    client.chat_end("sse-after").await;
    let after = sse_until(&mut on_b, |e| e.data.contains("\"state\":\"final\"") && e.data.contains("sse-after")).await;
    let mut all = seen;
    all.extend(ids(&marker));
    all.extend(ids(&after));
    let rows = ids_from_rows(&c);
    assert_eq!(all, rows, "A's events then B's are every row's, once, in order");
    assert!(!marker.iter().chain(&after).any(|e| e.event.as_deref() == Some("reset")), "{marker:?}");
    // The same reconnect now replays all of it from the database, as it was sent live.
    let mut again = SseStream::open(&b, EVENTS, &headers).await.expect("SSE on B");
    let replayed = sse_until(&mut again, |e| e.id.as_ref() == rows.last()).await;
    assert_eq!(ids(&replayed), rows[4..].to_vec());
    let live: Vec<&SseEvent> = marker.iter().chain(&after).filter(|e| e.id.is_some()).collect();
    for (r, l) in replayed.iter().zip(live) {
        assert_eq!(
            (&r.event, r.data.contains("\"state\":\"final\"")),
            (&l.event, l.data.contains("\"state\":\"final\""))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_and_the_relay_announcing_the_same_rows_send_each_event_once() {
    let c = cluster(2);
    let (a, b) = (c.replicas[0].addr.clone(), c.replicas[1].addr.clone());
    let mut sender = Client::connect(&a).await;
    sender
        .request("chat.send", json!({"sessionKey": "main", "message": "one", "idempotencyKey": "o-1"}))
        .await
        .expect("send");
    sender.chat_end("o-1").await;
    let first = ids_from_rows(&c)[0].clone();
    // B starts watching the session only now, from the client's id: its relay announces A's rows
    // after it while the catch-up replays them.
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str()), ("Last-Event-ID", first.as_str())];
    let mut on_b = SseStream::open(&b, EVENTS, &headers).await.expect("SSE on B");
    sender
        .request("chat.send", json!({"sessionKey": "main", "message": "two", "idempotencyKey": "o-2"}))
        .await
        .expect("send");
    sender.chat_end("o-2").await;
    let got = sse_until(&mut on_b, |e| e.data.contains("\"state\":\"final\"") && e.data.contains("o-2")).await;
    assert_eq!(ids(&got), ids_from_rows(&c)[1..].to_vec(), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_dying_in_the_middle_of_a_takeover_leaves_it_to_a_third_and_it_is_resumed_once() {
    let pg = Postgres::shared();
    let mut c = cluster(3);
    let _client = streaming(&c.replicas[0].addr, "tk-1").await;
    c.replicas[0].kill9();
    // The test takes the session's turn lock as soon as the dead replica's is gone: the survivor
    // that claims the run then waits for it, claimed but with nothing written.
    let held = pg.hold_advisory_lock(&c.url, pincer_pg::turn_lock_key("agent:main:main"));
    let claim = "SELECT replica, heartbeat FROM runs WHERE run_id = 'tk-1'";
    let (claimer, beat) = poll_async(Duration::from_secs(10), Duration::from_millis(20), || async {
        let row = c.sql(claim);
        let (who, beat) = row.split_once('|')?;
        (who != "replica-0").then(|| (who.to_owned(), beat.to_owned()))
    })
    .await
    .expect("a survivor claims the dead replica's run");
    // While it waits, the claim is beaten as the claimer's own (not dropped as a run it lacks).
    poll_async(Duration::from_secs(3), Duration::from_millis(20), || async {
        let row = c.sql(claim);
        (row.split_once('|').is_some_and(|(who, b)| who == claimer && b != beat)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the claim of {claimer} was not beaten: {:?}", c.sql(claim)));
    let marked = "SELECT count(*) FROM entries WHERE line LIKE '%pincer.turn-resumed%'";
    assert_eq!(c.sql(marked), "0", "nothing written while the lock is held");
    let i: usize = claimer.trim_start_matches("replica-").parse().expect("replica number");
    c.replicas[i].kill9();
    pg.release(&c.url, held);
    // The third replica claims the run in turn and resumes it, once.
    poll_async(Duration::from_secs(15), Duration::from_millis(50), || async { (c.sql(marked) == "1").then_some(()) })
        .await
        .expect("the third replica resumes the turn");
    poll_async(Duration::from_secs(30), Duration::from_millis(50), || async {
        (c.sql("SELECT count(*) FROM runs") == "0").then_some(())
    })
    .await
    .expect("the run's row goes once the resumed run ends");
    assert_eq!(c.sql(marked), "1", "one attempt");
    let replies = "SELECT count(*) FROM entries WHERE type = 'message' AND line LIKE '%\"role\":\"assistant\"%'";
    assert_eq!(c.sql(replies), "1", "one reply");
    let third = 3 - i;
    let said = || c.replicas[third].log_text().contains("resuming a turn interrupted before its reply");
    poll_async(Duration::from_secs(5), Duration::from_millis(50), || async { said().then_some(()) })
        .await
        .expect("the third replica logged the takeover");
    // Chained after the turn's user row.
    let user = c.sql("SELECT id FROM entries WHERE idempotency_key = 'tk-1:user'");
    assert_eq!(c.sql("SELECT parent_id FROM entries WHERE line LIKE '%pincer.turn-resumed%'"), user);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_survivors_of_a_dead_replica_resume_its_turn_once() {
    let pg = Postgres::shared();
    let mut c = cluster(3);
    let _client = streaming(&c.replicas[0].addr, "two-1").await;
    c.replicas[0].kill9();
    // With the turn lock held by the test, both survivors beat and look for stale runs several
    // times while the run's takeover waits: the run stays with the one that claimed it.
    let held = pg.hold_advisory_lock(&c.url, pincer_pg::turn_lock_key("agent:main:main"));
    let claim = "SELECT replica, heartbeat FROM runs WHERE run_id = 'two-1'";
    let mut last = poll_async(Duration::from_secs(10), Duration::from_millis(20), || async {
        let row = c.sql(claim);
        row.split_once('|').is_some_and(|(who, _)| who != "replica-0").then_some(row)
    })
    .await
    .expect("a survivor claims the dead replica's run");
    let claimer = last.split_once('|').map(|(w, _)| w.to_owned()).expect("claimer");
    for _ in 0..4 {
        last = poll_async(Duration::from_secs(3), Duration::from_millis(20), || async {
            let row = c.sql(claim);
            (row != last).then_some(row)
        })
        .await
        .expect("the claim is beaten");
        assert!(last.starts_with(&format!("{claimer}|")), "the other survivor took the run: {last}");
    }
    pg.release(&c.url, held);
    let marked = "SELECT count(*) FROM entries WHERE line LIKE '%pincer.turn-resumed%'";
    poll_async(Duration::from_secs(30), Duration::from_millis(50), || async {
        (c.sql("SELECT count(*) FROM runs") == "0").then_some(())
    })
    .await
    .expect("no run left");
    // The logs are written in the background: wait for the line, then count.
    let said = || {
        (1..3).map(|i| c.replicas[i].log_text().matches("resuming a turn interrupted before its reply").count()).sum()
    };
    poll_async(Duration::from_secs(5), Duration::from_millis(50), || async { (said() > 0).then_some(()) })
        .await
        .expect("a survivor logged the takeover");
    assert_eq!((said(), c.sql(marked)), (1, "1".into()), "one attempt, by one survivor");
    let replies = "SELECT count(*) FROM entries WHERE type = 'message' AND line LIKE '%\"role\":\"assistant\"%'";
    assert_eq!(c.sql(replies), "1", "one reply");
}

/// `session.message` events of `c` up to and including the first `last` accepts, as (seq, key).
async fn messages_until(c: &mut Client, last: impl Fn(&Value) -> bool) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    loop {
        let f = c.event_within(|f| f["event"] == "session.message", Duration::from_secs(10)).await;
        let p = &f["payload"];
        let key = p["message"]["idempotencyKey"].as_str().unwrap_or("(reply)").to_owned();
        out.push((p["messageSeq"].as_u64().unwrap_or_else(|| panic!("no messageSeq: {f}")), key));
        if last(p) {
            return out;
        }
    }
}

async fn turn(c: &mut Client, run: &str) {
    c.request("chat.send", json!({"sessionKey": "main", "message": run, "idempotencyKey": run})).await.expect("send");
    c.chat_end(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_resumes_its_session_messages_after_seq_on_another_replica() {
    let c = cluster(2);
    let (a, b) = (c.replicas[0].addr.clone(), c.replicas[1].addr.clone());
    let mut sender = Client::connect(&a).await;
    let mut watcher = Client::connect(&a).await;
    watcher.request("sessions.messages.subscribe", json!({"key": "main"})).await.expect("subscribe");
    turn(&mut sender, "w-1").await;
    let first = messages_until(&mut watcher, |p| p["message"]["role"] == "assistant").await;
    let seqs = |q: &str| -> Vec<u64> { c.sql(q).lines().map(|l| l.parse().expect("seq")).collect() };
    let all = "SELECT seq FROM entries WHERE type = 'message' ORDER BY seq";
    assert_eq!(first.iter().map(|(s, _)| *s).collect::<Vec<_>>(), seqs(all), "messageSeq is the row's seq");
    // The watcher saw w-1's user row only, and goes away; w-2 happens.
    let seen = first[0].0;
    drop(watcher);
    turn(&mut sender, "w-2").await;
    // Back after that seq, on B whose relay starts following the session then (from that seq: it
    // announces A's rows the replay sends too): w-1's reply, then w-2, then live, each once.
    let mut back = Client::connect(&b).await;
    let sid = c.sql("SELECT session_id FROM transcripts");
    let r = back
        .request("sessions.messages.subscribe", json!({"key": "main", "afterSeq": seen, "sessionId": sid}))
        .await
        .expect("subscribe after a seq");
    assert_eq!((r["replayed"].as_u64(), r["sessionId"].as_str()), (Some(3), Some(sid.as_str())), "{r}");
    turn(&mut sender, "w-3").await;
    let got = messages_until(&mut back, |p| {
        p["message"]["role"] == "assistant" && p["message"]["content"].to_string().contains("w-3")
    })
    .await;
    let want: Vec<u64> = seqs(all).into_iter().filter(|s| *s > seen).collect();
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), want, "{got:?}");
    assert_eq!(got[1].1, "w-2:user");
    // Bad input: a clear error, or `reset` when the seq names nothing of this transcript.
    let neg = back
        .request("sessions.messages.subscribe", json!({"key": "main", "afterSeq": -1}))
        .await
        .expect_err("negative");
    assert!(neg["message"].as_str().is_some_and(|m| m.contains("afterSeq")), "{neg}");
    for (params, why) in [
        (json!({"key": "main", "afterSeq": 999_999_999_u64}), "names no entry"),
        (json!({"key": "main", "afterSeq": seen, "sessionId": "another"}), "replaced"),
    ] {
        let r = back.request("sessions.messages.subscribe", params).await.expect("an answer");
        assert!(r["reset"].as_str().is_some_and(|m| m.contains(why) && m.contains("refetch")), "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_waiting_behind_a_reset_on_another_replica_goes_to_the_new_transcript() {
    let pg = Postgres::shared();
    let c = cluster(2);
    let mut a = Client::connect(&c.replicas[0].addr).await;
    let mut b = Client::connect(&c.replicas[1].addr).await;
    a.request("chat.send", json!({"sessionKey": "main", "message": "one", "idempotencyKey": "rs-1"}))
        .await
        .expect("send");
    a.chat_end("rs-1").await;
    let old = c.sql("SELECT file FROM transcripts");
    assert!(old.ends_with(".jsonl") && !old.contains('\n'), "one transcript: {old}");
    // The test holds the session index's lock: A's reset takes the session's turn, then waits
    // for the index, holding the turn.
    let index = pg.hold_advisory_lock(&c.url, pincer_pg::lock_key("agents/main/sessions/sessions.json"));
    let reset = tokio::spawn(async move { a.request("sessions.reset", json!({"key": "main"})).await });
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    poll_async(Duration::from_secs(10), Duration::from_millis(20), || async { (c.sql(waiting) == "1").then_some(()) })
        .await
        .expect("A's reset waits for the index, holding the session's turn");
    // A label of an entry of the old transcript sent through B waits for the turn A holds; so
    // does a turn sent through B, which reads the session now (the old transcript).
    let first = c.sql("SELECT id FROM entries WHERE idempotency_key = 'rs-1:user'");
    let mut b2 = Client::connect(&c.replicas[1].addr).await;
    let label = tokio::spawn(async move {
        b2.request("sessions.label", json!({"sessionKey": "main", "entryId": first, "label": "first"})).await
    });
    let queued = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                  AND query LIKE 'SELECT pg_try_advisory_lock%'";
    poll_async(Duration::from_secs(10), Duration::from_millis(20), || async { (c.sql(queued) != "0").then_some(()) })
        .await
        .expect("B's label asks for the session's turn");
    let ack = b
        .request("chat.send", json!({"sessionKey": "main", "message": "two", "idempotencyKey": "rs-2"}))
        .await
        .expect("send");
    // B read the session before the ack: whenever its turn gets the lock, it has the old name.
    assert_eq!(ack["status"], "started", "{ack}");
    pg.release(&c.url, index);
    reset.await.expect("reset task").expect("sessions.reset");
    let fin = b.chat_end("rs-2").await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}");
    let err = label.await.expect("label task").expect_err("a label of the reset session's old entry");
    assert!(err.to_string().contains("was reset or deleted meanwhile"), "{err}");
    assert_eq!(c.sql("SELECT count(*) FROM entries WHERE type = 'label'"), "0", "no label written anywhere");

    // Nothing under the old name again: the old transcript is archived, B's turn is in the new one.
    let files = c.sql("SELECT file FROM transcripts ORDER BY file");
    let files: Vec<&str> = files.lines().collect();
    let new = format!(
        "agents/main/sessions/{}.jsonl",
        c.sql("SELECT session_id FROM sessions WHERE key = 'agent:main:main'")
    );
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.iter().any(|f| f.starts_with(&format!("{old}.reset."))), "{files:?}");
    assert!(files.contains(&new.as_str()) && !files.contains(&old.as_str()), "{files:?} (new: {new})");
    let where_is = |key: &str| {
        c.sql(&format!(
            "SELECT t.file FROM entries e JOIN transcripts t ON t.id = e.transcript WHERE e.idempotency_key = '{key}'"
        ))
    };
    assert_eq!(where_is("rs-2:user"), new);
    assert!(where_is("rs-1:user").starts_with(&format!("{old}.reset.")));
    let types = c.sql(&format!(
        "SELECT string_agg(e.line::json->'message'->>'role', ',' ORDER BY seq) FROM entries e \
         JOIN transcripts t ON t.id = e.transcript WHERE t.file = '{new}'"
    ));
    assert_eq!(types, "user,assistant", "B's turn and its reply, alone in the new transcript");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_queued_turns_are_run_by_a_survivor_in_order_once() {
    let mut c = cluster(2);
    let mut a = streaming(&c.replicas[0].addr, "q-1").await;
    // Two more turns wait behind the streaming one, each acknowledged (its record on disk).
    for (run, text) in [("q-2", "second"), ("q-3", "third")] {
        let ack = a
            .request("chat.send", json!({"sessionKey": "main", "message": text, "idempotencyKey": run}))
            .await
            .expect("send");
        assert_eq!(ack["status"], "started", "{ack}");
    }
    let queued = "SELECT count(*) FROM entries WHERE line LIKE '%pincer.turn-queued%'";
    poll_async(Duration::from_secs(10), Duration::from_millis(20), || async { (c.sql(queued) == "2").then_some(()) })
        .await
        .expect("both waiting turns recorded");
    let mut b = Client::connect(&c.replicas[1].addr).await;
    b.request("chat.history", json!({"sessionKey": "main"})).await.expect("watch the session");
    c.replicas[0].kill9();
    // The survivor answers the cut turn and then each waiting one, in the order they were sent.
    for run in ["q-1", "q-2", "q-3"] {
        let fin = b.chat_end(run).await;
        assert_eq!(fin["payload"]["state"], "final", "{run}: {fin}");
    }
    poll_async(Duration::from_secs(10), Duration::from_millis(50), || async {
        (c.sql("SELECT count(*) FROM runs") == "0").then_some(())
    })
    .await
    .expect("no run left");
    for run in ["q-1", "q-2", "q-3"] {
        let user = format!("SELECT count(*) FROM entries WHERE idempotency_key = '{run}:user'");
        assert_eq!(c.sql(&user), "1", "{run}: one user row");
    }
    let replies = "SELECT count(*) FROM entries WHERE type = 'message' AND line LIKE '%\"role\":\"assistant\"%'";
    assert_eq!(c.sql(replies), "3", "one reply each");
    // The export: on the one chain, each message's reply follows it, in the order sent; Pi reads
    // it identically.
    let bytes = c.export("main");
    let s = Session::parse(bytes.clone());
    let (path, cycle) = s.path_from(s.entries.len() - 1);
    assert!(!cycle);
    let chain: Vec<Value> =
        path.iter().map(|&i| s.value(i).expect("entry")).filter(|e| e["type"] == "message").collect();
    let keys: Vec<String> = chain.iter().map(|e| key_of(e).unwrap_or("(reply)").to_owned()).collect();
    let want = ["q-1:user", "(reply)", "q-2:user", "(reply)", "q-3:user", "(reply)"];
    assert_eq!(keys, want.map(String::from).to_vec(), "{keys:?}");
    let file = write(c.dir.path(), "main.jsonl", &bytes);
    let mine = comparable(&context_report(&s, &LeafArg::Default).expect("context").to_value());
    assert_eq!(mine, comparable(&oracle_context(&file, None)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_to_stop_a_run_reaches_it_on_another_replica() {
    let c = cluster(2);
    let mut b = Client::connect(&c.replicas[1].addr).await;
    // A request refused stops nothing: deleting the main session, or a reset for no known reason,
    // is refused, on the run's replica or another, and the run goes on.
    let mut a = streaming(&c.replicas[0].addr, "kept").await;
    for (client, params) in [(&mut a, json!({"key": "main"})), (&mut b, json!({"key": "main"}))] {
        let refused = client.request("sessions.delete", params).await.expect_err("main is kept");
        assert!(refused.to_string().contains("Cannot delete the main session"), "{refused}");
    }
    let refused =
        a.request("sessions.reset", json!({"key": "main", "reason": "bored"})).await.expect_err("no such reason");
    assert!(refused.to_string().contains("reason"), "{refused}");
    assert_eq!(a.chat_end("kept").await["payload"]["state"], "final");
    let ways: [(&str, Value, &str); 4] = [
        ("chat.send", json!({"sessionKey": "work", "message": "/stop", "idempotencyKey": "stop-msg"}), "stop-command"),
        ("sessions.abort", json!({"key": "work"}), "rpc"),
        ("sessions.reset", json!({"key": "work"}), "rpc"),
        ("sessions.delete", json!({"key": "work"}), "rpc"),
    ];
    for (n, (method, params, origin)) in ways.into_iter().enumerate() {
        let run = format!("stop-{n}");
        let mut a = streaming_in(&c.replicas[0].addr, "work", &run).await;
        let asked = std::time::Instant::now();
        let r = b.request(method, params).await.unwrap_or_else(|e| panic!("{method}: {e}"));
        let end = a.chat_end(&run).await;
        let took = asked.elapsed();
        assert_eq!(end["payload"]["state"], "aborted", "{method}: {end}");
        assert_eq!(end["payload"]["stopReason"], origin, "{method}: {end}");
        eprintln!("{method} on replica 1 ended the run on replica 0 in {took:?}: {r}");
        // One aborted partial, chained after the run's user row, with the origin of the request.
        let partial = format!("SELECT line FROM entries WHERE idempotency_key = '{run}:assistant'");
        let line: Value =
            serde_json::from_str(&c.sql(&partial)).unwrap_or_else(|e| panic!("{method}: one partial: {e}"));
        assert_eq!(line["message"]["openclawAbort"]["aborted"], true, "{method}: {line}");
        assert_eq!(line["message"]["openclawAbort"]["origin"], origin, "{method}: {line}");
        let user = c.sql(&format!("SELECT id FROM entries WHERE idempotency_key = '{run}:user'"));
        assert_eq!(line["parentId"], user.as_str(), "{method}: {line}");
    }
    // The runs are gone, and no turn ran twice.
    poll_async(Duration::from_secs(10), Duration::from_millis(50), || async {
        (c.sql("SELECT count(*) FROM runs") == "0").then_some(())
    })
    .await
    .expect("no run left");
    let replies = "SELECT count(*) FROM entries WHERE type = 'message' AND line LIKE '%\"role\":\"assistant\"%'";
    assert_eq!(c.sql(replies), "5", "the kept run's reply and one partial each");
}
