//! The request-body pass: building the JSON body of a model call for a long context, per API.
//! Each message's wire form is built once (the "first" pass, from messages at hand as values; and
//! from messages read from a transcript as JSON text, as in the turn after a gateway start); a
//! context that has not sent a body yet copies the cached forms (the "cached" pass, as after a
//! branch switch or a compaction); the next turn of a context that has sent one refers to
//! the bytes it sent and writes only the new messages (the "next turn" pass). Prints the median
//! time of each, and the throughput of all but the last, for contexts of 1,000 and 10,000 messages
//! (user/assistant pairs of about 500 bytes, as the gateway's `load` command writes). The times
//! do not include joining the body into one buffer, which a request does not do either (it sends
//! the pieces as they are).
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
            let (mut first, mut from_file, mut cached, mut next) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut bytes = 0;
            for _ in 0..rounds {
                let mut req = ModelRequest {
                    system_prompt: Some("Be brief.".into()),
                    messages: context(n),
                    tools: Vec::new().into(),
                };
                let t = Instant::now();
                let body = request_body(&model, &req).expect("an HTTP API");
                first.push(t.elapsed());
                bytes = body.len();

                let read = ModelRequest {
                    messages: req
                        .messages
                        .iter()
                        .map(|m| std::sync::Arc::new(ContextMessage::from_json(m.json())))
                        .collect(),
                    ..req.clone()
                };
                let t = Instant::now();
                let from_text = request_body(&model, &read).expect("an HTTP API");
                from_file.push(t.elapsed());
                assert_eq!(body.to_bytes(), from_text.to_bytes(), "a context read from a file writes the same body");

                let anew = ModelRequest { messages: req.messages.iter().cloned().collect(), ..req.clone() };
                let t = Instant::now();
                let again = request_body(&model, &anew).expect("an HTTP API");
                cached.push(t.elapsed());
                assert_eq!(body.to_bytes(), again.to_bytes(), "the cached pass writes the same body");

                req.messages
                    .push(ContextMessage::shared(json!({"role": "user", "content": "one more", "timestamp": n})));
                let t = Instant::now();
                let turn = request_body(&model, &req).expect("an HTTP API");
                next.push(t.elapsed());
                let whole = ModelRequest { messages: req.messages.iter().cloned().collect(), ..req.clone() };
                assert_eq!(turn.to_bytes(), request_body(&model, &whole).expect("an HTTP API").to_bytes());
            }
            let (f, r, c, x) = (median(first), median(from_file), median(cached), median(next));
            let mbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "request_body/{}/{n} messages: {:.2} MB body; first pass {:.2} ms ({:.0} MB/s), read from a file {:.2} ms ({:.0} MB/s), cached pass {:.2} ms ({:.0} MB/s), next turn {:.3} ms",
                format.name(),
                bytes as f64 / 1e6,
                ms(f),
                mbs(f),
                ms(r),
                mbs(r),
                ms(c),
                mbs(c),
                ms(x)
            );
        }
    }
}
