//! Gateway frame → request decoding (`pincer_gateway::protocol::parse_request`) over arbitrary text
//! frames (WebSocket text frames are UTF-8; other bytes are decoded lossily).
//!
//! Properties:
//! - `Ok` only for a JSON object with `"type":"req"`, non-empty string `id` and `method` equal to
//!   the returned ones, no keys besides type/id/method/params/traceparent, and `params` as given
//!   (`null` when absent);
//! - an error carries `INVALID_REQUEST`, a non-empty message, and an id (as its JSON text, found in
//!   the frame) only when the frame is an object with that non-empty string id, or a frame whose only
//!   fault is a lone surrogate escape (then the message names it);
//! - the response frame built for either outcome is valid JSON echoing the id;
//! - re-serializing an accepted request and parsing it again gives the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pincer_gateway::protocol::{parse_request, refusal, response, RpcError};
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed: Option<Value> = serde_json::from_str(&text).ok();
    let obj = parsed.as_ref().and_then(Value::as_object);
    match parse_request(&text) {
        Ok(req) => {
            assert!(!req.id.is_empty(), "empty id accepted");
            assert!(!req.method.is_empty(), "empty method accepted");
            assert!(!text.contains('\0'));
            let obj = obj.expect("an accepted frame is a JSON object");
            assert_eq!(obj.get("type"), Some(&json!("req")));
            assert_eq!(obj.get("id").and_then(Value::as_str), Some(req.id.as_str()));
            assert_eq!(obj.get("method").and_then(Value::as_str), Some(req.method.as_str()));
            assert_eq!(&req.params, obj.get("params").unwrap_or(&Value::Null));
            assert!(obj.keys().all(|k| matches!(k.as_str(), "type" | "id" | "method" | "params" | "traceparent")));

            let frame = json!({"type": "req", "id": req.id, "method": req.method, "params": req.params});
            let again = parse_request(&frame.to_string()).expect("a re-serialized request parses");
            assert_eq!(
                (again.id.as_str(), again.method.as_str(), &again.params),
                (req.id.as_str(), req.method.as_str(), &req.params)
            );

            check_response(&req.id, Ok(json!({"ok": true})));
        }
        Err((id, e)) => {
            assert_eq!(e.code.as_str(), "INVALID_REQUEST");
            assert!(!e.message.is_empty());
            if let Some(id) = &id {
                // The id as JSON text: the frame's own id.
                match obj {
                    Some(obj) => {
                        let given: Value = serde_json::from_str(id).expect("an id read from JSON is JSON");
                        assert_eq!(obj.get("id"), Some(&given));
                        assert!(given.as_str().is_some_and(|s| !s.is_empty()), "an error with an empty id");
                    }
                    // A frame only JavaScript parses (a lone surrogate): the refusal names it, and the
                    // id is the frame's text as it was sent.
                    None => {
                        assert!(e.message.contains("surrogate"), "{}", e.message);
                        assert!(text.contains(id.as_str()), "the id {id:?} is not the frame's text");
                    }
                }
                let frame = refusal(Some(id), "unknown", e);
                assert!(frame.starts_with(r#"{"type":"res","id":"#) && frame.ends_with('}'), "{frame}");
            } else if let Some(obj) = obj {
                // No id reported: the frame had no usable id, or it was refused before reading it.
                let usable = obj.get("id").and_then(Value::as_str).is_some_and(|s| !s.is_empty());
                assert!(!usable || text.contains('\0'), "an object with id {:?} lost its id", obj.get("id"));
            }
        }
    }
});

fn check_response(id: &str, result: Result<Value, RpcError>) {
    let ok = result.is_ok();
    let frame: Value = serde_json::from_str(&response(id, result)).expect("a response frame is JSON");
    assert_eq!(frame["type"], json!("res"));
    assert_eq!(frame["id"], json!(id));
    assert_eq!(frame["ok"], json!(ok));
}
