//! Request bodies of each wire format compared with snapshots (insta), for a context that
//! exercises every mapping: system prompt, string and block user content, user and tool-result
//! images, thinking with signatures, tool calls and results (error ones too), converted
//! bashExecution / compactionSummary messages, a skipped aborted turn and an orphaned call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use pincer_agent::{start_run, CancellationToken, MemorySink, ToolRegistry};
use serde_json::{json, Value};
use support::*;

fn context(f: Format) -> Vec<Value> {
    let api = f.api().as_str();
    let signature = match f {
        Format::OpenaiResponses => json!({"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"think"}],"encrypted_content":"enc=="}).to_string(),
        _ => "sig-1".to_owned(),
    };
    vec![
        json!({"role":"compactionSummary","summary":"Earlier we set up the project.","tokensBefore":1234,"timestamp":1}),
        json!({"role":"user","content":[{"type":"text","text":"What is in this picture?"},{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"}],"timestamp":2}),
        json!({"role":"assistant","content":[
            {"type":"thinking","thinking":"think","thinkingSignature":signature},
            {"type":"text","text":"Let me look closer."},
            {"type":"toolCall","id":"call_a","name":"read_file","arguments":{"path":"a.txt"}},
            {"type":"toolCall","id":"call_b","name":"current_time","arguments":{}}],
            "api":api,"provider":f.name(),"model":f.model_id(),"usage":{},"stopReason":"toolUse","timestamp":3}),
        json!({"role":"toolResult","toolCallId":"call_a","toolName":"read_file","content":[{"type":"text","text":"file body"},{"type":"image","data":"R0lGODlh","mimeType":"image/gif"}],"isError":false,"timestamp":4}),
        json!({"role":"toolResult","toolCallId":"call_b","toolName":"current_time","content":[{"type":"text","text":"clock broken"}],"isError":true,"timestamp":5}),
        json!({"role":"assistant","content":[{"type":"text","text":"It is a cat."}],"api":"anthropic-messages","provider":"other","model":"m","usage":{},"stopReason":"stop","timestamp":6}),
        json!({"role":"bashExecution","command":"ls","output":"a.txt","exitCode":0,"cancelled":false,"truncated":false,"timestamp":7}),
        json!({"role":"user","content":"Write a poem.","timestamp":8}),
        json!({"role":"assistant","content":[{"type":"text","text":"Roses are"}],"api":api,"provider":f.name(),"model":f.model_id(),"usage":{},"stopReason":"aborted","timestamp":9}),
        json!({"role":"assistant","content":[{"type":"toolCall","id":"call_orphan","name":"current_time","arguments":{}}],"api":api,"provider":f.name(),"model":f.model_id(),"usage":{},"stopReason":"toolUse","timestamp":10}),
        json!({"role":"user","content":"Try again.","timestamp":11}),
    ]
}

async fn request_body(f: Format) -> Value {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::stream(script(f, &turn(vec![text(&["ok"])], (1, 1, 0)))));
    let sink = Arc::new(MemorySink::new());
    let rx = start_run(run_request(
        fake.model(),
        context(f),
        ToolRegistry::with_builtins("."),
        sink,
        CancellationToken::new(),
    ));
    let events = collect(rx).await;
    assert!(matches!(events.last(), Some(pincer_agent::RunEvent::Final { .. })), "{events:?}");
    let sent = fake.requests().remove(0);
    // The body goes out in pieces, but with its length up front: not every server takes chunked bodies.
    assert_eq!(sent.headers.get("content-length"), Some(&sent.body_len.to_string()));
    assert!(!sent.headers.contains_key("transfer-encoding"), "{:?}", sent.headers);
    sent.body
}

#[tokio::test]
async fn openai_completions_request() {
    insta::assert_json_snapshot!(request_body(Format::OpenaiCompletions).await);
}

#[tokio::test]
async fn openai_responses_request() {
    insta::assert_json_snapshot!(request_body(Format::OpenaiResponses).await);
}

#[tokio::test]
async fn anthropic_messages_request() {
    insta::assert_json_snapshot!(request_body(Format::Anthropic).await);
}
