//! End to end with a real local model: llama.cpp's own OpenAI-compatible `llama-server` serving
//! SmolLM2-135M-Instruct (both built or fetched by `scripts/llama-server-setup`, which `scripts/test`
//! runs first and whose output sets `PINCER_LLAMA_SERVER` and `PINCER_LLAMA_MODEL`), the real
//! `pincer gateway` process in front of it, and a client speaking the gateway protocol as a user
//! would: a turn, a second turn that carries the first, an abort mid-stream, and a compaction whose
//! summary comes from the model. A byte-for-byte recording proxy sits between the gateway and
//! llama-server, so the test sees exactly what Pincer sent and what llama.cpp answered.
//!
//! The assertions are about structure (rows, chains, usage, stop reasons), never about what the
//! 135M-parameter model says.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::probe::message_text as text;
use pincer_testkit::probe::read_rows as entries;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");
/// Pi's stop reasons (`StopReason` of pi-ai).
const PI_STOP_REASONS: [&str; 5] = ["stop", "length", "toolUse", "error", "aborted"];

/// A path from the environment that `scripts/llama-server-setup` provides. Never skipped: a run
/// without it fails and says what to do.
fn required_path(var: &str) -> PathBuf {
    let v = std::env::var_os(var).unwrap_or_else(|| {
        panic!(
            "{var} is not set. This test needs llama.cpp's llama-server and a small model: run \
             `eval \"$(scripts/llama-server-setup)\"` (it builds and fetches them once per machine into \
             target/llama and prints the variables), then run the test again; scripts/test does this itself."
        )
    });
    let p = PathBuf::from(v);
    assert!(p.is_file(), "{var}={} is not a file: run scripts/llama-server-setup again", p.display());
    p
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `llama-server` on a free loopback port; killed on drop. Its output goes to a file for diagnosis.
struct LlamaServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl LlamaServer {
    fn start(bin: &Path, model: &Path, log: PathBuf) -> LlamaServer {
        let port = free_port();
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            // A small context, one slot (so it is all the slot's), two threads for the two cores,
            // greedy sampling so a run behaves the same each time.
            .args(["-c", "2048", "-np", "1", "-t", "2", "--temp", "0", "--seed", "1"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut s = LlamaServer { child, port, log };
        s.wait_healthy();
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `GET /health` until it answers 200 (503 while the model loads).
    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama-server exited ({status}) before it was healthy:\n{}", self.log_text());
            }
            if http_get_status(self.port, "/health") == Some(200) {
                return;
            }
            assert!(Instant::now() < deadline, "llama-server was not healthy within 120 s:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split_whitespace().nth(1)?.parse().ok()
}

/// What went through one proxied connection, in both directions.
#[derive(Default, Clone)]
struct Conn {
    up: Vec<u8>,
    down: Vec<u8>,
}

/// A TCP proxy on a free port in front of `target`: forwards bytes both ways untouched and keeps a
/// copy. When either side closes, both are closed (an abort reaches llama-server as a disconnect).
struct Recorder {
    port: u16,
    conns: Arc<Mutex<Vec<Arc<Mutex<Conn>>>>>,
}

impl Recorder {
    async fn start(target: u16) -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let conns: Arc<Mutex<Vec<Arc<Mutex<Conn>>>>> = Arc::default();
        let all = conns.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let conn = Arc::new(Mutex::new(Conn::default()));
                all.lock().expect("conns").push(conn.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let (c1, c2) = (conn.clone(), conn);
                    let up = pipe(cr, sw, c1, true);
                    let down = pipe(sr, cw, c2, false);
                    // Either direction ending drops both sockets.
                    tokio::select! { _ = up => {}, _ = down => {} }
                });
            }
        });
        Recorder { port, conns }
    }

    /// Every (request body, response body) pair so far, in order, responses de-chunked.
    fn exchanges(&self) -> Vec<(Value, String)> {
        let conns: Vec<Conn> =
            self.conns.lock().expect("conns").iter().map(|c| c.lock().expect("conn").clone()).collect();
        let mut out = Vec::new();
        for c in conns {
            let reqs = split_requests(&c.up);
            let resps = split_responses(&c.down);
            for (i, body) in reqs.into_iter().enumerate() {
                let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                out.push((req, resps.get(i).cloned().unwrap_or_default()));
            }
        }
        out
    }

    /// The `chat/completions` exchanges (requests with messages).
    fn completions(&self) -> Vec<(Value, String)> {
        self.exchanges().into_iter().filter(|(r, _)| r["messages"].is_array()).collect()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// The bodies of the HTTP/1.1 requests on one connection (Content-Length framing, as reqwest sends JSON).
fn split_requests(mut b: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(end) = find(b, b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&b[..end]).to_string();
        let len: usize = header(&head, "content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let body_end = (end + 4 + len).min(b.len());
        out.push(b[end + 4..body_end].to_vec());
        b = &b[body_end..];
    }
    out
}

/// The bodies of the HTTP/1.1 responses on one connection, de-chunked (a cut-off one as far as it got).
fn split_responses(mut b: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(end) = find(b, b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&b[..end]).to_string();
        let mut rest = &b[end + 4..];
        let mut body = Vec::new();
        if header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let Some(le) = find(rest, b"\r\n") else {
                    rest = &[];
                    break;
                };
                let size_hex = String::from_utf8_lossy(&rest[..le]).to_string();
                let size = usize::from_str_radix(size_hex.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
                rest = &rest[le + 2..];
                if size == 0 {
                    rest = rest.get(2..).unwrap_or(&[]);
                    break;
                }
                let take = size.min(rest.len());
                body.extend_from_slice(&rest[..take]);
                rest = rest.get(take + 2..).unwrap_or(&[]);
            }
        } else {
            let len = header(&head, "content-length").and_then(|v| v.parse().ok()).unwrap_or(rest.len());
            let take = len.min(rest.len());
            body.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        out.push(String::from_utf8_lossy(&body).to_string());
        b = rest;
    }
    out
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim().to_owned()).collect()
}

/// The usage object llama.cpp reported in a streamed response.
fn reported_usage(body: &str) -> Option<Value> {
    sse_data(body)
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
}

/// The message's usage is what llama.cpp reported in `resp`: `input` + `cacheRead` = `prompt_tokens`,
/// `cacheRead` = `prompt_tokens_details.cached_tokens`, `output` = `completion_tokens`, both > 0.
fn assert_usage_is_reported(msg: &Value, resp: &str) -> Value {
    let reported = reported_usage(resp).unwrap_or_else(|| panic!("no usage in llama.cpp's stream:\n{resp}"));
    let usage = msg["usage"].clone();
    let n = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    assert!(n(&usage, "/input") > 0 && n(&usage, "/output") > 0, "{usage}");
    assert_eq!(n(&usage, "/cacheRead"), n(&reported, "/prompt_tokens_details/cached_tokens"), "{usage} vs {reported}");
    assert_eq!(n(&usage, "/input") + n(&usage, "/cacheRead"), n(&reported, "/prompt_tokens"), "{usage} vs {reported}");
    assert_eq!(n(&usage, "/output"), n(&reported, "/completion_tokens"), "{usage} vs {reported}");
    assert_eq!(n(&usage, "/totalTokens"), n(&reported, "/total_tokens"), "{usage} vs {reported}");
    usage
}

/// The ids from `entry` back to the root, following `parentId`.
fn ancestry(all: &[Value], entry: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = entry.clone();
    while let Some(id) = cur["id"].as_str() {
        out.push(id.to_owned());
        match all.iter().find(|e| e["id"] == cur["parentId"]) {
            Some(p) => cur = p.clone(),
            None => break,
        }
    }
    out
}

fn pincer(args: &[&str], file: &Path) -> std::process::Output {
    Command::new(BIN).args(args).arg(file).output().expect("run pincer")
}

async fn send(c: &mut Client, message: &str, run_id: &str) {
    let ack = c
        .request("chat.send", json!({"sessionKey": "main", "message": message, "idempotencyKey": run_id}))
        .await
        .expect("chat.send");
    assert_eq!(ack["status"], "started", "{ack}");
}

/// The `chat` delta events of a run seen so far.
fn deltas(c: &Client, run_id: &str) -> usize {
    c.events
        .iter()
        .filter(|f| f["event"] == "chat" && f["payload"]["runId"] == run_id && f["payload"]["state"] == "delta")
        .count()
}

/// How long a step may take: a real model on a busy 2-core machine is slow (the whole test takes
/// about 20 s on an idle one).
const PATIENCE: Duration = Duration::from_secs(180);

/// Waits for the end of a run; on a timeout, shows both servers' logs.
async fn chat_end(c: &mut Client, run_id: &str, llama: &LlamaServer, gw: &GatewayProcess) -> Value {
    let id = run_id.to_owned();
    let end = move |f: &Value| {
        f["event"] == "chat"
            && f["payload"]["runId"] == id.as_str()
            && matches!(f["payload"]["state"].as_str(), Some("final" | "aborted" | "error"))
    };
    match tokio::time::timeout(PATIENCE, c.event_within(end, PATIENCE + Duration::from_secs(5))).await {
        Ok(v) => v,
        Err(_) => panic!("run {run_id} did not end\ngateway:\n{}\nllama-server:\n{}", gw.log_text(), llama.log_text()),
    }
}

fn config(proxy: u16) -> String {
    // One llama-server, three model ids (it serves whatever id is asked for): short replies for the
    // chat, a long limit for the story that gets aborted, and a middling one for the summary.
    // Compaction: a reserve that fits a 2048-token window (so no automatic compaction runs after these
    // small turns), a short recent tail (so the manual compaction has turns to summarise), and Pi's
    // plain mode: the quality guard of `safeguard` asks for sections a 135M model does not write.
    format!(
        r#"[models.providers.llama]
api = "openai-completions"
base_url = "http://127.0.0.1:{proxy}/v1"
first_byte_timeout_ms = 180000
idle_timeout_ms = 60000
max_retries = 0

[[models.providers.llama.models]]
id = "smollm2-135m-instruct"
context_window = 2048
max_tokens = 40

[[models.providers.llama.models]]
id = "smollm2-135m-instruct-long"
context_window = 2048
max_tokens = 1500

[[models.providers.llama.models]]
id = "smollm2-135m-instruct-summary"
context_window = 2048
max_tokens = 64

[agents.defaults]
model = "llama/smollm2-135m-instruct"

[agents.defaults.compaction]
mode = "default"
model = "llama/smollm2-135m-instruct-summary"
reserve_tokens = 256
reserve_tokens_floor = 0
keep_recent_tokens = 32
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_llama_cpp_server_chats_streams_aborts_and_summarises() {
    let started = Instant::now();
    let server_bin = required_path("PINCER_LLAMA_SERVER");
    let model = required_path("PINCER_LLAMA_MODEL");
    let dir = tempfile::tempdir().expect("tempdir");
    let llama = tokio::task::spawn_blocking({
        let log = dir.path().join("llama-server.log");
        move || LlamaServer::start(&server_bin, &model, log)
    })
    .await
    .expect("llama-server");
    let proxy = Recorder::start(llama.port).await;
    let state = dir.path().join("state");
    let gw = tokio::task::spawn_blocking({
        let (state, config) = (state.clone(), config(proxy.port));
        move || GatewayProcess::start(BIN, &state, &config)
    })
    .await
    .expect("gateway");
    let mut c = Client::connect(&gw.addr).await;
    eprintln!("llama-server and gateway up after {:?}", started.elapsed());

    // 1. A turn: deltas stream, then the final with the reply, written once and chained.
    send(&mut c, "Say hello in one short sentence.", "t1").await;
    let fin = chat_end(&mut c, "t1", &llama, &gw).await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}\n{}", gw.log_text());
    let reply = text(&fin["payload"]["message"]);
    assert!(!reply.trim().is_empty(), "empty reply: {fin}");
    assert!(deltas(&c, "t1") >= 1, "no delta before the final: {:?}", c.events);
    let file = transcript(&state);
    let l = entries(&file);
    let user1 = l.iter().find(|e| e["message"]["role"] == "user").expect("user row").clone();
    assert_eq!(user1["message"]["content"], "Say hello in one short sentence.");
    let asst1 = l.last().expect("rows").clone();
    assert_eq!(asst1["message"]["role"], "assistant", "{l:#?}");
    assert!(ancestry(&l, &asst1).contains(&user1["id"].as_str().expect("id").to_owned()), "{l:#?}");
    assert_eq!(asst1["message"]["api"], "openai-completions");
    assert_eq!(asst1["message"]["provider"], "llama");
    assert_eq!(asst1["message"]["model"], "smollm2-135m-instruct");
    let stop = asst1["message"]["stopReason"].as_str().expect("stopReason");
    assert!(["stop", "length"].contains(&stop), "stopReason {stop}");
    assert!(PI_STOP_REASONS.contains(&stop));
    assert_eq!(text(&asst1["message"]), reply, "the final is the persisted reply");
    // Usage is what llama.cpp reported, and the finish reason maps to the stop reason.
    let ex = proxy.completions();
    let (req1, resp1) = ex.last().expect("a request reached llama-server").clone();
    assert_eq!(req1["stream"], true);
    assert_eq!(req1["max_tokens"], 40, "max_tokens from the model config: {req1}");
    let usage = assert_usage_is_reported(&asst1["message"], &resp1);
    let finish: Vec<String> = sse_data(&resp1)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let want = if finish.last().map(String::as_str) == Some("length") { "length" } else { "stop" };
    assert_eq!(stop, want, "finish_reason {finish:?}");
    eprintln!("turn 1 ({stop}, {usage}) after {:?}: {reply:?}", started.elapsed());

    // 2. A second turn: the request carries the first turn, and the file's context has four messages.
    send(&mut c, "Now say goodbye.", "t2").await;
    let fin2 = chat_end(&mut c, "t2", &llama, &gw).await;
    assert_eq!(fin2["payload"]["state"], "final", "{fin2}");
    assert!(!text(&fin2["payload"]["message"]).trim().is_empty());
    let (req2, resp2) = proxy.completions().last().expect("second request").clone();
    // llama.cpp reuses the first turn's prompt from its cache and says so (`cached_tokens`).
    assert_usage_is_reported(&entries(&file).last().expect("rows")["message"], &resp2);
    let sent: Vec<(String, String)> = req2["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| (m["role"].as_str().unwrap_or("").to_owned(), text(m)))
        .collect();
    assert_eq!(
        sent,
        vec![
            ("user".to_owned(), "Say hello in one short sentence.".to_owned()),
            ("assistant".to_owned(), reply.clone()),
            ("user".to_owned(), "Now say goodbye.".to_owned()),
        ]
    );
    let l = entries(&file);
    let asst2 = l.last().expect("rows").clone();
    assert!(ancestry(&l, &asst2).contains(&asst1["id"].as_str().expect("id").to_owned()), "{l:#?}");
    let ctx = pincer(&["transcript", "context"], &file);
    assert!(ctx.status.success(), "{}", String::from_utf8_lossy(&ctx.stderr));
    let ctx: Value = serde_json::from_slice(&ctx.stdout).expect("context json");
    assert_eq!(ctx["context"]["messages"].as_array().map(Vec::len), Some(4), "{ctx}");
    eprintln!("turn 2 after {:?}", started.elapsed());

    // 3. Abort mid-stream: a long story, aborted at its first delta; the partial is persisted once.
    let p = c.request("sessions.patch", json!({"key": "main", "model": "llama/smollm2-135m-instruct-long"})).await;
    assert_eq!(p.expect("patch")["resolved"]["model"], "smollm2-135m-instruct-long");
    send(&mut c, "Write a very long story about a dragon who learns to bake bread.", "t3").await;
    let first_delta =
        |f: &Value| f["event"] == "chat" && f["payload"]["runId"] == "t3" && f["payload"]["state"] == "delta";
    c.event_within(first_delta, PATIENCE).await;
    let r = c.request("chat.abort", json!({"sessionKey": "main", "runId": "t3"})).await.expect("abort");
    assert_eq!(r, json!({"ok": true, "aborted": true, "runIds": ["t3"]}));
    let end = chat_end(&mut c, "t3", &llama, &gw).await;
    assert_eq!(end["payload"]["state"], "aborted", "{end}");
    let partial_text = text(&end["payload"]["message"]);
    assert!(!partial_text.trim().is_empty(), "{end}");
    let l = entries(&file);
    let partials: Vec<&Value> = l.iter().filter(|e| e["message"]["openclawAbort"].is_object()).collect();
    assert_eq!(partials.len(), 1, "{l:#?}");
    assert_eq!(partials[0]["message"]["openclawAbort"], json!({"aborted": true, "origin": "rpc", "runId": "t3"}));
    assert_eq!(text(&partials[0]["message"]), partial_text);
    assert_eq!(l.last(), Some(partials[0]), "the partial is the leaf");
    let (req3, resp3) = proxy.completions().last().expect("story request").clone();
    assert_eq!(req3["max_tokens"], 1500);
    let streamed: usize = sse_data(&resp3).len();
    assert!(reported_usage(&resp3).is_none(), "the story was cut off before llama.cpp finished it ({streamed} events)");
    let verify = pincer(&["transcript", "verify"], &file);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let p = c.request("sessions.patch", json!({"key": "main", "model": "llama/smollm2-135m-instruct"})).await;
    p.expect("patch back");
    eprintln!("abort after {:?} ({} characters kept)", started.elapsed(), partial_text.len());

    // A short turn after the abort. (Without it the compaction below would record `tokensBefore: 0`:
    // Pi's estimate takes the last assistant message's usage as the context size, and the persisted
    // partial is a gateway-injected message whose usage is all zeros, as OpenClaw writes it.)
    send(&mut c, "Thanks. Say it in three words.", "t4").await;
    let fin4 = chat_end(&mut c, "t4", &llama, &gw).await;
    assert_eq!(fin4["payload"]["state"], "final", "{fin4}");
    let (req4, _) = proxy.completions().last().expect("request after the abort").clone();
    let roles: Vec<&str> =
        req4["messages"].as_array().expect("messages").iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant", "user", "assistant", "user"],
        "the partial is in the context"
    );

    // 4. Compaction with a real summary request from the model.
    let before = entries(&file);
    let r = c.request("sessions.compact", json!({"key": "main"})).await.expect("compact");
    assert_eq!(r["compacted"], true, "{r}\n{}\n{}", gw.log_text(), llama.log_text());
    let after = entries(&file);
    assert_eq!(after.len(), before.len() + 1, "one entry appended");
    assert_eq!(after[..before.len()], before[..], "nothing rewritten");
    let comp = after.last().expect("compaction").clone();
    assert_eq!(comp["type"], "compaction", "{comp}");
    assert_eq!(comp["id"], r["entryId"]);
    assert_eq!(comp["parentId"], before.last().expect("leaf")["id"]);
    let summary = comp["summary"].as_str().expect("summary");
    assert!(!summary.trim().is_empty(), "{comp}");
    let kept = comp["firstKeptEntryId"].as_str().expect("firstKeptEntryId");
    assert!(before.iter().any(|e| e["id"] == kept), "firstKeptEntryId {kept} names no entry");
    assert_eq!(r["firstKeptEntryId"], kept);
    assert!(comp["tokensBefore"].as_u64().expect("tokensBefore") > 0, "{comp}");
    let (sreq, sresp) = proxy.completions().last().expect("summary request").clone();
    assert!(sreq.to_string().contains("context summarization assistant"), "{sreq}");
    assert_eq!(sreq["model"], "smollm2-135m-instruct-summary");
    assert!(sreq.get("tools").is_none(), "a summary request offers no tools");
    assert!(reported_usage(&sresp).is_some(), "the summary stream finished");
    let verify = pincer(&["transcript", "verify"], &file);
    assert_eq!(verify.status.code(), Some(0), "{}", String::from_utf8_lossy(&verify.stdout));
    let ctx = pincer(&["transcript", "context"], &file);
    let ctx: Value = serde_json::from_slice(&ctx.stdout).expect("context json");
    assert_eq!(ctx["context"]["messages"][0]["role"], "compactionSummary", "{ctx}");
    eprintln!("compaction after {:?}: {} characters of summary", started.elapsed(), summary.len());
    if std::env::var_os("PINCER_LLAMA_DEBUG").is_some() {
        eprintln!("gateway:\n{}\nllama-server:\n{}", gw.log_text(), llama.log_text());
    }
    drop(gw);
    drop(llama);
}

/// The main session's transcript in a state dir.
fn transcript(state: &Path) -> PathBuf {
    pincer_testkit::probe::transcript_path(state, "agent:main:main").expect("the main session has a transcript")
}

/// Copies one direction of a proxied connection and records what passed (`up`: client → server).
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    conn: Arc<Mutex<Conn>>,
    up: bool,
) {
    let mut buf = vec![0u8; 16384];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        let mut c = conn.lock().expect("conn");
        if up { &mut c.up } else { &mut c.down }.extend_from_slice(&buf[..n]);
    }
}
