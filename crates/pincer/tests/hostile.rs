//! Hostile input against real `pincer gateway` processes (issue 34): DNS-rebinding and cross-origin
//! requests on every HTTP route, `agentId` path tricks, API keys reading each other's sessions,
//! token guessing, hooks that fail, oversized `/v1` histories, subscription floods, and a second
//! gateway on one state directory. Each test attacks one rule, checks that nothing was read or
//! written that should not be, and prints what it measured.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{connect_params, Client, GatewayProcess, StartOptions, TOKEN};
use pincer_testkit::probe;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

struct Env {
    gw: GatewayProcess,
    fake: FakeOpenAi,
    _dir: tempfile::TempDir,
}

fn start(extra: &str) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeOpenAi::start_in_thread();
    let config = format!("{}{extra}", fake.gateway_toml());
    let gw = GatewayProcess::start_with(BIN, &dir.path().join("state"), &config, &StartOptions::default());
    Env { gw, fake, _dir: dir }
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().expect("port")
}

/// One raw HTTP/1.1 request (the caller picks every header, `Host` included): status and body.
async fn raw(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    sock.write_all(req.as_bytes()).await.expect("write");
    sock.write_all(body).await.expect("body");
    let bytes = probe::read_response(&mut sock, Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&bytes).to_string();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

async fn turn(addr: &str, key: &str, message: &str, run: &str) -> Value {
    let mut c = Client::connect(addr).await;
    let r = c.request("chat.send", json!({"sessionKey": key, "message": message, "idempotencyKey": run})).await;
    assert_eq!(r.expect("send")["status"], "started");
    c.chat_end(run).await
}

fn transcripts(state: &Path) -> usize {
    std::fs::read_dir(probe::sessions_dir(state, "main"))
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl")).count())
        .unwrap_or(0)
}

// 1 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h01_every_route_checks_host_origin_and_body_type_in_every_auth_mode() {
    let e = start(
        "[gateway]\nallowed_origins = [\"https://chat.example.com\"]\n[gateway.auth]\nmode = \"none\"\n[gateway.openai_api]\nenabled = true\n",
    );
    let addr = e.gw.addr.clone();
    assert_eq!(turn(&addr, "main", "a secret plan", "h01-turn").await["payload"]["state"], "final");
    let evil = format!("evil.example:{}", port(&addr));
    let own = [("Host", addr.as_str())];
    let rebound = [("Host", evil.as_str())];
    for path in ["/api/sessions/main/export?format=md", "/api/sessions/main/events", "/metrics", "/v1/models"] {
        let (status, body) = raw(&addr, "GET", path, &rebound, b"").await;
        assert_eq!(status, 403, "{path} under a rebound name: {body}");
        assert!(!body.contains("a secret plan"), "{path} leaked the transcript");
        assert!(body.contains("evil.example") && body.contains("allowed_hosts"), "{path}: the error names why: {body}");
    }
    let (status, body) = raw(&addr, "GET", "/api/sessions/main/export?format=md", &own, b"").await;
    assert_eq!(status, 200, "the gateway's own name still works: {body}");
    assert!(body.contains("a secret plan"));

    // A page on another origin cannot run a turn: not as text/plain (no preflight), not as JSON.
    let before = transcripts(&e.gw.state_dir);
    let chat = json!({"model": "pincer", "messages": [{"role": "user", "content": "drive-by turn"}]}).to_string();
    let (status, body) =
        raw(&addr, "POST", "/v1/chat/completions", &[own[0], ("Content-Type", "text/plain")], chat.as_bytes()).await;
    assert_eq!(status, 415, "text/plain body: {body}");
    assert!(body.contains("application/json"), "{body}");
    let evil_origin = [own[0], ("Content-Type", "application/json"), ("Origin", "http://evil.example")];
    let (status, body) = raw(&addr, "POST", "/v1/chat/completions", &evil_origin, chat.as_bytes()).await;
    assert_eq!(status, 403, "another origin: {body}");
    assert_eq!(transcripts(&e.gw.state_dir), before, "no turn was saved");
    // CORS: a preflight is answered for a configured origin only.
    let pre = [own[0], ("Origin", "https://chat.example.com"), ("Access-Control-Request-Method", "POST")];
    let (status, _) = raw(&addr, "OPTIONS", "/v1/chat/completions", &pre, b"").await;
    assert_eq!(status, 204, "preflight of an allowed origin");
    let pre_evil = [own[0], ("Origin", "http://evil.example"), ("Access-Control-Request-Method", "POST")];
    assert_eq!(raw(&addr, "OPTIONS", "/v1/chat/completions", &pre_evil, b"").await.0, 403);
    let json_ok = [own[0], ("Content-Type", "application/json; charset=utf-8")];
    let (status, body) = raw(&addr, "POST", "/v1/chat/completions", &json_ok, chat.as_bytes()).await;
    assert_eq!(status, 200, "a JSON POST from a client without Origin: {body}");

    // Token auth: a rebinding pair (Host and Origin both the rebound name) is refused too, unless
    // the operator named that host.
    let t = start("[gateway]\nallowed_hosts = [\"chat.example.com\"]\n");
    let evil = format!("evil.example:{}", port(&t.gw.addr));
    let up =
        probe::raw_upgrade(&t.gw.addr, Some(&evil), &[("Origin", &format!("http://{evil}"))]).await.expect("upgrade");
    assert_eq!(up.status, 403, "rebinding pair under token auth: {}", up.status_line);
    let named = format!("chat.example.com:{}", port(&t.gw.addr));
    let up =
        probe::raw_upgrade(&t.gw.addr, Some(&named), &[("Origin", &format!("http://{named}"))]).await.expect("upgrade");
    assert_eq!(up.status, 101, "a configured host: {}", up.status_line);
    let (status, _) = raw(&t.gw.addr, "GET", "/", &[("Host", "localhost")], b"").await;
    assert_eq!(status, 200, "the WebChat under localhost");
}

// 2 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h02_agent_ids_never_reach_the_filesystem() {
    let e = start("");
    // Someone else's agent directory with an index and an archived transcript in it.
    let outside = e._dir.path().join("elsewhere");
    let sessions = outside.join("sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    std::fs::write(sessions.join("sessions.json"), "{}").unwrap();
    let archived = "{\"type\":\"session\",\"version\":3,\"id\":\"x\",\"timestamp\":\"2026-01-01T00:00:00.000Z\",\"cwd\":\"/\"}\n\
        {\"type\":\"message\",\"id\":\"a1\",\"parentId\":null,\"timestamp\":\"2026-01-01T00:00:00.000Z\",\"message\":{\"role\":\"user\",\"content\":\"stolen words\",\"timestamp\":1}}\n";
    std::fs::write(sessions.join("s.jsonl.reset.2026-01-01T00-00-00.000Z"), archived).unwrap();
    let relative = format!("../../{}", outside.strip_prefix(e._dir.path()).unwrap().display());
    let mut c = Client::connect_with(&e.gw.addr, {
        let mut p = connect_params(TOKEN);
        p["scopes"] = json!(["operator.read"]);
        p
    })
    .await
    .expect("read-only connection");
    for agent in [outside.display().to_string(), relative, "..".into(), "main/../../x".into(), "Main".into()] {
        for method in ["sessions.archives.list", "sessions.archives.get", "sessions.list", "sessions.usage"] {
            let params = json!({"agentId": agent, "file": "s.jsonl.reset.2026-01-01T00-00-00.000Z"});
            let r = c.request(method, params).await;
            let err = r.expect_err(&format!("{method} with agentId {agent:?} must fail"));
            let msg = err["message"].as_str().unwrap_or("").to_owned();
            assert!(msg.contains("agentId") && !msg.contains("stolen"), "{method} {agent:?}: {err}");
        }
    }
}

// 3 ────────────────────────────────────────────────────────────────────────────────────────────

async fn v1(addr: &str, key: &str, messages: Value, headers: &[(&str, &str)]) -> (u16, Value, Option<String>) {
    pincer_agent::install_crypto_provider();
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .json(&json!({"model": "pincer", "messages": messages}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let session = resp.headers().get("x-pincer-session-key").map(|v| v.to_str().expect("ascii").to_owned());
    (status, resp.json().await.unwrap_or(Value::Null), session)
}

fn said(body: &Value) -> String {
    body["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h03_api_keys_never_reach_each_others_sessions() {
    let (ka, kb) = ("key-of-alice-0123456789", "key-of-bob-0123456789ab");
    let e = start(&format!("[gateway.openai_api]\nenabled = true\napi_keys = [\"{ka}\", \"{kb}\"]\n"));
    let addr = e.gw.addr.clone();
    assert_eq!(turn(&addr, "main", "the operator's own notes", "h03-main").await["payload"]["state"], "final");
    let hi = json!({"role": "user", "content": "hi"});
    let (status, b1, sb) = v1(&addr, kb, json!([hi]), &[]).await;
    assert_eq!(status, 200, "{b1}");
    let sb = sb.expect("bob's session");
    let bob_reply = said(&b1);
    // Bob goes on privately.
    let secret = json!({"role": "user", "content": "my bank pin is 4321"});
    let (status, _, s) = v1(&addr, kb, json!([hi, {"role": "assistant", "content": bob_reply}, secret]), &[]).await;
    assert_eq!((status, s.as_deref()), (200, Some(sb.as_str())), "bob's own history continues his session");

    // Alice resends Bob's opening exchange: she gets a session of her own, not his.
    let q = json!({"role": "user", "content": "what did I say before?"});
    let (status, body, sa) = v1(&addr, ka, json!([hi, {"role": "assistant", "content": bob_reply}, q]), &[]).await;
    assert_eq!(status, 200, "{body}");
    let sa = sa.expect("alice's session");
    assert_ne!(sa, sb, "alice landed in bob's session");
    let last = e.fake.requests().last().cloned().expect("a provider request");
    assert!(!last.to_string().contains("4321"), "alice's turn ran with bob's context: {last}");
    // Naming Bob's session, or the operator's main, gets nothing.
    for named in [sb.as_str(), "main"] {
        let (status, body, s) = v1(&addr, ka, json!([q]), &[("x-pincer-session-key", named)]).await;
        assert_eq!(status, 404, "alice naming {named}: {body}");
        assert_eq!(s, None);
    }
    assert!(!e.fake.requests().last().expect("req").to_string().contains("4321"));
    // Her own named session is hers; the operator (gateway token) still reaches everything.
    let (status, _, s) = v1(&addr, ka, json!([q]), &[("x-pincer-session-key", "alice-notes")]).await;
    assert_eq!((status, s.as_deref()), (200, Some("agent:main:alice-notes")));
    let (status, _, s) = v1(&addr, TOKEN, json!([q]), &[("x-pincer-session-key", sb.as_str())]).await;
    assert_eq!((status, s.as_deref()), (200, Some(sb.as_str())), "the operator reaches bob's session");
    let (status, _, s) = v1(&addr, kb, json!([q]), &[("x-pincer-session-key", "agent:main:alice-notes")]).await;
    assert_eq!((status, s), (404, None), "bob naming alice's session");
}

// 4 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h04_wrong_tokens_are_throttled_per_address() {
    let e = start("[gateway.openai_api]\nenabled = true\n");
    let addr = e.gw.addr.clone();
    let started = Instant::now();
    let mut refused = 0;
    let mut throttled = 0;
    for i in 0..40 {
        let p = connect_params(&format!("wrong-token-{i}"));
        match Client::connect_with(&addr, p).await {
            Ok(_) => panic!("a wrong token was accepted"),
            Err(err) => {
                let code = err["error"]["details"]["code"].as_str().unwrap_or("");
                if code == "AUTH_RATE_LIMITED" {
                    throttled += 1;
                } else {
                    refused += 1;
                }
            }
        }
    }
    let (status, _) = raw(&addr, "GET", "/metrics", &[("Host", &addr), ("Authorization", "Bearer nope")], b"").await;
    let (v1_status, _) =
        raw(&addr, "GET", "/v1/models", &[("Host", &addr), ("Authorization", "Bearer nope")], b"").await;
    let secs = started.elapsed().as_secs_f64();
    println!("40 WebSocket guesses in {secs:.2} s: {refused} checked, {throttled} refused unchecked; /metrics {status}, /v1 {v1_status}");
    // The burst of 10, and about one more per second it took.
    let allowed = 10 + secs.ceil() as usize + 1;
    assert!(refused <= allowed, "at most {allowed} guesses are checked: {refused} of 40");
    assert!(throttled >= 40 - allowed, "the rest are refused without a check: {throttled}");
    assert_eq!((status, v1_status), (429, 429), "HTTP routes share the address's throttle");
    let log = e.gw.log_text();
    assert!(log.contains("refused a login") && log.contains("127.0.0.1"), "refusals are logged with the peer");
}

// 5 ────────────────────────────────────────────────────────────────────────────────────────────

fn user_texts(state: &Path, key: &str) -> Vec<String> {
    let Some(file) = probe::transcript_path(state, key).filter(|f| f.exists()) else { return vec![] };
    probe::read_rows(&file)
        .iter()
        .filter(|r| r["message"]["role"] == "user")
        .map(|r| probe::message_text(&r["message"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h05_a_hook_that_fails_never_erases_the_message() {
    // A hook that answers without reading its input: every message is allowed, short or long.
    let e = start("[hooks.before_agent_run]\ncommand = [\"/bin/echo\", \"{\\\"outcome\\\":\\\"allow\\\"}\"]\n");
    let big = "long message ".repeat(8 * 1024); // 104 KiB
    for i in 0..10 {
        for (tag, text) in [("short", format!("short {i}")), ("long", format!("{i} {big}"))] {
            let end = turn(&e.gw.addr, "agent:main:echo-hook", &text, &format!("h05-{tag}-{i}")).await;
            assert_eq!(end["payload"]["state"], "final", "{tag} {i}: {end}");
        }
    }
    let texts = user_texts(&e.gw.state_dir, "agent:main:echo-hook");
    assert_eq!(texts.len(), 20);
    assert!(texts.iter().all(|t| !t.contains("[message blocked]")), "a message was erased: {texts:?}");

    // A hook that fails: the turn fails naming the hook, nothing is written, the key stays usable.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let fake = FakeOpenAi::start_in_thread();
    let flag = dir.path().join("hook-ok");
    let script = format!("cat >/dev/null; test -e {} || exit 3; echo '{{\"outcome\":\"allow\"}}'", flag.display());
    let config =
        format!("{}[hooks.before_agent_run]\ncommand = [\"sh\", \"-c\", {}]\n", fake.gateway_toml(), json!(script));
    let gw = GatewayProcess::start(BIN, &state, &config);
    let mut c = Client::connect(&gw.addr).await;
    let key = "agent:main:failing-hook";
    let send = json!({"sessionKey": key, "message": "my only copy of this text", "idempotencyKey": "h05-fail"});
    assert_eq!(c.request("chat.send", send.clone()).await.expect("send")["status"], "started");
    let end = c.chat_end("h05-fail").await;
    assert_eq!(end["payload"]["state"], "error", "{end}");
    assert_eq!(end["payload"]["errorKind"], "hook", "{end}");
    assert!(end["payload"]["errorMessage"].as_str().unwrap_or("").contains("hook"), "{end}");
    assert!(user_texts(&state, key).is_empty(), "nothing is written while the hook cannot decide");
    std::fs::write(&flag, "").unwrap();
    assert_eq!(c.request("chat.send", send).await.expect("resend")["status"], "started", "the key is still usable");
    assert_eq!(c.chat_end("h05-fail").await["payload"]["state"], "final");
    assert_eq!(user_texts(&state, key), vec!["my only copy of this text".to_string()]);
    drop(gw);

    // A background child holding the hook's stdout does not stall the turn.
    let bg = "cat >/dev/null; (sleep 60 &) ; echo '{\"outcome\":\"allow\"}'";
    let config =
        format!("{}[hooks.before_agent_run]\ncommand = [\"sh\", \"-c\", {}]\n", fake.gateway_toml(), json!(bg));
    let gw = GatewayProcess::start(BIN, &dir.path().join("state2"), &config);
    let started = Instant::now();
    assert_eq!(turn(&gw.addr, "agent:main:bg", "hello", "h05-bg").await["payload"]["state"], "final");
    println!("a turn behind a hook that leaves a child holding its stdout: {:?}", started.elapsed());

    // A configured hook program that does not exist: the gateway refuses to start, saying so.
    let missing =
        format!("{}[hooks.before_agent_run]\ncommand = [\"/usr/local/bin/my-policy-absent\"]\n", fake.gateway_toml());
    let stderr = pincer_testkit::gateway::refused_startup(BIN, &dir.path().join("state3"), &missing);
    assert!(stderr.contains("/usr/local/bin/my-policy-absent") && stderr.contains("does not exist"), "{stderr}");
}

// 6 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h06_a_long_v1_history_is_capped_and_written_in_one_commit() {
    let e = start("[gateway.openai_api]\nenabled = true\n");
    let addr = e.gw.addr.clone();
    let history = |n: usize| -> Value {
        let mut v: Vec<Value> = (0..n)
            .map(|i| match i % 2 {
                0 => json!({"role": "user", "content": format!("question {i}")}),
                _ => json!({"role": "assistant", "content": format!("answer {i}")}),
            })
            .collect();
        v.push(json!({"role": "user", "content": "and now?"}));
        Value::Array(v)
    };
    let before = transcripts(&e.gw.state_dir);
    let (status, body, _) = v1(&addr, TOKEN, history(20_000), &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("10000"), "the error names the limit: {body}");
    assert_eq!(transcripts(&e.gw.state_dir), before, "nothing written");
    let started = Instant::now();
    let (status, body, session) = v1(&addr, TOKEN, history(5_000), &[]).await;
    println!("a 5,001-message history grafted in {:?}", started.elapsed());
    assert_eq!(status, 200, "{body}");
    let rows = probe::transcript_rows(&e.gw.state_dir, &session.expect("session"));
    let messages = rows.iter().filter(|r| r["type"] == "message").count();
    assert_eq!(messages, 5_002, "the whole history, the question and the reply");
}

// 9 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h09_subscriptions_per_connection_are_capped() {
    let e = start("");
    let mut c = Client::connect(&e.gw.addr).await;
    let rss_before = probe::rss_kib(e.gw.pid());
    let mut first_refusal = None;
    for i in 0..4_200 {
        match c.request("sessions.messages.subscribe", json!({"key": format!("agent:main:flood-{i}")})).await {
            Ok(_) => {}
            Err(err) => {
                let msg = err["message"].as_str().unwrap_or("").to_owned();
                assert!(msg.contains("4096"), "the refusal names the limit: {msg}");
                first_refusal.get_or_insert(i);
            }
        }
    }
    let rss_after = probe::rss_kib(e.gw.pid());
    println!("RSS {rss_before} KiB -> {rss_after} KiB after 4,200 subscribes");
    assert_eq!(first_refusal, Some(4096), "the 4,097th key is refused");
    // Unsubscribing makes room; the connection still works.
    c.request("sessions.messages.unsubscribe", json!({"key": "agent:main:flood-0"})).await.expect("unsubscribe");
    c.request("sessions.messages.subscribe", json!({"key": "agent:main:one-more"})).await.expect("room again");
}

// 10 ───────────────────────────────────────────────────────────────────────────────────────────

/// A session `agent:main:big` whose transcript holds `n` user messages of `each` bytes, written
/// before the gateway starts.
fn big_session(state: &Path, n: usize, each: usize) {
    let dir = probe::sessions_dir(state, "main");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("sessions.json"), r#"{"agent:main:big": {"sessionId": "big-1", "updatedAt": 1}}"#).unwrap();
    let mut text = String::from(
        "{\"type\":\"session\",\"version\":3,\"id\":\"big-1\",\"timestamp\":\"2026-01-01T00:00:00.000Z\",\"cwd\":\"/\"}\n",
    );
    let body = "word ".repeat(each / 5);
    let mut parent = Value::Null;
    for i in 0..n {
        let id = format!("e{i:07}");
        let row = json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": format!("{i} {body}"), "timestamp": 1}});
        text.push_str(&format!("{row}\n"));
        parent = json!(id);
    }
    std::fs::write(dir.join("big-1.jsonl"), text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h10_large_answers_are_refused_early_or_share_one_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    big_session(&state, 80, 1024 * 1024); // an 80 MB transcript
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start(BIN, &state, &fake.gateway_toml());
    let pid = gw.pid();
    let mut c = Client::connect(&gw.addr).await;
    let base = probe::hwm_kib(pid);
    let r = c.request("sessions.export", json!({"sessionKey": "agent:main:big", "format": "html"})).await;
    let err = r.expect_err("an export larger than a frame");
    assert!(err["message"].as_str().unwrap_or("").contains("too large"), "{err}");
    let after_export = probe::hwm_kib(pid);
    println!("peak RSS {base} KiB -> {after_export} KiB after refusing an 80 MB export over the socket");
    // (A high-water mark read back can come out a little lower: the kernel's counters lag.)
    let grew = after_export.saturating_sub(base);
    assert!(grew < 60 * 1024, "the refusal came after building the export: +{grew} KiB");

    // Five histories at once (161 MB each, 805 MB together, over the 512 MB budget): they take
    // turns within the budget instead of all holding the file. (Five, not more: each waits at
    // most 30 s for its turn, and a slow machine takes seconds per history.)
    let calls = (0..5).map(|_| {
        let addr = gw.addr.clone();
        tokio::spawn(async move {
            let mut c = Client::connect(&addr).await;
            c.request("chat.history", json!({"sessionKey": "agent:main:big", "limit": 1000})).await
        })
    });
    let answers = futures::future::join_all(calls).await;
    for a in answers {
        let a = a.expect("task").expect("history");
        assert_eq!(a["messages"].as_array().map(Vec::len), Some(80));
    }
    let after = probe::hwm_kib(pid);
    println!("peak RSS {after_export} KiB -> {after} KiB after five concurrent chat.history of the 80 MB transcript");
    let grew = after.saturating_sub(after_export);
    assert!(grew < 500 * 1024, "five histories at once held +{grew} KiB");
}
