//! `openai-responses`: `POST {base_url}/responses` with `stream: true, store: false`.
//!
//! Decodes `response.output_text.delta`, reasoning summary/text deltas, function calls
//! (`response.output_item.added` + `response.function_call_arguments.delta` + `.done`), and the
//! terminal `response.completed` / `response.incomplete` / `response.failed` / `error`
//! events. A reasoning item is kept whole (with `encrypted_content`) as the thinking block's
//! `thinkingSignature`, and sent back verbatim on the next call, as Pi does.

use std::collections::VecDeque;

use serde_json::{json, Value};

use super::openai_completions::invalid_json;
use super::wire::{self, block_type, blocks, content_string, data_url, images, joined_text, str_of};
use super::{ErrorKind, Fault, ModelRequest, StreamDelta, WireRequest};
use crate::config::{Api, ResolvedModel};
use crate::context::WireForm;
use crate::message::{AssistantDraft, DraftBlock, StopReason, Usage};
use crate::sse::SseEvent;

/// How this API lists input items.
pub(crate) const LAYOUT: wire::Layout = wire::Layout {
    api: Api::OpenaiResponses,
    build: wire_form,
    lean: Some(lean_form),
    group_results: false,
    image_text_type: "input_text",
};

/// One message as this API's input items (cached on the message): an assistant message becomes
/// its reasoning, text and function-call items.
fn wire_form(msg: &Value) -> WireForm {
    let mut form = WireForm::default();
    let out = &mut form.items;
    match wire::role(msg) {
        "user" => {
            let parts: Vec<Value> = match content_string(msg) {
                Some(s) => vec![json!({"type": "input_text", "text": s})],
                None => blocks(msg)
                    .iter()
                    .filter_map(|b| match block_type(b) {
                        "text" => Some(json!({"type": "input_text", "text": str_of(b, "text")})),
                        "image" => Some(json!({"type": "input_image", "detail": "auto", "image_url": data_url(b)})),
                        _ => None,
                    })
                    .collect(),
            };
            if !parts.is_empty() {
                wire::item(out, &json!({"role": "user", "content": parts}));
            }
        }
        "assistant" => {
            let same_api = str_of(msg, "api") == "openai-responses";
            for b in blocks(msg) {
                match block_type(b) {
                    "thinking" if same_api => {
                        if let Some(item) = reasoning_item(b.get("thinkingSignature").and_then(Value::as_str)) {
                            wire::item(out, &item);
                        }
                    }
                    "text" if !str_of(b, "text").is_empty() => {
                        wire::item(out, &json!({"role": "assistant", "content": str_of(b, "text")}));
                    }
                    "toolCall" => {
                        let args = b.get("arguments").cloned().unwrap_or_else(|| json!({}));
                        wire::item(
                            out,
                            &json!({"type": "function_call", "call_id": str_of(b, "id"),
                                    "name": str_of(b, "name"), "arguments": args.to_string()}),
                        );
                    }
                    _ => {}
                }
            }
        }
        "toolResult" => {
            let content = blocks(msg);
            let text = joined_text(content);
            let imgs = images(content);
            let output = match (text.is_empty(), imgs.is_empty()) {
                (false, _) => text,
                (true, false) => "(see attached image)".to_owned(),
                (true, true) => "(no output)".to_owned(),
            };
            wire::item(
                out,
                &json!({"type": "function_call_output", "call_id": str_of(msg, "toolCallId"), "output": output}),
            );
            for i in imgs {
                wire::item(
                    &mut form.images,
                    &json!({"type": "input_image", "detail": "auto", "image_url": data_url(i)}),
                );
            }
        }
        _ => {}
    }
    form
}

/// The reasoning item a thinking block's signature carries (this API's own reasoning, sent back).
fn reasoning_item(signature: Option<&str>) -> Option<Value> {
    signature.and_then(|s| serde_json::from_str::<Value>(s).ok()).filter(|v| str_of(v, "type") == "reasoning")
}

/// [`wire_form`] from a [`wire::Lean`] decoding, writing the same bytes without a JSON tree;
/// `None` for images (rare: those take [`wire_form`]).
fn lean_form(msg: &wire::Lean<'_>) -> Option<WireForm> {
    #[derive(serde::Serialize)]
    struct FunctionCall<'a> {
        r#type: &'static str,
        call_id: &'a str,
        name: &'a str,
        arguments: String,
    }
    #[derive(serde::Serialize)]
    struct Output<'a> {
        r#type: &'static str,
        call_id: &'a str,
        output: &'a str,
    }
    if msg.has("image") {
        return None;
    }
    let mut form = WireForm::default();
    let out = &mut form.items;
    match &*msg.role {
        "user" => {
            let parts: Vec<wire::TextPart<'_>> = match &msg.content {
                wire::LeanContent::Text(s) => vec![wire::TextPart { r#type: "input_text", text: s }],
                _ => msg
                    .blocks()
                    .iter()
                    .filter(|b| b.kind == "text")
                    .map(|b| wire::TextPart { r#type: "input_text", text: &b.text })
                    .collect(),
            };
            if !parts.is_empty() {
                wire::item(out, &wire::Said { role: "user", content: parts });
            }
        }
        "assistant" => {
            let same_api = msg.api == "openai-responses";
            for b in msg.blocks() {
                match &*b.kind {
                    "thinking" if same_api => {
                        if let Some(item) = reasoning_item(Some(&b.thinking_signature)) {
                            wire::item(out, &item);
                        }
                    }
                    "text" if !b.text.is_empty() => {
                        wire::item(out, &wire::Said { role: "assistant", content: &*b.text })
                    }
                    "toolCall" => wire::item(
                        out,
                        &FunctionCall {
                            r#type: "function_call",
                            call_id: &b.id,
                            name: &b.name,
                            arguments: b.arguments().to_string(),
                        },
                    ),
                    _ => {}
                }
            }
        }
        "toolResult" => {
            let text = msg.joined_text();
            let output = if text.is_empty() { "(no output)" } else { &text };
            wire::item(out, &Output { r#type: "function_call_output", call_id: &msg.tool_call_id, output });
        }
        _ => return None,
    }
    Some(form)
}

/// Builds the request.
pub(crate) fn request(model: &ResolvedModel, req: &ModelRequest) -> WireRequest {
    let mut body = wire::Body::new();
    body.field("model", &model.model.id);
    if let Some(system) = req.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        body.field("instructions", &system);
    }
    body.list("input", |out| wire::write_messages(out, &req.messages, &LAYOUT));
    body.field("stream", &true);
    body.field("store", &false);
    if let Some(max) = model.model.max_tokens {
        body.field("max_output_tokens", &max);
    }
    if model.model.reasoning == Some(true) {
        body.field("include", &json!(["reasoning.encrypted_content"]));
        body.field("reasoning", &json!({"summary": "auto"}));
    }
    #[derive(serde::Serialize)]
    struct Tool<'a> {
        r#type: &'static str,
        name: &'a str,
        description: &'a str,
        parameters: &'a Value,
        strict: bool,
    }
    body.tools(&req.tools, Api::OpenaiResponses, |t| Tool {
        r#type: "function",
        name: &t.name,
        description: &t.description,
        parameters: &t.parameters,
        strict: false,
    });
    body.request(model, "/responses", Vec::new(), "authorization")
}

/// Stream decoder.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// (kind + output_index, draft block index).
    slots: Vec<(String, usize)>,
    refusal: String,
}

impl Decoder {
    fn slot(&self, key: &str) -> Option<usize> {
        self.slots.iter().find(|(k, _)| k == key).map(|(_, i)| *i)
    }

    fn block_for(&mut self, key: String, draft: &mut AssistantDraft, make: impl FnOnce() -> DraftBlock) -> usize {
        if let Some(i) = self.slot(&key) {
            return i;
        }
        draft.blocks.push(make());
        let i = draft.blocks.len() - 1;
        self.slots.push((key, i));
        i
    }
}

fn usage_from(response: &Value) -> Option<Usage> {
    let u = response.get("usage").filter(|u| u.is_object())?;
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("/input_tokens_details/cached_tokens");
    Some(Usage {
        input: n("/input_tokens").saturating_sub(cached),
        output: n("/output_tokens"),
        cache_read: cached,
        cache_write: 0,
    })
}

fn error_fault(err: &Value, context: &str) -> Fault {
    let code = str_of(err, "code");
    let message = str_of(err, "message");
    let kind = if code == "rate_limit_exceeded" {
        ErrorKind::RateLimit
    } else if code == "context_length_exceeded" || wire::is_context_length_message(message) {
        ErrorKind::ContextLength
    } else {
        ErrorKind::Unknown
    };
    let code = if code.is_empty() { String::new() } else { format!(" ({code})") };
    Fault::new(kind, format!("{context}{code}: {message}"))
}

impl super::Decoder for Decoder {
    fn event(
        &mut self,
        ev: &SseEvent,
        draft: &mut AssistantDraft,
        out: &mut VecDeque<StreamDelta>,
    ) -> Result<bool, Fault> {
        let data = ev.data.trim();
        if data == "[DONE]" {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| invalid_json(&e, data))?;
        let oi = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
        let delta = str_of(&v, "delta");
        match str_of(&v, "type") {
            "response.created" | "response.in_progress" => {
                if let Some(id) = v.pointer("/response/id").and_then(Value::as_str) {
                    draft.response_id = Some(id.to_owned());
                }
            }
            "response.output_item.added" => {
                let item = v.get("item").unwrap_or(&Value::Null);
                match str_of(item, "type") {
                    "reasoning" => {
                        self.block_for(format!("r{oi}"), draft, || DraftBlock::Thinking {
                            thinking: String::new(),
                            signature: None,
                            redacted: false,
                        });
                    }
                    "function_call" => {
                        let block = DraftBlock::ToolCall {
                            id: str_of(item, "call_id").to_owned(),
                            name: str_of(item, "name").to_owned(),
                            arguments: str_of(item, "arguments").to_owned(),
                        };
                        self.block_for(format!("f{oi}"), draft, || block);
                    }
                    _ => {}
                }
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" if !delta.is_empty() => {
                let i = self.block_for(format!("r{oi}"), draft, || DraftBlock::Thinking {
                    thinking: String::new(),
                    signature: None,
                    redacted: false,
                });
                if let Some(DraftBlock::Thinking { thinking, .. }) = draft.blocks.get_mut(i) {
                    thinking.push_str(delta);
                    out.push_back(StreamDelta::Thinking(delta.to_owned()));
                }
            }
            "response.output_text.delta" if !delta.is_empty() => {
                let i = self.block_for(format!("t{oi}"), draft, || DraftBlock::Text(String::new()));
                if let Some(DraftBlock::Text(t)) = draft.blocks.get_mut(i) {
                    t.push_str(delta);
                    out.push_back(StreamDelta::Text(delta.to_owned()));
                }
            }
            "response.refusal.delta" => self.refusal.push_str(delta),
            "response.function_call_arguments.delta" => {
                if let Some(DraftBlock::ToolCall { arguments, .. }) =
                    self.slot(&format!("f{oi}")).and_then(|i| draft.blocks.get_mut(i))
                {
                    arguments.push_str(delta);
                }
            }
            "response.output_item.done" => {
                let item = v.get("item").unwrap_or(&Value::Null);
                match str_of(item, "type") {
                    "function_call" => {
                        let final_args = str_of(item, "arguments");
                        if let Some(DraftBlock::ToolCall { arguments, .. }) =
                            self.slot(&format!("f{oi}")).and_then(|i| draft.blocks.get_mut(i))
                        {
                            if !final_args.is_empty() {
                                final_args.clone_into(arguments);
                            }
                        }
                    }
                    "reasoning" => {
                        let i = self.block_for(format!("r{oi}"), draft, || DraftBlock::Thinking {
                            thinking: String::new(),
                            signature: None,
                            redacted: false,
                        });
                        if let Some(DraftBlock::Thinking { thinking, signature, .. }) = draft.blocks.get_mut(i) {
                            if thinking.is_empty() {
                                let summary =
                                    item.get("summary").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
                                *thinking = summary.iter().map(|s| str_of(s, "text")).collect::<Vec<_>>().join("\n\n");
                            }
                            *signature = Some(item.to_string());
                        }
                    }
                    _ => {}
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = v.get("response").unwrap_or(&Value::Null);
                if let Some(u) = usage_from(response) {
                    draft.usage = u;
                }
                if !self.refusal.is_empty() {
                    return Err(Fault::new(ErrorKind::Refusal, format!("the model refused: {}", self.refusal)));
                }
                let has_calls = draft.blocks.iter().any(|b| matches!(b, DraftBlock::ToolCall { .. }));
                let reason = response.pointer("/incomplete_details/reason").and_then(Value::as_str);
                draft.stop_reason =
                    Some(match (str_of(response, "status"), reason) {
                        ("incomplete", Some("content_filter")) => return Err(Fault::new(
                            ErrorKind::Refusal,
                            "the response was stopped by the provider's content filter (incomplete: content_filter)",
                        )),
                        ("incomplete", _) => StopReason::Length,
                        _ if has_calls => StopReason::ToolUse,
                        _ => StopReason::Stop,
                    });
                return Ok(true);
            }
            "response.failed" => {
                let err = v.pointer("/response/error").unwrap_or(&Value::Null);
                return Err(error_fault(err, "response failed"));
            }
            "error" => {
                let err = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
                return Err(error_fault(err, "error event"));
            }
            _ => {}
        }
        Ok(false)
    }

    fn eof(&mut self, _draft: &mut AssistantDraft) -> Result<(), Fault> {
        Err(Fault::new(ErrorKind::Unknown, "stream ended before the response was complete (no response.completed)"))
    }
}
