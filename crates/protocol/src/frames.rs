//! Frames: a request parsed from a text frame (unknown top-level keys and lone surrogates refused,
//! naming what was wrong), and responses and events written as text.

use crate::RpcError;
use serde_json::{json, Map, Value};

/// A parsed request frame.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: String,
    pub method: String,
    pub params: Value,
}

/// Parses a text frame into a request. On error, the request's id as its JSON text (when one
/// could be read), for [`refusal`].
pub fn parse_request(text: &str) -> Result<Request, (Option<String>, RpcError)> {
    if text.contains('\u{0}') {
        return Err((None, RpcError::invalid("frame must not contain null bytes")));
    }
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Err(
                lone_surrogate(text).unwrap_or((None, RpcError::invalid(format!("frame is not valid JSON: {e}"))))
            )
        }
    };
    let Value::Object(obj) = v else {
        return Err((None, RpcError::invalid("frame must be a JSON object")));
    };
    let id = obj.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    let fail = |msg: String| Err((id.as_ref().map(|i| Value::from(i.as_str()).to_string()), RpcError::invalid(msg)));
    if obj.get("type").and_then(Value::as_str) != Some("req") {
        return fail("frame type must be \"req\"".into());
    }
    let Some(id_s) = id.clone() else {
        return fail("request id must be a non-empty string".into());
    };
    let Some(method) = obj.get("method").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
        return fail("request method must be a non-empty string".into());
    };
    if let Some(extra) = obj.keys().find(|k| !matches!(k.as_str(), "type" | "id" | "method" | "params" | "traceparent"))
    {
        return fail(format!("unexpected property '{extra}' in request frame"));
    }
    Ok(Request { id: id_s, method: method.to_owned(), params: obj.get("params").cloned().unwrap_or(Value::Null) })
}

/// The refusal of a frame that JavaScript's `JSON.parse` accepts but that is not valid Unicode:
/// a `\uD800`–`\uDFFF` escape without its other half (`JSON.stringify` writes them for a string
/// holding half a character). The error names the escape; the request's id is read from the frame
/// with those escapes replaced (same length, so the id's bytes in the frame are found), and is
/// answered as it was sent (so an id holding one comes back the same). `None` when the frame has
/// no lone surrogate or is not valid JSON for another reason too.
fn lone_surrogate(text: &str) -> Option<(Option<String>, RpcError)> {
    let b = text.as_bytes();
    let hex4 = |at: usize| -> Option<u32> {
        let h = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
        u32::from_str_radix(h, 16).ok()
    };
    let (mut lone, mut i, mut in_string) = (Vec::new(), 0, false);
    while i < b.len() {
        match (in_string, b[i]) {
            (false, b'"') | (true, b'"') => {
                in_string = !in_string;
                i += 1;
            }
            (true, b'\\') if b.get(i + 1) == Some(&b'u') => {
                let u = hex4(i + 2)?;
                let paired = (0xD800..0xDC00).contains(&u)
                    && b.get(i + 6..i + 8) == Some(b"\\u")
                    && hex4(i + 8).is_some_and(|l| (0xDC00..0xE000).contains(&l));
                if paired {
                    i += 12;
                    continue;
                }
                if (0xD800..0xE000).contains(&u) {
                    lone.push(i);
                }
                i += 6;
            }
            (true, b'\\') => i += 2,
            _ => i += 1,
        }
    }
    let first = *lone.first()?;
    let mut patched = b.to_vec();
    for &at in &lone {
        patched[at + 2..at + 6].copy_from_slice(b"fffd");
    }
    let patched = String::from_utf8(patched).ok()?;
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let head: Id<'_> = serde_json::from_str(&patched).ok()?;
    let id = head.id.map(|raw| raw.get()).filter(|r| r.starts_with('"') && *r != "\"\"").map(|r| {
        let at = r.as_ptr() as usize - patched.as_ptr() as usize;
        text[at..at + r.len()].to_owned()
    });
    let escape = &text[first..first + 6];
    let msg = format!(
        "frame is not valid JSON text: the string escape {escape} at byte {first} is a lone surrogate (half of a \
         UTF-16 character without its other half); strings must be valid Unicode"
    );
    Some((id, RpcError::invalid(msg)))
}

/// The error response to a frame that is no request: `id` is the request's id as its JSON text
/// ([`parse_request`]'s), `fallback` the id used when it had none.
pub fn refusal(id: Option<&str>, fallback: &str, e: RpcError) -> String {
    match id {
        Some(id) => format!(r#"{{"type":"res","id":{id},"ok":false,"error":{}}}"#, e.to_json()),
        None => response(fallback, Err(e)),
    }
}

/// `{"type":"res",…}` as text.
pub fn response(id: &str, result: Result<Value, RpcError>) -> String {
    let frame = match result {
        Ok(payload) => json!({"type": "res", "id": id, "ok": true, "payload": payload}),
        Err(e) => json!({"type": "res", "id": id, "ok": false, "error": e.to_json()}),
    };
    frame.to_string()
}

/// `{"type":"event",…}` as text, with a frame `seq` for broadcast events.
pub fn event(name: &str, payload: &Value, seq: Option<u64>) -> String {
    let mut m = Map::new();
    m.insert("type".into(), json!("event"));
    m.insert("event".into(), json!(name));
    m.insert("payload".into(), payload.clone());
    if let Some(s) = seq {
        m.insert("seq".into(), json!(s));
    }
    Value::Object(m).to_string()
}

/// An event frame from an already serialized payload (the bus serializes each payload once).
pub fn event_frame(name: &str, payload_json: &str, seq: Option<u64>) -> String {
    use std::fmt::Write;
    let mut f = String::with_capacity(payload_json.len() + 64);
    f.push_str("{\"type\":\"event\",\"event\":");
    // Event names are dotted identifiers: written as they are, anything else escaped.
    if name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        let _ = write!(f, "\"{name}\"");
    } else {
        f.push_str(&Value::from(name).to_string());
    }
    f.push_str(",\"payload\":");
    f.push_str(payload_json);
    if let Some(s) = seq {
        let _ = write!(f, ",\"seq\":{s}");
    }
    f.push('}');
    f
}
