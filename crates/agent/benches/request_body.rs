//! The request-body pass: building the JSON body of a model call for a long context, per API.
//! It is O(context) by nature; each message's wire form is built once (the "first" pass, as in
//! the turn after a gateway start) and then copied as bytes on every later turn (the "cached"
//! pass). Prints the median time and throughput of both for contexts of 1,000 and 10,000
//! messages (user/assistant pairs of about 500 bytes, as the gateway's `load` command writes).
//!
//! Run: `cargo bench -p pincer-agent --bench request_body`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use pincer_agent::provider::request_body;
use pincer_agent::{ContextMessage, Messages, ModelRequest};
use serde_json::json;
use support::*;

fn context(n: usize) -> Messages {
    let filler = "lorem ipsum dolor sit amet ".repeat(16);
    (0..n)
        .map(|i| {
            ContextMessage::shared(if i % 2 == 0 {
                json!({"role": "user", "content": format!("question {i}: {filler}"), "timestamp": i})
            } else {
                json!({"role": "assistant", "content": [{"type": "text", "text": format!("answer {i}: {filler}")}],
                    "api": "openai-completions", "provider": "fake", "model": "fake-model", "stopReason": "stop",
                    "usage": {"input": 10, "output": 10, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 20,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                    "timestamp": i})
            })
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    for format in ALL {
        let model = model_at(format, "http://127.0.0.1:9", &Knobs::default());
        for n in [1_000, 10_000] {
            let rounds = if n > 1_000 { 15 } else { 60 };
            let mut first = Vec::new();
            let mut cached = Vec::new();
            let mut bytes = 0;
            for _ in 0..rounds {
                let req = ModelRequest {
                    system_prompt: Some("Be brief.".into()),
                    messages: context(n),
                    tools: Vec::new().into(),
                };
                let t = Instant::now();
                let body = request_body(&model, &req).expect("an HTTP API");
                first.push(t.elapsed());
                let t = Instant::now();
                let again = request_body(&model, &req).expect("an HTTP API");
                cached.push(t.elapsed());
                assert_eq!(body, again, "the cached pass writes the same body");
                bytes = body.len();
            }
            let (f, c) = (median(first), median(cached));
            let mbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
            eprintln!(
                "request_body/{}/{n} messages: {:.2} MB body; first pass {:.2} ms ({:.0} MB/s), cached pass {:.2} ms ({:.0} MB/s)",
                format.name(),
                bytes as f64 / 1e6,
                f.as_secs_f64() * 1e3,
                mbs(f),
                c.as_secs_f64() * 1e3,
                mbs(c)
            );
        }
    }
}
