//! `openai-completions`: `POST {base_url}/chat/completions` with `stream: true` and
//! `stream_options.include_usage`, for OpenAI and OpenAI-compatible local servers.
//!
//! Quirks handled: no usage chunk (usage stays zero), usage on the finish chunk, `reasoning_content`
//! / `reasoning` deltas (thinking), tool-call deltas split over many chunks (keyed by `index`,
//! falling back to `id`), tool calls finished with `stop` instead of `tool_calls`, a missing
//! `[DONE]` after a finish reason, and `{"error":…}` objects inside the stream.

use std::collections::VecDeque;

use serde_json::{json, Map, Value};

use super::wire::{self, block_type, blocks, content_string, data_url, images, joined_text, str_of};
use super::{ErrorKind, Fault, ModelRequest, StreamDelta, WireRequest};
use crate::config::{Api, ResolvedModel};
use crate::context::WireForm;
use crate::message::{AssistantDraft, DraftBlock, StopReason, Usage};
use crate::sse::SseEvent;

/// How this API lists messages.
const LAYOUT: wire::Layout =
    wire::Layout { api: Api::OpenaiCompletions, build: wire_form, group_results: false, image_text_type: "text" };

/// One message on this API's wire (cached on the message).
fn wire_form(msg: &Value) -> WireForm {
    let mut form = WireForm::default();
    let out = &mut form.items;
    match wire::role(msg) {
        "user" => {
            if let Some(s) = content_string(msg) {
                wire::item(out, &json!({"role": "user", "content": s}));
                return form;
            }
            let content = blocks(msg);
            if images(content).is_empty() {
                wire::item(out, &json!({"role": "user", "content": joined_text(content)}));
                return form;
            }
            let parts: Vec<Value> = content
                .iter()
                .filter_map(|b| match block_type(b) {
                    "text" => Some(json!({"type": "text", "text": str_of(b, "text")})),
                    "image" => Some(json!({"type": "image_url", "image_url": {"url": data_url(b)}})),
                    _ => None,
                })
                .collect();
            wire::item(out, &json!({"role": "user", "content": parts}));
        }
        "assistant" => {
            let content = blocks(msg);
            let text = joined_text(content);
            let calls: Vec<Value> = content
                .iter()
                .filter(|b| block_type(b) == "toolCall")
                .map(|b| {
                    let args = b.get("arguments").cloned().unwrap_or_else(|| json!({}));
                    json!({"id": str_of(b, "id"), "type": "function",
                           "function": {"name": str_of(b, "name"), "arguments": args.to_string()}})
                })
                .collect();
            if text.is_empty() && calls.is_empty() {
                return form;
            }
            let mut m = Map::new();
            m.insert("role".into(), "assistant".into());
            m.insert("content".into(), if text.is_empty() { Value::Null } else { text.into() });
            if !calls.is_empty() {
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            wire::item(out, &Value::Object(m));
        }
        "toolResult" => {
            let content = blocks(msg);
            let text = joined_text(content);
            let imgs = images(content);
            let text = match (text.is_empty(), imgs.is_empty()) {
                (false, _) => text,
                (true, false) => "(see attached image)".to_owned(),
                (true, true) => "(no output)".to_owned(),
            };
            wire::item(out, &json!({"role": "tool", "tool_call_id": str_of(msg, "toolCallId"), "content": text}));
            for i in imgs {
                wire::item(&mut form.images, &json!({"type": "image_url", "image_url": {"url": data_url(i)}}));
            }
        }
        _ => {}
    }
    form
}

/// Builds the request.
pub(crate) fn request(model: &ResolvedModel, req: &ModelRequest) -> WireRequest {
    let mut body = wire::Body::for_messages(&req.messages, &LAYOUT, 4096);
    body.field("model", &model.model.id);
    body.list("messages", |out| {
        if let Some(system) = req.system_prompt.as_deref().filter(|s| !s.is_empty()) {
            wire::item(out, &json!({"role": "system", "content": system}));
        }
        wire::write_messages(out, &req.messages, &LAYOUT);
    });
    body.field("stream", &true);
    body.field("stream_options", &json!({"include_usage": true}));
    if let Some(max) = model.model.max_tokens {
        // OpenAI itself wants the new name (required by its reasoning models); local servers know the old one.
        let key =
            if model.provider.base_url.contains("api.openai.com") { "max_completion_tokens" } else { "max_tokens" };
        body.field(key, &max);
    }
    body.tools(&req.tools, |t| {
        json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}})
    });
    body.request(model, "/chat/completions", Vec::new(), "authorization")
}

/// Stream decoder.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// (`index` or id key, draft block index) per tool call.
    tool_slots: Vec<(String, usize)>,
    finish: Option<String>,
}

impl Decoder {
    fn finish(&mut self, draft: &mut AssistantDraft) -> Result<(), Fault> {
        let has_calls = draft.blocks.iter().any(|b| matches!(b, DraftBlock::ToolCall { .. }));
        let stop = match self.finish.as_deref() {
            Some("length") => StopReason::Length,
            Some("content_filter") => {
                return Err(Fault::new(
                    ErrorKind::Refusal,
                    "the response was stopped by the provider's content filter (finish_reason content_filter)",
                ))
            }
            _ if has_calls => StopReason::ToolUse,
            _ => StopReason::Stop,
        };
        draft.stop_reason = Some(stop);
        Ok(())
    }
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
            self.finish(draft)?;
            return Ok(true);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| invalid_json(&e, data))?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let message = wire::error_message_from_value(&v).unwrap_or_else(|| err.to_string());
            let kind = if wire::is_context_length_message(&err.to_string()) {
                ErrorKind::ContextLength
            } else {
                ErrorKind::Unknown
            };
            return Err(Fault::new(kind, format!("error in stream: {message}")));
        }
        if draft.response_id.is_none() {
            if let Some(id) = v.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                draft.response_id = Some(id.to_owned());
            }
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            let cached = n("/prompt_tokens_details/cached_tokens");
            draft.usage = Usage {
                input: n("/prompt_tokens").saturating_sub(cached),
                output: n("/completion_tokens"),
                cache_read: cached,
                cache_write: 0,
            };
        }
        let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return Ok(false);
        };
        if let Some(delta) = choice.get("delta") {
            let reasoning = ["reasoning_content", "reasoning", "reasoning_text"]
                .iter()
                .find_map(|k| delta.get(*k).and_then(Value::as_str).filter(|s| !s.is_empty()));
            if let Some(r) = reasoning {
                draft.push_thinking(r);
                out.push_back(StreamDelta::Thinking(r.to_owned()));
            }
            if let Some(t) = delta.get("content").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                draft.push_text(t);
                out.push_back(StreamDelta::Text(t.to_owned()));
            }
            for tc in delta.get("tool_calls").and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
                self.tool_call_delta(tc, draft);
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
        Ok(false)
    }

    fn eof(&mut self, draft: &mut AssistantDraft) -> Result<(), Fault> {
        if self.finish.is_none() {
            return Err(Fault::new(
                ErrorKind::Unknown,
                "stream ended before the response was complete (no finish_reason and no [DONE])",
            ));
        }
        self.finish(draft)
    }
}

impl Decoder {
    fn tool_call_delta(&mut self, tc: &Value, draft: &mut AssistantDraft) {
        let id = str_of(tc, "id");
        let key = match tc.get("index").and_then(Value::as_u64) {
            Some(i) => format!("#{i}"),
            None if !id.is_empty() => format!("id:{id}"),
            None => self.tool_slots.last().map_or_else(|| "#0".to_owned(), |(k, _)| k.clone()),
        };
        let name = tc.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
        let args = tc.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default();
        let slot = self.tool_slots.iter().find(|(k, _)| *k == key).map(|(_, i)| *i);
        match slot.and_then(|i| draft.blocks.get_mut(i)) {
            Some(DraftBlock::ToolCall { id: bid, name: bname, arguments }) => {
                if bid.is_empty() {
                    id.clone_into(bid);
                }
                if bname.is_empty() {
                    name.clone_into(bname);
                }
                arguments.push_str(args);
            }
            _ => {
                let id = if id.is_empty() { format!("call_{}", self.tool_slots.len()) } else { id.to_owned() };
                draft.blocks.push(DraftBlock::ToolCall { id, name: name.to_owned(), arguments: args.to_owned() });
                self.tool_slots.push((key, draft.blocks.len() - 1));
            }
        }
    }
}

pub(crate) fn invalid_json(e: &serde_json::Error, data: &str) -> Fault {
    let mut snippet: String = data.chars().take(200).collect();
    if snippet.len() < data.len() {
        snippet.push('…');
    }
    Fault::new(ErrorKind::Unknown, format!("invalid JSON in stream event ({e}): {snippet}"))
}
