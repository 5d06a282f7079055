//! Test support: the compaction tests' view of the fake model provider
//! ([`pincer_testkit::fake_provider`], OpenAI chat completions): each request is answered through a
//! script (a canned summary stream, an error status, or no answer at all) and recorded; plus
//! transcript helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use pincer_agent::{Api, ProviderConfig, Providers, ResolvedModel};
use pincer_testkit::fake_provider::{self as fake, Format, Options};
use serde_json::{json, Value};

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

fn server_script(script: Script) -> fake::Script {
    Box::new(move |req, index| {
        Some(match script(&req.body, index) {
            Reply::Text(text) => fake::Reply::stream(text_events(&text)),
            Reply::Status(status, message) => fake::Reply::status(Format::OpenaiCompletions, status, &message),
            Reply::NoResponse => fake::Reply::NoResponse,
        })
    })
}

pub struct FakeProvider(fake::FakeProvider);

impl FakeProvider {
    pub async fn start(script: Script) -> FakeProvider {
        FakeProvider(
            fake::FakeProvider::start_with(Format::OpenaiCompletions, Options::default(), server_script(script)).await,
        )
    }

    /// Replaces the script (for a later compaction in the same test).
    pub fn set_script(&self, script: Script) {
        self.0.set_script(server_script(script));
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.0.bodies()
    }

    pub async fn wait_requests(&self, n: usize) {
        self.0.wait_requests(n).await
    }

    /// A model on this provider: no retries, no output limit, the given context window.
    pub fn model(&self, context_window: Option<u64>) -> ResolvedModel {
        let mut cfg = ProviderConfig::new(Api::OpenaiCompletions, self.0.base_url());
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
