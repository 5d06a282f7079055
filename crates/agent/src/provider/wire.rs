//! Helpers shared by the request mappers and decoders: Pi's message clean-up before a call
//! (skipping failed assistant turns, closing orphaned tool calls), the request body over the
//! messages' cached wire forms and the context's prefix (a rope of pieces, sent as they are),
//! a message's lean decoding (no JSON tree) for building its wire form, content block access,
//! error-body reading and context-length detection.

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::config::ResolvedModel;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use crate::config::Api;
use crate::context::{ContextMessage, Kind, Messages, WireForm};

/// Text given to the model for a tool call whose result never arrived (an aborted run).
pub(crate) const NO_RESULT: &str = "No result provided";

/// What [`prepare`] hands on.
pub(crate) enum Step<'a> {
    /// The next message to send.
    Send(&'a ContextMessage),
    /// The context's first `n` messages are done and no tool call waits for its result: how the
    /// messages after them are sent does not depend on them.
    Settled(usize),
}

/// Pi context messages → the messages a provider sees, handed to `each` in order:
/// `convert_to_llm` (dropped roles go), then (as Pi's `transformMessages`) assistant messages that
/// ended in `error` or `aborted` are skipped, tool calls without a result get an error result
/// before the next message, and tool results that answer no pending call are dropped (APIs reject
/// both kinds of orphan). Works on each message's cached facts only: nothing here walks a
/// message's content, and nothing is collected. Starts at message `from`, which must be a point
/// where an earlier pass said [`Step::Settled`].
pub(crate) fn prepare(messages: &Messages, from: usize, mut each: impl FnMut(Step<'_>)) {
    let mut pending: Vec<(&str, &str)> = Vec::new();
    let mut answered: BTreeSet<&str> = BTreeSet::new();
    let close_pending =
        |each: &mut dyn FnMut(Step<'_>), pending: &mut Vec<(&str, &str)>, answered: &mut BTreeSet<&str>| {
            for (id, name) in pending.drain(..) {
                if !answered.contains(id) {
                    each(Step::Send(&ContextMessage::new(json!({
                        "role": "toolResult", "toolCallId": id, "toolName": name,
                        "content": [{"type": "text", "text": NO_RESULT}], "isError": true, "timestamp": 0
                    }))));
                }
            }
            answered.clear();
        };
    for (i, msg) in messages.iter_from(from).enumerate() {
        match msg.kind() {
            Kind::Dropped | Kind::Assistant { failed: true, .. } => {}
            Kind::Assistant { calls, .. } => {
                close_pending(&mut each, &mut pending, &mut answered);
                pending.extend(calls.iter().map(|(id, name)| (id.as_str(), name.as_str())));
                each(Step::Send(msg));
            }
            Kind::ToolResult { id } => {
                if pending.iter().any(|(p, _)| p == id) && answered.insert(id) {
                    each(Step::Send(msg));
                }
            }
            Kind::User => {
                close_pending(&mut each, &mut pending, &mut answered);
                each(Step::Send(msg));
            }
        }
        // With no call pending, what `answered` holds no longer matters: it is cleared before the
        // next call is looked at.
        if pending.is_empty() {
            each(Step::Settled(from + i + 1));
        }
    }
    close_pending(&mut each, &mut pending, &mut answered);
}

/// How an API lists the messages of a request.
pub(crate) struct Layout {
    pub api: Api,
    /// One message's wire form (computed once per message, then cached on it).
    pub build: fn(&Value) -> WireForm,
    /// The same from a [`Lean`] decoding, where the API has one (`None` from it: that message
    /// takes `build`).
    pub lean: Option<fn(&Lean<'_>) -> Option<WireForm>>,
    /// A run of tool results goes in one user message (Anthropic's `tool_result` blocks).
    pub group_results: bool,
    /// The text block type of the user message carrying a run's tool-result images.
    pub image_text_type: &'static str,
}

/// Where JSON text is appended: a mapper's buffer, or a request body's [`Rope`].
pub(crate) trait Out: std::io::Write {
    /// Appends bytes.
    fn bytes(&mut self, b: &[u8]);
}

impl Out for Vec<u8> {
    fn bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Appends `v` as JSON.
pub(crate) fn put(out: &mut impl Out, v: &impl Serialize) {
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.bytes(b"null");
    }
}

/// Appends `v` as JSON followed by a comma (the shape of [`WireForm`] items).
pub(crate) fn item(out: &mut impl Out, v: &impl Serialize) {
    put(out, v);
    out.bytes(b",");
}

/// Writes the context's prepared messages as comma-terminated elements of the body's message
/// array. The bytes of the messages an earlier request of this context already wrote (see
/// [`Messages::prefix`]) are sent as they are; the rest is copied from each message's wire form
/// (built once per message), and this request's bytes up to its last settled point become the
/// context's prefix for the next request.
pub(crate) fn write_messages(out: &mut Rope, messages: &Messages, layout: &Layout) {
    let (from, mut segments) = messages.prefix(layout.api).unwrap_or_default();
    for s in &segments {
        out.share(s);
    }
    let size: usize = messages
        .iter_from(from)
        .map(|m| {
            let f = m.wire(layout);
            f.items.len() + f.images.len()
        })
        .sum();
    let mut fresh: Vec<u8> = Vec::with_capacity(size + 1024);
    let mut results: Vec<u8> = Vec::new();
    let mut images: Vec<u8> = Vec::new();
    let mut settled = None;
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
    prepare(messages, from, |step| match step {
        Step::Send(m) => {
            let is_result = matches!(m.kind(), Kind::ToolResult { .. });
            if !is_result {
                flush(&mut fresh, &mut results, &mut images);
            }
            let form = m.wire(layout);
            if is_result && layout.group_results {
                results.extend_from_slice(&form.items);
            } else {
                fresh.extend_from_slice(&form.items);
            }
            images.extend_from_slice(&form.images);
        }
        Step::Settled(n) => {
            if results.is_empty() && images.is_empty() {
                settled = Some((n, fresh.len()));
            }
        }
    });
    flush(&mut fresh, &mut results, &mut images);
    let fresh = Bytes::from(fresh);
    out.share(&fresh);
    if let Some((n, at)) = settled.filter(|&(n, _)| n > from) {
        segments.push(fresh.slice(..at));
        merge_segments(&mut segments);
        messages.set_prefix(layout.api, n, segments);
    }
}

/// Merges the last two segments of a prefix while the last is at least half the one before it:
/// as in a binary counter, the pieces stay few (about log2 of the turns since the first), and a
/// byte is copied a few times in all, not once per turn.
fn merge_segments(segments: &mut Vec<Bytes>) {
    while let [.., a, b] = segments.as_slice() {
        if a.len() >= 2 * b.len() {
            break;
        }
        let mut joined = Vec::with_capacity(a.len() + b.len());
        joined.extend_from_slice(a);
        joined.extend_from_slice(b);
        segments.truncate(segments.len() - 2);
        segments.push(joined.into());
    }
}

/// Ends a comma-separated list in a buffer: drops the trailing comma.
fn end_list(out: &mut Vec<u8>) {
    if out.last() == Some(&b',') {
        out.pop();
    }
}

/// A request body as a list of byte pieces: JSON written here, and bytes shared from elsewhere
/// (a context's prefix) without a copy.
#[derive(Debug, Default)]
pub(crate) struct Rope {
    pieces: Vec<Bytes>,
    /// Literal bytes after the last piece.
    lit: Vec<u8>,
    len: usize,
}

impl std::io::Write for Rope {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.bytes(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Out for Rope {
    fn bytes(&mut self, b: &[u8]) {
        self.lit.extend_from_slice(b);
        self.len += b.len();
    }
}

impl Rope {
    fn close_lit(&mut self) {
        if !self.lit.is_empty() {
            self.pieces.push(Bytes::from(std::mem::take(&mut self.lit)));
        }
    }

    /// Appends `b` by reference.
    fn share(&mut self, b: &Bytes) {
        if !b.is_empty() {
            self.close_lit();
            self.pieces.push(b.clone());
            self.len += b.len();
        }
    }

    /// Ends a comma-separated list: drops the trailing comma.
    fn end_list(&mut self) {
        if !self.lit.is_empty() {
            let before = self.lit.len();
            end_list(&mut self.lit);
            self.len -= before - self.lit.len();
        } else if let Some(piece) = self.pieces.last_mut() {
            if piece.last() == Some(&b',') {
                piece.truncate(piece.len() - 1);
                self.len -= 1;
            }
        }
    }

    fn finish(mut self) -> Payload {
        self.close_lit();
        Payload { pieces: self.pieces.into(), len: self.len }
    }
}

/// A finished request body: its pieces, shared by the attempts of a retried request.
#[derive(Debug, Clone)]
pub struct Payload {
    pieces: std::sync::Arc<[Bytes]>,
    len: usize,
}

impl Payload {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty body (never, for a JSON object).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body as it is sent: its pieces, shared (a long context's prefix is not copied again).
    pub(crate) fn stream(&self) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
        futures::stream::iter((0..self.pieces.len()).map({
            let pieces = self.pieces.clone();
            move |i| Ok(pieces[i].clone())
        }))
    }

    /// The whole body in one buffer (for tests and benchmarks; a request streams its pieces).
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.len);
        for p in self.pieces.iter() {
            out.extend_from_slice(p);
        }
        out.into()
    }
}

/// A tool declaration's JSON for each wire format that has offered it (see [`Body::tools`]).
/// Equal to any other: it is a cache of what the declaration's fields say.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spelled(std::sync::Arc<[std::sync::OnceLock<Bytes>; 3]>);

impl PartialEq for Spelled {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Spelled {
    fn get(&self, api: Api, spell: impl FnOnce() -> Bytes) -> &Bytes {
        let slot = match api {
            Api::OpenaiCompletions | Api::PincerEcho => 0,
            Api::OpenaiResponses => 1,
            Api::AnthropicMessages => 2,
        };
        self.0[slot].get_or_init(spell)
    }
}

/// A JSON object written field by field, in order.
pub(crate) struct Body(Rope);

impl Body {
    pub(crate) fn new() -> Body {
        let mut out = Rope::default();
        out.bytes(b"{");
        Body(out)
    }

    fn key(&mut self, key: &str) {
        if self.0.len > 1 {
            self.0.bytes(b",");
        }
        put(&mut self.0, &key);
        self.0.bytes(b":");
    }

    /// A field with a serialized value.
    pub(crate) fn field(&mut self, key: &str, value: &impl Serialize) {
        self.key(key);
        put(&mut self.0, value);
    }

    /// A field whose value is an array of comma-terminated elements written by `write`.
    pub(crate) fn list(&mut self, key: &str, write: impl FnOnce(&mut Rope)) {
        self.key(key);
        self.0.bytes(b"[");
        write(&mut self.0);
        self.0.end_list();
        self.0.bytes(b"]");
    }

    /// `tools`, each spelled as the API wants a function declared; left out when the run has none.
    /// A tool's declaration is serialized by `spell` the first time `api` offers it, and its bytes
    /// are shared by every later request (a schema is not serialized again per model call).
    pub(crate) fn tools<'a, T: Serialize>(
        &mut self,
        tools: &'a [super::ToolSpec],
        api: Api,
        spell: impl Fn(&'a super::ToolSpec) -> T,
    ) {
        if tools.is_empty() {
            return;
        }
        self.key("tools");
        self.0.bytes(b"[");
        for (i, t) in tools.iter().enumerate() {
            if i > 0 {
                self.0.bytes(b",");
            }
            let bytes = t.spelled.get(api, || {
                let mut out = Vec::new();
                put(&mut out, &spell(t));
                Bytes::from(out)
            });
            self.0.share(bytes);
        }
        self.0.bytes(b"]");
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

    fn finish(mut self) -> Payload {
        self.0.bytes(b"}");
        self.0.finish()
    }
}

/// A `user`, `assistant` or `toolResult` message (the roles sent as they are) decoded straight from
/// its JSON text, without a JSON tree: strings borrowed from the text where they have no escapes,
/// the fields no request reads (usage, model, timestamps…) skipped unread. The first request after a
/// start, a branch switch or a compaction decodes every message of the context; decoding them as
/// values was most of that pass. Only what decodes cleanly is taken: another role, a field of an
/// unexpected type or a repeated field gives `None` from [`Lean::parse`], and the message is
/// decoded as a value, whose reading (see [`str_of`], [`blocks`]) is lenient.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Lean<'a> {
    #[serde(borrow)]
    pub role: Cow<'a, str>,
    #[serde(borrow, default)]
    pub content: LeanContent<'a>,
    #[serde(borrow, default, rename = "toolCallId")]
    pub tool_call_id: Cow<'a, str>,
    #[serde(borrow, default, rename = "stopReason")]
    pub stop_reason: Cow<'a, str>,
    /// The API that wrote an assistant message (thinking goes back only to the same API).
    #[serde(borrow, default)]
    pub api: Cow<'a, str>,
    /// `None` when missing or `null`.
    #[serde(default, rename = "isError")]
    pub is_error: Option<bool>,
}

/// A [`Lean`] message's content: missing or `null`, a string, or a list of blocks.
#[derive(Debug, Default)]
pub(crate) enum LeanContent<'a> {
    #[default]
    Missing,
    Text(Cow<'a, str>),
    Blocks(Vec<LeanBlock<'a>>),
}

/// A content block of a [`Lean`] message, with the fields the request mappers read of it.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct LeanBlock<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Cow<'a, str>,
    #[serde(borrow, default)]
    pub text: Cow<'a, str>,
    #[serde(borrow, default)]
    pub id: Cow<'a, str>,
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub thinking: Cow<'a, str>,
    #[serde(borrow, default, rename = "thinkingSignature")]
    pub thinking_signature: Cow<'a, str>,
    /// `None` when missing or `null`.
    #[serde(default)]
    pub redacted: Option<bool>,
    /// `Some(Value::Null)` for an explicit `null`, `None` when missing.
    #[serde(default, deserialize_with = "present")]
    pub arguments: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for LeanContent<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = LeanContent<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, a list of content blocks or null")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(LeanContent::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LeanContent::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(LeanContent::Text(Cow::Owned(s)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(LeanContent::Missing)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(2));
                while let Some(b) = seq.next_element()? {
                    blocks.push(b);
                }
                Ok(LeanContent::Blocks(blocks))
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

impl LeanBlock<'_> {
    /// A tool call's arguments as the value path has them (`{}` when missing).
    pub fn arguments(&self) -> Value {
        self.arguments.clone().unwrap_or_else(|| json!({}))
    }
}

/// A `{"role": …, "content": …}` message, as the lean request mappers write it.
#[derive(serde::Serialize)]
pub(crate) struct Said<C> {
    pub role: &'static str,
    pub content: C,
}

/// A `{"type": …, "text": …}` part, as the lean request mappers write it.
#[derive(serde::Serialize)]
pub(crate) struct TextPart<'a> {
    pub r#type: &'static str,
    pub text: &'a str,
}

impl<'a> Lean<'a> {
    /// Decodes `json`; `None` unless it is a message of a role sent as it is, cleanly typed.
    pub fn parse(json: &'a str) -> Option<Lean<'a>> {
        let m: Lean<'a> = serde_json::from_str(json).ok()?;
        matches!(&*m.role, "user" | "assistant" | "toolResult").then_some(m)
    }

    /// The content blocks (none when the content is a string or missing: as [`blocks`]).
    pub fn blocks(&self) -> &[LeanBlock<'a>] {
        match &self.content {
            LeanContent::Blocks(b) => b,
            _ => &[],
        }
    }

    /// Text blocks joined with `\n` (as [`joined_text`]).
    pub fn joined_text(&self) -> String {
        self.blocks().iter().filter(|b| b.kind == "text").map(|b| &*b.text).collect::<Vec<_>>().join("\n")
    }

    /// True when a content block is of type `kind`.
    pub fn has(&self, kind: &str) -> bool {
        self.blocks().iter().any(|b| b.kind == kind)
    }

    /// The message's role in the pre-call clean-up.
    pub(crate) fn kind(&self) -> Kind {
        match &*self.role {
            "assistant" => Kind::Assistant {
                failed: self.stop_reason == "error" || self.stop_reason == "aborted",
                calls: self
                    .blocks()
                    .iter()
                    .filter(|b| b.kind == "toolCall")
                    .map(|b| (b.id.clone().into_owned(), b.name.clone().into_owned()))
                    .collect(),
            },
            "toolResult" => Kind::ToolResult { id: self.tool_call_id.clone().into_owned() },
            _ => Kind::User,
        }
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
        prepare(&shared, 0, |s| {
            if let Step::Send(m) = s {
                prepared.push(m.value())
            }
        });
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

    /// The message array `write_messages` writes for `messages`, as one buffer.
    fn written(messages: &Messages, layout: &Layout) -> Vec<u8> {
        let mut body = Body::new();
        body.list("m", |out| write_messages(out, messages, layout));
        body.finish().to_bytes().to_vec()
    }

    /// A context with every shape the clean-up cares about, from a seed: plain and image user
    /// messages, assistant turns with and without tool calls, failed ones, results that answer,
    /// come twice or answer nothing, results with images, and messages Pi converts or drops.
    fn random_message(seed: &mut u64, open_calls: &mut Vec<String>) -> Value {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let r = (*seed >> 33) as usize;
        let n = r % 100;
        let img = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
        match r % 9 {
            0 | 1 => json!({"role": "user", "content": format!("question {n}"), "timestamp": n}),
            2 => {
                let calls: Vec<Value> = (0..=r % 3)
                    .map(|k| {
                        let id = format!("c{n}_{k}");
                        open_calls.push(id.clone());
                        json!({"type": "toolCall", "id": id, "name": "read", "arguments": {"k": k}})
                    })
                    .collect();
                let stop = if r.is_multiple_of(7) { "error" } else { "toolUse" };
                json!({"role": "assistant", "content": calls, "stopReason": stop, "timestamp": n})
            }
            3 | 4 => {
                let id = match open_calls.len() {
                    0 => "nobody".to_owned(),
                    len => open_calls[r % len].clone(),
                };
                let mut content = vec![json!({"type": "text", "text": format!("result {n}")})];
                if r.is_multiple_of(5) {
                    content.push(img);
                }
                json!({"role": "toolResult", "toolCallId": id, "toolName": "read", "content": content, "isError": false, "timestamp": n})
            }
            5 => {
                json!({"role": "assistant", "content": [{"type": "text", "text": format!("answer {n}")}], "stopReason": if r.is_multiple_of(4) { "aborted" } else { "stop" }, "timestamp": n})
            }
            6 => json!({"role": "user", "content": [{"type": "text", "text": "look"}, img], "timestamp": n}),
            7 => {
                json!({"role": "bashExecution", "command": "ls", "output": "a", "exitCode": 0, "cancelled": false, "truncated": false, "timestamp": n})
            }
            _ => json!({"role": "custom", "customType": "note", "content": "hidden", "display": false, "timestamp": n}),
        }
    }

    #[test]
    fn a_body_written_on_a_prefix_is_the_body_written_whole() {
        let layouts = [
            &super::super::openai_completions::LAYOUT,
            &super::super::openai_responses::LAYOUT,
            &super::super::anthropic::LAYOUT,
        ];
        for (seed0, layout) in (1..=6u64).zip(layouts.iter().cycle()) {
            let mut seed = seed0;
            let mut open_calls = Vec::new();
            let mut a = Messages::new();
            let mut used = 0;
            for turn in 0..400 {
                a.push(ContextMessage::shared(random_message(&mut seed, &mut open_calls)));
                if turn % 3 != 0 {
                    continue;
                }
                let fresh: Messages = a.iter().cloned().collect();
                assert_eq!(written(&a, layout), written(&fresh, layout), "seed {seed0}, {} messages", a.len());
                if let Some((n, segments)) = a.prefix(layout.api) {
                    used += 1;
                    assert!(n <= a.len());
                    assert!(segments.len() <= 12, "{} segments after {} messages", segments.len(), a.len());
                }
            }
            assert!(used > 100, "seed {seed0}: the prefix was there for {used} of 133 requests");

            // Clones that go different ways share the prefixes' home, never each other's bytes.
            let mut b = a.clone();
            for _ in 0..40 {
                a.push(ContextMessage::shared(random_message(&mut seed, &mut open_calls)));
                b.push(ContextMessage::shared(random_message(&mut seed, &mut open_calls)));
                for m in [&a, &b] {
                    let fresh: Messages = m.iter().cloned().collect();
                    assert_eq!(written(m, layout), written(&fresh, layout), "seed {seed0}, a fork");
                }
            }
        }
    }

    #[test]
    fn a_lean_decoding_writes_what_a_decoded_value_does() {
        let odd = [
            // Escapes, non-ASCII, and what JSON writers spell differently.
            r#"{"role":"user","content":"tab\tquote\" \u00e9 \ud83d\ude00 \/ end","timestamp":1}"#,
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b\n"},{"type":"other"}]}"#,
            r#"{"role":"user","content":null}"#,
            r#"{"role":"user"}"#,
            r#"{"role":"user","content":5}"#,
            r#"{"role":"user","content":[{"type":"text","text":7}]}"#,
            r#"{"role":"user","content":["loose string"]}"#,
            r#"{"role":"user","content":"first","content":"second"}"#,
            r#"{"role":"assistant","content":[{"type":"thinking","thinking":"hm","thinkingSignature":"s"},{"type":"toolCall","id":"c","name":"n","arguments":null},{"type":"toolCall","id":"d","name":"n"},{"type":"toolCall","id":"e","name":"n","arguments":{"z":1,"a":[1.5,"x"]}}],"stopReason":"toolUse"}"#,
            r#"{"role":"assistant","content":[],"stopReason":"stop"}"#,
            // Thinking goes back to the API that wrote it: Anthropic's signed, redacted or unsigned
            // blocks, and OpenAI Responses' reasoning items (the signature is the item's JSON).
            r#"{"role":"assistant","api":"anthropic-messages","content":[{"type":"thinking","thinking":"t1","thinkingSignature":"sig"},{"type":"thinking","thinking":"","thinkingSignature":"enc","redacted":true},{"type":"thinking","thinking":"t3","thinkingSignature":"s3","redacted":null},{"type":"thinking","thinking":"unsigned"},{"type":"thinking","thinking":"t4","thinkingSignature":"s4","redacted":false},{"type":"text","text":"ok"}],"stopReason":"stop"}"#,
            r#"{"role":"assistant","api":"openai-responses","content":[{"type":"thinking","thinking":"r","thinkingSignature":"{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s\"}],\"encrypted_content\":\"e\"}"},{"type":"thinking","thinkingSignature":"{\"type\":\"other\"}"},{"type":"thinking","thinkingSignature":"not json"},{"type":"thinking"},{"type":"toolCall","id":"c","name":"n","arguments":{}}],"stopReason":"toolUse"}"#,
            r#"{"role":"assistant","api":"openai-completions","content":[{"type":"thinking","thinking":"elsewhere","thinkingSignature":"{\"type\":\"reasoning\",\"id\":\"rs_2\"}"},{"type":"text","text":"t"}],"stopReason":"stop"}"#,
            r#"{"role":"assistant","api":"anthropic-messages","content":[{"type":"thinking","thinking":"x","thinkingSignature":"s","redacted":"yes"}]}"#,
            r#"{"role":"assistant","api":"openai-responses","content":[{"type":"thinking","thinkingSignature":5}]}"#,
            r#"{"role":"assistant","content":"a plain string","stopReason":"stop"}"#,
            r#"{"role":"assistant","content":[{"type":"text","text":"x"}],"stopReason":null}"#,
            r#"{"role":"assistant","content":[{"type":"text","text":""}],"stopReason":"aborted"}"#,
            r#"{"role":"toolResult","toolCallId":"c","content":[]}"#,
            r#"{"role":"toolResult","content":[{"type":"text","text":"out"}],"isError":true}"#,
            r#"{"role":"toolResult","toolCallId":"c","content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}"#,
            r#"{"role":"custom","customType":"n","content":"shown","display":true}"#,
            r#"{"role":"branchSummary","summary":"s","fromId":"x"}"#,
            r#"{"role":"compactionSummary","summary":"earlier","tokensBefore":9}"#,
            r#"{"role":"bashExecution","command":"ls","output":"a","exitCode":0,"excludeFromContext":true}"#,
            r#"{"role":5}"#,
            r#"[1,2]"#,
        ];
        let mut texts: Vec<String> = odd.iter().map(|s| (*s).to_owned()).collect();
        let (mut seed, mut open_calls) = (7u64, Vec::new());
        texts.extend((0..300).map(|_| random_message(&mut seed, &mut open_calls).to_string()));
        let mut lean_taken = 0;
        for layout in [
            &super::super::openai_completions::LAYOUT,
            &super::super::openai_responses::LAYOUT,
            &super::super::anthropic::LAYOUT,
        ] {
            for text in &texts {
                let value: Value = serde_json::from_str(text).unwrap();
                let by_value = ContextMessage::new(&value);
                let read = ContextMessage::from_json(text);
                let (v, r) = (by_value.llm().map(|m| (layout.build)(&m)).unwrap_or_default(), read.wire(layout));
                assert_eq!(
                    (String::from_utf8_lossy(&r.items), String::from_utf8_lossy(&r.images)),
                    (String::from_utf8_lossy(&v.items), String::from_utf8_lossy(&v.images)),
                    "{:?}: {text}",
                    layout.api
                );
                assert_eq!(read.kind(), by_value.kind(), "{:?}: {text}", layout.api);
                assert_eq!(read.llm(), by_value.llm(), "{text}");
                lean_taken += usize::from(layout.lean.is_some() && Lean::parse(text).is_some());
            }
        }
        assert!(lean_taken > 200, "the lean decoding took {lean_taken} messages");
        // What must go the lenient way does.
        for text in [odd[4], odd[5], odd[6], odd[7], odd[13], odd[14], odd[21], odd[25]] {
            assert!(Lean::parse(text).is_none(), "{text}");
        }
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
