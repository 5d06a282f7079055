//! The OpenClaw gateway wire protocol: request/response/event frames, the error shape and codes,
//! request validation (unknown top-level keys are refused, as TypeBox's `additionalProperties:false`
//! does), and the limits the server advertises.

use serde_json::{json, Map, Value};

/// Largest frame after the handshake (32 MiB): room for the documented 20 MB of attachments as
/// base64 (×4/3 ≈ 26.7 MB) plus the message and the frame around them.
pub const MAX_PAYLOAD_BYTES: usize = 32 * 1024 * 1024;
/// Largest frame before `connect` succeeded (64 KiB).
pub const MAX_PREAUTH_PAYLOAD_BYTES: usize = 64 * 1024;
/// Per-connection send buffer before a slow consumer is dropped/closed (50 MiB).
pub const MAX_BUFFERED_BYTES: usize = 50 * 1024 * 1024;
/// `tick` period.
pub const TICK_INTERVAL_MS: u64 = 30_000;
/// Time allowed for `connect` after the socket opens.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Protocol versions spoken.
pub const PROTOCOL_MIN: u64 = 3;
pub const PROTOCOL_MAX: u64 = 4;

/// Methods served (also advertised in `hello-ok`).
pub const METHODS: &[&str] = &[
    "connect",
    "health",
    "chat.send",
    "chat.startup",
    "chat.history",
    "chat.abort",
    "chat.inject",
    "sessions.list",
    "sessions.create",
    "sessions.patch",
    "sessions.reset",
    "sessions.delete",
    "sessions.compact",
    "sessions.abort",
    "sessions.subscribe",
    "sessions.unsubscribe",
    "sessions.messages.subscribe",
    "sessions.messages.unsubscribe",
    "agents.list",
    "agent.identity.get",
    "models.list",
    "chat.message.get",
    "sessions.branches.list",
    "sessions.branches.switch",
    "sessions.rewind",
    "sessions.fork",
    "sessions.tree",
    "sessions.label",
    "sessions.archives.list",
    "sessions.archives.get",
    "pincer.info",
];

/// Events emitted.
pub const EVENTS: &[&str] =
    &["connect.challenge", "tick", "chat", "agent", "session.message", "sessions.changed", "shutdown"];

/// An error in OpenClaw's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: &'static str,
    pub message: String,
    pub details: Option<Box<Value>>,
}

impl RpcError {
    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError { code: "INVALID_REQUEST", message: message.into(), details: None }
    }
    pub fn unavailable(message: impl Into<String>) -> RpcError {
        RpcError { code: "UNAVAILABLE", message: message.into(), details: None }
    }
    pub fn with_details(mut self, details: Value) -> RpcError {
        self.details = Some(Box::new(details));
        self
    }
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.details {
            e["details"] = (**d).clone();
        }
        e
    }
}

/// A parsed request frame.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: String,
    pub method: String,
    pub params: Value,
}

/// Parses a text frame into a request. On error, the id (if one could be read) for the response.
pub fn parse_request(text: &str) -> Result<Request, (Option<String>, RpcError)> {
    if text.contains('\u{0}') {
        return Err((None, RpcError::invalid("frame must not contain null bytes")));
    }
    let v: Value =
        serde_json::from_str(text).map_err(|e| (None, RpcError::invalid(format!("frame is not valid JSON: {e}"))))?;
    let Value::Object(obj) = v else {
        return Err((None, RpcError::invalid("frame must be a JSON object")));
    };
    let id = obj.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    let fail = |msg: String| Err((id.clone(), RpcError::invalid(msg)));
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
    let mut f = String::with_capacity(payload_json.len() + 64);
    f.push_str("{\"type\":\"event\",\"event\":");
    f.push_str(&Value::from(name).to_string());
    f.push_str(",\"payload\":");
    f.push_str(payload_json);
    if let Some(s) = seq {
        f.push_str(",\"seq\":");
        f.push_str(&s.to_string());
    }
    f.push('}');
    f
}

/// Reads a string parameter.
pub fn str_param<'a>(params: &'a Value, key: &str) -> Option<&'a str> {
    params.get(key).and_then(Value::as_str)
}

/// A required non-empty string parameter.
pub fn required_str<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    match params.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
        Some(Value::String(_)) => Err(RpcError::invalid(format!("{key} must not be empty"))),
        Some(_) => Err(RpcError::invalid(format!("{key} must be a string"))),
        None => Err(RpcError::invalid(format!("{key} is required"))),
    }
}

/// An optional integer parameter within bounds.
pub fn int_param(params: &Value, key: &str, min: u64, max: u64) -> Result<Option<u64>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(RpcError::invalid(format!("{key} must be an integer from {min} to {max}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_validation() {
        let r = parse_request(r#"{"type":"req","id":"1","method":"health"}"#).expect("valid");
        assert_eq!((r.id.as_str(), r.method.as_str(), r.params), ("1", "health", Value::Null));
        let (id, e) = parse_request(r#"{"type":"req","id":"2","method":"health","x":1}"#).expect_err("extra key");
        assert_eq!(id.as_deref(), Some("2"));
        assert_eq!(e.message, "unexpected property 'x' in request frame");
        assert!(parse_request("nope").is_err());
        assert!(parse_request(r#"{"type":"req","id":"","method":"m"}"#).is_err());
        assert!(parse_request("{\"type\":\"req\",\"id\":\"1\",\"method\":\"m\u{0}\"}").is_err());
        assert_eq!(
            response("9", Err(RpcError::invalid("bad"))),
            r#"{"type":"res","id":"9","ok":false,"error":{"code":"INVALID_REQUEST","message":"bad"}}"#
        );
        assert_eq!(
            event("tick", &json!({"ts": 1}), Some(3)),
            r#"{"type":"event","event":"tick","payload":{"ts":1},"seq":3}"#
        );
        assert_eq!(event_frame("tick", r#"{"ts":1}"#, Some(3)), event("tick", &json!({"ts": 1}), Some(3)));
        assert_eq!(event_frame("x", "{}", None), event("x", &json!({}), None));
    }
}
