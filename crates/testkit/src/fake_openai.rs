//! A fake OpenAI-compatible provider: a real HTTP server on 127.0.0.1:0 that answers
//! `POST /v1/chat/completions` with an SSE stream in OpenAI's exact framing (role chunk, content
//! deltas, a usage chunk, `[DONE]`). What it does is chosen by markers in the last user message:
//! `[slow]` streams 40 chunks 100 ms apart (to abort mid-stream), `[fail]` answers HTTP 400 with an
//! OpenAI error body, `[tool]` asks for the `current_time` tool first. Every request body is recorded.

use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone)]
pub struct FakeOpenAi {
    pub addr: std::net::SocketAddr,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl FakeOpenAi {
    /// Starts the server on the current tokio runtime.
    pub async fn start() -> FakeOpenAi {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake provider");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let rec = requests.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let rec = rec.clone();
                tokio::spawn(async move {
                    let _ = handle(sock, rec).await;
                });
            }
        });
        FakeOpenAi { addr, requests }
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

    /// A `[models.providers.fake]` section pointing at this server.
    pub fn provider_toml(&self) -> String {
        format!(
            "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
             [[models.providers.fake.models]]\nid = \"fake-model\"\ncontext_window = 32000\n",
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

async fn handle(mut sock: TcpStream, rec: Arc<Mutex<Vec<Value>>>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let header_end = loop {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    while buf.len() < header_end + len {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body: Value = serde_json::from_slice(&buf[header_end..]).unwrap_or(Value::Null);
    if let Ok(mut r) = rec.lock() {
        r.push(body.clone());
    }
    let said = last_user_text(&body);
    if said.contains("[fail]") {
        let err = json!({"error": {"message": "The fake provider was told to fail", "type": "invalid_request_error", "code": null}});
        let text = err.to_string();
        let resp = format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        );
        return sock.write_all(resp.as_bytes()).await;
    }
    sock.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n",
    )
    .await?;
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
    } else {
        let reply = format!("Fake reply: you said \"{said}\"");
        let slow = said.contains("[slow]");
        let pieces: Vec<String> = if slow {
            (0..40).map(|i| format!("word{i} ")).collect()
        } else {
            reply.split_inclusive(' ').map(str::to_owned).collect()
        };
        for p in pieces {
            sock.write_all(chunk(json!({"content": p}), Value::Null).as_bytes()).await?;
            if slow {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        sock.write_all(chunk(json!({}), json!("stop")).as_bytes()).await?;
    }
    let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
        "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}});
    sock.write_all(format!("data: {usage}\n\ndata: [DONE]\n\n").as_bytes()).await?;
    sock.shutdown().await
}
