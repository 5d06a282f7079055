//! Helpers shared by the request mappers and decoders: Pi's message clean-up before a call
//! (`convert_to_llm`, skipping failed assistant turns, closing orphaned tool calls), content
//! block access, error-body reading and context-length detection.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::message::convert_to_llm;

/// Text given to the model for a tool call whose result never arrived (an aborted run).
pub(crate) const NO_RESULT: &str = "No result provided";

/// Pi context messages → the messages a provider sees: `convert_to_llm`, then (as Pi's
/// `transformMessages`) assistant messages that ended in `error` or `aborted` are skipped,
/// tool calls without a result get an error result before the next message, and tool
/// results that answer no pending call are dropped (APIs reject both kinds of orphan).
pub(crate) fn prepare(messages: &[Arc<Value>]) -> Vec<Arc<Value>> {
    let mut out = Vec::new();
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut answered: BTreeSet<String> = BTreeSet::new();
    let close_pending =
        |out: &mut Vec<Arc<Value>>, pending: &mut Vec<(String, String)>, answered: &BTreeSet<String>| {
            for (id, name) in pending.drain(..) {
                if !answered.contains(&id) {
                    out.push(Arc::new(json!({
                        "role": "toolResult", "toolCallId": id, "toolName": name,
                        "content": [{"type": "text", "text": NO_RESULT}], "isError": true, "timestamp": 0
                    })));
                }
            }
        };
    for msg in convert_to_llm(messages) {
        match role(&msg) {
            "assistant" => {
                let stop = msg.get("stopReason").and_then(Value::as_str).unwrap_or_default();
                if stop == "error" || stop == "aborted" {
                    continue;
                }
                close_pending(&mut out, &mut pending, &answered);
                answered.clear();
                for block in blocks(&msg) {
                    if block.get("type").and_then(Value::as_str) == Some("toolCall") {
                        pending.push((str_of(block, "id").to_owned(), str_of(block, "name").to_owned()));
                    }
                }
                out.push(msg);
            }
            "toolResult" => {
                let id = str_of(&msg, "toolCallId");
                if pending.iter().any(|(p, _)| p == id) && answered.insert(id.to_owned()) {
                    out.push(msg);
                }
            }
            _ => {
                close_pending(&mut out, &mut pending, &answered);
                answered.clear();
                out.push(msg);
            }
        }
    }
    close_pending(&mut out, &mut pending, &answered);
    out
}

/// A message's `role`.
pub(crate) fn role(msg: &Value) -> &str {
    str_of(msg, "role")
}

/// A string field, `""` when missing.
pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Content blocks; a string content is not a block list (see [`content_string`]).
pub(crate) fn blocks(msg: &Value) -> &[Value] {
    msg.get("content").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// The content when it is a plain string.
pub(crate) fn content_string(msg: &Value) -> Option<&str> {
    msg.get("content").and_then(Value::as_str)
}

/// A block's `type`.
pub(crate) fn block_type(b: &Value) -> &str {
    str_of(b, "type")
}

/// Text blocks of a content list joined with `\n`.
pub(crate) fn joined_text(content: &[Value]) -> String {
    content.iter().filter(|b| block_type(b) == "text").map(|b| str_of(b, "text")).collect::<Vec<_>>().join("\n")
}

/// Image blocks of a content list.
pub(crate) fn images(content: &[Value]) -> Vec<&Value> {
    content.iter().filter(|b| block_type(b) == "image").collect()
}

/// `data:<mime>;base64,<data>` for an image block.
pub(crate) fn data_url(image: &Value) -> String {
    format!("data:{};base64,{}", str_of(image, "mimeType"), str_of(image, "data"))
}

/// The most useful message from an error body: `error.message` (OpenAI, Anthropic),
/// `error` as a string (Ollama), `message`, `detail`; else the text itself, shortened.
pub(crate) fn error_message_from_body(text: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        if let Some(m) = error_message_from_value(&v) {
            return m;
        }
    }
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return "(empty response body)".to_owned();
    }
    shorten(trimmed, 500)
}

/// The message inside a JSON error object, if it has one.
pub(crate) fn error_message_from_value(v: &Value) -> Option<String> {
    let candidates =
        [v.pointer("/error/message"), v.get("error").filter(|e| e.is_string()), v.get("message"), v.get("detail")];
    candidates.into_iter().flatten().find_map(|m| m.as_str()).map(|m| shorten(m, 2000))
}

fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// True for the ways providers and local servers say the prompt does not fit.
pub(crate) fn is_context_length_message(text: &str) -> bool {
    let t = text.to_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "context size",
        "prompt is too long",
        "too many tokens",
        "input is too long",
        "exceeds the context",
    ]
    .iter()
    .any(|p| t.contains(p))
}

/// Images from tool results, which these APIs cannot carry in a tool message, go in one user message
/// right after the results; `text_type` is the API's text block type (`text` or `input_text`).
pub(crate) fn flush_tool_images(out: &mut Vec<Value>, pending: &mut Vec<Value>, text_type: &str) {
    if !pending.is_empty() {
        let mut content = vec![json!({"type": text_type, "text": "Attached image(s) from tool result:"})];
        content.append(pending);
        out.push(json!({"role": "user", "content": content}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn prepare_skips_failed_turns_and_closes_orphans() {
        let call = |id: &str| json!({"type":"toolCall","id":id,"name":"t","arguments":{}});
        let input = vec![
            json!({"role":"user","content":"a","timestamp":1}),
            json!({"role":"assistant","content":[call("x")],"stopReason":"error","timestamp":2}),
            json!({"role":"toolResult","toolCallId":"x","toolName":"t","content":[],"isError":false,"timestamp":3}),
            json!({"role":"assistant","content":[call("c1"), call("c2")],"stopReason":"toolUse","timestamp":4}),
            json!({"role":"toolResult","toolCallId":"c1","toolName":"t","content":[],"isError":false,"timestamp":5}),
            json!({"role":"user","content":"b","timestamp":6}),
        ];
        assert_eq!(
            prepare(&input.into_iter().map(Arc::new).collect::<Vec<_>>())
                .into_iter()
                .map(|m| (*m).clone())
                .collect::<Vec<_>>(),
            vec![
                json!({"role":"user","content":"a","timestamp":1}),
                json!({"role":"assistant","content":[call("c1"), call("c2")],"stopReason":"toolUse","timestamp":4}),
                json!({"role":"toolResult","toolCallId":"c1","toolName":"t","content":[],"isError":false,"timestamp":5}),
                json!({"role":"toolResult","toolCallId":"c2","toolName":"t","content":[{"type":"text","text":NO_RESULT}],"isError":true,"timestamp":0}),
                json!({"role":"user","content":"b","timestamp":6}),
            ]
        );
    }

    #[test]
    fn error_bodies() {
        assert_eq!(error_message_from_body(r#"{"error":{"message":"bad key","type":"x"}}"#), "bad key");
        assert_eq!(error_message_from_body(r#"{"error":"model not found"}"#), "model not found");
        assert_eq!(error_message_from_body("  "), "(empty response body)");
        assert_eq!(error_message_from_body("<html>oops</html>"), "<html>oops</html>");
        assert!(is_context_length_message("prompt is too long: 208000 tokens > 200000 maximum"));
        assert!(!is_context_length_message("Rate limit reached"));
    }
}
