//! Pi's `buildSessionContext`: the messages, thinking level and model the LLM sees at a leaf.
//!
//! Only the entries on the root→leaf path are decoded in full. The rules (last compaction on the path
//! wins, kept range from `firstKeptEntryId`, synthesized summary and custom messages with the entry's
//! timestamp in ms) follow Pi 0.73.1 exactly; see `pi-session-format.md` §10.

use crate::ids::js_date_ms;
use crate::session::{Kind, Leaf, Session};
use pincer_pi::js::truthy;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// The LLM context at one leaf. Messages are the raw JSON text of the file, borrowed from the
/// session's buffer (Pi pushes the stored objects verbatim), so building a context neither parses
/// nor copies a message; synthesized messages (summaries, custom messages) are owned.
#[derive(Clone, Debug)]
pub struct Context<'a> {
    pub messages: Vec<Cow<'a, str>>,
    pub thinking_level: Value,
    pub model: Value,
    /// Indices (into [`Session::entries`]) of the root→leaf path.
    pub path: Vec<usize>,
    /// True when a parent cycle cut the path short (Pi would hang).
    pub cycle: bool,
}

impl Context<'_> {
    /// `{messages, thinkingLevel, model}` as Pi returns it (for tests and small contexts).
    pub fn to_json(&self) -> Value {
        json!({"messages": self.message_values(), "thinkingLevel": self.thinking_level, "model": self.model})
    }

    /// The messages decoded.
    pub fn message_values(&self) -> Vec<Value> {
        self.messages.iter().map(|m| serde_json::from_str(m).unwrap_or(Value::Null)).collect()
    }

    /// Writes `{"messages":[…],"thinkingLevel":…,"model":…}` with the messages as they are in the file.
    pub fn write_json(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        out.write_all(b"{\"messages\":[")?;
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            out.write_all(m.as_bytes())?;
        }
        write!(out, "],\"thinkingLevel\":{},\"model\":{}}}", self.thinking_level, self.model)
    }
}

#[derive(Deserialize)]
struct MessageHead {
    role: Option<Value>,
    provider: Option<Value>,
    model: Option<Value>,
}

fn raw(v: &Value) -> Cow<'static, str> {
    Cow::Owned(v.to_string())
}

fn empty() -> Context<'static> {
    Context { messages: vec![], thinking_level: json!("off"), model: Value::Null, path: vec![], cycle: false }
}

/// Builds the context at `leaf` (usually `session.leaf`). Path entries are decoded only when a rule
/// needs them: messages are borrowed raw, other entries decoded as they are reached.
pub fn build_context<'a>(s: &'a Session, leaf: &Leaf) -> Context<'a> {
    let start = match leaf {
        Leaf::Empty | Leaf::Null => return empty(),
        Leaf::Entry(i) => *i,
    };
    let (path, cycle) = s.path_from(start);
    let mut ctx = empty();
    ctx.cycle = cycle;
    // Last writer wins: the last thinking change, the last model change or assistant message, the
    // last compaction. Scanning backwards stops decoding as soon as each is known.
    let (mut thinking, mut model, mut compaction) = (None, None, None);
    for (pos, &i) in path.iter().enumerate().rev() {
        match s.entries[i].kind {
            Kind::ThinkingLevelChange if thinking.is_none() => {
                thinking = Some(value(s, i).get("thinkingLevel").cloned().unwrap_or(Value::Null))
            }
            Kind::ModelChange if model.is_none() => {
                let v = value(s, i);
                model = Some(model_of(v.get("provider"), v.get("modelId")))
            }
            Kind::Message if model.is_none() => model = assistant_model(&message(s, i)),
            Kind::Compaction if compaction.is_none() => compaction = Some(pos),
            _ => {}
        }
        if thinking.is_some() && model.is_some() && compaction.is_some() {
            break;
        }
    }
    if let Some(t) = thinking {
        ctx.thinking_level = t;
    }
    if let Some(m) = model {
        ctx.model = m;
    }
    let mut messages = Vec::new();
    match compaction {
        Some(cpos) => {
            let c = &value(s, path[cpos]);
            let mut m = Map::new();
            m.insert("role".into(), json!("compactionSummary"));
            insert_opt(&mut m, "summary", c.get("summary"));
            insert_opt(&mut m, "tokensBefore", c.get("tokensBefore"));
            m.insert("timestamp".into(), ts(c));
            messages.push(raw(&Value::Object(m)));
            // Pi finds the compaction again by id: the first compaction on the path with that id.
            let cid = s.entries[path[cpos]].id.clone();
            let cidx = path
                .iter()
                .position(|&i| s.entries[i].kind == Kind::Compaction && s.entries[i].id == cid)
                .unwrap_or(cpos);
            let first_kept = c.get("firstKeptEntryId").and_then(crate::parse::value_key);
            let kept = match first_kept {
                Some(k) => path[..cidx].iter().position(|&i| s.entries[i].id.as_ref() == Some(&k)).unwrap_or(cidx),
                None => cidx,
            };
            emit_all(s, &path[kept..cidx], &mut messages);
            emit_all(s, &path[cidx + 1..], &mut messages);
        }
        None => emit_all(s, &path, &mut messages),
    }
    ctx.messages = messages;
    ctx.path = path;
    ctx
}

fn model_of(provider: Option<&Value>, model_id: Option<&Value>) -> Value {
    let mut m = Map::new();
    insert_opt(&mut m, "provider", provider);
    insert_opt(&mut m, "modelId", model_id);
    Value::Object(m)
}

/// JSON.stringify drops keys whose value is `undefined`.
fn insert_opt(m: &mut Map<String, Value>, key: &str, v: Option<&Value>) {
    if let Some(v) = v {
        m.insert(key.into(), v.clone());
    }
}

/// `new Date(entry.timestamp).getTime()`, `NaN` printed as `null`.
fn ts(entry: &Value) -> Value {
    js_date_ms(entry.get("timestamp")).map(Value::from).unwrap_or(Value::Null)
}

/// `{provider, modelId}` when the raw message is an assistant's.
fn assistant_model(msg: &str) -> Option<Value> {
    let h = serde_json::from_str::<MessageHead>(msg).ok()?;
    (h.role.as_ref().and_then(Value::as_str) == Some("assistant"))
        .then(|| model_of(h.provider.as_ref(), h.model.as_ref()))
}

/// A message entry's raw message; Pi pushes `entry.message` even when it is missing (JSON `null`).
fn message(s: &Session, i: usize) -> Cow<'_, str> {
    s.raw_message(i).unwrap_or(Cow::Borrowed("null"))
}

/// Any other entry, fully decoded.
fn value(s: &Session, i: usize) -> Value {
    s.value(i).unwrap_or(Value::Null)
}

/// Paths at least this long are emitted by several threads.
const PARALLEL_EMIT: usize = 16_384;

/// The messages of the entries of `path`, in order. Checking that each raw message is UTF-8 is most
/// of the work, so a long path is split over the available cores.
fn emit_all<'a>(s: &'a Session, path: &[usize], out: &mut Vec<Cow<'a, str>>) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    out.reserve(path.len());
    if threads < 2 || path.len() < PARALLEL_EMIT {
        return path.iter().for_each(|&i| emit(s, i, out));
    }
    let parts = std::thread::scope(|scope| {
        let handles: Vec<_> = path
            .chunks(path.len().div_ceil(threads))
            .map(|part| {
                scope.spawn(move || {
                    let mut v = Vec::with_capacity(part.len());
                    part.iter().for_each(|&i| emit(s, i, &mut v));
                    v
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect::<Option<Vec<_>>>()
    });
    match parts {
        Some(parts) => parts.into_iter().for_each(|p| out.extend(p)),
        // A panicking thread: emit everything here instead.
        None => path.iter().for_each(|&i| emit(s, i, out)),
    }
}

/// The message entry `i` contributes to the context, if any.
fn emit<'a>(s: &'a Session, i: usize, out: &mut Vec<Cow<'a, str>>) {
    let kind = s.entries[i].kind;
    if kind == Kind::Message {
        out.push(message(s, i));
        return;
    }
    if !matches!(kind, Kind::CustomMessage | Kind::BranchSummary) {
        return;
    }
    let v = &value(s, i);
    match kind {
        Kind::CustomMessage => {
            let mut m = Map::new();
            m.insert("role".into(), json!("custom"));
            for k in ["customType", "content", "display", "details"] {
                insert_opt(&mut m, k, v.get(k));
            }
            m.insert("timestamp".into(), ts(v));
            out.push(raw(&Value::Object(m)));
        }
        Kind::BranchSummary if v.get("summary").is_some_and(truthy) => {
            let mut m = Map::new();
            m.insert("role".into(), json!("branchSummary"));
            insert_opt(&mut m, "summary", v.get("summary"));
            insert_opt(&mut m, "fromId", v.get("fromId"));
            m.insert("timestamp".into(), ts(v));
            out.push(raw(&Value::Object(m)));
        }
        _ => {}
    }
}
