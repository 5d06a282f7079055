//! Agent runs against each fake provider: the tool-call loop (persisted chain, tool errors as
//! `isError` results, turn limit), abort at each stage (before the first byte, mid-stream,
//! during a tool, during a retry wait), wire-format quirks of local servers, the echo model,
//! persistence failures and the per-session queue.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use pincer_agent::{
    start_run, CancellationToken, MemorySink, ResolvedModel, RunEvent, Tool, ToolOutput, ToolRegistry, ECHO_PREFIX,
};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use support::*;

per_format!(
    tool_loop_persists_in_order,
    turn_limit_ends_with_error,
    abort_before_first_byte,
    abort_mid_stream_returns_partial,
    abort_during_tool,
    abort_during_retry_wait,
    abort_after_persist_between_turns,
    client_tool_calls_end_the_run,
);

/// Deterministic test tools: `add`, `fail`, `hang` (never returns), `snap` (an image), `wait`
/// (returns once `release` has run: called in that order in one message, they finish only when the
/// calls run concurrently).
struct TestTool(&'static str, Arc<tokio::sync::Notify>);

impl Tool for TestTool {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        "test tool"
    }
    fn parameters(&self) -> Value {
        match self.0 {
            "add" => {
                json!({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]})
            }
            _ => json!({"type":"object","properties":{}}),
        }
    }
    fn call(&self, args: Value) -> pincer_agent::tools::ToolFuture<'_> {
        Box::pin(async move {
            match self.0 {
                "add" => Ok(ToolOutput::text(format!("{}", args["a"].as_f64().unwrap() + args["b"].as_f64().unwrap()))),
                "hang" => std::future::pending().await,
                "wait" => {
                    self.1.notified().await;
                    Ok(ToolOutput::text("released"))
                }
                "release" => {
                    self.1.notify_one();
                    Ok(ToolOutput::text("released the waiter"))
                }
                "snap" => Ok(ToolOutput {
                    content: vec![
                        json!({"type":"text","text":"screenshot"}),
                        json!({"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"}),
                    ],
                    details: None,
                }),
                _ => Err(pincer_agent::ToolError::failed("disk on fire")),
            }
        })
    }
}

pub fn test_tools(workspace: &std::path::Path) -> ToolRegistry {
    let mut r = ToolRegistry::with_builtins(workspace);
    let gate = Arc::new(tokio::sync::Notify::new());
    for name in ["add", "fail", "hang", "snap", "wait", "release"] {
        r.register(Arc::new(TestTool(name, gate.clone())));
    }
    r
}

fn tool_result(id: &str, name: &str, text: &str, is_error: bool) -> Value {
    json!({"role":"toolResult","toolCallId":id,"toolName":name,"content":[{"type":"text","text":text}],"isError":is_error,"timestamp":0})
}

fn entry(message: &Value, parent: bool) -> Value {
    json!({"type":"message","id":"<id>","parentId": if parent { json!("<id>") } else { Value::Null },"timestamp":"<ts>","message":message})
}

async fn tool_loop_persists_in_order(f: Format) {
    let fake = FakeProvider::start(f).await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "buy milk").unwrap();
    let t1 = turn(
        vec![
            text(&["Checking."]),
            tool_call("call_1", "read", &["{\"pa", "th\": \"notes", ".txt\"}"]),
            tool_call("call_2", "add", &["{\"a\": 2,", " \"b\": 3}"]),
            tool_call("call_3", "fail", &["{}"]),
            tool_call("call_4", "nope", &["{}"]),
            tool_call("call_5", "wait", &["{}"]),
            tool_call("call_6", "release", &["{}"]),
        ],
        (50, 30, 0),
    );
    let t2 = turn(vec![text(&["All ", "done."])], (120, 4, 40));
    fake.push(Reply::stream(script(f, &t1)));
    fake.push(Reply::stream(script(f, &t2)));
    let sink = Arc::new(MemorySink::new());
    let rx = start_run(run_request(
        fake.model(),
        vec![user("go")],
        test_tools(ws.path()),
        sink.clone(),
        CancellationToken::new(),
    ));
    // A guard against a deadlock, not a timing assertion: run one after another, `wait` never ends.
    let events = tokio::time::timeout(std::time::Duration::from_secs(60), collect(rx))
        .await
        .expect("`wait` never returned: the calls of one message did not run concurrently");
    let events = events_json(&events);

    let a1 = expected_assistant(f, &t1);
    let a2 = expected_assistant(f, &t2);
    let results = [
        tool_result("call_1", "read", "buy milk", false),
        tool_result("call_2", "add", "5", false),
        tool_result("call_3", "fail", "disk on fire", true),
        tool_result(
            "call_4",
            "nope",
            "Tool nope not found. Available tools: add, current_time, edit, fail, find, grep, hang, ls, read, release, snap, wait, write",
            true,
        ),
        tool_result("call_5", "wait", "released", false),
        tool_result("call_6", "release", "released the waiter", false),
    ];
    let mut expected_events = vec![
        json!({"textDelta":"Checking.","text":"Checking."}),
        json!({"usage": a1["usage"]}),
        json!({"persisted": entry(&a1, false)}),
    ];
    let calls = [
        ("call_1", "read", json!({"path":"notes.txt"})),
        ("call_2", "add", json!({"a":2,"b":3})),
        ("call_3", "fail", json!({})),
        ("call_4", "nope", json!({})),
        ("call_5", "wait", json!({})),
        ("call_6", "release", json!({})),
    ];
    // Every call is announced first; the results, run concurrently, are written in call order.
    for (id, name, args) in &calls {
        expected_events.push(json!({"toolCallStart":{"id":id,"name":name,"arguments":args}}));
    }
    for r in &results {
        expected_events.push(json!({"persisted": entry(r, true)}));
    }
    expected_events.extend([
        json!({"textDelta":"All ","text":"All "}),
        json!({"textDelta":"done.","text":"All done."}),
        json!({"usage": a2["usage"]}),
        json!({"persisted": entry(&a2, true)}),
        json!({"final": entry(&a2, true)}),
    ]);
    assert_eq!(events, expected_events);
    let mut expected_messages = vec![a1];
    expected_messages.extend(results);
    expected_messages.push(a2);
    assert_eq!(chained_messages(&sink.entries()), expected_messages);

    // The second call carries the whole exchange, in the wire format's own shape.
    let bodies = fake.bodies();
    assert_eq!(bodies.len(), 2);
    insta::assert_json_snapshot!(format!("tool_loop_second_request_{}", f.name()), bodies[1]);
}

async fn turn_limit_ends_with_error(f: Format) {
    let fake = FakeProvider::start(f).await;
    let t1 = turn(vec![tool_call("c1", "add", &["{\"a\":1,\"b\":1}"])], (5, 5, 0));
    fake.push(Reply::stream(script(f, &t1)));
    let sink = Arc::new(MemorySink::new());
    let mut req = run_request(
        fake.model(),
        vec![user("loop")],
        test_tools(std::path::Path::new(".")),
        sink.clone(),
        CancellationToken::new(),
    );
    req.max_turns = 1;
    let events = collect(start_run(req)).await;
    let message =
        "turn limit reached: the model asked for tools again after 1 model calls; send another message to continue";
    let limit_msg = json!({"role":"assistant","content":[],"api":f.api().as_str(),"provider":f.name(),"model":f.model_id(),
        "usage": pincer_agent::message::Usage::default().to_pi(None),"stopReason":"error","timestamp":0,"errorMessage":message});
    assert_eq!(
        chained_messages(&sink.entries()),
        vec![expected_assistant(f, &t1), tool_result("c1", "add", "2", false), limit_msg.clone()]
    );
    assert_eq!(
        events_json(&events).last().unwrap(),
        &json!({"error":{"entry":entry(&limit_msg, true),"message":message,"kind":"unknown"}})
    );
    assert_eq!(fake.requests().len(), 1);
}

/// A call of a client tool (offered beside the registry's) ends the run on the message that made it:
/// the agent's calls of the same message run and are written, the client's are not run.
async fn client_tool_calls_end_the_run(f: Format) {
    let fake = FakeProvider::start(f).await;
    let t1 = turn(
        vec![tool_call("c1", "add", &["{\"a\":1,\"b\":2}"]), tool_call("c2", "lookup", &["{\"q\":\"x\"}"])],
        (5, 5, 0),
    );
    fake.push(Reply::stream(script(f, &t1)));
    let sink = Arc::new(MemorySink::new());
    let mut req = run_request(
        fake.model(),
        vec![user("look it up")],
        test_tools(std::path::Path::new(".")),
        sink.clone(),
        CancellationToken::new(),
    );
    let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
    req.client_tools = Arc::new([pincer_agent::ToolSpec::new("lookup", "Looks a word up.", schema)]);
    let events = collect(start_run(req)).await;
    let mut asked = expected_assistant(f, &t1);
    asked[pincer_agent::CLIENT_CALLS_FIELD] = json!(["c2"]);
    assert_eq!(chained_messages(&sink.entries()), vec![asked.clone(), tool_result("c1", "add", "3", false)]);
    assert_eq!(events_json(&events).last().unwrap(), &json!({"final": entry(&asked, false)}));
    assert_eq!(fake.requests().len(), 1, "the run ended: the client runs lookup");
    let offered = fake.bodies()[0].to_string();
    assert!(offered.contains("lookup") && offered.contains("Looks a word up."), "{offered}");
}

async fn abort_before_first_byte(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::NoResponse);
    let sink = Arc::new(MemorySink::new());
    let cancel = CancellationToken::new();
    let rx = start_run(run_request(fake.model(), vec![user("hi")], ToolRegistry::new(), sink.clone(), cancel.clone()));
    fake.wait_requests(1).await;
    cancel.cancel();
    let events = collect(rx).await;
    assert_eq!(events, vec![RunEvent::Aborted { partial_text: String::new(), partial_message: None }]);
    assert_eq!(sink.entries(), Vec::<Value>::new());
}

async fn abort_mid_stream_returns_partial(f: Format) {
    let fake = FakeProvider::start(f).await;
    let control = fake.push_controlled();
    let evs = script(f, &hello_turn());
    let sink = Arc::new(MemorySink::new());
    let cancel = CancellationToken::new();
    let mut rx =
        start_run(run_request(fake.model(), vec![user("hi")], ToolRegistry::new(), sink.clone(), cancel.clone()));
    // Release the stream one event at a time until the first text arrives.
    let mut released = 0;
    let first = loop {
        control.send(Step::Send(evs[released].clone())).unwrap();
        released += 1;
        if released == split_after_first_text(f, &evs) {
            break next_event(&mut rx).await;
        }
    };
    assert_eq!(first, RunEvent::TextDelta { delta: "Hel".into() });
    control.send(Step::Send(evs[released].clone())).unwrap();
    assert_eq!(next_event(&mut rx).await, RunEvent::TextDelta { delta: "lo".into() });
    cancel.cancel();
    let rest = events_json(&collect(rx).await);
    let mut partial = expected_assistant(f, &hello_turn());
    partial["content"] = json!([{"type":"text","text":"Hello"}]);
    partial["stopReason"] = json!("aborted");
    partial["usage"] = match f {
        Format::Anthropic => json!({"input":10,"output":1,"cacheRead":2,"cacheWrite":0,"totalTokens":13,
            "cost":{"input":0.00003,"output":0.000015,"cacheRead":0.0000006,"cacheWrite":0,"total":0.00003f64 + 0.000015 + 0.0000006}}),
        _ => pincer_agent::message::Usage::default().to_pi(None),
    };
    assert_eq!(rest, vec![json!({"aborted":{"partialText":"Hello","partialMessage":partial}})]);
    assert_eq!(sink.entries(), Vec::<Value>::new(), "an aborted run appends nothing");
    // The rest of the stream is never read: releasing more changes nothing.
    let _ = control.send(Step::Send(evs[released + 1].clone()));
    assert_eq!(sink.entries(), Vec::<Value>::new());
}

fn hello_turn() -> Turn {
    turn(vec![text(&["Hel", "lo", " world"])], (10, 5, 2))
}

async fn abort_during_tool(f: Format) {
    let fake = FakeProvider::start(f).await;
    let t1 = turn(vec![tool_call("h1", "hang", &["{}"]), tool_call("h2", "add", &["{\"a\":1,\"b\":2}"])], (5, 5, 0));
    fake.push(Reply::stream(script(f, &t1)));
    let sink = Arc::new(MemorySink::new());
    let cancel = CancellationToken::new();
    let mut rx = start_run(run_request(
        fake.model(),
        vec![user("hang")],
        test_tools(std::path::Path::new(".")),
        sink.clone(),
        cancel.clone(),
    ));
    // Both calls are announced before they run; `add` finishes, `hang` never does.
    let mut started = Vec::new();
    while started.len() < 2 {
        if let RunEvent::ToolCallStart { id, .. } = next_event(&mut rx).await {
            started.push(id);
        }
    }
    assert_eq!(started, ["h1", "h2"]);
    cancel.cancel();
    assert_eq!(collect(rx).await, vec![RunEvent::Aborted { partial_text: String::new(), partial_message: None }]);
    assert_eq!(
        chained_messages(&sink.entries()),
        vec![expected_assistant(f, &t1)],
        "no tool result after the abort (not even the finished `add`)"
    );
    assert_eq!(fake.requests().len(), 1);
}

async fn abort_during_retry_wait(f: Format) {
    let fake = FakeProvider::start(f).await;
    fake.push(Reply::Status {
        status: 429,
        headers: vec![("retry-after".into(), "50".into())],
        body: f.error_body(429, "slow down"),
    });
    let sink = Arc::new(MemorySink::new());
    let cancel = CancellationToken::new();
    let rx = start_run(run_request(fake.model(), vec![user("hi")], ToolRegistry::new(), sink.clone(), cancel.clone()));
    fake.wait_requests(1).await;
    cancel.cancel();
    assert_eq!(collect(rx).await, vec![RunEvent::Aborted { partial_text: String::new(), partial_message: None }]);
    assert_eq!(sink.entries(), Vec::<Value>::new());
}

/// Abort while the second model call is pending: the first turn stays persisted, nothing more.
async fn abort_after_persist_between_turns(f: Format) {
    let fake = FakeProvider::start(f).await;
    let t1 = turn(vec![tool_call("c1", "add", &["{\"a\":1,\"b\":2}"])], (5, 5, 0));
    fake.push(Reply::stream(script(f, &t1)));
    fake.push(Reply::NoResponse);
    let sink = Arc::new(MemorySink::new());
    let cancel = CancellationToken::new();
    let rx = start_run(run_request(
        fake.model(),
        vec![user("add")],
        test_tools(std::path::Path::new(".")),
        sink.clone(),
        cancel.clone(),
    ));
    fake.wait_requests(2).await;
    cancel.cancel();
    let events = collect(rx).await;
    assert_eq!(events.last().unwrap(), &RunEvent::Aborted { partial_text: String::new(), partial_message: None });
    assert_eq!(
        chained_messages(&sink.entries()),
        vec![expected_assistant(f, &t1), tool_result("c1", "add", "3", false)]
    );
}

// --- quirks of OpenAI-compatible local servers -------------------------------------------------

fn chat(data: Value) -> String {
    format!("data: {data}\n\n")
}

async fn run_chat_stream(events: Vec<String>) -> (Vec<Value>, Vec<Value>) {
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    fake.push(Reply::stream(events));
    let sink = Arc::new(MemorySink::new());
    let rx = start_run(run_request(
        fake.model(),
        vec![user("hi")],
        test_tools(std::path::Path::new(".")),
        sink.clone(),
        CancellationToken::new(),
    ));
    let events = events_json(&collect(rx).await);
    (events, chained_messages(&sink.entries()))
}

fn local_assistant(content: Value, stop: &str) -> Value {
    json!({"role":"assistant","content":content,"api":"openai-completions","provider":"oaichat","model":"gpt-test",
           "responseId":"x","usage":pincer_agent::message::Usage::default().to_pi(None),"stopReason":stop,"timestamp":0})
}

/// Ollama style: `reasoning` deltas, a whole tool call in one chunk finished with "stop",
/// no usage chunk, no `[DONE]`.
#[tokio::test]
async fn ollama_style_stream() {
    let (events, messages) = run_chat_stream(vec![
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"hmm"},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"content":"","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"add","arguments":"{\"a\":1,\"b\":2}"}}]},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]})),
    ])
    .await;
    let expected = local_assistant(
        json!([{"type":"thinking","thinking":"hmm"},{"type":"toolCall","id":"call_a","name":"add","arguments":{"a":1,"b":2}}]),
        "toolUse",
    );
    assert_eq!(messages[0], expected);
    assert_eq!(events[0], json!({"thinkingDelta":"hmm","thinking":"hmm"}));
    // The next call got a server-side 500 ("no reply scripted"): the loop really went on.
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1], tool_result("call_a", "add", "3", false));
}

/// vLLM / llama.cpp style: `reasoning_content`, tool-call deltas without ids after the first,
/// two calls interleaved by index, usage on the finish chunk, and an error object mid-stream.
#[tokio::test]
async fn split_tool_call_deltas_by_index() {
    let (_, messages) = run_chat_stream(vec![
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"reasoning_content":"plan"},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c0","function":{"name":"add","arguments":""}}]},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c1","function":{"name":"fail","arguments":"{"}}]},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"}"}}]},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"2,\"b\":2}"}}]},"finish_reason":null}]})),
        chat(json!({"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})),
        "data: [DONE]\n\n".to_owned(),
    ])
    .await;
    let mut expected = local_assistant(
        json!([{"type":"thinking","thinking":"plan"},
               {"type":"toolCall","id":"c0","name":"add","arguments":{"a":2,"b":2}},
               {"type":"toolCall","id":"c1","name":"fail","arguments":{}}]),
        "toolUse",
    );
    expected["usage"] = json!({"input":7,"output":3,"cacheRead":0,"cacheWrite":0,"totalTokens":10,
        "cost":{"input":0.000021,"output":0.000045,"cacheRead":0,"cacheWrite":0,"total":0.000066}});
    assert_eq!(
        messages[..3],
        [expected, tool_result("c0", "add", "4", false), tool_result("c1", "fail", "disk on fire", true)]
    );
}

#[tokio::test]
async fn error_object_inside_a_chat_stream() {
    let (events, _) = run_chat_stream(vec![
        chat(json!({"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]})),
        chat(json!({"error":{"message":"the request exceeds the available context size","type":"exceed_context_size_error"}})),
    ])
    .await;
    assert_eq!(
        events.last().unwrap()["error"]["message"],
        "provider oaichat (openai-completions, model gpt-test): error in stream: the request exceeds the available context size"
    );
    assert_eq!(events.last().unwrap()["error"]["kind"], "context_length");
}

#[tokio::test]
async fn refusals_are_reported_as_such() {
    let cases: Vec<(Format, Vec<String>)> = vec![
        (Format::OpenaiCompletions, vec![
            chat(json!({"id":"x","choices":[{"index":0,"delta":{"content":"I"},"finish_reason":null}]})),
            chat(json!({"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]})),
            "data: [DONE]\n\n".to_owned(),
        ]),
        (Format::Anthropic, vec![
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n".to_owned(),
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\"},\"usage\":{\"output_tokens\":0}}\n\n".to_owned(),
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned(),
        ]),
        (Format::OpenaiResponses, vec![
            "event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",\"output_index\":0,\"delta\":\"I can't help with that.\"}\n\n".to_owned(),
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":6}}}\n\n".to_owned(),
        ]),
    ];
    for (f, evs) in cases {
        let fake = FakeProvider::start(f).await;
        fake.push(Reply::stream(evs));
        let (events, messages) = simple_run(&fake, fake.model()).await;
        let err = &events.last().unwrap()["error"];
        assert_eq!(err["kind"], "refusal", "{f:?}");
        assert_eq!(messages[0]["stopReason"], "error");
        assert_eq!(messages[0]["errorMessage"], err["message"]);
    }
}

#[tokio::test]
async fn in_stream_errors_of_responses_and_anthropic() {
    let fake = FakeProvider::start(Format::OpenaiResponses).await;
    fake.push(Reply::stream(vec![
        "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model.\"}}}\n\n".to_owned(),
    ]));
    let (events, _) = simple_run(&fake, fake.model()).await;
    assert_eq!(
        events.last().unwrap()["error"],
        json!({"entry": events[0]["persisted"], "kind": "context_length",
               "message": "provider oairesp (openai-responses, model gpt-resp-test): response failed (context_length_exceeded): Your input exceeds the context window of this model."})
    );
    let fake = FakeProvider::start(Format::Anthropic).await;
    fake.push(Reply::stream(vec![
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".to_owned(),
    ]));
    let (events, _) = simple_run(&fake, fake.model()).await;
    assert_eq!(
        events.last().unwrap()["error"]["message"],
        "provider claude (anthropic-messages, model claude-test): error event (overloaded_error): Overloaded"
    );
}

// --- echo, persistence failure, queue ------------------------------------------------------------

#[tokio::test]
async fn echo_model_streams_offline() {
    let sink = Arc::new(MemorySink::new());
    let msgs = vec![
        json!({"role":"user","content":[{"type":"text","text":"ping"},{"type":"image","data":"AA==","mimeType":"image/png"}],"timestamp":1}),
    ];
    let rx = start_run(run_request(
        ResolvedModel::echo(),
        msgs,
        ToolRegistry::new(),
        sink.clone(),
        CancellationToken::new(),
    ));
    let events = collect(rx).await;
    let deltas = events.iter().filter(|e| matches!(e, RunEvent::TextDelta { .. })).count();
    let text = format!("{ECHO_PREFIX} You said: ping (with 1 image)");
    assert!(deltas > 5, "streams word by word, got {deltas} deltas");
    assert_eq!(
        chained_messages(&sink.entries()),
        vec![
            json!({"role":"assistant","content":[{"type":"text","text":text}],"api":"pincer-echo","provider":"pincer","model":"echo",
                    "usage":pincer_agent::message::Usage::default().to_pi(None),"stopReason":"stop","timestamp":0})
        ]
    );
}

#[tokio::test]
async fn failed_append_ends_the_run_with_an_error() {
    let sink = Arc::new(MemorySink::new());
    sink.fail_appends("disk full");
    let rx = start_run(run_request(
        ResolvedModel::echo(),
        vec![user("x")],
        ToolRegistry::new(),
        sink.clone(),
        CancellationToken::new(),
    ));
    let events = collect(rx).await;
    assert_eq!(
        events.last().unwrap(),
        &RunEvent::Error {
            entry: None,
            message: "cannot append to the transcript: disk full".into(),
            kind: pincer_agent::ErrorKind::Unknown
        }
    );
}

/// Panics on its first append (inside the run), then appends normally.
struct PanicsOnce {
    inner: MemorySink,
    panicked: std::sync::atomic::AtomicBool,
}

impl pincer_agent::TranscriptSink for PanicsOnce {
    fn append_message(&self, message: Value) -> pincer_agent::SinkFuture<'_> {
        if !self.panicked.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("sink exploded");
        }
        self.inner.append_message(message)
    }
}

#[tokio::test]
async fn a_panicking_run_still_ends_with_a_persisted_error() {
    let sink = Arc::new(PanicsOnce { inner: MemorySink::new(), panicked: false.into() });
    let mut req = run_request(
        ResolvedModel::echo(),
        vec![user("x")],
        ToolRegistry::new(),
        Arc::new(MemorySink::new()),
        CancellationToken::new(),
    );
    req.sink = sink.clone();
    let events = collect(start_run(req)).await;
    let entries = sink.inner.entries();
    assert_eq!(entries.len(), 1, "the error message is appended by the guard");
    let msg = &entries[0]["message"];
    assert_eq!(
        (&msg["stopReason"], &msg["errorMessage"]),
        (&json!("error"), &json!("the run panicked: sink exploded"))
    );
    assert_eq!(
        &events[events.len() - 2..],
        &[
            RunEvent::Persisted { entry: entries[0].clone().into() },
            RunEvent::Error {
                entry: Some(entries[0].clone().into()),
                message: "the run panicked: sink exploded".into(),
                kind: pincer_agent::ErrorKind::Internal
            }
        ]
    );
}
