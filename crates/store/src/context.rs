//! Pi's `buildSessionContext`: the messages, thinking level and model the LLM sees at a leaf.
//!
//! Only the entries on the root→leaf path are decoded in full. The rules (last compaction on the path
//! wins, kept range from `firstKeptEntryId`, synthesized summary and custom messages with the entry's
//! timestamp in ms) follow Pi 0.73.1 exactly; see `pi-session-format.md` §10.

use crate::ids::js_date_ms;
use crate::session::{Kind, Leaf, Session};
use serde_json::{json, Map, Value};

/// The LLM context at one leaf.
#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    pub messages: Vec<Value>,
    pub thinking_level: Value,
    pub model: Value,
    /// Indices (into [`Session::entries`]) of the root→leaf path.
    pub path: Vec<usize>,
    /// True when a parent cycle cut the path short (Pi would hang).
    pub cycle: bool,
}

impl Context {
    /// `{messages, thinkingLevel, model}` as Pi returns it.
    pub fn to_json(&self) -> Value {
        json!({"messages": self.messages, "thinkingLevel": self.thinking_level, "model": self.model})
    }
}

fn empty() -> Context {
    Context { messages: vec![], thinking_level: json!("off"), model: Value::Null, path: vec![], cycle: false }
}

/// Builds the context at `leaf` (usually `session.leaf`).
pub fn build_context(s: &Session, leaf: &Leaf) -> Context {
    let start = match leaf {
        Leaf::Empty | Leaf::Null => return empty(),
        Leaf::Entry(i) => *i,
    };
    let (path, cycle) = s.path_from(start);
    let values: Vec<Value> = path.iter().map(|&i| s.value(i).unwrap_or(Value::Null)).collect();
    let mut ctx = empty();
    ctx.cycle = cycle;
    let mut compaction: Option<usize> = None;
    for (pos, (&i, v)) in path.iter().zip(&values).enumerate() {
        match s.entries[i].kind {
            Kind::ThinkingLevelChange => ctx.thinking_level = v.get("thinkingLevel").cloned().unwrap_or(Value::Null),
            Kind::ModelChange => ctx.model = model_of(v.get("provider"), v.get("modelId")),
            Kind::Message => {
                let m = v.get("message");
                if m.and_then(|m| m.get("role")).and_then(Value::as_str) == Some("assistant") {
                    ctx.model = model_of(m.and_then(|m| m.get("provider")), m.and_then(|m| m.get("model")));
                }
            }
            Kind::Compaction => compaction = Some(pos),
            _ => {}
        }
    }
    let mut messages = Vec::new();
    match compaction {
        Some(cpos) => {
            let c = &values[cpos];
            let mut m = Map::new();
            m.insert("role".into(), json!("compactionSummary"));
            insert_opt(&mut m, "summary", c.get("summary"));
            insert_opt(&mut m, "tokensBefore", c.get("tokensBefore"));
            m.insert("timestamp".into(), ts(c));
            messages.push(Value::Object(m));
            // Pi finds the compaction again by id: the first compaction on the path with that id.
            let cid = s.entries[path[cpos]].id.clone();
            let cidx = path
                .iter()
                .position(|&i| s.entries[i].kind == Kind::Compaction && s.entries[i].id == cid)
                .unwrap_or(cpos);
            let first_kept = c.get("firstKeptEntryId").and_then(crate::parse::value_key);
            let mut found = false;
            for pos in 0..cidx {
                if first_kept.is_some() && s.entries[path[pos]].id == first_kept {
                    found = true;
                }
                if found {
                    emit(s.entries[path[pos]].kind, &values[pos], &mut messages);
                }
            }
            for pos in cidx + 1..path.len() {
                emit(s.entries[path[pos]].kind, &values[pos], &mut messages);
            }
        }
        None => {
            for (pos, &i) in path.iter().enumerate() {
                emit(s.entries[i].kind, &values[pos], &mut messages);
            }
        }
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

fn emit(kind: Kind, v: &Value, out: &mut Vec<Value>) {
    match kind {
        Kind::Message => out.push(v.get("message").cloned().unwrap_or(Value::Null)),
        Kind::CustomMessage => {
            let mut m = Map::new();
            m.insert("role".into(), json!("custom"));
            for k in ["customType", "content", "display", "details"] {
                insert_opt(&mut m, k, v.get(k));
            }
            m.insert("timestamp".into(), ts(v));
            out.push(Value::Object(m));
        }
        Kind::BranchSummary if v.get("summary").is_some_and(truthy) => {
            let mut m = Map::new();
            m.insert("role".into(), json!("branchSummary"));
            insert_opt(&mut m, "summary", v.get("summary"));
            insert_opt(&mut m, "fromId", v.get("fromId"));
            m.insert("timestamp".into(), ts(v));
            out.push(Value::Object(m));
        }
        _ => {}
    }
}

/// JavaScript truthiness of a JSON value.
pub(crate) fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}
