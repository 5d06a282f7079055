//! What `openai_clients.rs` and `openai_clients_external.rs` share: a gateway with the endpoint,
//! Open WebUI's request shapes, posting, and reading transcripts.

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{GatewayProcess, TOKEN};
use pincer_testkit::probe::{session_index, sessions_dir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub async fn start(state: &Path, fake: &FakeOpenAi) -> GatewayProcess {
    let (state, config) =
        (state.to_path_buf(), format!("{}[gateway.openai_api]\nenabled = true\n", fake.gateway_toml()));
    tokio::task::spawn_blocking(move || GatewayProcess::start(BIN, &state, &config)).await.expect("start")
}

pub fn reply(said: &str) -> String {
    format!("Fake reply: you said \"{said}\"")
}

/// `POST /v1/chat/completions`: status, body (JSON, or the SSE text), and the session header.
pub async fn post(addr: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String, Option<String>) {
    pincer_agent::install_crypto_provider();
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let session = resp.headers().get("x-pincer-session-key").map(|v| v.to_str().expect("ascii").to_owned());
    (status, resp.text().await.expect("body"), session)
}

/// A streamed answer put together as an OpenAI client does: (text, tool calls, finish reason).
pub fn assemble(sse: &str) -> (String, Vec<Value>, String) {
    let data: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{sse}");
    let (mut content, mut calls, mut finish) = (String::new(), Vec::<Value>::new(), String::new());
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).expect("chunk");
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        let choice = &c["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().expect("index") as usize;
            if calls.len() <= i {
                calls.push(json!({"id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}));
            }
            let args = format!(
                "{}{}",
                calls[i]["function"]["arguments"].as_str().unwrap_or_default(),
                call["function"]["arguments"].as_str().unwrap_or_default()
            );
            calls[i]["function"]["arguments"] = json!(args);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (content, calls, finish)
}

pub fn transcript(state: &Path, key: &str) -> PathBuf {
    let index = session_index(state, "main");
    sessions_dir(state, "main").join(format!("{}.jsonl", index[key]["sessionId"].as_str().expect("session id")))
}

pub fn messages(rows: &[Value]) -> Vec<&Value> {
    rows.iter().filter(|e| e["type"] == "message").collect()
}

/// The message rows of a file are chained: each the child of the one before it (a session's
/// system prompt change, an entry of its own, may come between).
pub fn assert_chained(rows: &[Value]) {
    let by_id = |id: &Value| rows.iter().find(|e| e["id"] == *id);
    let between = |e: &&Value| e["type"] == "custom" && e["customType"] == "pincer.system-prompt";
    for pair in messages(rows).windows(2) {
        let mut parent = &pair[1]["parentId"];
        while let Some(p) = by_id(parent).filter(|_| *parent != pair[0]["id"]).filter(between) {
            parent = &p["parentId"];
        }
        assert_eq!(*parent, pair[0]["id"], "chained: {}", pair[1]);
    }
}

/// A representative subset of the built-in tools Open WebUI 0.12.4 offers with every chat turn in
/// native function calling (`open_webui/tools/builtin.py`, specs as `utils/tools.py` makes them from
/// the signatures and docstrings), as it sends them: `{"type": "function", "function": spec}`.
pub fn open_webui_tools() -> Value {
    let int = |d: &str| json!({"type": "integer", "description": d});
    json!([
        {"type": "function", "function": {"name": "get_current_timestamp",
            "description": "Get the current Unix timestamp in seconds.",
            "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "calculate_timestamp",
            "description": "Get the current Unix timestamp, optionally adjusted by days, weeks, months, or years.\nUse this to calculate timestamps for date filtering in search functions.\nExamples: \"last week\" = weeks_ago=1, \"3 days ago\" = days_ago=3, \"a year ago\" = years_ago=1",
            "parameters": {"type": "object", "properties": {
                "days_ago": int("Number of days to subtract from current time (default: 0)"),
                "weeks_ago": int("Number of weeks to subtract from current time (default: 0)"),
                "months_ago": int("Number of months to subtract from current time (default: 0)"),
                "years_ago": int("Number of years to subtract from current time (default: 0)")}}}},
        {"type": "function", "function": {"name": "search_web",
            "description": "Search the public web for information. Best for current events, external references,\nor topics not covered in internal documents.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "The search query to look up"},
                "count": int("Number of results to return (default: admin-configured value)")},
                "required": ["query"]}}},
        {"type": "function", "function": {"name": "fetch_url",
            "description": "Fetch and extract the main text content from a web page URL.",
            "parameters": {"type": "object", "properties": {
                "url": {"type": "string", "description": "The URL to fetch content from"}}, "required": ["url"]}}},
        {"type": "function", "function": {"name": "search_notes",
            "description": "Search the user's saved notes by title and content.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "The search query to find matching notes"},
                "count": int("Maximum number of results to return (default: 5)"),
                "start_timestamp": int("Only include notes updated after this Unix timestamp (seconds)"),
                "end_timestamp": int("Only include notes updated before this Unix timestamp (seconds)")},
                "required": ["query"]}}},
        {"type": "function", "function": {"name": "search_chats",
            "description": "Search the user's previous chat conversations by title and message content,\nexcluding the current chat.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "Exact phrase or descriptive keyword query to find matching previous chats"},
                "count": int("Maximum number of results to return (default: 5)")},
                "required": ["query"]}}},
    ])
}

/// An Open WebUI chat request: its system prompt, the messages, streaming with usage, its tools.
pub fn open_webui_chat(messages: &[Value]) -> Value {
    let mut all = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    all.extend(messages.iter().cloned());
    json!({"model": "pincer", "messages": all, "stream": true, "stream_options": {"include_usage": true},
        "tools": open_webui_tools()})
}

/// Sends an Open WebUI chat turn (streamed, with its tools); (reply text, session key).
pub async fn owui_turn(addr: &str, messages: &[Value], headers: &[(&str, &str)]) -> (String, String) {
    let (status, body, session) = post(addr, &open_webui_chat(messages), headers).await;
    assert_eq!(status, 200, "{body}");
    let (content, _, finish) = assemble(&body);
    assert_eq!(finish, "stop", "{body}");
    (content, session.expect("the session is named"))
}

pub fn user(said: &str) -> Value {
    json!({"role": "user", "content": said})
}

pub fn assistant(said: &str) -> Value {
    json!({"role": "assistant", "content": said})
}

/// The headers Open WebUI sends with `ENABLE_FORWARD_USER_INFO_HEADERS=true` (`utils/headers.py`):
/// the user's, and the chat id.
pub fn forwarded(chat: &str) -> [(&str, &str); 5] {
    [
        ("X-OpenWebUI-User-Name", "Ada Lovelace"),
        ("X-OpenWebUI-User-Id", "7d1c0a52-3b8e-4c1e-9a57-2f4d7c1e9b10"),
        ("X-OpenWebUI-User-Email", "ada@example.com"),
        ("X-OpenWebUI-User-Role", "admin"),
        ("X-OpenWebUI-Chat-Id", chat),
    ]
}
