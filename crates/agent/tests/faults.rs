//! Runs against the fake provider of each wire format: a normal stream, and every fault
//! (429/5xx with retries, retry-after too long, context length, cut streams, invalid JSON,
//! first-byte and idle timeouts, refused connections, missing terminal event, a reply over
//! `max_reply_bytes`, nonsense `retry-after` values), checking the events and the persisted
//! transcript as whole values.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use support::*;

per_format!(
    text_and_thinking_stream,
    length_stop,
    retries_429_then_succeeds,
    gives_up_after_retries_on_5xx,
    retry_after_longer_than_allowed,
    context_length_error,
    no_retry_once_output_streamed,
    invalid_json_event,
    cut_mid_event_on_clean_eof,
    ends_without_terminal_event,
    idle_timeout,
    first_byte_timeout_no_headers,
    first_byte_timeout_no_body,
    connection_refused,
    reply_over_max_reply_bytes_is_cut,
    many_small_deltas_add_up_to_the_text,
    retry_after_ms_inf_is_ignored,
);

fn prefix(f: Format) -> String {
    format!("provider {} ({}, model {}): ", f.name(), f.api().as_str(), f.model_id())
}

fn zero_usage() -> Value {
    pincer_agent::message::Usage::default().to_pi(None)
}

/// The error assistant message a run persists (normalized).
fn error_message(f: Format, content: Value, usage: Value, response_id: bool, message: &str) -> Value {
    let mut m =
        json!({"role":"assistant","content":content,"api":f.api().as_str(),"provider":f.name(),"model":f.model_id()});
    if response_id {
        m["responseId"] = json!(f.response_id());
    }
    m["usage"] = usage;
    m["stopReason"] = json!("error");
    m["timestamp"] = json!(0);
    m["errorMessage"] = json!(message);
    m
}

/// Usage known when a stream fails after its first events (Anthropic reports input in message_start).
fn partial_usage(f: Format, t: &Turn) -> Value {
    match f {
        Format::Anthropic => json!({"input":t.usage.0,"output":1,"cacheRead":t.usage.2,"cacheWrite":0,
            "totalTokens":t.usage.0+1+t.usage.2,"cost":{"input":t.usage.0 as f64 * 3.0 / 1e6,"output":0.000015,
            "cacheRead":t.usage.2 as f64 * 0.3 / 1e6,"cacheWrite":0,"total":t.usage.0 as f64 * 3.0 / 1e6 + 0.000015 + t.usage.2 as f64 * 0.3 / 1e6}}),
        Format::OpenaiCompletions | Format::OpenaiResponses => zero_usage(),
    }
}

fn error_events(entry_msg: &Value, message: &str, kind: &str) -> Vec<Value> {
    let entry = json!({"type":"message","id":"<id>","parentId":null,"timestamp":"<ts>","message":entry_msg});
    vec![json!({"persisted": entry}), json!({"error": {"entry": entry, "message": message, "kind": kind}})]
}

fn hello() -> Turn {
    turn(vec![text(&["Hel", "lo", " world"])], (10, 5, 2))
}

async fn text_and_thinking_stream(f: Format) {
    let fake = FakeProvider::start(f).await;
    let t = turn(vec![thinking(&["Let me ", "think."], "sig-abc"), text(&["Hel", "lo"])], (100, 20, 30));
    fake.push(Reply::stream(script(f, &t)));
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let expected = expected_assistant(f, &t);
    let entry = json!({"type":"message","id":"<id>","parentId":null,"timestamp":"<ts>","message":expected.clone()});
    assert_eq!(
        events,
        vec![
            json!({"thinkingDelta":"Let me ","thinking":"Let me "}),
            json!({"thinkingDelta":"think.","thinking":"Let me think."}),
            json!({"textDelta":"Hel","text":"Hel"}),
            json!({"textDelta":"lo","text":"Hello"}),
            json!({"usage": expected["usage"]}),
            json!({"persisted": entry}),
            json!({"final": entry}),
        ]
    );
    assert_eq!(messages, vec![expected.clone()]);
    assert_eq!(
        expected["usage"],
        json!({"input":100,"output":20,"cacheRead":30,"cacheWrite":0,"totalTokens":150,
               "cost":{"input":0.0003,"output":0.0003,"cacheRead":0.000009,"cacheWrite":0,"total":0.000609}})
    );
    let req = &fake.requests()[0];
    let auth = match f {
        Format::Anthropic => (req.headers.get("x-api-key").cloned(), req.headers.get("anthropic-version").cloned()),
        _ => (req.headers.get("authorization").cloned(), None),
    };
    let expected_auth = match f {
        Format::Anthropic => (Some("sk-test-key".to_owned()), Some("2023-06-01".to_owned())),
        _ => (Some("Bearer sk-test-key".to_owned()), None),
    };
    assert_eq!(
        (req.path.as_str(), auth, req.headers.get("x-pincer-test").cloned()),
        (f.path(), expected_auth, Some("1".into()))
    );
}

async fn length_stop(f: Format) {
    let fake = FakeProvider::start(f).await;
    let mut t = hello();
    t.end = End::Length;
    fake.push(Reply::stream(script(f, &t)));
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let expected = expected_assistant(f, &t);
    assert_eq!(expected["stopReason"], "length");
    assert_eq!(messages, vec![expected.clone()]);
    assert_eq!(events.last().unwrap()["final"]["message"], expected);
}

async fn retries_429_then_succeeds(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::Status {
        status: 429,
        headers: vec![("retry-after".into(), "0".into())],
        body: f.error_body(429, "Rate limit reached"),
    });
    fake.push(Reply::Status { status: 503, headers: vec![], body: f.error_body(503, "busy") });
    fake.push(Reply::stream(script(f, &hello())));
    let (events, messages) = simple_run(&fake, fake.model()).await;
    assert_eq!(messages, vec![expected_assistant(f, &hello())]);
    assert_eq!(events.last().unwrap()["final"]["message"], expected_assistant(f, &hello()));
    // Each retry is told before its wait: the first one was rate limited, the second was not.
    assert_eq!(
        events[..2],
        [
            json!({"retrying": {"attempt": 1, "maxRetries": 2, "rateLimited": true}}),
            json!({"retrying": {"attempt": 2, "maxRetries": 2, "rateLimited": false}})
        ]
    );
    let bodies = fake.bodies();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|b| *b == bodies[0]), "every retry sends the same body");
}

async fn gives_up_after_retries_on_5xx(f: Format) {
    let fake = FakeProvider::start(f).await;
    for _ in 0..3 {
        fake.push(Reply::Status { status: 503, headers: vec![], body: f.error_body(503, "The server is overloaded") });
    }
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let message = format!("{}HTTP 503 Service Unavailable: The server is overloaded (after 3 attempts)", prefix(f));
    let msg = error_message(f, json!([]), zero_usage(), false, &message);
    let retries = (1..=2).map(|n| json!({"retrying": {"attempt": n, "maxRetries": 2, "rateLimited": false}}));
    assert_eq!(events, retries.chain(error_events(&msg, &message, "unknown")).collect::<Vec<_>>());
    assert_eq!(messages, vec![msg]);
    assert_eq!(fake.requests().len(), 3);
}

async fn retry_after_longer_than_allowed(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::Status {
        status: 429,
        headers: vec![("retry-after".into(), "3600".into())],
        body: f.error_body(429, "Rate limit reached for requests"),
    });
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let message = format!(
        "{}HTTP 429 Too Many Requests: Rate limit reached for requests; the server asks to wait 3600.0s, longer than retry_max_delay_ms (60.0s)",
        prefix(f)
    );
    let msg = error_message(f, json!([]), zero_usage(), false, &message);
    assert_eq!(events, error_events(&msg, &message, "rate_limit"));
    assert_eq!(messages, vec![msg]);
    assert_eq!(fake.requests().len(), 1);
}

async fn context_length_error(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::Status { status: 400, headers: vec![], body: f.context_length_body() });
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let detail = match f {
        Format::Anthropic => "prompt is too long: 208310 tokens > 200000 maximum",
        _ => "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
    };
    let message = format!("{}HTTP 400 Bad Request: {detail}", prefix(f));
    let msg = error_message(f, json!([]), zero_usage(), false, &message);
    assert_eq!(events, error_events(&msg, &message, "context_length"));
    assert_eq!(messages, vec![msg]);
    assert_eq!(fake.requests().len(), 1, "a 400 is not retried");
}

/// Output streamed, then the connection is cut (chunked body never finished): an error, and
/// never a retry, with the partial text persisted in the error message.
async fn no_retry_once_output_streamed(f: Format) {
    let fake = FakeProvider::start(f).await;
    let events = script(f, &hello());
    let cut_at = split_after_first_text(f, &events);
    let mut steps: Vec<Step> = events[..cut_at].iter().cloned().map(Step::Send).collect();
    steps.push(Step::Send(events[cut_at][..events[cut_at].len() / 2].to_owned()));
    steps.push(Step::Cut);
    fake.push(Reply::Stream(steps, Framing::Chunked));
    fake.push(Reply::stream(script(f, &hello()))); // would be used by a (wrong) retry
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let err = &events.last().unwrap()["error"];
    let message = err["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{}stream cut after ", prefix(f)))
            && message.contains("before the response was complete"),
        "{message}"
    );
    let msg = error_message(f, json!([{"type":"text","text":"Hel"}]), partial_usage(f, &hello()), true, message);
    assert_eq!(events[0], json!({"textDelta":"Hel","text":"Hel"}));
    assert_eq!(events[1..], error_events(&msg, message, "unknown")[..]);
    assert_eq!(messages, vec![msg]);
    assert_eq!(fake.requests().len(), 1);
}

async fn invalid_json_event(f: Format) {
    let fake = FakeProvider::start(f).await;
    let events = script(f, &hello());
    let cut_at = split_after_first_text(f, &events);
    let mut evs: Vec<String> = events[..cut_at].to_vec();
    evs.push("data: {\"type\": oops}\n\n".to_owned());
    evs.extend(events[cut_at..].iter().cloned());
    fake.push(Reply::stream(evs));
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let message =
        format!("{}invalid JSON in stream event (expected value at line 1 column 10): {{\"type\": oops}}", prefix(f));
    let msg = error_message(f, json!([{"type":"text","text":"Hel"}]), partial_usage(f, &hello()), true, &message);
    let mut expected = vec![json!({"textDelta":"Hel","text":"Hel"})];
    expected.extend(error_events(&msg, &message, "unknown"));
    assert_eq!(events, expected);
    assert_eq!(messages, vec![msg]);
}

/// A close-delimited body ending inside an event: the HTTP layer sees a clean EOF, the SSE
/// parser sees the unfinished event.
async fn cut_mid_event_on_clean_eof(f: Format) {
    let fake = FakeProvider::start(f).await;
    let events = script(f, &hello());
    let cut_at = split_after_first_text(f, &events);
    let mut steps: Vec<Step> = events[..cut_at].iter().cloned().map(Step::Send).collect();
    steps.push(Step::Send("data: {\"partial\":".to_owned()));
    fake.push(Reply::Stream(steps, Framing::CloseDelimited));
    let (events, messages) = simple_run(&fake, fake.model()).await;
    let sent: usize =
        script(f, &hello())[..cut_at].iter().map(String::len).sum::<usize>() + "data: {\"partial\":".len();
    let message = format!("{}stream cut mid-event after {sent} bytes (connection closed)", prefix(f));
    let msg = error_message(f, json!([{"type":"text","text":"Hel"}]), partial_usage(f, &hello()), true, &message);
    let mut expected = vec![json!({"textDelta":"Hel","text":"Hel"})];
    expected.extend(error_events(&msg, &message, "unknown"));
    assert_eq!(events, expected);
    assert_eq!(messages, vec![msg]);
}

/// Every event complete, but the terminal one never comes.
async fn ends_without_terminal_event(f: Format) {
    let fake = FakeProvider::start(f).await;
    let events = script(f, &hello());
    let cut_at = split_after_first_text(f, &events);
    fake.push(Reply::stream(events[..cut_at].to_vec()));
    let (events, _) = simple_run(&fake, fake.model()).await;
    let detail = match f {
        Format::OpenaiCompletions => "stream ended before the response was complete (no finish_reason and no [DONE])",
        Format::OpenaiResponses => "stream ended before the response was complete (no response.completed)",
        Format::Anthropic => "stream ended before the response was complete (no message_stop)",
    };
    assert_eq!(events.last().unwrap()["error"]["message"], format!("{}{detail}", prefix(f)));
}

async fn idle_timeout(f: Format) {
    let fake = FakeProvider::start(f).await;
    let events = script(f, &hello());
    let cut_at = split_after_first_text(f, &events);
    let mut steps: Vec<Step> = events[..cut_at].iter().cloned().map(Step::Send).collect();
    steps.push(Step::Stall);
    fake.push(Reply::Stream(steps, Framing::Chunked));
    let model = fake.model_with(&Knobs { idle_ms: 200, ..Knobs::default() });
    let (events, messages) = simple_run(&fake, model).await;
    let err = &events.last().unwrap()["error"];
    let message = err["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{}stream stalled: nothing received for 0.2s (idle timeout) after ", prefix(f))),
        "{message}"
    );
    assert_eq!(err["kind"], "timeout");
    assert_eq!(
        messages,
        vec![error_message(f, json!([{"type":"text","text":"Hel"}]), partial_usage(f, &hello()), true, message)]
    );
}

async fn first_byte_timeout_no_headers(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::NoResponse);
    let model = fake.model_with(&Knobs { first_byte_ms: 200, ..Knobs::default() });
    let (events, messages) = simple_run(&fake, model).await;
    let message =
        format!("{}no response from http://{}{} within 0.2s (first-byte timeout)", prefix(f), fake.addr, f.path());
    let msg = error_message(f, json!([]), zero_usage(), false, &message);
    assert_eq!(events, error_events(&msg, &message, "timeout"));
    assert_eq!(messages, vec![msg]);
}

async fn first_byte_timeout_no_body(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::Stream(vec![Step::Stall], Framing::Chunked));
    let model = fake.model_with(&Knobs { first_byte_ms: 200, ..Knobs::default() });
    let (events, _) = simple_run(&fake, model).await;
    assert_eq!(
        events.last().unwrap()["error"],
        json!({"entry": events[0]["persisted"], "kind": "timeout",
               "message": format!("{}timed out after 0.2s waiting for the first byte of the stream", prefix(f))})
    );
}

async fn connection_refused(f: Format) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let base = match f {
        Format::Anthropic => format!("http://{addr}"),
        _ => format!("http://{addr}/v1"),
    };
    let model = model_at(f, &base, &Knobs { max_retries: 1, ..Knobs::default() });
    let sink = std::sync::Arc::new(pincer_agent::MemorySink::new());
    let rx = pincer_agent::start_run(run_request(
        model,
        vec![user("hi")],
        pincer_agent::ToolRegistry::new(),
        sink.clone(),
        Default::default(),
    ));
    let events = events_json(&collect(rx).await);
    let message = events.last().unwrap()["error"]["message"].as_str().unwrap().to_owned();
    let url = format!("http://{addr}{}", f.path());
    assert!(message.starts_with(&format!("{}cannot connect to {url}: ", prefix(f))), "{message}");
    assert!(message.ends_with("(after 2 attempts)"), "{message}");
    assert_eq!(chained_messages(&sink.entries()), vec![error_message(f, json!([]), zero_usage(), false, &message)]);
}

/// Runs with `max_reply_bytes = cap`; returns (events, persisted messages).
async fn capped_run(fake: &FakeProvider, cap: usize) -> (Vec<pincer_agent::RunEvent>, Vec<Value>) {
    let sink = std::sync::Arc::new(pincer_agent::MemorySink::new());
    let mut req = run_request(
        fake.model(),
        vec![user("hi")],
        pincer_agent::ToolRegistry::new(),
        sink.clone(),
        pincer_agent::CancellationToken::new(),
    );
    req.max_reply_bytes = cap;
    let events = collect(pincer_agent::start_run(req)).await;
    (events, sink.entries().into_iter().map(|e| e["message"].clone()).collect())
}

/// 8 MiB streamed against a 1 MiB cap: the run stops reading, persists the partial message as an
/// error naming the cap, and ends with `ReplyTooLarge`.
async fn reply_over_max_reply_bytes_is_cut(f: Format) {
    const CHUNK: usize = 64 * 1024;
    const CAP: usize = 1024 * 1024;
    let fake = FakeProvider::start(f).await;
    let chunk = "z".repeat(CHUNK);
    let chunks: Vec<&str> = (0..128).map(|_| chunk.as_str()).collect();
    fake.push(Reply::stream(script(f, &turn(vec![text(&chunks)], (1, 1, 0)))));
    let (events, messages) = capped_run(&fake, CAP).await;
    assert_eq!(messages.len(), 1, "only the partial assistant message is persisted");
    let m = &messages[0];
    let persisted = m["content"][0]["text"].as_str().unwrap().len();
    assert!(persisted > CAP && persisted <= CAP + CHUNK, "persisted {persisted} bytes of text");
    assert_eq!(m["stopReason"], "error");
    let expected =
        format!("provider {}: reply exceeded the 1048576-byte limit (max_reply_bytes); the stream was cut", f.name());
    assert_eq!(m["errorMessage"], json!(expected));
    let deltas: usize = events
        .iter()
        .map(|e| match e {
            pincer_agent::RunEvent::TextDelta { delta } => delta.len(),
            _ => 0,
        })
        .sum();
    assert!(deltas > CAP && deltas <= persisted, "{deltas} bytes streamed before the cut");
    match events.last().unwrap() {
        pincer_agent::RunEvent::Error { entry, message, kind } => {
            assert_eq!(*kind, pincer_agent::ErrorKind::ReplyTooLarge);
            assert_eq!(kind.as_str(), "reply_too_large");
            assert_eq!(message, &expected);
            assert_eq!(entry.as_ref().map(|e| &e["message"]), Some(m));
        }
        other => panic!("expected an error event, got {other:?}"),
    }
}

/// Thousands of small chunks: each delta event carries only its piece, and the pieces add up to
/// exactly the persisted text.
async fn many_small_deltas_add_up_to_the_text(f: Format) {
    let fake = FakeProvider::start(f).await;
    let pieces: Vec<String> = (0..3000).map(|i| format!("w{i} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    fake.push(Reply::stream(script(f, &turn(vec![text(&refs)], (1, 1, 0)))));
    let (events, messages) = capped_run(&fake, pincer_agent::DEFAULT_MAX_REPLY_BYTES).await;
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            pincer_agent::RunEvent::TextDelta { delta } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, refs, "one event per piece, each only the piece");
    let whole = pieces.concat();
    assert_eq!(deltas.iter().map(|d| d.len()).sum::<usize>(), whole.len());
    assert_eq!(messages[0]["content"][0]["text"], json!(whole));
    assert!(matches!(events.last(), Some(pincer_agent::RunEvent::Final { .. })));
}

/// `retry-after-ms: inf` (and friends) must not panic the run: it is ignored, the normal backoff
/// applies, and the retry succeeds.
async fn retry_after_ms_inf_is_ignored(f: Format) {
    let fake = FakeProvider::start(f).await;
    for v in ["inf", "NaN"] {
        fake.push(Reply::Status {
            status: 429,
            headers: vec![("retry-after-ms".into(), v.into())],
            body: f.error_body(429, "Rate limit reached"),
        });
    }
    fake.push(Reply::stream(script(f, &hello())));
    let knobs = Knobs { max_retries: 3, ..Knobs::default() };
    let (events, messages) = simple_run(&fake, fake.model_with(&knobs)).await;
    assert_eq!(messages, vec![expected_assistant(f, &hello())]);
    assert_eq!(events.last().unwrap()["final"]["message"], expected_assistant(f, &hello()));
    assert_eq!(fake.requests().len(), 3);
}
