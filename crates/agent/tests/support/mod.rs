//! Test support: a fake model provider (a real HTTP/1.1 server on 127.0.0.1:0) that speaks the
//! exact streaming wire format of OpenAI chat completions, OpenAI Responses or Anthropic
//! Messages, records every request, and plays scripted replies: streams released all at once or
//! chunk by chunk on command, held open, stalled, cut mid-event, error bodies (429 with
//! `retry-after`, 5xx, context length), or no answer at all. Also shared by the bench and the
//! concurrency example, plus helpers to build models and collect run events.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pincer_agent::{Api, ProviderConfig, Providers, ResolvedModel, RunEvent};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

/// The three wire formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenaiCompletions,
    OpenaiResponses,
    Anthropic,
}

pub const ALL: [Format; 3] = [Format::OpenaiCompletions, Format::OpenaiResponses, Format::Anthropic];

impl Format {
    pub fn api(self) -> Api {
        match self {
            Format::OpenaiCompletions => Api::OpenaiCompletions,
            Format::OpenaiResponses => Api::OpenaiResponses,
            Format::Anthropic => Api::AnthropicMessages,
        }
    }
    pub fn path(self) -> &'static str {
        match self {
            Format::OpenaiCompletions => "/v1/chat/completions",
            Format::OpenaiResponses => "/v1/responses",
            Format::Anthropic => "/v1/messages",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Format::OpenaiCompletions => "oaichat",
            Format::OpenaiResponses => "oairesp",
            Format::Anthropic => "claude",
        }
    }
    pub fn model_id(self) -> &'static str {
        match self {
            Format::OpenaiCompletions => "gpt-test",
            Format::OpenaiResponses => "gpt-resp-test",
            Format::Anthropic => "claude-test",
        }
    }
    pub fn response_id(self) -> &'static str {
        match self {
            Format::OpenaiCompletions => "chatcmpl-1",
            Format::OpenaiResponses => "resp_1",
            Format::Anthropic => "msg_1",
        }
    }
    /// The provider's error body for an HTTP status.
    pub fn error_body(self, status: u16, message: &str) -> String {
        match self {
            Format::Anthropic => {
                let kind = match status {
                    429 => "rate_limit_error",
                    529 => "overloaded_error",
                    500..=599 => "api_error",
                    401 => "authentication_error",
                    _ => "invalid_request_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
            }
            Format::OpenaiCompletions | Format::OpenaiResponses => {
                let (kind, code) = match status {
                    429 => ("requests", json!("rate_limit_exceeded")),
                    500..=599 => ("server_error", Value::Null),
                    _ => ("invalid_request_error", Value::Null),
                };
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}}).to_string()
            }
        }
    }
    /// The context-length error body each provider returns (HTTP 400).
    pub fn context_length_body(self) -> String {
        match self {
            Format::Anthropic => json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "prompt is too long: 208310 tokens > 200000 maximum"}})
            .to_string(),
            Format::OpenaiCompletions | Format::OpenaiResponses => json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
            .to_string(),
        }
    }
}

/// One piece of a scripted stream.
pub enum Step {
    /// Bytes to send (usually one complete SSE event).
    Send(String),
    /// Send nothing more and keep the connection open.
    Stall,
    /// Close the connection without ending the body properly.
    Cut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `transfer-encoding: chunked`; a cut is a protocol error the client sees.
    Chunked,
    /// No length: the body ends when the connection closes (a cut looks like a clean EOF).
    CloseDelimited,
}

pub enum Reply {
    /// 200 `text/event-stream` playing these steps, then ending the body.
    Stream(Vec<Step>, Framing),
    /// 200 `text/event-stream` playing steps as the test sends them; ends when the sender drops.
    Controlled(mpsc::UnboundedReceiver<Step>),
    /// An error status with a JSON body and extra headers.
    Status { status: u16, headers: Vec<(String, String)>, body: String },
    /// Read the request and never answer.
    NoResponse,
}

impl Reply {
    pub fn stream(events: Vec<String>) -> Reply {
        Reply::Stream(events.into_iter().map(Step::Send).collect(), Framing::Chunked)
    }
}

/// A recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

#[derive(Default)]
struct State {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    arrived: Notify,
}

pub struct FakeProvider {
    pub format: Format,
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProvider {
    pub async fn start(format: Format) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(format, sock, st).await;
                });
            }
        });
        FakeProvider { format, addr, state, task }
    }

    pub fn base_url(&self) -> String {
        match self.format {
            Format::Anthropic => format!("http://{}", self.addr),
            Format::OpenaiCompletions | Format::OpenaiResponses => format!("http://{}/v1", self.addr),
        }
    }

    pub fn push(&self, reply: Reply) {
        self.state.replies.lock().unwrap().push_back(reply);
    }

    /// Pushes a controlled stream and returns its control.
    pub fn push_controlled(&self) -> mpsc::UnboundedSender<Step> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.push(Reply::Controlled(rx));
        tx
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }

    /// Waits until at least `n` requests have arrived.
    pub async fn wait_requests(&self, n: usize) {
        loop {
            let notified = self.state.arrived.notified();
            if self.state.requests.lock().unwrap().len() >= n {
                return;
            }
            notified.await;
        }
    }
}

async fn read_request(sock: &mut TcpStream) -> Option<(String, BTreeMap<String, String>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some((path, headers, body))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

async fn serve(format: Format, mut sock: TcpStream, st: Arc<State>) -> std::io::Result<()> {
    let Some((path, headers, body)) = read_request(&mut sock).await else { return Ok(()) };
    let body_json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    st.requests.lock().unwrap().push(Recorded { path: path.clone(), headers, body: body_json });
    st.arrived.notify_waiters();
    let reply = if path != format.path() {
        Reply::Status { status: 404, headers: vec![], body: format.error_body(404, &format!("no route {path}")) }
    } else {
        st.replies.lock().unwrap().pop_front().unwrap_or_else(|| Reply::Status {
            status: 500,
            headers: vec![],
            body: format.error_body(500, "fake provider: no reply scripted"),
        })
    };
    match reply {
        Reply::NoResponse => wait_for_close(&mut sock).await,
        Reply::Status { status, headers, body } => {
            let mut head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                reason(status),
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            sock.write_all(head.as_bytes()).await?;
            sock.write_all(body.as_bytes()).await?;
            sock.shutdown().await
        }
        Reply::Stream(steps, framing) => {
            let (tx, rx) = mpsc::unbounded_channel();
            for s in steps {
                let _ = tx.send(s);
            }
            drop(tx);
            play(sock, rx, framing).await
        }
        Reply::Controlled(rx) => play(sock, rx, Framing::Chunked).await,
    }
}

async fn wait_for_close(sock: &mut TcpStream) -> std::io::Result<()> {
    let mut tmp = [0u8; 1024];
    while sock.read(&mut tmp).await? > 0 {}
    Ok(())
}

async fn play(mut sock: TcpStream, mut rx: mpsc::UnboundedReceiver<Step>, framing: Framing) -> std::io::Result<()> {
    let te = if framing == Framing::Chunked { "transfer-encoding: chunked\r\n" } else { "" };
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n{te}\r\n");
    sock.write_all(head.as_bytes()).await?;
    sock.flush().await?;
    let mut scratch = [0u8; 64];
    loop {
        let step = tokio::select! {
            s = rx.recv() => s,
            // The client went away: stop.
            r = sock.read(&mut scratch) => match r { Ok(0) | Err(_) => return Ok(()), Ok(_) => continue },
        };
        match step {
            Some(Step::Send(s)) => {
                if framing == Framing::Chunked {
                    sock.write_all(format!("{:x}\r\n", s.len()).as_bytes()).await?;
                    sock.write_all(s.as_bytes()).await?;
                    sock.write_all(b"\r\n").await?;
                } else {
                    sock.write_all(s.as_bytes()).await?;
                }
                sock.flush().await?;
            }
            Some(Step::Stall) => return wait_for_close(&mut sock).await,
            Some(Step::Cut) => return Ok(()), // dropping the socket closes it mid-body
            None => {
                if framing == Framing::Chunked {
                    sock.write_all(b"0\r\n\r\n").await?;
                }
                return sock.shutdown().await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scripts: one description of a model turn, rendered in each wire format.

#[derive(Debug, Clone)]
pub enum Part {
    Thinking { chunks: Vec<String>, signature: String },
    Text(Vec<String>),
    ToolCall { id: String, name: String, arg_chunks: Vec<String> },
}

pub fn text(chunks: &[&str]) -> Part {
    Part::Text(chunks.iter().map(|s| (*s).to_owned()).collect())
}
pub fn thinking(chunks: &[&str], signature: &str) -> Part {
    Part::Thinking { chunks: chunks.iter().map(|s| (*s).to_owned()).collect(), signature: signature.to_owned() }
}
pub fn tool_call(id: &str, name: &str, arg_chunks: &[&str]) -> Part {
    Part::ToolCall {
        id: id.into(),
        name: name.into(),
        arg_chunks: arg_chunks.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Stop,
    Length,
    ToolUse,
}

#[derive(Debug, Clone)]
pub struct Turn {
    pub parts: Vec<Part>,
    /// (uncached input, output, cache read)
    pub usage: (u64, u64, u64),
    pub end: End,
}

pub fn turn(parts: Vec<Part>, usage: (u64, u64, u64)) -> Turn {
    let end = if parts.iter().any(|p| matches!(p, Part::ToolCall { .. })) { End::ToolUse } else { End::Stop };
    Turn { parts, usage, end }
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The events of a whole turn, one string per SSE event.
pub fn script(format: Format, t: &Turn) -> Vec<String> {
    match format {
        Format::OpenaiCompletions => script_chat(t),
        Format::OpenaiResponses => script_responses(t),
        Format::Anthropic => script_anthropic(t),
    }
}

fn chat_chunk(delta: Value, finish: Value) -> String {
    sse(
        None,
        &json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-test",
                "choices":[{"index":0,"delta":delta,"logprobs":null,"finish_reason":finish}]}),
    )
}

fn script_chat(t: &Turn) -> Vec<String> {
    let mut out = vec![chat_chunk(json!({"role":"assistant","content":""}), Value::Null)];
    let mut tool_index = 0;
    for p in &t.parts {
        match p {
            Part::Thinking { chunks, .. } => {
                out.extend(chunks.iter().map(|c| chat_chunk(json!({"reasoning_content": c}), Value::Null)));
            }
            Part::Text(chunks) => out.extend(chunks.iter().map(|c| chat_chunk(json!({"content": c}), Value::Null))),
            Part::ToolCall { id, name, arg_chunks } => {
                out.push(chat_chunk(
                    json!({"tool_calls":[{"index":tool_index,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}),
                    Value::Null,
                ));
                out.extend(arg_chunks.iter().map(|c| {
                    chat_chunk(json!({"tool_calls":[{"index":tool_index,"function":{"arguments":c}}]}), Value::Null)
                }));
                tool_index += 1;
            }
        }
    }
    let finish = match t.end {
        End::Stop => "stop",
        End::Length => "length",
        End::ToolUse => "tool_calls",
    };
    out.push(chat_chunk(json!({}), json!(finish)));
    let (input, output, cached) = t.usage;
    out.push(sse(
        None,
        &json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-test","choices":[],
                "usage":{"prompt_tokens":input+cached,"completion_tokens":output,"total_tokens":input+cached+output,
                         "prompt_tokens_details":{"cached_tokens":cached}}}),
    ));
    out.push("data: [DONE]\n\n".to_owned());
    out
}

fn resp(data: Value) -> String {
    let ty = data["type"].as_str().unwrap_or_default().to_owned();
    sse(Some(&ty), &data)
}

fn script_responses(t: &Turn) -> Vec<String> {
    let mut out = vec![resp(json!({"type":"response.created","sequence_number":0,
        "response":{"id":"resp_1","object":"response","status":"in_progress","model":"gpt-resp-test","output":[],"usage":null}}))];
    let mut items = Vec::new();
    for (oi, p) in t.parts.iter().enumerate() {
        match p {
            Part::Thinking { chunks, signature } => {
                let id = format!("rs_{oi}");
                out.push(resp(json!({"type":"response.output_item.added","output_index":oi,
                    "item":{"id":id,"type":"reasoning","summary":[]}})));
                for c in chunks {
                    out.push(resp(json!({"type":"response.reasoning_summary_text.delta","item_id":id,"output_index":oi,"summary_index":0,"delta":c})));
                }
                let item = json!({"id":id,"type":"reasoning","summary":[{"type":"summary_text","text":chunks.concat()}],"encrypted_content":signature});
                out.push(resp(json!({"type":"response.output_item.done","output_index":oi,"item":item})));
                items.push(item);
            }
            Part::Text(chunks) => {
                let id = format!("msg_{oi}");
                out.push(resp(json!({"type":"response.output_item.added","output_index":oi,
                    "item":{"id":id,"type":"message","status":"in_progress","role":"assistant","content":[]}})));
                out.push(resp(
                    json!({"type":"response.content_part.added","item_id":id,"output_index":oi,"content_index":0,
                    "part":{"type":"output_text","text":"","annotations":[]}}),
                ));
                for c in chunks {
                    out.push(resp(json!({"type":"response.output_text.delta","item_id":id,"output_index":oi,"content_index":0,"delta":c})));
                }
                out.push(resp(json!({"type":"response.output_text.done","item_id":id,"output_index":oi,"content_index":0,"text":chunks.concat()})));
                let item = json!({"id":id,"type":"message","status":"completed","role":"assistant",
                    "content":[{"type":"output_text","text":chunks.concat(),"annotations":[]}]});
                out.push(resp(json!({"type":"response.output_item.done","output_index":oi,"item":item})));
                items.push(item);
            }
            Part::ToolCall { id, name, arg_chunks } => {
                let item_id = format!("fc_{oi}");
                out.push(resp(json!({"type":"response.output_item.added","output_index":oi,
                    "item":{"id":item_id,"type":"function_call","status":"in_progress","call_id":id,"name":name,"arguments":""}})));
                for c in arg_chunks {
                    out.push(resp(json!({"type":"response.function_call_arguments.delta","item_id":item_id,"output_index":oi,"delta":c})));
                }
                out.push(resp(json!({"type":"response.function_call_arguments.done","item_id":item_id,"output_index":oi,"arguments":arg_chunks.concat()})));
                let item = json!({"id":item_id,"type":"function_call","status":"completed","call_id":id,"name":name,"arguments":arg_chunks.concat()});
                out.push(resp(json!({"type":"response.output_item.done","output_index":oi,"item":item})));
                items.push(item);
            }
        }
    }
    let (input, output, cached) = t.usage;
    let usage = json!({"input_tokens":input+cached,"input_tokens_details":{"cached_tokens":cached},
        "output_tokens":output,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":input+cached+output});
    let (ty, status, details) = match t.end {
        End::Length => ("response.incomplete", "incomplete", json!({"reason":"max_output_tokens"})),
        End::Stop | End::ToolUse => ("response.completed", "completed", Value::Null),
    };
    out.push(resp(
        json!({"type":ty,"response":{"id":"resp_1","object":"response","status":status,"model":"gpt-resp-test",
        "incomplete_details":details,"output":items,"usage":usage}}),
    ));
    out
}

fn ant(data: Value) -> String {
    let ty = data["type"].as_str().unwrap_or_default().to_owned();
    sse(Some(&ty), &data)
}

fn script_anthropic(t: &Turn) -> Vec<String> {
    let (input, output, cached) = t.usage;
    let mut out = vec![ant(json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",
        "content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,
        "usage":{"input_tokens":input,"cache_creation_input_tokens":0,"cache_read_input_tokens":cached,"output_tokens":1}}}))];
    out.push("event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned());
    for (i, p) in t.parts.iter().enumerate() {
        match p {
            Part::Thinking { chunks, signature } => {
                out.push(ant(
                    json!({"type":"content_block_start","index":i,"content_block":{"type":"thinking","thinking":""}}),
                ));
                for c in chunks {
                    out.push(ant(
                        json!({"type":"content_block_delta","index":i,"delta":{"type":"thinking_delta","thinking":c}}),
                    ));
                }
                out.push(ant(json!({"type":"content_block_delta","index":i,"delta":{"type":"signature_delta","signature":signature}})));
            }
            Part::Text(chunks) => {
                out.push(ant(
                    json!({"type":"content_block_start","index":i,"content_block":{"type":"text","text":""}}),
                ));
                for c in chunks {
                    out.push(ant(
                        json!({"type":"content_block_delta","index":i,"delta":{"type":"text_delta","text":c}}),
                    ));
                }
            }
            Part::ToolCall { id, name, arg_chunks } => {
                out.push(ant(json!({"type":"content_block_start","index":i,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}})));
                for c in arg_chunks {
                    out.push(ant(json!({"type":"content_block_delta","index":i,"delta":{"type":"input_json_delta","partial_json":c}})));
                }
            }
        }
        out.push(ant(json!({"type":"content_block_stop","index":i})));
    }
    let stop = match t.end {
        End::Stop => "end_turn",
        End::Length => "max_tokens",
        End::ToolUse => "tool_use",
    };
    out.push(ant(json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":{"output_tokens":output}})));
    out.push(ant(json!({"type":"message_stop"})));
    out
}

// ---------------------------------------------------------------------------------------------
// Models and runs.

pub struct Knobs {
    pub first_byte_ms: u64,
    pub idle_ms: u64,
    pub connect_ms: u64,
    pub max_retries: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        // Generous: only guards; tests that exercise a timeout set it short.
        Knobs { first_byte_ms: 30_000, idle_ms: 30_000, connect_ms: 10_000, max_retries: 2 }
    }
}

pub fn provider_config(format: Format, base_url: &str, knobs: &Knobs) -> ProviderConfig {
    let mut cfg = ProviderConfig::new(format.api(), base_url);
    cfg.api_key = Some("sk-test-key".into());
    cfg.headers = Some(BTreeMap::from([("x-pincer-test".to_owned(), "1".to_owned())]));
    let mut m = pincer_agent::ModelConfig::named(format.model_id());
    m.max_tokens = Some(1024);
    m.cost = Some(pincer_agent::ModelCost { input: 3.0, output: 15.0, cache_read: 0.3, cache_write: 3.75 });
    cfg.models = vec![m];
    cfg.first_byte_timeout_ms = Some(knobs.first_byte_ms);
    cfg.idle_timeout_ms = Some(knobs.idle_ms);
    cfg.connect_timeout_ms = Some(knobs.connect_ms);
    cfg.max_retries = Some(knobs.max_retries);
    cfg.retry_base_delay_ms = Some(5);
    cfg
}

pub fn model_at(format: Format, base_url: &str, knobs: &Knobs) -> ResolvedModel {
    let providers =
        Providers::new(BTreeMap::from([(format.name().to_owned(), provider_config(format, base_url, knobs))])).unwrap();
    providers.resolve(&format!("{}/{}", format.name(), format.model_id())).unwrap()
}

impl FakeProvider {
    pub fn model(&self) -> ResolvedModel {
        model_at(self.format, &self.base_url(), &Knobs::default())
    }
    pub fn model_with(&self, knobs: &Knobs) -> ResolvedModel {
        model_at(self.format, &self.base_url(), knobs)
    }
}

/// Guard against hangs only: no test relies on it for timing.
pub const GUARD: Duration = Duration::from_secs(60);

/// Receives events until the channel closes.
pub async fn collect(mut rx: mpsc::Receiver<RunEvent>) -> Vec<RunEvent> {
    let mut out = Vec::new();
    tokio::time::timeout(GUARD, async {
        while let Some(e) = rx.recv().await {
            out.push(e);
        }
    })
    .await
    .expect("run did not finish within the guard time");
    out
}

/// Receives the next event.
pub async fn next_event(rx: &mut mpsc::Receiver<RunEvent>) -> RunEvent {
    tokio::time::timeout(GUARD, rx.recv()).await.expect("no event within the guard time").expect("run ended")
}

/// Replaces volatile values (message and entry timestamps, entry ids) with fixed ones, after
/// checking that the entries form one parentId chain.
pub fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, val) in m {
                let val = match (k.as_str(), val) {
                    ("timestamp", Value::Number(_)) => json!(0),
                    ("timestamp", Value::String(_)) => json!("<ts>"),
                    ("id" | "parentId", Value::String(_)) if m.contains_key("message") => json!("<id>"),
                    _ => normalize(val),
                };
                out.insert(k.clone(), val);
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

/// Checks the chain of entries and returns their messages, normalized.
pub fn chained_messages(entries: &[Value]) -> Vec<Value> {
    let mut parent = Value::Null;
    for e in entries {
        assert_eq!(e["type"], "message");
        assert_eq!(e["parentId"], parent, "entries must be chained in order");
        parent = e["id"].clone();
    }
    entries.iter().map(|e| normalize(&e["message"])).collect()
}

/// Events with volatile values normalized, as JSON for whole-value comparison.
/// Deltas carry only the new piece; `text`/`thinking` here are what a consumer accumulates from
/// them for the current assistant message (reset when it is persisted).
pub fn events_json(events: &[RunEvent]) -> Vec<Value> {
    let (mut text, mut thinking) = (String::new(), String::new());
    events
        .iter()
        .map(|e| match e {
            RunEvent::TextDelta { delta } => {
                text.push_str(delta);
                json!({"textDelta": delta, "text": text})
            }
            RunEvent::ThinkingDelta { delta } => {
                thinking.push_str(delta);
                json!({"thinkingDelta": delta, "thinking": thinking})
            }
            RunEvent::Persisted { entry } if entry["message"]["role"] == "assistant" => {
                text.clear();
                thinking.clear();
                json!({"persisted": normalize(entry)})
            }
            RunEvent::ToolCallStart { id, name, arguments } => json!({"toolCallStart": {"id": id, "name": name, "arguments": arguments}}),
            RunEvent::Persisted { entry } => json!({"persisted": normalize(entry)}),
            RunEvent::Usage(u) => json!({"usage": u}),
            RunEvent::Final { entry } => json!({"final": normalize(entry)}),
            RunEvent::Error { entry, message, kind } => {
                json!({"error": {"entry": entry.as_ref().map(normalize), "message": message, "kind": kind.as_str()}})
            }
            RunEvent::Aborted { partial_text, partial_message } => {
                json!({"aborted": {"partialText": partial_text, "partialMessage": partial_message.as_ref().map(normalize)}})
            }
        })
        .collect()
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text, "timestamp": 1_700_000_000_000u64})
}

/// The assistant message a run persists for `t` from `format`'s fake (after normalize).
pub fn expected_assistant(format: Format, t: &Turn) -> Value {
    let content: Vec<Value> = t
        .parts
        .iter()
        .map(|p| match p {
            Part::Thinking { chunks, signature } => {
                let sig = match format {
                    Format::OpenaiCompletions => None,
                    Format::Anthropic => Some(signature.clone()),
                    Format::OpenaiResponses => None, // filled below: the whole reasoning item
                };
                match sig {
                    Some(s) => json!({"type":"thinking","thinking":chunks.concat(),"thinkingSignature":s}),
                    None => json!({"type":"thinking","thinking":chunks.concat()}),
                }
            }
            Part::Text(chunks) => json!({"type":"text","text":chunks.concat()}),
            Part::ToolCall { id, name, arg_chunks } => json!({"type":"toolCall","id":id,"name":name,
                "arguments": serde_json::from_str::<Value>(&arg_chunks.concat()).unwrap()}),
        })
        .collect();
    let mut content = content;
    if format == Format::OpenaiResponses {
        for (oi, (p, c)) in t.parts.iter().zip(content.iter_mut()).enumerate() {
            if let Part::Thinking { chunks, signature } = p {
                let item = json!({"id":format!("rs_{oi}"),"type":"reasoning","summary":[{"type":"summary_text","text":chunks.concat()}],"encrypted_content":signature});
                c["thinkingSignature"] = json!(item.to_string());
            }
        }
    }
    let (input, output, cached) = t.usage;
    let usage = pincer_agent::message::Usage { input, output, cache_read: cached, cache_write: 0 }
        .to_pi(Some(&pincer_agent::ModelCost { input: 3.0, output: 15.0, cache_read: 0.3, cache_write: 3.75 }));
    let stop = match t.end {
        End::Stop => "stop",
        End::Length => "length",
        End::ToolUse => "toolUse",
    };
    json!({"role":"assistant","content":content,"api":format.api().as_str(),"provider":format.name(),
           "model":format.model_id(),"responseId":format.response_id(),"usage":usage,"stopReason":stop,"timestamp":0})
}

pub fn run_request(
    model: ResolvedModel,
    messages: Vec<Value>,
    tools: pincer_agent::ToolRegistry,
    sink: Arc<pincer_agent::MemorySink>,
    cancel: pincer_agent::CancellationToken,
) -> pincer_agent::RunRequest {
    pincer_agent::RunRequest {
        model,
        system_prompt: Some("You are a test assistant.".into()),
        messages: messages.into_iter().map(pincer_agent::ContextMessage::shared).collect(),
        tools: Arc::new(tools),
        sink,
        cancel,
        max_turns: 8,
        run_id: "run-1".into(),
        max_reply_bytes: pincer_agent::DEFAULT_MAX_REPLY_BYTES,
    }
}

/// Runs to the end against `fake` with no tools; returns (events, persisted messages).
pub async fn simple_run(fake: &FakeProvider, model: ResolvedModel) -> (Vec<Value>, Vec<Value>) {
    let sink = Arc::new(pincer_agent::MemorySink::new());
    let _ = fake;
    let rx = pincer_agent::start_run(run_request(
        model,
        vec![user("hi")],
        pincer_agent::ToolRegistry::new(),
        sink.clone(),
        pincer_agent::CancellationToken::new(),
    ));
    let events = collect(rx).await;
    (events_json(&events), chained_messages(&sink.entries()))
}

/// Splits a script after the first event that carries text (the stream has "output" then).
pub fn split_after_first_text(format: Format, events: &[String]) -> usize {
    let marker = match format {
        Format::OpenaiCompletions => "\"content\":\"",
        Format::OpenaiResponses => "response.output_text.delta",
        Format::Anthropic => "text_delta",
    };
    events.iter().position(|e| e.contains(marker) && !e.contains("\"content\":\"\"")).unwrap() + 1
}
