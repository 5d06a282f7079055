//! A fake OpenAI-compatible provider for the gateway's tests: the one [`crate::fake_provider`] server,
//! keep-alive, with a script that answers
//! `POST /v1/chat/completions` with an SSE stream in OpenAI's exact framing (role chunk, content
//! deltas, a usage chunk, `[DONE]`). What it does is chosen by markers in the last user message:
//! `[slow]` streams 40 chunks 100 ms apart (to abort mid-stream; [`Pacing`] sets that and a pause
//! between the pieces of ordinary replies), `[slowish]` 12 chunks 50 ms apart
//! (a turn that is often caught mid-stream but ends soon), `[huge]` streams 100 MB of text in 64 KiB
//! chunks as fast as the client reads (until it hangs up), `[fail]` answers HTTP 400 (and closes the connection) with an
//! OpenAI error body, `[ratelimit]` answers 429 (`retry-after: 0`) the first time a message carries it
//! and streams the reply when it is sent again, `[tool]` asks for the `ls` tool first, `[mcp]` for server-everything's echo ([`MCP_ECHO`]), `[bash]` for
//! `bash` running [`BASH_LINES`] (five lines over two seconds) first, `[approve]` for `bash` running
//! `echo approved >> approved.log` (once per user message), `[call:a,b]` asks for the tools `a` and
//! `b` (arguments `{"query": "<tool name>"}`; a client's tools; only when the request offers tools,
//! as a real model) in one message, streamed as OpenAI streams calls (id and name first, then the
//! arguments in pieces), `[exec]` for the Codex CLI's shell
//! tool `exec_command` running [`EXEC_COMMAND`] (once per user message). A compaction request (Pi's
//! summarization prompts) gets a summary with every required section that quotes the conversation,
//! so identifiers survive. Usage reports about a token per four characters of the request, as a real
//! provider would. Every request body is recorded (unless started unrecorded).

use crate::fake_provider::{FakeProvider, Format, Framing, Options, Recorded, Reply, Step};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The MCP tool `[mcp]` asks for (arguments `{"message": "hello from MCP"}`): server-everything's
/// echo, configured as server `everything`.
pub const MCP_ECHO: &str = "mcp__everything__echo";

/// The command `[bash]` asks `bash` to run: prints `line-1` … `line-5`, 0.4 s apart.
pub const BASH_LINES: &str = "for i in 1 2 3 4 5; do echo line-$i; sleep 0.4; done";

/// The command `[exec]` asks the Codex CLI's `exec_command` tool to run: writes `codex.txt`.
pub const EXEC_COMMAND: &str = "printf 'made by codex' > codex.txt && echo wrote codex.txt";

/// How fast replies stream: the pause before the first piece (a model's time to first token), after
/// each piece of an ordinary reply, and after each of the 40 pieces of a `[slow]` one.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    pub first: Duration,
    pub word: Duration,
    pub slow: Duration,
}

impl Default for Pacing {
    /// Ordinary replies at once, `[slow]` ones 100 ms apart.
    fn default() -> Self {
        Pacing { first: Duration::ZERO, word: Duration::ZERO, slow: Duration::from_millis(100) }
    }
}

#[derive(Clone)]
pub struct FakeOpenAi {
    pub addr: std::net::SocketAddr,
    server: Arc<FakeProvider>,
    /// The pace of the replies it starts from now on ([`Self::set_pacing`]).
    pacing: Arc<std::sync::Mutex<Pacing>>,
}

impl FakeOpenAi {
    /// Starts the server on the current tokio runtime (it serves until the runtime ends).
    pub async fn start() -> FakeOpenAi {
        Self::start_with(true, Pacing::default()).await
    }

    /// Starts a server that keeps no request bodies (for load: long sessions send large ones).
    pub async fn start_unrecorded() -> FakeOpenAi {
        Self::start_with(false, Pacing::default()).await
    }

    /// Starts a server whose replies stream at this pace (the browser tests watch them arrive).
    pub async fn start_paced(pacing: Pacing) -> FakeOpenAi {
        Self::start_with(true, pacing).await
    }

    async fn start_with(record: bool, pacing: Pacing) -> FakeOpenAi {
        // Unrecorded (load): a long session's body is read only as far as the script looks.
        let read_body = if record { crate::fake_provider::read_whole_body } else { lean_body };
        let options = Options { record, keep_alive: true, read_body };
        // `[ratelimit]`: the first request with a given such message is refused with 429 (retry at once).
        let limited = std::sync::Mutex::new(std::collections::HashSet::new());
        let pacing = Arc::new(std::sync::Mutex::new(pacing));
        let current = pacing.clone();
        let script = Box::new(move |r: &Recorded, _| {
            let said = last_user_text(&r.body);
            if said.contains("[ratelimit]") && limited.lock().unwrap_or_else(|e| e.into_inner()).insert(said.clone()) {
                let err = json!({"error": {"message": "Rate limit reached (the fake's [ratelimit])",
                    "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}});
                return Some(Reply::Status {
                    status: 429,
                    headers: vec![("retry-after".into(), "0".into())],
                    body: err.to_string(),
                });
            }
            let pacing = *current.lock().unwrap_or_else(|e| e.into_inner());
            Some(answer(r, &said, pacing))
        });
        let server = FakeProvider::start_with(Format::OpenaiCompletions, options, script).await.detach();
        FakeOpenAi { addr: server.addr, server: Arc::new(server), pacing }
    }

    /// Replies started from now on stream at `pacing` (those streaming keep their pace): e.g. at
    /// once after a test's storm, once nothing can land mid-stream any more.
    pub fn set_pacing(&self, pacing: Pacing) {
        *self.pacing.lock().unwrap_or_else(|e| e.into_inner()) = pacing;
    }

    /// Starts it on a thread of its own (for tests that are not async).
    pub fn start_in_thread() -> FakeOpenAi {
        Self::start_in_thread_paced(Pacing::default())
    }

    /// [`Self::start_paced`] on a thread of its own.
    pub fn start_in_thread_paced(pacing: Pacing) -> FakeOpenAi {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let f = FakeOpenAi::start_paced(pacing).await;
                let _ = tx.send(f);
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("fake provider started")
    }

    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// The server underneath (for [`crate::wire::check_request_against_pi`]).
    pub fn provider(&self) -> &FakeProvider {
        &self.server
    }

    /// The request bodies received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.server.bodies()
    }

    /// The `usage` objects of the streams answered so far, in the order of [`FakeOpenAi::requests`]
    /// (a `[fail]` request answers with an error and has none).
    pub fn usages(&self) -> Vec<Value> {
        self.server.requests().iter().filter_map(usage_of).collect()
    }

    /// Waits until at least `n` requests have arrived.
    pub async fn wait_requests(&self, n: usize) {
        self.server.wait_requests(n).await
    }

    /// A `[models.providers.fake]` section pointing at this server.
    pub fn provider_toml(&self) -> String {
        self.provider_toml_window(32000)
    }

    /// [`FakeOpenAi::provider_toml`] with `fake/fake-model` as the agents' default model: the config
    /// most gateway tests start from (append more sections to it).
    pub fn gateway_toml(&self) -> String {
        self.gateway_toml_window(32000)
    }

    /// The same, with a given context window.
    pub fn gateway_toml_window(&self, window: u64) -> String {
        format!("{}\n[agents.defaults]\nmodel = \"fake/fake-model\"\n", self.provider_toml_window(window))
    }

    /// The provider section with a given context window.
    pub fn provider_toml_window(&self, window: u64) -> String {
        format!(
            "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
             [[models.providers.fake.models]]\nid = \"fake-model\"\ncontext_window = {window}\n",
            self.base_url()
        )
    }
}

/// The text of the last user message of a chat-completions request body.
pub fn last_user_text(body: &Value) -> String {
    let Some(m) = body["messages"].as_array().and_then(|m| m.iter().rev().find(|m| m["role"] == "user")) else {
        return String::new();
    };
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(""),
        _ => String::new(),
    }
}

/// What the script reads of a chat request, without decoding the whole conversation: the system
/// (developer) messages, the last user message and the tool results' roles. A long session's body is
/// several MB and this server shares the load command's cores with the gateway, so the messages are
/// found by a byte search when it can ([`lean_by_scan`]), else by a borrowed parse.
fn lean_body(body: &[u8]) -> Value {
    lean_by_scan(body).unwrap_or_else(|| lean_by_parse(body))
}

/// One message as the script reads it.
#[derive(serde::Deserialize)]
struct LeanMessage<'a> {
    #[serde(borrow, default)]
    role: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a serde_json::value::RawValue>,
}

/// The messages the script reads, from all of them with the index of the last user message.
fn lean_messages<'a>(
    all: impl Iterator<Item = (usize, Option<&'a str>)>,
    last_user: Option<usize>,
    content: impl Fn(usize) -> Value,
) -> Value {
    let messages: Vec<Value> = all
        .filter_map(|(i, role)| match role? {
            r @ ("system" | "developer" | "user") if r != "user" || Some(i) == last_user => {
                Some(json!({"role": r, "content": content(i)}))
            }
            "tool" => Some(json!({"role": "tool"})),
            _ => None,
        })
        .collect();
    json!({ "messages": messages })
}

fn raw_content(m: &LeanMessage<'_>) -> Value {
    m.content.and_then(|c| serde_json::from_str(c.get()).ok()).unwrap_or(Value::Null)
}

/// Decodes the `messages` array (borrowed: contents stay unparsed until needed).
fn lean_by_parse(body: &[u8]) -> Value {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        messages: Vec<LeanMessage<'a>>,
    }
    let Ok(b) = serde_json::from_slice::<Body<'_>>(body) else {
        return crate::fake_provider::read_whole_body(body);
    };
    let last_user = b.messages.iter().rposition(|m| m.role.as_deref() == Some("user"));
    lean_messages(b.messages.iter().map(|m| m.role.as_deref()).enumerate(), last_user, |i| raw_content(&b.messages[i]))
}

/// The gateway writes compact JSON with `role` first in every message, and `{"role":"` cannot occur
/// inside a JSON string (its quotes would be escaped), so each match of it starts a message: only
/// the messages the script reads are decoded. `None` when no message starts so (another layout).
fn lean_by_scan(body: &[u8]) -> Option<Value> {
    const AT: &[u8] = b"{\"role\":\"";
    let starts: Vec<usize> = memchr::memmem::find_iter(body, AT).collect();
    let role_at = |p: usize| {
        let rest = &body[p + AT.len()..];
        std::str::from_utf8(&rest[..memchr::memchr(b'"', rest)?]).ok()
    };
    let roles: Vec<Option<&str>> = starts.iter().map(|&p| role_at(p)).collect();
    // Every `"role":` key must be one of those starts (a message with another key first is not).
    let keys = memchr::memmem::find_iter(body, b"\"role\":").count();
    if roles.is_empty() || roles.contains(&None) || keys != starts.len() {
        return None;
    }
    let last_user = roles.iter().rposition(|r| *r == Some("user"));
    let content = |i: usize| {
        let mut one = serde_json::Deserializer::from_slice(&body[starts[i]..]).into_iter::<LeanMessage<'_>>();
        one.next().and_then(Result::ok).map(|m| raw_content(&m)).unwrap_or(Value::Null)
    };
    Some(lean_messages(roles.iter().copied().enumerate(), last_user, content))
}

/// A compaction's summary for the last user message of Pi's summarization request (`said`): every
/// section Pi's quality guard requires, quoting the conversation and the previous summary, as a
/// real model keeps what they say.
pub fn summary(said: &str) -> String {
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
    if said.contains("## Original Request") && !said.contains("## Goal") {
        format!(
            "## Original Request\n{conversation}\n\n## Early Progress\n- started\n\n## Context for Suffix\n- continue"
        )
    } else {
        format!(
            "## Goal\nSummary of the conversation.\n\n## Constraints & Preferences\n- none\n\n## Progress\n### Done\n- [x] talked\n\n\
             ### In Progress\n- [ ] more\n\n### Blocked\n- nothing\n\n## Key Decisions\n- **keep going**: asked to\n\n\
             ## Next Steps\n1. answer the next message\n\n## Critical Context\n{conversation}"
        )
    }
}

/// Whether the request is a compaction's (Pi's summarization system prompt).
pub fn is_summarization(body: &Value) -> bool {
    body["messages"].as_array().is_some_and(|m| {
        m.iter().any(|m| {
            matches!(m["role"].as_str(), Some("system" | "developer"))
                && m["content"].as_str().is_some_and(|c| c.contains("context summarization assistant"))
        })
    })
}

fn chunk(delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// The usage a streamed answer reports: about a token per four bytes of the request, as a real
/// provider would; `None` for a request answered with an error.
fn usage_of(req: &Recorded) -> Option<Value> {
    usage_for(req, &last_user_text(&req.body))
}

/// [`usage_of`] when the last user message is already known.
fn usage_for(req: &Recorded, said: &str) -> Option<Value> {
    let prompt_tokens = req.body_len / 4;
    (!said.contains("[fail]"))
        .then(|| json!({"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7}))
}

/// Whether the request has a tool result after its last user message (the call was made).
fn answered_since_user(body: &Value) -> bool {
    let messages = body["messages"].as_array().map_or(&[][..], Vec::as_slice);
    messages.iter().rev().take_while(|m| m["role"] != "user").any(|m| m["role"] == "tool")
}

/// The reply to one request, chosen by the markers of its last user message.
fn answer(req: &Recorded, said: &str, pacing: Pacing) -> Reply {
    let body = &req.body;
    if said.contains("[fail]") {
        let err = json!({"error": {"message": "The fake provider was told to fail", "type": "invalid_request_error", "code": null}});
        return Reply::Status { status: 400, headers: vec![], body: err.to_string() };
    }
    let mut steps = Vec::new();
    if !pacing.first.is_zero() {
        steps.push(Step::Pause(pacing.first));
    }
    steps.push(Step::Send(chunk(json!({"role": "assistant", "content": ""}), Value::Null)));
    let has_tool_result = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
    let tool = if said.contains("[tool]") {
        Some(("ls", json!({})))
    } else if said.contains("[bash]") {
        Some(("bash", json!({"command": BASH_LINES})))
    } else if said.contains("[mcp]") {
        Some((MCP_ECHO, json!({"message": "hello from MCP"})))
    } else {
        None
    };
    let asked = said.split_once("[call:").and_then(|(_, rest)| rest.split_once(']')).map(|(names, _)| names);
    // As a real model, it calls only when the request offers tools (a background request, such as
    // Open WebUI's follow-up prompt quoting a `[call:…]` message, offers none).
    let offers_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    if let Some(names) = asked.filter(|_| !has_tool_result && offers_tools) {
        for (i, name) in names.split(',').map(str::trim).enumerate() {
            let args = json!({"query": name}).to_string();
            let (head, tail) = args.split_at(args.len() / 2);
            let open = json!({"tool_calls": [{"index": i, "id": format!("call_{name}"), "type": "function",
                "function": {"name": name, "arguments": head}}]});
            steps.push(Step::Send(chunk(open, Value::Null)));
            let more = json!({"tool_calls": [{"index": i, "function": {"arguments": tail}}]});
            steps.push(Step::Send(chunk(more, Value::Null)));
        }
        steps.push(Step::Send(chunk(json!({}), json!("tool_calls"))));
    } else if let Some((name, args)) = tool.filter(|_| !has_tool_result) {
        let call = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]});
        steps.push(Step::Send(chunk(call, Value::Null)));
        steps.push(Step::Send(chunk(json!({}), json!("tool_calls"))));
    } else if said.contains("[exec]") && !answered_since_user(body) {
        let args = json!({"cmd": EXEC_COMMAND}).to_string();
        let call = json!({"tool_calls": [{"index": 0, "id": "call_exec", "type": "function",
            "function": {"name": "exec_command", "arguments": args}}]});
        steps.push(Step::Send(chunk(call, Value::Null)));
        steps.push(Step::Send(chunk(json!({}), json!("tool_calls"))));
    } else if said.contains("[approve]") && !answered_since_user(body) {
        let args = json!({"command": "echo approved >> approved.log"}).to_string();
        let call = json!({"tool_calls": [{"index": 0, "id": "call_b", "type": "function",
            "function": {"name": "bash", "arguments": args}}]});
        steps.push(Step::Send(chunk(call, Value::Null)));
        steps.push(Step::Send(chunk(json!({}), json!("tool_calls"))));
    } else if is_summarization(body) {
        steps.push(Step::Send(chunk(json!({"content": summary(said)}), Value::Null)));
        steps.push(Step::Send(chunk(json!({}), json!("stop"))));
    } else if said.contains("[huge]") {
        let piece = "x".repeat(64 * 1024);
        steps.push(Step::Repeat(chunk(json!({"content": piece}), Value::Null), 100_000_000 / piece.len()));
        steps.push(Step::Send(chunk(json!({}), json!("stop"))));
    } else {
        let reply = format!("Fake reply: you said \"{said}\"");
        let (slow, gap) = if said.contains("[slow]") {
            (Some(40), pacing.slow)
        } else if said.contains("[slowish]") {
            (Some(12), Duration::from_millis(50))
        } else {
            (None, pacing.word)
        };
        let pieces: Vec<String> = if let Some(n) = slow {
            (0..n).map(|i| format!("word{i} ")).collect()
        } else {
            reply.split_inclusive(' ').map(str::to_owned).collect()
        };
        for p in pieces {
            steps.push(Step::Send(chunk(json!({"content": p}), Value::Null)));
            if !gap.is_zero() {
                steps.push(Step::Pause(gap));
            }
        }
        steps.push(Step::Send(chunk(json!({}), json!("stop"))));
    }
    let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
        "choices": [], "usage": usage_for(req, said)});
    steps.push(Step::Send(format!("data: {usage}\n\ndata: [DONE]\n\n")));
    Reply::Stream(steps, Framing::Chunked)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte search reads what the parse reads, or declines.
    #[test]
    fn the_scan_reads_a_body_as_the_parse_does() {
        let tricky = r#"say {"role":"user","content":"x"} and "role": twice"#;
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are a context summarization assistant."},
                {"role": "user", "content": tricky},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"role\":\"user\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"role\": 1}"},
                {"role": "user", "content": [{"type": "text", "text": "last "}, {"type": "text", "text": tricky}]},
                {"role": "assistant", "content": "after"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        let scanned = lean_by_scan(&bytes).expect("the gateway's layout is scanned");
        assert_eq!(scanned, lean_by_parse(&bytes));
        assert_eq!(scanned["messages"].as_array().unwrap().len(), 3, "{scanned}");
        assert_eq!(last_user_text(&scanned), format!("last {tricky}"));
        assert!(is_summarization(&scanned));

        // A message whose first key is not `role` is not found by the search: it declines.
        let other = json!({"messages": [{"role": "user", "content": "a"}, {"content": "b", "role": "user"}]});
        let bytes = serde_json::to_vec(&other).unwrap();
        assert_eq!(lean_by_scan(&bytes), None);
        assert_eq!(last_user_text(&lean_body(&bytes)), "b");
    }
}
