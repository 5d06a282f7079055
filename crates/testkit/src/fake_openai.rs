//! A fake OpenAI-compatible provider: a real HTTP server on 127.0.0.1:0 that answers
//! `POST /v1/chat/completions` with an SSE stream in OpenAI's exact framing (role chunk, content
//! deltas, a usage chunk, `[DONE]`). What it does is chosen by markers in the last user message:
//! `[slow]` streams 40 chunks 100 ms apart (to abort mid-stream), `[slowish]` 12 chunks 50 ms apart
//! (a turn that is often caught mid-stream but ends soon), `[huge]` streams 100 MB of text in 64 KiB
//! chunks as fast as the client reads (until it hangs up), `[fail]` answers HTTP 400 (and closes the connection) with an
//! OpenAI error body, `[tool]` asks for the `current_time` tool first. A compaction request (Pi's
//! summarization prompts) gets a summary with every required section that quotes the conversation,
//! so identifiers survive. Usage reports about a token per four characters of the request, as a real
//! provider would. Every request body is recorded.

use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone)]
pub struct FakeOpenAi {
    pub addr: std::net::SocketAddr,
    requests: Arc<Mutex<Vec<Value>>>,
    usages: Arc<Mutex<Vec<Value>>>,
}

impl FakeOpenAi {
    /// Starts the server on the current tokio runtime.
    pub async fn start() -> FakeOpenAi {
        Self::start_with(true).await
    }

    /// Starts a server that keeps no request bodies (for load: long sessions send large ones).
    pub async fn start_unrecorded() -> FakeOpenAi {
        Self::start_with(false).await
    }

    async fn start_with(record: bool) -> FakeOpenAi {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake provider");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let usages = Arc::new(Mutex::new(Vec::new()));
        let rec = record.then(|| Recorder { requests: requests.clone(), usages: usages.clone() });
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let rec = rec.clone();
                tokio::spawn(async move {
                    let _ = handle(sock, rec).await;
                });
            }
        });
        FakeOpenAi { addr, requests, usages }
    }

    /// Starts it on a thread of its own (for tests that are not async).
    pub fn start_in_thread() -> FakeOpenAi {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let f = FakeOpenAi::start().await;
                let _ = tx.send(f);
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("fake provider started")
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The request bodies received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The `usage` objects of the streams answered so far, in the order of [`FakeOpenAi::requests`].
    pub fn usages(&self) -> Vec<Value> {
        self.usages.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// A `[models.providers.fake]` section pointing at this server.
    pub fn provider_toml(&self) -> String {
        self.provider_toml_window(32000)
    }

    /// The same, with a given context window.
    pub fn provider_toml_window(&self, window: u64) -> String {
        format!(
            "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
             [[models.providers.fake.models]]\nid = \"fake-model\"\ncontext_window = {window}\n",
            self.base_url()
        )
    }
}

fn last_user_text(body: &Value) -> String {
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    let Some(m) = msgs.iter().rev().find(|m| m["role"] == "user") else { return String::new() };
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(""),
        _ => String::new(),
    }
}

/// Serves one connection: requests one after another on it (HTTP/1.1 keep-alive, chunked
/// responses, as real providers answer), until the client closes it.
/// Where a recording server keeps what it received and the usage it answered.
#[derive(Clone)]
struct Recorder {
    requests: Arc<Mutex<Vec<Value>>>,
    usages: Arc<Mutex<Vec<Value>>>,
}

async fn handle(mut sock: TcpStream, rec: Option<Recorder>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let Some(body_len) = read_request(&mut sock, &mut buf).await? else { return Ok(()) };
        let body: Value = serde_json::from_slice(&buf[..body_len]).unwrap_or(Value::Null);
        buf.drain(..body_len);
        if !respond(&mut sock, body, body_len, rec.as_ref()).await? {
            return sock.shutdown().await;
        }
    }
}

/// Reads one request's head and body; leaves the body at the start of `buf` (and returns its
/// length), followed by whatever of the next request came with it. `None`: the client closed.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
    let mut tmp = [0u8; 65536];
    let header_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    buf.drain(..header_end);
    while buf.len() < len {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Ok(Some(len))
}

/// Writes a chunked response body piece by piece.
struct Chunked<'a>(&'a mut TcpStream);

impl Chunked<'_> {
    async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut framed = format!("{:x}\r\n", data.len()).into_bytes();
        framed.extend_from_slice(data);
        framed.extend_from_slice(b"\r\n");
        self.0.write_all(&framed).await
    }

    async fn end(self) -> std::io::Result<()> {
        self.0.write_all(b"0\r\n\r\n").await
    }
}

/// Answers one request; `false` when the connection is to be closed after it.
async fn respond(sock: &mut TcpStream, body: Value, body_len: usize, rec: Option<&Recorder>) -> std::io::Result<bool> {
    if let Some(Ok(mut r)) = rec.map(|r| r.requests.lock()) {
        r.push(body.clone());
    }
    let said = last_user_text(&body);
    let prompt_tokens = body_len / 4;
    if said.contains("[fail]") {
        let err = json!({"error": {"message": "The fake provider was told to fail", "type": "invalid_request_error", "code": null}});
        let text = err.to_string();
        let resp = format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        );
        sock.write_all(resp.as_bytes()).await?;
        return Ok(false);
    }
    sock.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await?;
    let mut sock = Chunked(sock);
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    sock.write_all(chunk(json!({"role": "assistant", "content": ""}), Value::Null).as_bytes()).await?;
    let has_tool_result = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
    if said.contains("[tool]") && !has_tool_result {
        let call = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "current_time", "arguments": "{}"}}]});
        sock.write_all(chunk(call, Value::Null).as_bytes()).await?;
        sock.write_all(chunk(json!({}), json!("tool_calls")).as_bytes()).await?;
    } else if body.to_string().contains("context summarization assistant") {
        // A real model keeps what the conversation and the previous summary say; so does the fake.
        let between = |open: &str, close: &str| {
            said.split_once(open)
                .and_then(|(_, rest)| rest.split_once(close))
                .map(|(x, _)| x.to_owned())
                .unwrap_or_default()
        };
        let conversation = format!(
            "{}\n{}",
            between("<previous-summary>", "</previous-summary>"),
            between("<conversation>", "</conversation>")
        );
        let summary = if said.contains("## Original Request") && !said.contains("## Goal") {
            format!("## Original Request\n{conversation}\n\n## Early Progress\n- started\n\n## Context for Suffix\n- continue")
        } else {
            format!(
                "## Goal\nSummary of the conversation.\n\n## Constraints & Preferences\n- none\n\n## Progress\n### Done\n- [x] talked\n\n\
                 ### In Progress\n- [ ] more\n\n### Blocked\n- nothing\n\n## Key Decisions\n- **keep going**: asked to\n\n\
                 ## Next Steps\n1. answer the next message\n\n## Critical Context\n{conversation}"
            )
        };
        sock.write_all(chunk(json!({"content": summary}), Value::Null).as_bytes()).await?;
        sock.write_all(chunk(json!({}), json!("stop")).as_bytes()).await?;
    } else if said.contains("[huge]") {
        let piece = "x".repeat(64 * 1024);
        for _ in 0..(100_000_000 / piece.len()) {
            sock.write_all(chunk(json!({"content": piece}), Value::Null).as_bytes()).await?;
        }
        sock.write_all(chunk(json!({}), json!("stop")).as_bytes()).await?;
    } else {
        let reply = format!("Fake reply: you said \"{said}\"");
        let (slow, gap) = if said.contains("[slow]") {
            (Some(40), 100)
        } else if said.contains("[slowish]") {
            (Some(12), 50)
        } else {
            (None, 0)
        };
        let pieces: Vec<String> = if let Some(n) = slow {
            (0..n).map(|i| format!("word{i} ")).collect()
        } else {
            reply.split_inclusive(' ').map(str::to_owned).collect()
        };
        for p in pieces {
            sock.write_all(chunk(json!({"content": p}), Value::Null).as_bytes()).await?;
            if slow.is_some() {
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
        }
        sock.write_all(chunk(json!({}), json!("stop")).as_bytes()).await?;
    }
    let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
        "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7}});
    if let Some(Ok(mut u)) = rec.map(|r| r.usages.lock()) {
        u.push(usage["usage"].clone());
    }
    sock.write_all(format!("data: {usage}\n\ndata: [DONE]\n\n").as_bytes()).await?;
    sock.end().await?;
    Ok(true)
}
