//! `pincer_pi::llm` against the real Pi library: every message shape on which the two copies of
//! `convertToLlm` that Pincer once had disagreed (missing custom content, truthy flags, string and
//! odd exit codes, non-string fields printed by template literals), run through Pi's own
//! `convertToLlm` and `bashExecutionToText` in one Node process and compared whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

fn pi(messages: &Value) -> Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/convert.mjs");
    let mut child = Command::new("node")
        .arg(script)
        .env("PINCER_PI_ORACLE", pincer_testkit::oracle_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node");
    child.stdin.take().unwrap().write_all(messages.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "node failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn bash(fields: Value) -> Value {
    let mut m = json!({"role": "bashExecution", "timestamp": 5});
    m.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
    m
}

#[test]
fn convert_to_llm_matches_pi_on_every_divergence() {
    let mut messages = vec![
        // Passed through untouched, unknown fields and all.
        json!({"role": "user", "content": "hi", "timestamp": 1, "x-extra": {"k": [1, 2]}}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "a"}], "stopReason": "stop", "timestamp": 2}),
        json!({"role": "toolResult", "toolCallId": "c", "toolName": "t", "content": [], "isError": false}),
        // Custom content: string, blocks, missing (left out, not [] or null), null, a number.
        json!({"role": "custom", "customType": "n", "content": "note", "display": true, "timestamp": 3}),
        json!({"role": "custom", "customType": "i", "content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]}),
        json!({"role": "custom", "customType": "m", "display": false, "timestamp": 4}),
        json!({"role": "custom", "customType": "z", "content": null}),
        json!({"role": "custom", "customType": "q", "content": 7}),
        // Summaries: string, missing (`undefined`), a number, an object.
        json!({"role": "branchSummary", "summary": "left", "fromId": "a", "timestamp": 6}),
        json!({"role": "branchSummary", "fromId": "a"}),
        json!({"role": "compactionSummary", "summary": 12.0, "tokensBefore": 1}),
        json!({"role": "compactionSummary", "summary": {"a": 1}}),
        // Roles that are not for the model.
        json!({"role": "somethingNew", "content": "x"}),
        json!({"role": 5, "content": "x"}),
        json!({"content": "no role"}),
    ];
    // bashExecution: exclusion and flags by JavaScript truthiness, exit codes by `!== 0` and printed
    // by String(), fields printed by template literals.
    for exclude in [json!(true), json!(1), json!("yes"), json!("false"), json!(false), json!(0), json!(""), Value::Null]
    {
        messages.push(bash(json!({"command": "ls", "output": "o", "excludeFromContext": exclude})));
    }
    for code in [
        json!(0),
        json!(0.0),
        json!(2),
        json!(2.5),
        json!(1e21),
        json!(-1),
        json!("0"),
        json!("2"),
        json!(""),
        json!(true),
        json!(false),
        json!([1, null, 2]),
        json!({"a": 1}),
        Value::Null,
    ] {
        messages.push(bash(json!({"command": "make", "output": "", "exitCode": code})));
    }
    messages.push(bash(json!({"command": "make", "output": "x"})));
    for cancelled in [json!(true), json!(1), json!("y"), json!(0), json!("")] {
        messages.push(bash(json!({"command": "sleep", "output": "x", "exitCode": 3, "cancelled": cancelled})));
    }
    for (truncated, path) in [
        (json!(true), json!("/tmp/o")),
        (json!("yes"), json!("/tmp/o")),
        (json!(1), json!(42)),
        (json!(true), json!("")),
        (json!(0), json!("/tmp/o")),
        (json!(true), Value::Null),
    ] {
        messages.push(bash(json!({"command": "cat", "output": "x", "truncated": truncated, "fullOutputPath": path})));
    }
    for (command, output) in [
        (Value::Null, json!("x")),
        (json!(42), json!(0)),
        (json!(["a", "b"]), json!(5)),
        (json!({"c": 1}), json!(["l1", "l2"])),
        (json!("ok"), json!(" ")),
    ] {
        messages.push(bash(json!({"command": command, "output": output})));
    }
    messages.push(json!({"role": "bashExecution"}));
    let input = Value::Array(messages);

    let want = pi(&input);
    let list = input.as_array().unwrap();
    let got = json!({
        "llm": pincer_pi::llm::convert_to_llm(list),
        "bash": list
            .iter()
            .filter(|m| m["role"] == "bashExecution")
            .map(pincer_pi::llm::bash_execution_to_text)
            .collect::<Vec<_>>(),
    });
    assert_eq!(got, want);
}
