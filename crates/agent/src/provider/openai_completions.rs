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
pub(crate) const LAYOUT: wire::Layout = wire::Layout {
    api: Api::OpenaiCompletions,
    build: wire_form,
    lean: Some(lean_form),
    group_results: false,
    image_text_type: "text",
};

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

/// [`wire_form`] from a [`wire::Lean`] decoding, writing the same bytes without a JSON tree;
/// `None` for content with images (rare: those take [`wire_form`]).
fn lean_form(msg: &wire::Lean<'_>) -> Option<WireForm> {
    #[derive(serde::Serialize)]
    struct ToolMessage<'a> {
        role: &'static str,
        tool_call_id: &'a str,
        content: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Assistant<'a> {
        role: &'static str,
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<Call<'a>>,
    }
    #[derive(serde::Serialize)]
    struct Call<'a> {
        id: &'a str,
        r#type: &'static str,
        function: Function<'a>,
    }
    #[derive(serde::Serialize)]
    struct Function<'a> {
        name: &'a str,
        arguments: String,
    }
    let mut form = WireForm::default();
    let out = &mut form.items;
    match &*msg.role {
        "user" => {
            if msg.has("image") {
                return None;
            }
            match &msg.content {
                wire::LeanContent::Text(s) => wire::item(out, &wire::Said { role: "user", content: s }),
                _ => wire::item(out, &wire::Said { role: "user", content: &msg.joined_text() }),
            }
        }
        "assistant" => {
            let text = msg.joined_text();
            let tool_calls: Vec<Call<'_>> = msg
                .blocks()
                .iter()
                .filter(|b| b.kind == "toolCall")
                .map(|b| Call {
                    id: &b.id,
                    r#type: "function",
                    function: Function { name: &b.name, arguments: b.arguments().to_string() },
                })
                .collect();
            if text.is_empty() && tool_calls.is_empty() {
                return Some(form);
            }
            let content = (!text.is_empty()).then_some(text.as_str());
            wire::item(out, &Assistant { role: "assistant", content, tool_calls });
        }
        "toolResult" => {
            if msg.has("image") {
                return None;
            }
            let text = msg.joined_text();
            let content = if text.is_empty() { "(no output)" } else { &text };
            wire::item(out, &ToolMessage { role: "tool", tool_call_id: &msg.tool_call_id, content });
        }
        _ => return None,
    }
    Some(form)
}

/// Builds the request.
pub(crate) fn request(model: &ResolvedModel, req: &ModelRequest) -> WireRequest {
    let mut body = wire::Body::new();
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
    #[derive(serde::Serialize)]
    struct Tool<'a> {
        r#type: &'static str,
        function: Function<'a>,
    }
    #[derive(serde::Serialize)]
    struct Function<'a> {
        name: &'a str,
        description: &'a str,
        parameters: &'a Value,
    }
    body.tools(&req.tools, Api::OpenaiCompletions, |t| Tool {
        r#type: "function",
        function: Function { name: &t.name, description: &t.description, parameters: &t.parameters },
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
        let v: Value;
        let piece = match Piece::fast(data) {
            Some(p) => p,
            None => {
                v = serde_json::from_str(data).map_err(|e| invalid_json(&e, data))?;
                if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
                    let message = wire::error_message_from_value(&v).unwrap_or_else(|| err.to_string());
                    let kind = if wire::is_context_length_message(&err.to_string()) {
                        ErrorKind::ContextLength
                    } else {
                        ErrorKind::Unknown
                    };
                    return Err(Fault::new(kind, format!("error in stream: {message}")));
                }
                Piece::of(&v)
            }
        };
        if draft.response_id.is_none() {
            if let Some(id) = piece.id.filter(|s| !s.is_empty()) {
                draft.response_id = Some(id.into_owned());
            }
        }
        if let Some(u) = piece.usage {
            draft.usage = u;
        }
        if let Some(r) = piece.reasoning {
            draft.push_thinking(&r);
            out.push_back(StreamDelta::Thinking(r.into_owned()));
        }
        if let Some(t) = piece.content {
            draft.push_text(&t);
            out.push_back(StreamDelta::Text(t.into_owned()));
        }
        for tc in piece.tool_calls.iter() {
            self.tool_call_delta(tc, draft);
        }
        if let Some(f) = piece.finish {
            self.finish = Some(f.into_owned());
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

/// What one stream chunk (`chat.completion.chunk`) says, as far as the draft needs it.
#[derive(Debug, Default, PartialEq)]
struct Piece<'a> {
    id: Option<std::borrow::Cow<'a, str>>,
    usage: Option<Usage>,
    /// Non-empty reasoning of the first choice's delta.
    reasoning: Option<std::borrow::Cow<'a, str>>,
    /// Non-empty text of the first choice's delta.
    content: Option<std::borrow::Cow<'a, str>>,
    tool_calls: std::borrow::Cow<'a, [Value]>,
    finish: Option<std::borrow::Cow<'a, str>>,
}

/// The keys of a chunk that matter, each kept as its raw JSON (everything else is skipped).
#[derive(serde::Deserialize)]
struct RawChunk<'a> {
    #[serde(borrow, default)]
    error: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    usage: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    choices: Option<Vec<RawChoice<'a>>>,
}

#[derive(serde::Deserialize)]
struct RawChoice<'a> {
    #[serde(borrow, default)]
    delta: Option<RawDelta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
struct RawDelta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    reasoning_text: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a serde_json::value::RawValue>,
}

/// A JSON string's text (borrowed unless it has escapes); `None` for anything else.
fn raw_str(raw: Option<&serde_json::value::RawValue>) -> Option<std::borrow::Cow<'_, str>> {
    let raw = raw?.get();
    match serde_json::from_str::<&str>(raw) {
        Ok(s) => Some(std::borrow::Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(raw).ok().map(std::borrow::Cow::Owned),
    }
}

impl<'a> Piece<'a> {
    /// A chunk read without building a JSON tree: `None` (the caller reads it as a `Value`) for
    /// anything unusual (an error, duplicate keys, a key of an unexpected type), so both ways
    /// read every chunk alike.
    fn fast(data: &'a str) -> Option<Piece<'a>> {
        let c: RawChunk<'a> = serde_json::from_str(data).ok()?;
        if c.error.is_some_and(|e| e.get() != "null") {
            return None;
        }
        let mut p = Piece { id: raw_str(c.id), ..Piece::default() };
        if let Some(u) = c.usage.filter(|u| u.get() != "null") {
            p.usage = Some(usage_of(&serde_json::from_str(u.get()).ok()?)?);
        }
        let Some(choice) = c.choices.and_then(|c| c.into_iter().next()) else {
            return Some(p);
        };
        if let Some(d) = choice.delta {
            p.reasoning = [d.reasoning_content, d.reasoning, d.reasoning_text]
                .into_iter()
                .find_map(|r| raw_str(r).filter(|s| !s.is_empty()));
            p.content = raw_str(d.content).filter(|s| !s.is_empty());
            if let Some(tc) = d.tool_calls.filter(|t| t.get() != "null") {
                p.tool_calls = std::borrow::Cow::Owned(serde_json::from_str(tc.get()).ok()?);
            }
        }
        p.finish = raw_str(choice.finish_reason);
        Some(p)
    }

    /// The same read from a decoded chunk.
    fn of(v: &'a Value) -> Piece<'a> {
        let borrowed = |v: Option<&'a Value>| v.and_then(Value::as_str).map(std::borrow::Cow::Borrowed);
        let mut p = Piece { id: borrowed(v.get("id")), usage: v.get("usage").and_then(usage_of), ..Piece::default() };
        let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return p;
        };
        if let Some(delta) = choice.get("delta") {
            p.reasoning = ["reasoning_content", "reasoning", "reasoning_text"]
                .iter()
                .find_map(|k| borrowed(delta.get(*k)).filter(|s| !s.is_empty()));
            p.content = borrowed(delta.get("content")).filter(|s| !s.is_empty());
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                p.tool_calls = std::borrow::Cow::Borrowed(calls);
            }
        }
        p.finish = borrowed(choice.get("finish_reason"));
        p
    }
}

/// A chunk's `usage` object as Pi counts it; `None` when it is not an object.
fn usage_of(u: &Value) -> Option<Usage> {
    u.as_object()?;
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("/prompt_tokens_details/cached_tokens");
    Some(Usage {
        input: n("/prompt_tokens").saturating_sub(cached),
        output: n("/completion_tokens"),
        cache_read: cached,
        cache_write: 0,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast read of a chunk says what the decoded read says, and declines what it cannot read.
    #[test]
    fn chunks_read_fast_as_they_read_decoded() {
        let read = [
            r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"Hi \"there\" \u00e9\ud83d\ude00"},"finish_reason":null}]}"#,
            r#"{"id":"c1","choices":[{"delta":{"reasoning_content":"","reasoning":"think","content":null}}]}"#,
            r#"{"id":"c1","choices":[{"delta":{"reasoning_text":"why"}}]}"#,
            r#"{"id":"c1","choices":[{"delta":{},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":5}}}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"t","arguments":"{}"}}]}}]}"#,
            r#"{"id":null,"choices":null}"#,
            r#"{"id":"c1","choices":[{"delta":null,"finish_reason":"length"},{"delta":{"content":"second choice"}}]}"#,
            r#"{"error":null,"id":"c2","choices":[{"delta":{"content":"x"}}]}"#,
        ];
        for data in read {
            let fast = Piece::fast(data).unwrap_or_else(|| panic!("fast read declined {data}"));
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(fast, Piece::of(&v), "{data}");
        }
        let declined = [
            r#"{"error":{"message":"boom"}}"#,
            r#"{"id":"a","id":"b"}"#,
            r#"{"id":"c","choices":{"0":{}}}"#,
            r#"{"choices":[{"delta":"text"}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":{"index":0}}}]}"#,
            r#"{"usage":"lots"}"#,
            r#"not json"#,
        ];
        for data in declined {
            assert!(Piece::fast(data).is_none(), "{data}");
        }
    }

    /// An unusual chunk still decodes as before (through the decoded read).
    #[test]
    fn unusual_chunks_decode_through_the_value() {
        let mut d = Decoder::default();
        let mut draft = AssistantDraft::new();
        let mut out = VecDeque::new();
        let ev = |data: &str| SseEvent { event: "message".into(), data: data.to_owned(), id: None };
        let r = super::super::Decoder::event(
            &mut d,
            &ev(r#"{"id":"a","id":"b","choices":[{"delta":{"content":"x"}}]}"#),
            &mut draft,
            &mut out,
        );
        assert!(matches!(r, Ok(false)));
        assert_eq!(draft.response_id.as_deref(), Some("b"), "the last duplicate key wins, as in JSON.parse");
        assert!(matches!(out.pop_front(), Some(StreamDelta::Text(t)) if t == "x"));
        let r = super::super::Decoder::event(
            &mut d,
            &ev(r#"{"error":{"message":"maximum context length exceeded"}}"#),
            &mut draft,
            &mut out,
        );
        assert!(matches!(r, Err(f) if f.kind == ErrorKind::ContextLength));
    }
}
