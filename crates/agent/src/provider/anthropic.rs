//! `anthropic-messages`: `POST {base_url}/v1/messages` with `stream: true`.
//!
//! Decodes `message_start` (id, input and cache usage), `content_block_start/delta/stop`
//! (text, thinking with its signature, redacted thinking, tool use with `input_json_delta`),
//! `message_delta` (stop reason, output usage), `message_stop`, `ping` and `error`.
//! Tool results go back as `tool_result` blocks (images included) in one user message per run
//! of consecutive results.

use std::collections::VecDeque;

use serde_json::{json, Value};

use super::openai_completions::invalid_json;
use super::wire::{self, block_type, blocks, content_string, str_of};
use super::{ErrorKind, Fault, ModelRequest, StreamDelta, WireRequest};
use crate::config::{Api, ResolvedModel};
use crate::context::WireForm;
use crate::message::{AssistantDraft, DraftBlock, StopReason};
use crate::sse::SseEvent;

/// `max_tokens` when the model config has none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u64 = 8192;
pub(crate) const VERSION: &str = "2023-06-01";

fn image_block(b: &Value) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": str_of(b, "mimeType"), "data": str_of(b, "data")}})
}

fn user_parts(content: &[Value]) -> Vec<Value> {
    content
        .iter()
        .filter_map(|b| match block_type(b) {
            "text" if !str_of(b, "text").is_empty() => Some(json!({"type": "text", "text": str_of(b, "text")})),
            "image" => Some(image_block(b)),
            _ => None,
        })
        .collect()
}

/// How this API lists messages: a run of tool results is one user message of `tool_result` blocks.
pub(crate) const LAYOUT: wire::Layout = wire::Layout {
    api: Api::AnthropicMessages,
    build: wire_form,
    lean: Some(lean_form),
    group_results: true,
    image_text_type: "text",
};

/// One message on this API's wire (cached on the message); a tool result is its `tool_result` block.
fn wire_form(msg: &Value) -> WireForm {
    let mut form = WireForm::default();
    let out = &mut form.items;
    match wire::role(msg) {
        "user" => {
            if let Some(s) = content_string(msg) {
                if !s.is_empty() {
                    wire::item(out, &json!({"role": "user", "content": s}));
                }
                return form;
            }
            let parts = user_parts(blocks(msg));
            if !parts.is_empty() {
                wire::item(out, &json!({"role": "user", "content": parts}));
            }
        }
        "assistant" => {
            let same_api = str_of(msg, "api") == "anthropic-messages";
            let mut parts = Vec::new();
            for b in blocks(msg) {
                match block_type(b) {
                    "thinking" if same_api => {
                        let sig = str_of(b, "thinkingSignature");
                        if b.get("redacted").and_then(Value::as_bool) == Some(true) {
                            parts.push(json!({"type": "redacted_thinking", "data": sig}));
                        } else if !sig.is_empty() {
                            parts
                                .push(json!({"type": "thinking", "thinking": str_of(b, "thinking"), "signature": sig}));
                        }
                    }
                    "text" if !str_of(b, "text").is_empty() => {
                        parts.push(json!({"type": "text", "text": str_of(b, "text")}));
                    }
                    "toolCall" => {
                        let input = b.get("arguments").cloned().unwrap_or_else(|| json!({}));
                        parts.push(
                            json!({"type": "tool_use", "id": str_of(b, "id"), "name": str_of(b, "name"), "input": input}),
                        );
                    }
                    _ => {}
                }
            }
            if !parts.is_empty() {
                wire::item(out, &json!({"role": "assistant", "content": parts}));
            }
        }
        "toolResult" => {
            let mut content = user_parts(blocks(msg));
            if content.is_empty() {
                content.push(json!({"type": "text", "text": "(no output)"}));
            }
            wire::item(
                out,
                &json!({
                    "type": "tool_result",
                    "tool_use_id": str_of(msg, "toolCallId"),
                    "content": content,
                    "is_error": msg.get("isError").and_then(Value::as_bool).unwrap_or(false),
                }),
            );
        }
        _ => {}
    }
    form
}

/// [`wire_form`] from a [`wire::Lean`] decoding, writing the same bytes without a JSON tree;
/// `None` for images (rare: those take [`wire_form`]).
fn lean_form(msg: &wire::Lean<'_>) -> Option<WireForm> {
    #[derive(serde::Serialize)]
    #[serde(untagged)]
    enum Part<'a> {
        Text(wire::TextPart<'a>),
        ToolUse { r#type: &'static str, id: &'a str, name: &'a str, input: Value },
        Redacted { r#type: &'static str, data: &'a str },
        Thinking { r#type: &'static str, thinking: &'a str, signature: &'a str },
    }
    #[derive(serde::Serialize)]
    struct ToolResult<'a> {
        r#type: &'static str,
        tool_use_id: &'a str,
        content: Vec<wire::TextPart<'a>>,
        is_error: bool,
    }
    if msg.has("image") {
        return None;
    }
    let texts = || {
        msg.blocks()
            .iter()
            .filter(|b| b.kind == "text" && !b.text.is_empty())
            .map(|b| wire::TextPart { r#type: "text", text: &b.text })
    };
    let mut form = WireForm::default();
    let out = &mut form.items;
    match &*msg.role {
        "user" => match &msg.content {
            wire::LeanContent::Text(s) if s.is_empty() => {}
            wire::LeanContent::Text(s) => wire::item(out, &wire::Said { role: "user", content: &**s }),
            _ => {
                let parts: Vec<_> = texts().collect();
                if !parts.is_empty() {
                    wire::item(out, &wire::Said { role: "user", content: parts });
                }
            }
        },
        "assistant" => {
            let same_api = msg.api == "anthropic-messages";
            let parts: Vec<Part<'_>> = msg
                .blocks()
                .iter()
                .filter_map(|b| match &*b.kind {
                    "thinking" if same_api => {
                        let signature = &*b.thinking_signature;
                        if b.redacted == Some(true) {
                            Some(Part::Redacted { r#type: "redacted_thinking", data: signature })
                        } else {
                            (!signature.is_empty()).then_some(Part::Thinking {
                                r#type: "thinking",
                                thinking: &b.thinking,
                                signature,
                            })
                        }
                    }
                    "text" if !b.text.is_empty() => Some(Part::Text(wire::TextPart { r#type: "text", text: &b.text })),
                    "toolCall" => {
                        Some(Part::ToolUse { r#type: "tool_use", id: &b.id, name: &b.name, input: b.arguments() })
                    }
                    _ => None,
                })
                .collect();
            if !parts.is_empty() {
                wire::item(out, &wire::Said { role: "assistant", content: parts });
            }
        }
        "toolResult" => {
            let mut content: Vec<_> = texts().collect();
            if content.is_empty() {
                content.push(wire::TextPart { r#type: "text", text: "(no output)" });
            }
            let is_error = msg.is_error.unwrap_or(false);
            wire::item(out, &ToolResult { r#type: "tool_result", tool_use_id: &msg.tool_call_id, content, is_error });
        }
        _ => return None,
    }
    Some(form)
}

/// Builds the request.
pub(crate) fn request(model: &ResolvedModel, req: &ModelRequest) -> WireRequest {
    let mut body = wire::Body::new();
    body.field("model", &model.model.id);
    body.field("max_tokens", &model.model.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    body.field("stream", &true);
    if let Some(system) = req.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        body.field("system", &system);
    }
    body.list("messages", |out| wire::write_messages(out, &req.messages, &LAYOUT));
    #[derive(serde::Serialize)]
    struct Tool<'a> {
        name: &'a str,
        description: &'a str,
        input_schema: &'a Value,
    }
    body.tools(&req.tools, Api::AnthropicMessages, |t| Tool {
        name: &t.name,
        description: &t.description,
        input_schema: &t.parameters,
    });
    body.request(model, "/v1/messages", vec![("anthropic-version".to_owned(), VERSION.to_owned())], "x-api-key")
}

/// Stream decoder.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// (content block index, draft block index).
    slots: Vec<(u64, usize)>,
    stop_reason: Option<String>,
}

fn error_fault(err: &Value) -> Fault {
    let kind_str = str_of(err, "type");
    let message = str_of(err, "message");
    let kind = match kind_str {
        "rate_limit_error" => ErrorKind::RateLimit,
        _ if wire::is_context_length_message(message) => ErrorKind::ContextLength,
        _ => ErrorKind::Unknown,
    };
    Fault::new(kind, format!("error event ({kind_str}): {message}"))
}

impl super::Decoder for Decoder {
    fn event(
        &mut self,
        ev: &SseEvent,
        draft: &mut AssistantDraft,
        out: &mut VecDeque<StreamDelta>,
    ) -> Result<bool, Fault> {
        let data = ev.data.trim();
        let v: Value = serde_json::from_str(data).map_err(|e| invalid_json(&e, data))?;
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let slot = self.slots.iter().find(|(k, _)| *k == index).map(|(_, i)| *i);
        match str_of(&v, "type") {
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                if let Some(id) = m.get("id").and_then(Value::as_str) {
                    draft.response_id = Some(id.to_owned());
                }
                apply_usage(m.get("usage"), draft);
            }
            "content_block_start" => {
                let b = v.get("content_block").unwrap_or(&Value::Null);
                let block = match str_of(b, "type") {
                    "text" => {
                        let t = str_of(b, "text");
                        if !t.is_empty() {
                            out.push_back(StreamDelta::Text(t.to_owned()));
                        }
                        DraftBlock::Text(t.to_owned())
                    }
                    "thinking" => DraftBlock::Thinking {
                        thinking: str_of(b, "thinking").to_owned(),
                        signature: None,
                        redacted: false,
                    },
                    "redacted_thinking" => DraftBlock::Thinking {
                        thinking: "[Reasoning redacted]".to_owned(),
                        signature: Some(str_of(b, "data").to_owned()),
                        redacted: true,
                    },
                    "tool_use" => DraftBlock::ToolCall {
                        id: str_of(b, "id").to_owned(),
                        name: str_of(b, "name").to_owned(),
                        arguments: String::new(),
                    },
                    _ => return Ok(false),
                };
                draft.blocks.push(block);
                self.slots.push((index, draft.blocks.len() - 1));
            }
            "content_block_delta" => {
                let d = v.get("delta").unwrap_or(&Value::Null);
                let Some(block) = slot.and_then(|i| draft.blocks.get_mut(i)) else {
                    return Ok(false);
                };
                match (str_of(d, "type"), block) {
                    ("text_delta", DraftBlock::Text(t)) => {
                        let s = str_of(d, "text");
                        t.push_str(s);
                        out.push_back(StreamDelta::Text(s.to_owned()));
                    }
                    ("thinking_delta", DraftBlock::Thinking { thinking, .. }) => {
                        let s = str_of(d, "thinking");
                        thinking.push_str(s);
                        out.push_back(StreamDelta::Thinking(s.to_owned()));
                    }
                    ("signature_delta", DraftBlock::Thinking { signature, .. }) => {
                        signature.get_or_insert_with(String::new).push_str(str_of(d, "signature"));
                    }
                    ("input_json_delta", DraftBlock::ToolCall { arguments, .. }) => {
                        arguments.push_str(str_of(d, "partial_json"));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_owned());
                }
                apply_usage(v.get("usage"), draft);
            }
            "message_stop" => {
                draft.stop_reason = Some(match self.stop_reason.as_deref() {
                    Some("max_tokens") | Some("model_context_window_exceeded") => StopReason::Length,
                    Some("tool_use") => StopReason::ToolUse,
                    Some("refusal") => {
                        return Err(Fault::new(ErrorKind::Refusal, "the model refused to answer (stop_reason refusal)"))
                    }
                    _ if draft.blocks.iter().any(|b| matches!(b, DraftBlock::ToolCall { .. })) => StopReason::ToolUse,
                    _ => StopReason::Stop,
                });
                return Ok(true);
            }
            "error" => return Err(error_fault(v.get("error").unwrap_or(&Value::Null))),
            _ => {}
        }
        Ok(false)
    }

    fn eof(&mut self, _draft: &mut AssistantDraft) -> Result<(), Fault> {
        Err(Fault::new(ErrorKind::Unknown, "stream ended before the response was complete (no message_stop)"))
    }
}

/// Anthropic sends input and cache counts in `message_start` and cumulative counts in
/// `message_delta`; a field present overrides the earlier value.
fn apply_usage(u: Option<&Value>, draft: &mut AssistantDraft) {
    let Some(u) = u.filter(|u| u.is_object()) else {
        return;
    };
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(x) = n("input_tokens") {
        draft.usage.input = x;
    }
    if let Some(x) = n("output_tokens") {
        draft.usage.output = x;
    }
    if let Some(x) = n("cache_read_input_tokens") {
        draft.usage.cache_read = x;
    }
    if let Some(x) = n("cache_creation_input_tokens") {
        draft.usage.cache_write = x;
    }
}
