//! Test support: a fake OpenAI chat-completions provider (a real HTTP/1.1 server on 127.0.0.1:0,
//! adapted from `crates/agent/tests/support`) that records every request and answers each one
//! through a script (a canned summary stream, an error status, or no answer at all), plus
//! transcript helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use pincer_agent::{Api, ProviderConfig, Providers, ResolvedModel};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// How the fake answers one request.
pub enum Reply {
    /// A 200 SSE stream whose assistant text is this.
    Text(String),
    /// An error status with an OpenAI error body.
    Status(u16, String),
    /// Read the request and never answer.
    NoResponse,
}

/// Chooses the reply from the request body and its 0-based arrival index.
pub type Script = Box<dyn Fn(&Value, usize) -> Reply + Send + Sync>;

struct State {
    script: Mutex<Script>,
    requests: Mutex<Vec<Value>>,
    arrived: Notify,
}

pub struct FakeProvider {
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
    pub async fn start(script: Script) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state =
            Arc::new(State { script: Mutex::new(script), requests: Mutex::new(Vec::new()), arrived: Notify::new() });
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, st).await;
                });
            }
        });
        FakeProvider { addr, state, task }
    }

    /// Replaces the script (for a later compaction in the same test).
    pub fn set_script(&self, script: Script) {
        *self.state.script.lock().unwrap() = script;
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.state.requests.lock().unwrap().clone()
    }

    pub async fn wait_requests(&self, n: usize) {
        loop {
            let notified = self.state.arrived.notified();
            if self.state.requests.lock().unwrap().len() >= n {
                return;
            }
            notified.await;
        }
    }

    /// A model on this provider: no retries, no output limit, the given context window.
    pub fn model(&self, context_window: Option<u64>) -> ResolvedModel {
        let mut cfg = ProviderConfig::new(Api::OpenaiCompletions, format!("http://{}/v1", self.addr));
        cfg.api_key = Some("sk-test".into());
        let mut m = pincer_agent::ModelConfig::named("summarizer");
        m.context_window = context_window;
        cfg.models = vec![m];
        cfg.max_retries = Some(0);
        cfg.first_byte_timeout_ms = Some(60_000);
        cfg.idle_timeout_ms = Some(60_000);
        let providers = Providers::new(BTreeMap::from([("fake".to_owned(), cfg)])).unwrap();
        providers.resolve("fake/summarizer").unwrap()
    }
}

async fn read_request(sock: &mut TcpStream) -> Option<Vec<u8>> {
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
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "content-length")
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some(body)
}

fn chunk(delta: Value, finish: Value) -> String {
    let data = json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"summarizer",
        "choices":[{"index":0,"delta":delta,"logprobs":null,"finish_reason":finish}]});
    format!("data: {data}\n\n")
}

/// The SSE events of a reply whose text is `text` (sent in two pieces).
pub fn text_events(text: &str) -> Vec<String> {
    let cut = text.char_indices().nth(text.chars().count() / 2).map(|(i, _)| i).unwrap_or(0);
    let mut out = vec![chunk(json!({"role":"assistant","content":""}), Value::Null)];
    for piece in [&text[..cut], &text[cut..]] {
        if !piece.is_empty() {
            out.push(chunk(json!({"content": piece}), Value::Null));
        }
    }
    out.push(chunk(json!({}), json!("stop")));
    let usage = json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"summarizer",
        "choices":[],"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150}});
    out.push(format!("data: {usage}\n\n"));
    out.push("data: [DONE]\n\n".to_owned());
    out
}

async fn serve(mut sock: TcpStream, st: Arc<State>) -> std::io::Result<()> {
    let Some(body) = read_request(&mut sock).await else { return Ok(()) };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let index = {
        let mut reqs = st.requests.lock().unwrap();
        reqs.push(body.clone());
        reqs.len() - 1
    };
    st.arrived.notify_waiters();
    let reply = (st.script.lock().unwrap())(&body, index);
    match reply {
        Reply::NoResponse => {
            let mut tmp = [0u8; 1024];
            while sock.read(&mut tmp).await? > 0 {}
            Ok(())
        }
        Reply::Status(status, message) => {
            let body =
                json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}}).to_string();
            let head = format!(
                "HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await?;
            sock.write_all(body.as_bytes()).await?;
            sock.shutdown().await
        }
        Reply::Text(text) => {
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n",
            );
            for ev in text_events(&text) {
                out.push_str(&format!("{:x}\r\n{ev}\r\n", ev.len()));
            }
            out.push_str("0\r\n\r\n");
            sock.write_all(out.as_bytes()).await?;
            sock.shutdown().await
        }
    }
}

/// The user text of a recorded chat-completions request (its last message).
pub fn prompt_text(body: &Value) -> String {
    let msgs = body["messages"].as_array().unwrap();
    msgs.last().unwrap()["content"].as_str().unwrap().to_owned()
}

/// The system prompt of a recorded request.
pub fn system_text(body: &Value) -> String {
    body["messages"][0]["content"].as_str().unwrap().to_owned()
}

/// A value as JavaScript holds it (`1.0` is 1, array-index keys first), to compare with node output.
pub fn js_normal(v: &Value) -> Value {
    serde_json::from_str(&pincer_pi::js::stringify(v)).unwrap()
}

/// The context messages Pincer builds for `file` at its leaf.
pub fn pincer_context(file: &Path) -> Vec<Value> {
    let s = pincer_store::Session::parse(std::fs::read(file).unwrap());
    pincer_store::build_context(&s, &s.leaf).message_values()
}

/// The context messages the real Pi library builds for `file` at its leaf.
pub fn pi_context(file: &Path) -> Vec<Value> {
    let out = pincer_testkit::oracle_context(file, None);
    out["context"]["messages"].as_array().unwrap_or_else(|| panic!("oracle failed: {out}")).clone()
}
