//! Helpers shared by the request mappers and decoders: Pi's message clean-up before a call
//! (skipping failed assistant turns, closing orphaned tool calls), the request body writer over
//! the messages' cached wire forms, content block access, error-body reading and context-length
//! detection.

use std::collections::BTreeSet;

use crate::config::ResolvedModel;
use serde::Serialize;
use serde_json::{json, Value};

use crate::config::Api;
use crate::context::{ContextMessage, Kind, Messages, WireForm};

/// Text given to the model for a tool call whose result never arrived (an aborted run).
pub(crate) const NO_RESULT: &str = "No result provided";

/// Pi context messages → the messages a provider sees, handed to `each` in order:
/// `convert_to_llm` (dropped roles go), then (as Pi's `transformMessages`) assistant messages that
/// ended in `error` or `aborted` are skipped, tool calls without a result get an error result
/// before the next message, and tool results that answer no pending call are dropped (APIs reject
/// both kinds of orphan). Works on each message's cached facts only: nothing here walks a
/// message's content, and nothing is collected.
pub(crate) fn prepare(messages: &Messages, mut each: impl FnMut(&ContextMessage)) {
    let mut pending: Vec<(&str, &str)> = Vec::new();
    let mut answered: BTreeSet<&str> = BTreeSet::new();
    let close_pending =
        |each: &mut dyn FnMut(&ContextMessage), pending: &mut Vec<(&str, &str)>, answered: &mut BTreeSet<&str>| {
            for (id, name) in pending.drain(..) {
                if !answered.contains(id) {
                    each(&ContextMessage::new(json!({
                        "role": "toolResult", "toolCallId": id, "toolName": name,
                        "content": [{"type": "text", "text": NO_RESULT}], "isError": true, "timestamp": 0
                    })));
                }
            }
            answered.clear();
        };
    for msg in messages.iter() {
        match msg.kind() {
            Kind::Dropped | Kind::Assistant { failed: true, .. } => {}
            Kind::Assistant { calls, .. } => {
                close_pending(&mut each, &mut pending, &mut answered);
                pending.extend(calls.iter().map(|(id, name)| (id.as_str(), name.as_str())));
                each(msg);
            }
            Kind::ToolResult { id } => {
                if pending.iter().any(|(p, _)| p == id) && answered.insert(id) {
                    each(msg);
                }
            }
            Kind::User => {
                close_pending(&mut each, &mut pending, &mut answered);
                each(msg);
            }
        }
    }
    close_pending(&mut each, &mut pending, &mut answered);
}

/// How an API lists the messages of a request.
pub(crate) struct Layout {
    pub api: Api,
    /// One message's wire form (computed once per message, then cached on it).
    pub build: fn(&Value) -> WireForm,
    /// A run of tool results goes in one user message (Anthropic's `tool_result` blocks).
    pub group_results: bool,
    /// The text block type of the user message carrying a run's tool-result images.
    pub image_text_type: &'static str,
}

/// Appends `v` as JSON.
pub(crate) fn put(out: &mut Vec<u8>, v: &impl Serialize) {
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// Appends `v` as JSON followed by a comma (the shape of [`WireForm`] items).
pub(crate) fn item(out: &mut Vec<u8>, v: &Value) {
    put(out, v);
    out.push(b',');
}

/// Ends a comma-separated list: drops the trailing comma.
fn end_list(out: &mut Vec<u8>) {
    if out.last() == Some(&b',') {
        out.pop();
    }
}

/// Writes the context's prepared messages as comma-terminated elements of the body's message
/// array, each message's wire form built once and then copied as bytes.
pub(crate) fn write_messages(out: &mut Vec<u8>, messages: &Messages, layout: &Layout) {
    let mut results: Vec<u8> = Vec::new();
    let mut images: Vec<u8> = Vec::new();
    let flush = |out: &mut Vec<u8>, results: &mut Vec<u8>, images: &mut Vec<u8>| {
        if !results.is_empty() {
            out.extend_from_slice(br#"{"role":"user","content":["#);
            out.append(results);
            end_list(out);
            out.extend_from_slice(b"]},");
        }
        if !images.is_empty() {
            out.extend_from_slice(br#"{"role":"user","content":["#);
            item(out, &json!({"type": layout.image_text_type, "text": "Attached image(s) from tool result:"}));
            out.append(images);
            end_list(out);
            out.extend_from_slice(b"]},");
        }
    };
    prepare(messages, |m| {
        let is_result = matches!(m.kind(), Kind::ToolResult { .. });
        if !is_result {
            flush(out, &mut results, &mut images);
        }
        let form = m.wire(layout.api, layout.build);
        if is_result && layout.group_results {
            results.extend_from_slice(&form.items);
        } else {
            out.extend_from_slice(&form.items);
        }
        images.extend_from_slice(&form.images);
    });
    flush(out, &mut results, &mut images);
}

/// Request bodies of long contexts are megabytes. Their buffers are kept (a bounded few) and
/// reused, so a turn does not map, fault in, zero and unmap fresh pages for every body.
mod pool {
    use std::sync::Mutex;

    /// Smaller buffers come from the allocator as usual.
    const MIN_POOLED: usize = 256 * 1024;
    /// Bytes of capacity kept for reuse at most.
    const MAX_POOLED_BYTES: usize = 48 * 1024 * 1024;

    static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

    fn free() -> std::sync::MutexGuard<'static, Vec<Vec<u8>>> {
        pincer_pi::lock(&FREE)
    }

    /// An empty buffer with room for `n` bytes.
    pub fn take(n: usize) -> Vec<u8> {
        if n < MIN_POOLED {
            return Vec::with_capacity(n);
        }
        let mut free = free();
        if let Some(i) = free.iter().position(|b| b.capacity() >= n) {
            return free.swap_remove(i);
        }
        // The kept buffers are too small for the context now: give the largest up, and leave room
        // for the context to grow for a while.
        if let Some(i) = (0..free.len()).max_by_key(|&i| free[i].capacity()) {
            free.swap_remove(i);
        }
        Vec::with_capacity(n + n / 4)
    }

    /// A body's bytes; the buffer goes back to the pool when the last reference is dropped.
    pub struct Pooled(pub Vec<u8>);

    impl AsRef<[u8]> for Pooled {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Pooled {
        fn drop(&mut self) {
            let mut buf = std::mem::take(&mut self.0);
            if buf.capacity() < MIN_POOLED {
                return;
            }
            buf.clear();
            let mut free = free();
            let mut kept: usize = free.iter().map(Vec::capacity).sum();
            // Keep the newest; drop the smallest kept ones while over the budget.
            free.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
            while kept + buf.capacity() > MAX_POOLED_BYTES {
                match free.pop() {
                    Some(b) => kept -= b.capacity(),
                    None => return,
                }
            }
            free.push(buf);
        }
    }
}

/// A JSON object written field by field, in order.
pub(crate) struct Body(Vec<u8>);

impl Body {
    /// A body with room for `messages`' wire forms (building any not built yet) and `extra` bytes.
    pub(crate) fn for_messages(messages: &Messages, layout: &Layout, extra: usize) -> Body {
        let size: usize = messages
            .iter()
            .map(|m| {
                let f = m.wire(layout.api, layout.build);
                f.items.len() + f.images.len()
            })
            .sum();
        Body::with_capacity(size + extra)
    }

    pub(crate) fn with_capacity(n: usize) -> Body {
        let mut out = pool::take(n);
        out.push(b'{');
        Body(out)
    }

    fn key(&mut self, key: &str) {
        if self.0.len() > 1 {
            self.0.push(b',');
        }
        put(&mut self.0, &key);
        self.0.push(b':');
    }

    /// A field with a serialized value.
    pub(crate) fn field(&mut self, key: &str, value: &impl Serialize) {
        self.key(key);
        put(&mut self.0, value);
    }

    /// A field whose value is an array of comma-terminated elements written by `write`.
    pub(crate) fn list(&mut self, key: &str, write: impl FnOnce(&mut Vec<u8>)) {
        self.key(key);
        self.0.push(b'[');
        write(&mut self.0);
        end_list(&mut self.0);
        self.0.push(b']');
    }

    /// `tools`, each spelled as the API wants a function declared; left out when the run has none.
    /// `spell` borrows from the spec (the schemas are serialized from where they are, not copied).
    pub(crate) fn tools<'a, T: Serialize>(
        &mut self,
        tools: &'a [super::ToolSpec],
        spell: impl Fn(&'a super::ToolSpec) -> T,
    ) {
        if !tools.is_empty() {
            self.field("tools", &tools.iter().map(spell).collect::<Vec<T>>());
        }
    }

    /// The finished request: `POST {base_url}{path}` with this body, the API's headers, and the
    /// provider's key as `key_header` (prefixed `Bearer ` for `authorization`) when it has one.
    pub(crate) fn request(
        self,
        model: &ResolvedModel,
        path: &str,
        mut headers: Vec<(String, String)>,
        key_header: &str,
    ) -> super::WireRequest {
        if let Some(key) = &model.provider.api_key {
            let value = if key_header == "authorization" { format!("Bearer {key}") } else { key.clone() };
            headers.push((key_header.to_owned(), value));
        }
        super::WireRequest { url: format!("{}{path}", model.provider.base_url), headers, body: self.finish() }
    }

    pub(crate) fn finish(mut self) -> bytes::Bytes {
        self.0.push(b'}');
        bytes::Bytes::from_owner(pool::Pooled(self.0))
    }
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
        let shared: Messages = input.into_iter().map(ContextMessage::shared).collect();
        let mut prepared = Vec::new();
        prepare(&shared, |m| prepared.push(m.value()));
        assert_eq!(
            prepared,
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
