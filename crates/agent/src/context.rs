//! One message of a run's context, shared (behind an `Arc`) by the gateway's context cache, the
//! run and the request builders. It is kept as its JSON text (as in the transcript: a context
//! built from a file parses no message), and, each computed once per message rather than once per
//! turn, what Pi's `convertToLlm` makes of it, the facts the pre-call clean-up needs, and its
//! serialized wire form for each provider API; and, per context, the bytes its last request body
//! sent, which the next turn's body refers to (so a turn in a long session copies the wire forms
//! of its new messages only).

use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::Api;
use crate::provider::wire::{Layout, Lean};
use pincer_pi::llm::Converted;

/// A shared context message.
pub type SharedMessage = Arc<ContextMessage>;

/// What a request mapper makes of one message: JSON values, each followed by a comma, for the
/// API's message list (or, for a tool result under Anthropic, for the user message grouping a run
/// of results), and the image parts a tool result hands to the user message after its run.
#[derive(Debug, Default)]
pub(crate) struct WireForm {
    pub items: Vec<u8>,
    pub images: Vec<u8>,
}

/// The message's role in the pre-call clean-up (Pi's `transformMessages`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `user` (including what `convertToLlm` turned into one).
    User,
    /// `assistant`; `failed` when it ended in `error` or `aborted` (skipped); its tool calls (id, name).
    Assistant { failed: bool, calls: Vec<(String, String)> },
    /// `toolResult` answering the call `id`.
    ToolResult { id: String },
    /// Not sent to the model at all.
    Dropped,
}

/// What one parse of the message tells.
#[derive(Debug)]
struct Facts {
    kind: Kind,
    /// The `convertToLlm` result of a custom role (`None`: the message is sent as it is, or dropped).
    converted: Option<Box<RawValue>>,
}

impl Facts {
    /// What the pre-call clean-up needs to know of the message `v`.
    fn of(v: &Value) -> Facts {
        let (m, converted) = match pincer_pi::llm::convert_one(v) {
            Some(Converted::Same) => (std::borrow::Cow::Borrowed(v), None),
            Some(Converted::User(c)) => {
                let raw = to_raw(&c);
                (std::borrow::Cow::Owned(c), Some(raw))
            }
            None => return Facts { kind: Kind::Dropped, converted: None },
        };
        let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let kind = match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                let stop = m.get("stopReason").and_then(Value::as_str).unwrap_or_default();
                let calls = crate::provider::wire::blocks(&m)
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("toolCall"))
                    .map(|b| (str_of(b, "id"), str_of(b, "name")))
                    .collect();
                Kind::Assistant { failed: stop == "error" || stop == "aborted", calls }
            }
            Some("toolResult") => Kind::ToolResult { id: str_of(&m, "toolCallId") },
            _ => Kind::User,
        };
        Facts { kind, converted }
    }
}

/// A Pi context message with its derived forms.
#[derive(Debug)]
pub struct ContextMessage {
    raw: Box<RawValue>,
    facts: OnceLock<Facts>,
    wire: [OnceLock<WireForm>; 3],
}

fn to_raw(v: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap_or_default())
}

impl ContextMessage {
    /// Wraps a Pi message (serialized once; its facts taken from the value at hand, not re-parsed).
    pub fn new(value: impl std::borrow::Borrow<Value>) -> ContextMessage {
        let value = value.borrow();
        let m = ContextMessage::from_raw_value(to_raw(value));
        let _ = m.facts.set(Facts::of(value));
        m
    }

    /// Wraps a Pi message given as JSON text (as the transcript has it); not valid JSON → `null`.
    pub fn from_json(json: &str) -> ContextMessage {
        let raw = RawValue::from_string(json.to_owned()).unwrap_or_else(|_| to_raw(&Value::Null));
        ContextMessage::from_raw_value(raw)
    }

    fn from_raw_value(raw: Box<RawValue>) -> ContextMessage {
        ContextMessage { raw, facts: OnceLock::new(), wire: Default::default() }
    }

    /// Wraps a Pi message behind a shared handle.
    pub fn shared(value: impl std::borrow::Borrow<Value>) -> SharedMessage {
        Arc::new(ContextMessage::new(value))
    }

    /// [`ContextMessage::shared`] for a message that continues a context whose last message is
    /// `like`: the wire forms `like` has (the APIs that context goes out in) are built now, from
    /// the value at hand, instead of parsing the message back on the next request.
    pub fn shared_like(value: &Value, like: Option<&ContextMessage>) -> SharedMessage {
        let m = ContextMessage::new(value);
        if let Some(like) = like {
            let send_as_is = matches!(m.facts.get(), Some(f) if f.converted.is_none() && f.kind != Kind::Dropped);
            for (slot, api) in SLOTS.iter().enumerate() {
                if send_as_is && like.wire[slot].get().is_some() {
                    let _ = m.wire[slot].set((crate::provider::layout(*api).build)(value));
                }
            }
        }
        Arc::new(m)
    }

    /// The message's JSON text.
    pub fn json(&self) -> &str {
        self.raw.get()
    }

    /// The Pi message, decoded (a new value each time: for occasional use).
    pub fn value(&self) -> Value {
        serde_json::from_str(self.raw.get()).unwrap_or(Value::Null)
    }

    fn facts(&self) -> &Facts {
        self.facts.get_or_init(|| Facts::of(&self.value()))
    }

    /// The JSON of the message the model sees (Pi's `convertToLlm`): the message itself for
    /// `user`, `assistant` and `toolResult`, a user message for the custom roles, `None` when dropped.
    pub fn llm_json(&self) -> Option<&str> {
        let f = self.facts();
        match (&f.kind, &f.converted) {
            (Kind::Dropped, _) => None,
            (_, Some(c)) => Some(c.get()),
            (_, None) => Some(self.raw.get()),
        }
    }

    /// [`ContextMessage::llm_json`] decoded.
    pub fn llm(&self) -> Option<Value> {
        self.llm_json().map(|j| serde_json::from_str(j).unwrap_or(Value::Null))
    }

    pub(crate) fn kind(&self) -> &Kind {
        &self.facts().kind
    }

    /// The wire form for `layout`'s API, built the first time it is asked for: from a lean decoding
    /// of the text where the API has one (which also gives the message's facts), else from the
    /// model's view as a value. A message read from a file is decoded once for its facts and its
    /// first wire form together (decoding is most of the first request-body pass after a start, a
    /// branch switch or a compaction).
    pub(crate) fn wire(&self, layout: &Layout) -> &WireForm {
        self.wire[slot(layout.api)].get_or_init(|| {
            if let Some(lean_form) = layout.lean {
                if let Some(lean) = Lean::parse(self.raw.get()) {
                    let _ = self.facts.get_or_init(|| Facts { kind: lean.kind(), converted: None });
                    if let Some(form) = lean_form(&lean) {
                        return form;
                    }
                }
            }
            let build = layout.build;
            let decoded = self.facts.get().is_none().then(|| self.value());
            let facts = match &decoded {
                Some(v) => self.facts.get_or_init(|| Facts::of(v)),
                None => self.facts(),
            };
            match (&facts.kind, &facts.converted, decoded) {
                (Kind::Dropped, _, _) => WireForm::default(),
                (_, None, Some(v)) => build(&v),
                _ => self.llm().map(|v| build(&v)).unwrap_or_default(),
            }
        })
    }
}

/// The API of each wire-form slot of a [`ContextMessage`].
const SLOTS: [Api; 3] = [Api::OpenaiCompletions, Api::OpenaiResponses, Api::AnthropicMessages];

/// The wire-form slot of `api` (the echo model's requests are spelled as OpenAI's).
fn slot(api: Api) -> usize {
    SLOTS.iter().position(|a| *a == api).unwrap_or(0)
}

/// Messages per frozen chunk of [`Messages`].
const CHUNK: usize = 32;

/// A run's context: a list of shared messages that is cheap to clone and to extend. Full chunks
/// are frozen, and the list of them is itself shared between clones, so cloning a context of any
/// length copies one list handle and at most one chunk's messages (a turn clones its session's
/// context about three times; a list of chunk handles copied each time was ~2,000 reference counts
/// touched per turn at 10,000 messages). A clone that freezes a chunk while the list is shared
/// copies the list's handles then, once per [`CHUNK`] messages.
#[derive(Debug, Clone, Default)]
pub struct Messages {
    frozen: Arc<Vec<Arc<[SharedMessage]>>>,
    tail: Vec<SharedMessage>,
    /// Shared by the clones: see [`Prefixes`].
    prefixes: Arc<Prefixes>,
}

/// Per API, the wire bytes that the last request body of a context (or of a clone of it) sent
/// for its first messages, up to a point where no tool call waited for its result (from there
/// on, what a message is sent as does not depend on what came before). The next request of a
/// context that starts with the same messages sends those bytes as they are and writes only the
/// messages after them: in a long session, a turn's body is a few new messages, not the whole
/// history again. Each entry holds the messages it covers, and is used only by a context that
/// starts with exactly those (the same shared messages, compared by identity), so clones that
/// went different ways never take each other's bytes.
#[derive(Debug, Default)]
struct Prefixes([Mutex<Option<Prefix>>; 3]);

#[derive(Debug)]
struct Prefix {
    /// The context the bytes were written for: its first `count` messages are covered.
    frozen: Arc<Vec<Arc<[SharedMessage]>>>,
    tail: Vec<SharedMessage>,
    count: usize,
    /// The covered messages' wire bytes in order, in a few pieces (see `provider::wire`).
    segments: Vec<Bytes>,
}

impl Messages {
    /// An empty context.
    pub fn new() -> Messages {
        Messages::default()
    }

    /// Appends a message.
    pub fn push(&mut self, m: SharedMessage) {
        self.tail.push(m);
        if self.tail.len() == CHUNK {
            let chunk = std::mem::take(&mut self.tail).into();
            Arc::make_mut(&mut self.frozen).push(chunk);
        }
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.frozen.len() * CHUNK + self.tail.len()
    }

    /// True without messages.
    pub fn is_empty(&self) -> bool {
        self.frozen.is_empty() && self.tail.is_empty()
    }

    /// The messages in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &SharedMessage> + '_ {
        self.frozen.iter().flat_map(|c| c.iter()).chain(self.tail.iter())
    }

    /// The last message.
    pub fn last(&self) -> Option<&SharedMessage> {
        self.tail.last().or_else(|| self.frozen.last().and_then(|c| c.last()))
    }

    /// The messages from the `i`th on.
    pub(crate) fn iter_from(&self, i: usize) -> impl Iterator<Item = &SharedMessage> + '_ {
        let (chunk, within) = (i / CHUNK, i % CHUNK);
        let frozen = self.frozen.get(chunk..).unwrap_or_default();
        let tail_from = i.saturating_sub(self.frozen.len() * CHUNK).min(self.tail.len());
        frozen
            .iter()
            .enumerate()
            .flat_map(move |(n, c)| c.get(if n == 0 { within } else { 0 }..).unwrap_or_default())
            .chain(self.tail[tail_from..].iter())
    }

    fn at(frozen: &[Arc<[SharedMessage]>], tail: &[SharedMessage], i: usize) -> Option<*const ContextMessage> {
        let m = match frozen.get(i / CHUNK) {
            Some(chunk) => chunk.get(i % CHUNK),
            None => tail.get(i - frozen.len() * CHUNK),
        };
        m.map(Arc::as_ptr)
    }

    /// True when this context's first `p.count` messages are the very messages `p` covers.
    fn starts_like(&self, p: &Prefix) -> bool {
        if p.count > self.len() {
            return false;
        }
        // Whole chunks both have frozen are compared by handle first (one comparison for 32).
        let both = self.frozen.len().min(p.frozen.len()).min(p.count / CHUNK);
        let same_list = Arc::ptr_eq(&self.frozen, &p.frozen);
        for c in 0..both {
            let (a, b) = (&self.frozen[c], &p.frozen[c]);
            if !same_list && !Arc::ptr_eq(a, b) && !a.iter().zip(b.iter()).all(|(x, y)| Arc::ptr_eq(x, y)) {
                return false;
            }
        }
        (both * CHUNK..p.count).all(|i| {
            let mine = Messages::at(&self.frozen, &self.tail, i);
            mine.is_some() && mine == Messages::at(&p.frozen, &p.tail, i)
        })
    }

    /// The wire bytes of this context's first messages for `api`, if a request of this context
    /// (or of one it shares its first messages with) wrote them: how many messages they cover, and
    /// the bytes in pieces.
    pub(crate) fn prefix(&self, api: Api) -> Option<(usize, Vec<Bytes>)> {
        let slot = pincer_pi::lock(&self.prefixes.0[slot(api)]);
        slot.as_ref().filter(|p| self.starts_like(p)).map(|p| (p.count, p.segments.clone()))
    }

    /// Keeps `segments` as the wire bytes of this context's first `count` messages for `api`.
    pub(crate) fn set_prefix(&self, api: Api, count: usize, segments: Vec<Bytes>) {
        let frozen_count = self.frozen.len() * CHUNK;
        let tail = self.tail[..count.saturating_sub(frozen_count).min(self.tail.len())].to_vec();
        let p = Prefix { frozen: self.frozen.clone(), tail, count: count.min(self.len()), segments };
        *pincer_pi::lock(&self.prefixes.0[slot(api)]) = Some(p);
    }
}

impl FromIterator<SharedMessage> for Messages {
    fn from_iter<I: IntoIterator<Item = SharedMessage>>(iter: I) -> Messages {
        let mut m = Messages::new();
        for x in iter {
            m.push(x);
        }
        m
    }
}

impl From<Vec<SharedMessage>> for Messages {
    fn from(v: Vec<SharedMessage>) -> Messages {
        v.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_continuing_a_context_gets_the_wire_forms_it_goes_out_in() {
        let messages = [
            json!({"role": "user", "content": "hi \u{1f600} \"quoted\"", "timestamp": 1}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "yes"}, {"type": "toolCall", "id": "c1", "name": "read", "arguments": {"path": "a"}}], "stopReason": "toolUse", "timestamp": 2}),
            json!({"role": "toolResult", "toolCallId": "c1", "toolName": "read", "content": [{"type": "text", "text": "x"}], "isError": false, "timestamp": 3}),
            json!({"role": "custom", "customType": "note", "content": "a note", "display": true, "timestamp": 4}),
        ];
        for api in SLOTS {
            let previous = ContextMessage::shared(json!({"role": "user", "content": "before"}));
            let _ = previous.wire(crate::provider::layout(api));
            for v in &messages {
                let eager = ContextMessage::shared_like(v, Some(&previous));
                let lazy = ContextMessage::shared(v);
                let slot = slot(api);
                let as_is = !matches!(v["role"].as_str(), Some("custom"));
                assert_eq!(eager.wire[slot].get().is_some(), as_is, "{api:?} {v}");
                assert!(eager.wire.iter().enumerate().all(|(i, w)| i == slot || w.get().is_none()));
                let (e, l) = (eager.wire(crate::provider::layout(api)), lazy.wire(crate::provider::layout(api)));
                assert_eq!((&e.items, &e.images), (&l.items, &l.images), "{api:?} {v}");
            }
            let alone = ContextMessage::shared_like(&messages[0], None);
            assert!(alone.wire.iter().all(|w| w.get().is_none()), "nothing to go by: built when first sent");
        }
    }

    #[test]
    fn clones_share_frozen_chunks_and_keep_order() {
        let mut a: Messages = (0..600).map(|i| ContextMessage::shared(json!(i))).collect();
        let b = a.clone();
        a.push(ContextMessage::shared(json!(600)));
        assert_eq!((a.len(), b.len()), (601, 600));
        assert!(Arc::ptr_eq(&a.frozen[1], &b.frozen[1]), "full chunks are shared, not copied");
        let d = b.clone();
        assert!(Arc::ptr_eq(&b.frozen, &d.frozen), "so is the list of them");
        assert!(Arc::ptr_eq(&a.frozen, &b.frozen), "a push that froze nothing keeps the list");
        let seen: Vec<i64> = a.iter().map(|m| m.value().as_i64().unwrap_or(-1)).collect();
        assert_eq!(seen, (0..601).collect::<Vec<_>>());
        assert_eq!(a.iter().next_back().map(|m| m.value()), Some(json!(600)));
        assert_eq!(b.last().map(|m| m.value()), Some(json!(599)));
        let mut c: Messages = (0..CHUNK).map(|i| ContextMessage::shared(json!(i))).collect();
        assert_eq!(c.last().map(|m| m.value()), Some(json!(CHUNK - 1)), "last of a just-frozen chunk");
        c.push(ContextMessage::shared(json!("x")));
        assert_eq!(c.len(), CHUNK + 1);

        // Freezing a chunk while a clone shares the list leaves the clone as it was.
        let mut x: Messages = (0..2 * CHUNK - 1).map(|i| ContextMessage::shared(json!(i))).collect();
        let y = x.clone();
        x.push(ContextMessage::shared(json!(2 * CHUNK - 1)));
        assert!(!Arc::ptr_eq(&x.frozen, &y.frozen));
        assert_eq!((x.frozen.len(), y.frozen.len(), x.len(), y.len()), (2, 1, 2 * CHUNK, 2 * CHUNK - 1));
        let values = |m: &Messages| m.iter().map(|v| v.value().as_u64().unwrap_or(u64::MAX)).collect::<Vec<_>>();
        assert_eq!(values(&x), (0..2 * CHUNK as u64).collect::<Vec<_>>());
        assert_eq!(values(&y), (0..2 * CHUNK as u64 - 1).collect::<Vec<_>>());
    }
}
