//! The fake model provider every Rust test uses: a real HTTP/1.1 server on 127.0.0.1:0 that speaks
//! the exact streaming wire format of OpenAI chat completions, OpenAI Responses or Anthropic
//! Messages (rendered from a [`Turn`] by [`script`]), records every request, and answers each one
//! as its script says: a queue of replies pushed by the test ([`FakeProvider::push`]), or a
//! function of the request ([`FakeProvider::start_with`]; [`crate::fake_openai`] is one, driven by
//! markers in the user's text). A reply is a stream released all at once or step by step on
//! command, paused, held open, stalled, cut mid-event (chunked or close-delimited), an error
//! status with headers (429 with `retry-after`, 5xx, context length), or no answer at all.
//! Connections are closed after each answer unless the server was started keep-alive (as real
//! providers serve, for the gateway's pooled client). Tests that need byte-level faults below HTTP
//! keep their own raw TCP listeners.

mod script;

pub use script::*;

use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
    /// The `api` name of `pincer.toml` (and of Pi's assistant messages) for this format.
    pub fn api_name(self) -> &'static str {
        match self {
            Format::OpenaiCompletions => "openai-completions",
            Format::OpenaiResponses => "openai-responses",
            Format::Anthropic => "anthropic-messages",
        }
    }
    /// The path requests are served on (others get a 404).
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
    /// The same bytes `n` times, as fast as the client reads (a huge reply without holding it).
    Repeat(String, usize),
    /// Wait before the next step.
    Pause(Duration),
    /// Send nothing more and keep the connection open.
    Stall,
    /// Close the connection without ending the body properly.
    Cut,
}

/// How a stream's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `transfer-encoding: chunked`; a cut is a protocol error the client sees.
    Chunked,
    /// No length: the body ends when the connection closes (a cut looks like a clean EOF).
    CloseDelimited,
}

/// The answer to one request.
pub enum Reply {
    /// 200 `text/event-stream` playing these steps, then ending the body.
    Stream(Vec<Step>, Framing),
    /// 200 `text/event-stream` playing steps as the test sends them; ends when the sender drops.
    Controlled(mpsc::UnboundedReceiver<Step>),
    /// An error status with a JSON body and extra headers; the connection is closed after it.
    Status { status: u16, headers: Vec<(String, String)>, body: String },
    /// Read the request and never answer.
    NoResponse,
}

impl Reply {
    /// A chunked stream of these events.
    pub fn stream(events: Vec<String>) -> Reply {
        Reply::Stream(events.into_iter().map(Step::Send).collect(), Framing::Chunked)
    }

    /// An error status with `format`'s error body for it.
    pub fn status(format: Format, status: u16, message: &str) -> Reply {
        Reply::Status { status, headers: vec![], body: format.error_body(status, message) }
    }
}

/// A recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    /// Header names in lowercase.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`null` when it is not JSON).
    pub body: Value,
    /// The body's length in bytes.
    pub body_len: usize,
}

/// Chooses the reply to a request from it and its 0-based arrival index; `None` takes the next
/// pushed reply.
pub type Script = Box<dyn Fn(&Recorded, usize) -> Option<Reply> + Send + Sync>;

struct State {
    script: Mutex<Script>,
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// Requests seen (also when they are not kept).
    count: Mutex<usize>,
    record: bool,
    keep_alive: bool,
    read_body: fn(&[u8]) -> Value,
    arrived: Notify,
}

/// How a [`FakeProvider`] serves.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Keep request bodies for [`FakeProvider::requests`] (off for load: long sessions send large ones).
    pub record: bool,
    /// Serve further requests on a connection after a stream (HTTP/1.1 keep-alive) instead of closing it.
    pub keep_alive: bool,
    /// How a request body becomes [`Recorded::body`]: the whole JSON by default (`null` when it is
    /// not JSON); a server under load may read only what its script looks at.
    pub read_body: fn(&[u8]) -> Value,
}

impl Default for Options {
    fn default() -> Self {
        Options { record: true, keep_alive: false, read_body: read_whole_body }
    }
}

/// The body as JSON, `null` when it is not JSON.
pub fn read_whole_body(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

pub struct FakeProvider {
    pub format: Format,
    pub addr: SocketAddr,
    state: Arc<State>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl FakeProvider {
    /// A server that answers with the replies the test pushes (HTTP 500 when none is left), on
    /// the current tokio runtime; it stops when dropped.
    pub async fn start(format: Format) -> FakeProvider {
        Self::start_with(format, Options::default(), Box::new(|_, _| None)).await
    }

    /// A server whose script chooses each reply.
    pub async fn start_with(format: Format, options: Options, script: Script) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake provider");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(State {
            script: Mutex::new(script),
            replies: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
            count: Mutex::new(0),
            record: options.record,
            keep_alive: options.keep_alive,
            read_body: options.read_body,
            arrived: Notify::new(),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(format, sock, st).await;
                });
            }
        });
        FakeProvider { format, addr, state, task: Some(task) }
    }

    /// Keeps serving after this handle is dropped (until the runtime ends).
    pub fn detach(mut self) -> FakeProvider {
        self.task = None;
        self
    }

    /// The base URL a provider config takes (`/v1` for OpenAI's formats).
    pub fn base_url(&self) -> String {
        match self.format {
            Format::Anthropic => format!("http://{}", self.addr),
            Format::OpenaiCompletions | Format::OpenaiResponses => format!("http://{}/v1", self.addr),
        }
    }

    /// Queues the reply to a later request.
    pub fn push(&self, reply: Reply) {
        self.state.replies.lock().unwrap().push_back(reply);
    }

    /// Pushes a controlled stream and returns its control.
    pub fn push_controlled(&self) -> mpsc::UnboundedSender<Step> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.push(Reply::Controlled(rx));
        tx
    }

    /// Replaces the script (for a later phase of the same test).
    pub fn set_script(&self, script: Script) {
        *self.state.script.lock().unwrap() = script;
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Their bodies.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }

    /// Waits until at least `n` requests have arrived.
    pub async fn wait_requests(&self, n: usize) {
        loop {
            let notified = self.state.arrived.notified();
            if *self.state.count.lock().unwrap() >= n {
                return;
            }
            notified.await;
        }
    }
}

/// Reads one request's head and body. `buf` holds bytes read past the previous request (none:
/// clients do not pipeline). `None`: the client closed.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, BTreeMap<String, String>, Vec<u8>)> {
    let mut tmp = [0u8; 65536];
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
    buf.drain(..head_end + 4);
    // Long sessions send megabytes: read straight into the buffer, and hand it over whole.
    buf.reserve(len.saturating_sub(buf.len()));
    while buf.len() < len {
        if sock.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
    let rest = buf.split_off(len);
    Some((path, headers, std::mem::replace(buf, rest)))
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

/// Serves one connection: one request, or (keep-alive) requests one after another until a reply
/// closes it or the client does.
async fn serve(format: Format, mut sock: TcpStream, st: Arc<State>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let Some((path, headers, body)) = read_request(&mut sock, &mut buf).await else { return Ok(()) };
        let rec = Recorded { path, headers, body: (st.read_body)(&body), body_len: body.len() };
        let index = {
            let mut count = st.count.lock().unwrap();
            *count += 1;
            *count - 1
        };
        let scripted = (st.script.lock().unwrap())(&rec, index);
        let path = rec.path.clone();
        if st.record {
            st.requests.lock().unwrap().push(rec);
        }
        st.arrived.notify_waiters();
        let reply = if path != format.path() {
            Reply::status(format, 404, &format!("no route {path}"))
        } else {
            scripted
                .or_else(|| st.replies.lock().unwrap().pop_front())
                .unwrap_or_else(|| Reply::status(format, 500, "fake provider: no reply scripted"))
        };
        let keep = match reply {
            Reply::NoResponse => return wait_for_close(&mut sock).await,
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
                false
            }
            Reply::Stream(steps, framing) => {
                let (tx, rx) = mpsc::unbounded_channel();
                for s in steps {
                    let _ = tx.send(s);
                }
                drop(tx);
                let keep = st.keep_alive && framing == Framing::Chunked;
                if !play(&mut sock, rx, framing, keep).await? {
                    return Ok(());
                }
                keep
            }
            Reply::Controlled(rx) => {
                if !play(&mut sock, rx, Framing::Chunked, st.keep_alive).await? {
                    return Ok(());
                }
                st.keep_alive
            }
        };
        if !keep {
            return sock.shutdown().await;
        }
    }
}

async fn wait_for_close(sock: &mut TcpStream) -> std::io::Result<()> {
    let mut tmp = [0u8; 1024];
    while sock.read(&mut tmp).await? > 0 {}
    Ok(())
}

async fn send(sock: &mut TcpStream, framing: Framing, s: &str) -> std::io::Result<()> {
    if framing == Framing::Chunked {
        let mut framed = format!("{:x}\r\n", s.len()).into_bytes();
        framed.extend_from_slice(s.as_bytes());
        framed.extend_from_slice(b"\r\n");
        sock.write_all(&framed).await
    } else {
        sock.write_all(s.as_bytes()).await
    }
}

/// Plays a stream. `Ok(false)`: the connection is done with (cut, stalled until the client left,
/// or the client went away).
async fn play(
    sock: &mut TcpStream,
    mut rx: mpsc::UnboundedReceiver<Step>,
    framing: Framing,
    keep_alive: bool,
) -> std::io::Result<bool> {
    let te = if framing == Framing::Chunked { "transfer-encoding: chunked\r\n" } else { "" };
    let conn = if keep_alive { "" } else { "connection: close\r\n" };
    let head =
        format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n{conn}{te}\r\n");
    sock.write_all(head.as_bytes()).await?;
    sock.flush().await?;
    let mut scratch = [0u8; 64];
    loop {
        let step = tokio::select! {
            s = rx.recv() => s,
            // The client went away: stop.
            r = sock.read(&mut scratch) => match r { Ok(0) | Err(_) => return Ok(false), Ok(_) => continue },
        };
        match step {
            Some(Step::Send(s)) => {
                send(sock, framing, &s).await?;
                sock.flush().await?;
            }
            Some(Step::Repeat(s, n)) => {
                for _ in 0..n {
                    send(sock, framing, &s).await?;
                }
            }
            Some(Step::Pause(d)) => tokio::time::sleep(d).await,
            Some(Step::Stall) => {
                wait_for_close(sock).await?;
                return Ok(false);
            }
            Some(Step::Cut) => return Ok(false), // dropping the socket closes it mid-body
            None => {
                if framing == Framing::Chunked {
                    sock.write_all(b"0\r\n\r\n").await?;
                }
                return Ok(true);
            }
        }
    }
}
