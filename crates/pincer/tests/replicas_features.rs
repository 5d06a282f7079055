//! The features a JSONL state directory has, on the PostgreSQL store with several `pincer gateway`
//! replicas: full-text search (`sessions.search`, `pincer sessions search --config`) finds from
//! one replica what was sent through another, with the answers a JSONL gateway gives;
//! `sessions.compact {maxLines}` keeps the lines the file store keeps (and the old transcript);
//! the archive listing reads what reset and delete set aside; the OpenAI endpoint continues a
//! stateless conversation sent alternately to two replicas as one session, and a Responses API
//! response made through one is retrieved and continued (and branched from) through another; the transcript
//! commands take `--session KEY` of the database (those that work on files say so).
#![allow(clippy::disallowed_methods)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_store::{context_report, LeafArg, Session};
use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::postgres::Postgres;
use pincer_testkit::{comparable, oracle_context};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    config: String,
    replicas: Vec<GatewayProcess>,
    fake: FakeOpenAi,
}

/// `n` replicas on a new database of the shared cluster; `extra` is appended to the config.
fn cluster(n: usize, extra: &str) -> Cluster {
    let pg = Postgres::shared();
    let url = pg.database("features");
    let fake = FakeOpenAi::start_in_thread();
    let config =
        format!("{}\n{extra}\n[store]\nbackend = \"postgres\"\nurl = \"{url}\"\npool_size = 4\n", fake.gateway_toml());
    let dir = tempfile::tempdir().expect("tempdir");
    let replicas = pincer_testkit::postgres::start_replicas(BIN, dir.path(), &config, n);
    Cluster { dir, url, config, replicas, fake }
}

impl Cluster {
    fn sql(&self, q: &str) -> String {
        Postgres::shared().psql(&self.url, q)
    }

    /// `pincer <args…> --config FILE` (the cluster's config) through replica 0's state dir.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        let config = self.dir.path().join("cli.toml");
        std::fs::write(&config, &self.config).expect("config");
        std::process::Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(self.dir.path().join("r0"))
            .output()
            .expect("pincer")
    }

    fn export(&self, key: &str) -> Vec<u8> {
        let out = self.cli(&["transcript", "export", "--session", key]);
        assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    }
}

/// Sends `message` to `session` and waits for the turn's end.
async fn turn(client: &mut Client, session: &str, message: &str, run: &str) {
    let ack = client
        .request("chat.send", json!({"sessionKey": session, "message": message, "idempotencyKey": run}))
        .await
        .expect("chat.send");
    assert_eq!(ack["status"], "started", "{ack}");
    let fin = client.chat_end(run).await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}");
}

/// The conversations both stores are searched over.
async fn converse(client: &mut Client) {
    turn(client, "trip", "Visit the Café Múseum near Pena Palace tomorrow", "t1").await;
    turn(client, "trip", "then plan a or plan b for lunch", "t2").await;
    turn(client, "chores", "buy milk and bread", "c1").await;
    turn(client, "zoo", "a zebra crossing by the museum", "z1").await;
    let patched = client.request("sessions.patch", json!({"key": "zoo", "archived": true})).await.expect("archive");
    assert!(patched["ok"].as_bool().unwrap_or(true), "{patched}");
}

/// A search's hits without what differs between engines and runs (ids, times, scores), sorted.
fn hits(found: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = found["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{found}"))
        .iter()
        .map(|h| {
            assert!(h["messageId"].is_string() && h["messageId"] == h["entryId"], "{h}");
            assert!(h["sessionId"].is_string() && h["timestamp"].as_i64().is_some_and(|t| t > 0), "{h}");
            assert!(h["score"].as_f64().is_some_and(|s| s > 0.0), "{h}");
            json!({"sessionKey": h["sessionKey"], "role": h["role"], "snippet": h["snippet"], "title": h["title"],
                "archived": h["archived"]})
        })
        .collect();
    out.sort_by_key(|v| v.to_string());
    out
}

/// The queries both stores answer, with the (session, role) pairs each must find.
fn queries() -> Vec<(Value, Vec<(&'static str, &'static str)>)> {
    let trip_both = vec![("agent:main:trip", "assistant"), ("agent:main:trip", "user")];
    vec![
        (json!({"query": "cafe MUSEUM"}), trip_both.clone()),
        (json!({"query": "\"pena palace\""}), trip_both.clone()),
        (json!({"query": "\"palace pena\""}), vec![]),
        (json!({"query": "mús*"}), trip_both.clone()),
        (json!({"query": "\"pena pal\"*"}), trip_both.clone()),
        (json!({"query": "zebra"}), vec![]),
        (
            json!({"query": "zebra", "includeArchived": true}),
            vec![("agent:main:zoo", "assistant"), ("agent:main:zoo", "user")],
        ),
        (
            json!({"query": "zebra", "scope": {"archived": true}}),
            vec![("agent:main:zoo", "assistant"), ("agent:main:zoo", "user")],
        ),
        (json!({"query": "foo\" OR 1=1 --"}), vec![]),
        (json!({"query": "a & !b :*"}), trip_both.clone()),
        (json!({"query": "milk", "sessionKeys": ["trip"]}), vec![]),
        (json!({"query": "milk", "limit": 1}), vec![("agent:main:chores", "user")]),
    ]
}

fn pairs(h: &[Value]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = h
        .iter()
        .map(|h| (h["sessionKey"].as_str().unwrap_or("").to_owned(), h["role"].as_str().unwrap_or("").to_owned()))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_on_one_replica_finds_what_another_wrote_as_a_jsonl_gateway_does() {
    let c = cluster(2, "");
    let mut a = Client::connect(&c.replicas[0].addr).await;
    converse(&mut a).await;

    // The same conversations on a JSONL gateway: its answers are the reference.
    let files_dir = tempfile::tempdir().expect("tempdir");
    let jsonl = GatewayProcess::start(BIN, files_dir.path(), &c.fake.gateway_toml());
    let mut j = Client::connect(&jsonl.addr).await;
    converse(&mut j).await;

    // Replica B, right after A's appends (no wait: the rows are written in the appending transaction).
    let mut b = Client::connect(&c.replicas[1].addr).await;
    for (params, want) in queries() {
        let on_pg = b.request("sessions.search", params.clone()).await.unwrap_or_else(|e| panic!("{params}: {e}"));
        let on_files = j.request("sessions.search", params.clone()).await.unwrap_or_else(|e| panic!("{params}: {e}"));
        let want: Vec<(String, String)> = want.iter().map(|(k, r)| ((*k).to_owned(), (*r).to_owned())).collect();
        assert_eq!(pairs(&hits(&on_pg)), want, "{params}: {on_pg}");
        assert_eq!(hits(&on_pg), hits(&on_files), "{params}: the same hits as on JSONL");
        assert_eq!(on_pg["truncated"], on_files["truncated"], "{params}");
    }
    let one = b.request("sessions.search", json!({"query": "Múseum"})).await.expect("search");
    let hit = one["results"].as_array().and_then(|r| r.iter().find(|h| h["role"] == "user")).cloned().expect("hit");
    assert_eq!(hit["title"], "Visit the Café Múseum near Pena Palace tomorrow");
    assert_eq!(hit["snippet"], "Visit the Café Múseum near Pena Palace tomorrow");
    assert_eq!(hit["archived"], false);
    let id = hit["entryId"].as_str().expect("id");
    let entry = c.sql(&format!("SELECT count(*) FROM entries WHERE id = '{id}' AND line LIKE '%Múseum%'"));
    assert_eq!(entry, "1", "the hit names the entry");

    // Bad input: a clear error, and nothing written.
    let rows = c.sql("SELECT (SELECT count(*) FROM entries) || '/' || (SELECT count(*) FROM search_messages)");
    for bad in [json!({"query": "   "}), json!({"query": "-- * \"\""}), json!({"query": "x", "limit": 0})] {
        let e = b.request("sessions.search", bad.clone()).await.expect_err("refused");
        assert_eq!(e["code"], "INVALID_REQUEST", "{bad}: {e}");
        let je = j.request("sessions.search", bad.clone()).await.expect_err("refused on files too");
        assert_eq!(e["message"], je["message"], "{bad}");
    }
    assert_eq!(c.sql("SELECT (SELECT count(*) FROM entries) || '/' || (SELECT count(*) FROM search_messages)"), rows);
    assert_eq!(c.sql("SELECT count(*) FROM search_messages"), "8", "one row per user or assistant message");

    // The CLI over the database.
    let out = c.cli(&["sessions", "search", "pena palace", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut keys: Vec<&str> = rows.as_array().expect("rows").iter().filter_map(|r| r["sessionKey"].as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["agent:main:trip", "agent:main:trip"], "{rows}");
    assert!(!c.replicas[0].log_text().contains("search is off"), "{}", c.replicas[0].log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_max_lines_keeps_what_the_file_store_keeps_and_the_old_transcript() {
    let c = cluster(2, "");
    let mut a = Client::connect(&c.replicas[0].addr).await;
    for i in 0..4 {
        turn(&mut a, "long", &format!("message number {i}"), &format!("l{i}")).await;
    }
    // A branch: the leaf moved back (a `leaf` entry), so the cut re-roots a link.
    let h = a.request("chat.history", json!({"sessionKey": "long"})).await.expect("history");
    let user3 = h["messages"][6]["__openclaw"]["id"].as_str().map(str::to_owned);
    let user3 = user3.unwrap_or_else(|| panic!("{}", h["messages"][6]));
    a.request("sessions.rewind", json!({"sessionKey": "long", "entryId": user3})).await.expect("rewind");
    turn(&mut a, "long", "a new last message", "l4").await;
    let before = c.export("long");

    // The file store's trim of the same transcript is the reference.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("long.jsonl");
    std::fs::write(&file, &before).expect("write");
    let store = pincer_store::Store::new(pincer_store::StoreOptions::default());
    let on_file = store.trim(&file, 5).expect("file trim");
    assert!(on_file.compacted);
    let want = std::fs::read(&file).expect("trimmed file");

    // Bad input writes nothing.
    let mut b = Client::connect(&c.replicas[1].addr).await;
    let count = c.sql("SELECT count(*) FROM entries");
    for bad in [json!({"key": "long", "maxLines": 0}), json!({"key": "long", "maxLines": "5"})] {
        let e = b.request("sessions.compact", bad.clone()).await.expect_err("refused");
        assert_eq!(e["code"], "INVALID_REQUEST", "{bad}: {e}");
    }
    let none = b.request("sessions.compact", json!({"key": "nothing-here", "maxLines": 3})).await.expect_err("none");
    assert_eq!(none["message"], "session not found: nothing-here", "{none}");
    assert_eq!(c.sql("SELECT count(*) FROM entries"), count);
    assert_eq!(c.sql("SELECT count(*) FROM transcripts WHERE file LIKE '%.bak.%'"), "0");

    // Through replica B.
    let r = b.request("sessions.compact", json!({"key": "long", "maxLines": 5})).await.expect("compact");
    assert_eq!((&r["ok"], &r["compacted"], &r["kept"]), (&json!(true), &json!(true), &json!(5)), "{r}");
    let backup = r["backup"].as_str().expect("backup");
    assert!(backup.contains("/agents/main/sessions/") && backup.contains(".jsonl.bak."), "{r}");
    let after = c.export("long");
    assert_eq!(String::from_utf8_lossy(&after), String::from_utf8_lossy(&want), "the file store's lines");
    let exported = dir.path().join("exported.jsonl");
    std::fs::write(&exported, &after).expect("write");
    let s = Session::parse(after.clone());
    let mine = comparable(&context_report(&s, &LeafArg::Default).expect("context").to_value());
    assert_eq!(mine, comparable(&oracle_context(&exported, None)), "Pi reads it identically");
    assert_eq!(comparable(&oracle_context(&exported, None)), comparable(&oracle_context(&file, None)));

    // The old transcript is kept whole, as the backup.
    let rel = backup.rsplit_once("/agents/").map(|(_, r)| format!("agents/{r}")).expect("backup under agents/");
    let kept = c.sql(&format!(
        "SELECT t.header || E'\\n' || string_agg(e.line, E'\\n' ORDER BY e.seq) FROM transcripts t \
         JOIN entries e ON e.transcript = t.id WHERE t.file = '{rel}' GROUP BY t.header"
    ));
    assert_eq!(format!("{kept}\n"), String::from_utf8_lossy(&before));

    // Search forgot the cut messages; the session goes on from its leaf on either replica.
    let found = b.request("sessions.search", json!({"query": "number"})).await.expect("search");
    let texts: Vec<&str> =
        found["results"].as_array().expect("results").iter().filter_map(|h| h["snippet"].as_str()).collect();
    assert_eq!(texts, ["Fake reply: you said \"message number 3\""], "only the kept reply: {found}");
    // Replica A, which ran the earlier turns (and keeps their context in memory), sends the model
    // only what was kept.
    let asked = c.fake.requests().len();
    turn(&mut a, "long", "after the cut", "l5").await;
    let sent: Vec<String> = c.fake.requests()[asked..].iter().map(Value::to_string).collect();
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].contains("message number 1") && sent[0].contains("a new last message"), "{}", sent[0]);
    let h = b.request("chat.history", json!({"sessionKey": "long"})).await.expect("history");
    let texts: Vec<String> =
        h["messages"].as_array().expect("messages").iter().map(pincer_testkit::probe::message_text).collect();
    assert_eq!(texts.last().map(String::as_str), Some("Fake reply: you said \"after the cut\""), "{texts:?}");
    let s = Session::parse(c.export("long"));
    assert_eq!(s.entries.len(), 6, "4 kept + the turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_set_aside_through_one_replica_are_listed_and_read_on_another() {
    let c = cluster(2, "");
    let mut a = Client::connect(&c.replicas[0].addr).await;
    turn(&mut a, "gone", "first chat to reset", "g1").await;
    a.request("sessions.reset", json!({"key": "gone"})).await.expect("reset");
    turn(&mut a, "del", "second chat to delete", "d1").await;
    a.request("sessions.delete", json!({"key": "del"})).await.expect("delete");

    let mut b = Client::connect(&c.replicas[1].addr).await;
    let list = b.request("sessions.archives.list", json!({})).await.expect("list");
    let rows = list["archives"].as_array().unwrap_or_else(|| panic!("{list}"));
    let view: Vec<Value> =
        rows.iter().map(|r| json!([r["reason"], r["title"], r["messageCount"], r["archivedAt"].is_u64()])).collect();
    let mut want =
        vec![json!(["reset", "first chat to reset", 2, true]), json!(["deleted", "second chat to delete", 2, true])];
    // Newest first: names sort by their timestamps.
    let names: Vec<&str> = rows.iter().filter_map(|r| r["file"].as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable_by(|x, y| y.cmp(x));
    assert_eq!(names, sorted);
    if rows[0]["reason"] == "deleted" {
        want.reverse();
    }
    assert_eq!(view, want, "{list}");
    for r in rows {
        let got = b.request("sessions.archives.get", json!({"file": r["file"]})).await.expect("get");
        let msgs = got["messages"].as_array().expect("messages");
        assert_eq!(msgs.len(), 2, "{got}");
        assert_eq!(pincer_testkit::probe::message_text(&msgs[0]), r["title"].as_str().expect("title"));
    }
    for bad in ["nope.jsonl.reset.1", "../../etc/passwd", "agents/main/sessions/x.jsonl"] {
        let e = b.request("sessions.archives.get", json!({"file": bad})).await.expect_err("refused");
        assert!(e["message"].as_str().is_some_and(|m| m.contains("not found")), "{e}");
    }
    let e = b.request("sessions.archives.list", json!({"agentId": "ghost"})).await.expect_err("refused");
    assert!(e["message"].as_str().is_some_and(|m| m.contains("unknown agent")), "{e}");
    assert!(Path::new(&c.dir.path().join("r1")).exists());
}

/// `POST /v1/chat/completions` with `messages`: the reply's text and the session it went to.
async fn complete(addr: &str, messages: &Value) -> (String, String) {
    pincer_agent::install_crypto_provider(); // reqwest is built without one (see the workspace Cargo.toml)
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {}", pincer_testkit::gateway::TOKEN))
        .json(&json!({"model": "pincer", "messages": messages}))
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let session = resp.headers().get("x-pincer-session-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: Value = serde_json::from_str(&resp.text().await.expect("body")).expect("json");
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{body}")).to_owned();
    (text, session.expect("the session is named"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_endpoint_continues_a_history_resent_alternately_to_two_replicas_as_one_session() {
    let c = cluster(2, "[gateway.openai_api]\nenabled = true");
    let (a, b) = (c.replicas[0].addr.clone(), c.replicas[1].addr.clone());
    // Both replicas build their index before the conversation exists: each must learn the
    // other's appends (and the session A begins) from the database.
    let (_, other_b) = complete(&b, &json!([{"role": "user", "content": "unrelated on b"}])).await;
    let (_, other_a) = complete(&a, &json!([{"role": "user", "content": "unrelated on a"}])).await;
    let mut history: Vec<Value> = Vec::new();
    let mut session: Option<String> = None;
    for i in 0..6 {
        let said = format!("step {i} of the plan");
        history.push(json!({"role": "user", "content": said}));
        let to = if i % 2 == 0 { &a } else { &b };
        let (text, key) = complete(to, &json!(history)).await;
        assert_eq!(text, format!("Fake reply: you said \"{said}\""));
        assert_eq!(&key, session.get_or_insert_with(|| key.clone()), "turn {i} through {to}");
        history.push(json!({"role": "assistant", "content": text}));
    }
    let session = session.expect("a session");
    assert!(session != other_a && session != other_b && other_a != other_b);
    // One session, each turn once, one chain.
    let s = Session::parse(c.export(&session));
    let rows: Vec<Value> = (0..s.entries.len()).map(|i| s.value(i).expect("entry")).collect();
    let texts: Vec<String> = rows.iter().map(|r| pincer_testkit::probe::message_text(&r["message"])).collect();
    let want: Vec<String> = history.iter().map(|m| m["content"].as_str().expect("text").to_owned()).collect();
    assert_eq!(texts, want);
    for (i, row) in rows.iter().enumerate() {
        let parent = if i == 0 { Value::Null } else { rows[i - 1]["id"].clone() };
        assert_eq!(row["parentId"], parent, "entry {i} chains to the one before it");
    }
    let sessions = c.sql("SELECT count(*) FROM sessions WHERE key LIKE 'agent:main:openai:%'");
    assert_eq!(sessions, "3", "the conversation and the two unrelated ones");

    // Cut through B to its last two turns: a client resending what was kept continues the session
    // through A, whose index had read the whole of it, as one gateway on files would.
    let mut ws = Client::connect(&b).await;
    let r = ws.request("sessions.compact", json!({"key": session, "maxLines": 5})).await.expect("compact");
    assert_eq!(r["compacted"], true, "{r}");
    let mut kept: Vec<Value> = history[8..].to_vec();
    kept.push(json!({"role": "user", "content": "step 6 of the plan"}));
    let (text, key) = complete(&a, &json!(kept)).await;
    assert_eq!((text.as_str(), key.as_str()), ("Fake reply: you said \"step 6 of the plan\"", session.as_str()));
    assert_eq!(Session::parse(c.export(&session)).entries.len(), 6, "the 4 kept entries and the new turn");
}

/// `POST /v1/responses` with `body` (or `GET /v1/responses/{id}`): the response and its session.
async fn respond(addr: &str, body: &Value, get: Option<&str>) -> (Value, String) {
    pincer_agent::install_crypto_provider();
    let client = reqwest::Client::new();
    let req = match get {
        Some(id) => client.get(format!("http://{addr}/v1/responses/{id}")),
        None => client.post(format!("http://{addr}/v1/responses")).json(body),
    };
    let resp = req
        .header("authorization", format!("Bearer {}", pincer_testkit::gateway::TOKEN))
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let session = resp.headers().get("x-pincer-session-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: Value = serde_json::from_str(&resp.text().await.expect("body")).expect("json");
    assert_eq!(status, 200, "{body}");
    (body, session.expect("the session is named"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_made_through_one_replica_is_retrieved_and_continued_through_another() {
    let c = cluster(2, "[gateway.openai_api]\nenabled = true");
    let (a, b) = (c.replicas[0].addr.clone(), c.replicas[1].addr.clone());
    let said = |r: &Value| r["output"][0]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    let (r1, session) = respond(&a, &json!({"model": "pincer", "input": "first, through a"}), None).await;
    let id = r1["id"].as_str().expect("id");
    // Read from the database by the other replica, which never saw it in memory.
    let (got, in_b) = respond(&b, &Value::Null, Some(id)).await;
    assert_eq!((said(&got), in_b.as_str()), (said(&r1), session.as_str()));
    let (r2, s2) =
        respond(&b, &json!({"model": "pincer", "input": "second, through b", "previous_response_id": id}), None).await;
    assert_eq!((said(&r2).as_str(), s2.as_str()), ("Fake reply: you said \"second, through b\"", session.as_str()));
    let (r3, s3) =
        respond(&a, &json!({"model": "pincer", "input": "a branch, through a", "previous_response_id": id}), None)
            .await;
    assert_eq!(s3, session);
    assert_eq!(said(&r3), "Fake reply: you said \"a branch, through a\"");
    // One transcript: the second turn and the branch are both children of the first reply.
    let s = Session::parse(c.export(&session));
    let rows: Vec<Value> = (0..s.entries.len()).map(|i| s.value(i).expect("entry")).collect();
    let row = |text: &str| -> &Value {
        rows.iter().find(|r| pincer_testkit::probe::message_text(&r["message"]) == text).expect(text)
    };
    let first_reply = row("Fake reply: you said \"first, through a\"");
    assert_eq!(row("second, through b")["parentId"], first_reply["id"]);
    let branch = row("a branch, through a");
    let mut parent = branch["parentId"].clone();
    while let Some(leaf) = rows.iter().find(|r| r["id"] == parent && r["type"] == "leaf") {
        parent = leaf["parentId"].clone();
    }
    assert_eq!(parent, first_reply["id"], "the branch grows from the first reply");
    assert_eq!(rows.iter().filter(|r| r["type"] == "message").count(), 6, "each turn once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transcript_commands_take_a_session_key_of_the_database() {
    let c = cluster(1, "");
    let mut a = Client::connect(&c.replicas[0].addr).await;
    turn(&mut a, "main", "remember the blue door", "k1").await;
    let run = |args: &[&str]| {
        let out = c.cli(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Read through the store: history, context, export, the same session.
    let (code, out, err) = run(&["transcript", "history", "--session", "main", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let history: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(history["messages"].as_array().map(Vec::len), Some(2), "{history}");
    assert!(out.contains("remember the blue door"), "{out}");
    let (code, out, err) = run(&["transcript", "context", "--session", "main"]);
    assert_eq!(code, Some(0), "{err}");
    let context: Value = serde_json::from_str(&out).expect("json");
    let session = Session::parse(c.export("main"));
    assert_eq!(context["leafId"].as_str(), session.leaf_id(), "{context}");
    // Appended through the database, chained to the leaf.
    let (code, out, err) = run(&[
        "transcript",
        "append",
        "--session",
        "main",
        "--message",
        r#"{"role":"user","content":"a note","timestamp":0}"#,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let appended: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(appended["parentId"].as_str(), session.leaf_id(), "{appended}");
    assert_eq!(Session::parse(c.export("main")).leaf_id(), appended["id"].as_str());
    // verify and repair work on files: they say so, and name what works instead.
    for cmd in ["verify", "repair"] {
        let (code, _, err) = run(&["transcript", cmd, "--session", "main"]);
        assert_eq!(code, Some(2), "{cmd}: {err}");
        assert!(err.starts_with(&format!("pincer: `transcript {cmd}` works on JSONL files")), "{err}");
        assert!(err.contains("transcript export --session agent:main:main --format jsonl"), "{err}");
    }
}
