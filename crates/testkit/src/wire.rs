//! Pi's context in OpenAI chat-completions wire form, written from Pi's rules (`convertToLlm` and
//! `transformMessages`) independently of Pincer's mapper: the gateway tests compare what the fake
//! provider received with this form of the real Pi library's context of the file.

use serde_json::{json, Value};
use std::path::Path;

/// Text blocks joined with `\n`.
pub fn joined(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A reference of the OpenAI chat-completions messages for Pi context messages, written from
/// Pi's rules (convertToLlm and transformMessages) independently of Pincer's mapper.
pub fn openai_messages(context: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    // Tool calls of the last assistant message still waiting for their result.
    let mut pending: Vec<Value> = Vec::new();
    // Images of the tool results just sent: Pi sends them after the results, as a user message.
    let mut images: Vec<Value> = Vec::new();
    let flush = |out: &mut Vec<Value>, images: &mut Vec<Value>| {
        if !images.is_empty() {
            let mut content = vec![json!({"type": "text", "text": "Attached image(s) from tool result:"})];
            content.append(images);
            out.push(json!({"role": "user", "content": content}));
        }
    };
    for m in context {
        let role = m["role"].as_str().unwrap_or_default();
        if role != "toolResult" {
            flush(&mut out, &mut images);
        }
        let failed = role == "assistant" && matches!(m["stopReason"].as_str(), Some("error" | "aborted"));
        if role != "toolResult" && !failed {
            for id in pending.drain(..) {
                out.push(json!({"role": "tool", "tool_call_id": id, "content": "No result provided"}));
            }
        }
        match role {
            "user" => out.push(json!({"role": "user", "content": joined(&m["content"])})),
            "compactionSummary" => out.push(json!({"role": "user", "content": format!(
                "The conversation history before this point was compacted into the following summary:\n\n<summary>\n{}\n</summary>",
                m["summary"].as_str().unwrap_or_default())})),
            "branchSummary" => out.push(json!({"role": "user", "content": format!(
                "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n{}</summary>",
                m["summary"].as_str().unwrap_or_default())})),
            "assistant" => {
                if matches!(m["stopReason"].as_str(), Some("error" | "aborted")) {
                    continue;
                }
                let text = joined(&m["content"]);
                let calls: Vec<Value> = m["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|b| b["type"] == "toolCall")
                    .map(|b| json!({"id": b["id"], "type": "function",
                        "function": {"name": b["name"], "arguments": b["arguments"].to_string()}}))
                    .collect();
                let mut a = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
                if !calls.is_empty() {
                    pending = calls.iter().map(|c| c["id"].clone()).collect();
                    a["tool_calls"] = json!(calls);
                }
                out.push(a);
            }
            "toolResult" => {
                pending.retain(|id| *id != m["toolCallId"]);
                let blocks = m["content"].as_array().map_or(&[][..], Vec::as_slice);
                let pictures: Vec<Value> = blocks
                    .iter()
                    .filter(|b| b["type"] == "image")
                    .map(|b| {
                        let url = format!("data:{};base64,{}", b["mimeType"].as_str().unwrap_or_default(), b["data"].as_str().unwrap_or_default());
                        json!({"type": "image_url", "image_url": {"url": url}})
                    })
                    .collect();
                let text = match joined(&m["content"]) {
                    t if !t.is_empty() => t,
                    _ if !pictures.is_empty() => "(see attached image)".to_owned(),
                    _ => "(no output)".to_owned(),
                };
                images.extend(pictures);
                out.push(json!({"role": "tool", "tool_call_id": m["toolCallId"], "content": text}));
            }
            other => panic!("a context message of role {other:?} in this fixture"),
        }
    }
    flush(&mut out, &mut images);
    out
}

/// A chat-completions request's messages without its system prompt: the conversation the model
/// got, to compare with [`openai_messages`] of Pi's context.
pub fn conversation(request: &Value) -> Vec<Value> {
    let messages = request["messages"].as_array().expect("the request's messages");
    messages.iter().filter(|m| m["role"] != "system").cloned().collect()
}

/// The `toolResult` messages of a transcript, in file order.
pub fn tool_results(file: &Path) -> Vec<Value> {
    crate::probe::read_rows(file)
        .into_iter()
        .filter(|r| r["message"]["role"] == "toolResult")
        .map(|r| r["message"].clone())
        .collect()
}

/// The text of a result's first block.
pub fn result_text(m: &Value) -> &str {
    m["content"][0]["text"].as_str().unwrap_or_default()
}

/// The provider's request `n` (without the system prompt) must equal Pi's context of the file at
/// the row before the assistant message that answered it, in OpenAI's wire form.
pub fn check_request_against_pi(file: &Path, fake: &crate::fake_provider::FakeProvider, n: usize) {
    let rows = crate::probe::read_rows(file);
    let assistants: Vec<usize> =
        rows.iter().enumerate().filter(|(_, r)| r["message"]["role"] == "assistant").map(|(i, _)| i).collect();
    let leaf = rows[assistants[n] - 1]["id"].as_str().unwrap_or_default().to_owned();
    let pi = crate::oracle_context(file, Some(&leaf));
    let expected = openai_messages(pi["context"]["messages"].as_array().map_or(&[][..], Vec::as_slice));
    let got: Vec<Value> = fake.bodies()[n]["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|m| m["role"] != "system")
        .cloned()
        .collect();
    assert_eq!(got, expected, "request {n} against Pi's context at {leaf}");
}
