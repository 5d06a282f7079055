//! Test support: the agent's view of the fake model provider ([`pincer_testkit::fake_provider`],
//! re-exported here: the wire formats, scripted turns, replies and faults), plus helpers to build
//! models on it, run the agent and collect and normalize run events. Also shared by the bench and
//! the concurrency example.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use pincer_agent::{Api, ProviderConfig, Providers, ResolvedModel, RunEvent};
pub use pincer_testkit::fake_provider::*;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// The agent's [`Api`] of a wire format.
pub trait FormatApi {
    fn api(self) -> Api;
}

impl FormatApi for Format {
    fn api(self) -> Api {
        match self {
            Format::OpenaiCompletions => Api::OpenaiCompletions,
            Format::OpenaiResponses => Api::OpenaiResponses,
            Format::Anthropic => Api::AnthropicMessages,
        }
    }
}

/// Models served by a fake provider.
pub trait FakeModels {
    /// Its model, with default knobs.
    fn model(&self) -> ResolvedModel;
    /// Its model, with these knobs.
    fn model_with(&self, knobs: &Knobs) -> ResolvedModel;
}

impl FakeModels for FakeProvider {
    fn model(&self) -> ResolvedModel {
        model_at(self.format, &self.base_url(), &Knobs::default())
    }
    fn model_with(&self, knobs: &Knobs) -> ResolvedModel {
        model_at(self.format, &self.base_url(), knobs)
    }
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
            RunEvent::ToolCallUpdate { id, name, partial } => json!({"toolCallUpdate": {"id": id, "name": name, "partial": partial}}),
            RunEvent::Persisted { entry } => json!({"persisted": normalize(entry)}),
            RunEvent::Usage(u) => json!({"usage": u}),
            RunEvent::Retrying(r) => {
                json!({"retrying": {"attempt": r.attempt, "maxRetries": r.max_retries, "rateLimited": r.rate_limited}})
            }
            RunEvent::Final { entry } => json!({"final": normalize(entry)}),
            RunEvent::Error { entry, message, kind } => {
                json!({"error": {"entry": entry.as_deref().map(normalize), "message": message, "kind": kind.as_str()}})
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
        client_tools: Arc::new([]),
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

/// One test per wire format: `per_format!(name, …)` makes `name::{openai_completions,
/// openai_responses, anthropic}`, each calling `name(Format::…)`.
#[allow(unused_macros)] // not every test binary that includes this module uses it
macro_rules! per_format {
    ($($name:ident),* $(,)?) => { $(
        mod $name {
            use super::*;
            #[tokio::test]
            async fn openai_completions() { super::$name(Format::OpenaiCompletions).await }
            #[tokio::test]
            async fn openai_responses() { super::$name(Format::OpenaiResponses).await }
            #[tokio::test]
            async fn anthropic() { super::$name(Format::Anthropic).await }
        }
    )* };
}
#[allow(unused_imports)]
pub(crate) use per_format;
