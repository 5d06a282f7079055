//! The OpenClaw gateway wire protocol as Pincer speaks it (v3–v4): request, response and event
//! frames ([`frames`]), the method table ([`methods`]), the limits ([`limits`]), the error shape
//! and codes ([`error`]), params decoding ([`params`]) and the typed payloads of the events the
//! gateway sends ([`events`]). Plain serde types: no tokio, no axum, no I/O, so every adapter and
//! test reads the same definitions.

pub mod error;
pub mod events;
pub mod frames;
pub mod limits;
pub mod methods;
pub mod params;

pub use error::*;
pub use events::*;
pub use frames::*;
pub use limits::*;
pub use methods::*;
pub use params::*;

/// Events emitted.
pub const EVENTS: &[&str] =
    &["connect.challenge", "tick", "chat", "agent", "session.message", "sessions.changed", "shutdown"];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Example {
        session_key: NonBlank,
        limit: Option<u32>,
    }

    #[test]
    fn run_statuses_have_one_name_each() {
        use RunStatus::*;
        for s in [Started, InFlight, Ok, Error, Aborted, Blocked, Interrupted] {
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
            assert_eq!(serde_json::from_value::<RunStatus>(json!(s.as_str())).unwrap(), s);
        }
        let answer = RunAnswer::new("r1", InFlight);
        assert_eq!(answer.to_value(), serde_json::to_value(&answer).unwrap());
        assert_eq!(answer.to_value(), json!({"runId": "r1", "status": "in_flight"}));
    }

    #[test]
    fn params_name_the_method_and_the_field() {
        let m = Method::SessionsRewind;
        let err = |v: Value| params::<Example>(m, &v).map(|_| ()).unwrap_err().message;
        assert_eq!(err(json!({})), "invalid sessions.rewind params: missing field `sessionKey`");
        assert_eq!(
            err(json!({"sessionKey": "  "})),
            "invalid sessions.rewind params: at /sessionKey: must not be empty"
        );
        assert_eq!(
            err(json!({"sessionKey": 5})),
            "invalid sessions.rewind params: at /sessionKey: invalid type: integer `5`, expected a string"
        );
        assert_eq!(
            err(json!({"sessionKey": "main", "limit": -1})),
            "invalid sessions.rewind params: at /limit: invalid value: integer `-1`, expected u32"
        );
        let ok: Example = params(m, &json!({"sessionKey": " main ", "agentId": "x"})).unwrap();
        assert_eq!(&*ok.session_key, "main");
        // Every method has one name, and the names parse back.
        assert!(Method::ALL.iter().all(|m| Method::parse(m.name()) == Some(*m)));
        assert_eq!(Method::parse("nope"), None);
    }

    #[test]
    fn request_validation() {
        let r = parse_request(r#"{"type":"req","id":"1","method":"health"}"#).expect("valid");
        assert_eq!((r.id.as_str(), r.method.as_str(), r.params), ("1", "health", Value::Null));
        let (id, e) = parse_request(r#"{"type":"req","id":"2","method":"health","x":1}"#).expect_err("extra key");
        assert_eq!(id.as_deref(), Some(r#""2""#));
        assert_eq!(e.message, "unexpected property 'x' in request frame");
        assert!(parse_request("nope").is_err());
        assert!(parse_request(r#"{"type":"req","id":"","method":"m"}"#).is_err());
        assert!(parse_request("{\"type\":\"req\",\"id\":\"1\",\"method\":\"m\u{0}\"}").is_err());
        // Lone surrogates (JSON.parse takes them, Rust strings cannot hold them): refused with the
        // request's own id, as sent; a pair is a character and is fine.
        let (id, e) =
            parse_request(r#"{"type":"req","id":"7","method":"m","params":{"t":"a\ud800b"}}"#).expect_err("lone");
        assert_eq!(id.as_deref(), Some(r#""7""#));
        assert!(e.message.contains(r"\ud800 at byte 52 is a lone surrogate"), "{}", e.message);
        let (id, _) = parse_request(r#"{"params":"\\udc00\uDC00","id":"x\udc00\\","type":"req"}"#).expect_err("lone");
        assert_eq!(id.as_deref(), Some(r#""x\udc00\\""#));
        assert_eq!(
            refusal(id.as_deref(), "unknown", RpcError::invalid("bad")),
            r#"{"type":"res","id":"x\udc00\\","ok":false,"error":{"code":"INVALID_REQUEST","message":"bad"}}"#
        );
        let (id, _) =
            parse_request(r#"{"type":"req","id":"8","method":"m","params":{"t":"\ud800"},}"#).expect_err("bad");
        assert_eq!(id, None, "still not JSON with the surrogate replaced");
        let ok = parse_request(r#"{"type":"req","id":"9","method":"m","params":{"t":"\ud83d\ude00 \\ud800"}}"#);
        assert_eq!(ok.expect("a pair and an escaped backslash").params["t"], "\u{1F600} \\ud800");
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
        assert_eq!(event_frame("odd \"name\"", "{}", Some(1)), event("odd \"name\"", &json!({}), Some(1)));
    }
}
