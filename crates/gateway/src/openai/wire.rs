//! OpenAI Chat Completions shapes ↔ Pi messages: a request's `messages` become the system prompt,
//! the Pi messages of its history and its new user turn; each message gets a content hash (the
//! same function for a Pi message read from a transcript and for one converted from a request, so
//! "the client's history equals this branch" is a comparison of hashes); usage, finish reasons and
//! errors are written in OpenAI's shapes.

use crate::openclaw::chat::sanitize_message;
use pincer_store::redact::Redactor;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A message's content hash, or a chain of them (the hash of a whole history up to a message).
pub type Hash = u128;

/// The chain of an empty history.
pub const ROOT: Hash = 0;

/// Marks the Pi messages a client sent as history (assistant rows it wrote, tool steps it ran), so
/// they are told apart from the gateway's own tool steps (which a client never sees).
pub const CLIENT_FIELD: &str = "openaiClient";

pub use pincer_agent::CLIENT_CALLS_FIELD;

/// The chain hash of a history `prev` followed by a message whose hash is `message`.
pub fn chain(prev: Hash, message: Hash) -> Hash {
    let mut h = Sha256::new();
    h.update(prev.to_le_bytes());
    h.update(message.to_le_bytes());
    first_128(&h.finalize())
}

fn first_128(digest: &[u8]) -> Hash {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(b)
}

fn text_blocks<'a>(content: Option<&'a Value>, sep: &str) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<&'a str>>()
            .join(sep),
        _ => String::new(),
    }
}

/// The text an OpenAI client sees of an assistant message (its text blocks, joined).
pub use crate::follow::reply_text as assistant_text;

fn field(h: &mut Sha256, tag: &[u8], value: &[u8]) {
    h.update(tag);
    h.update((value.len() as u64).to_le_bytes());
    h.update(value);
}

/// The content hash of a Pi message as an OpenAI client would resend it, or `None` for a message a
/// client never sees: the gateway's own tool steps (an assistant message that stopped for tools and
/// its tool results, unless a client sent them), error rows, and custom roles. Compared by role,
/// text (trimmed), images, tool calls and tool results; timestamps, usage and model are ignored.
pub fn message_hash(m: &Value) -> Option<Hash> {
    let role = m.get("role")?.as_str()?;
    let client = m.get(CLIENT_FIELD).and_then(Value::as_bool) == Some(true);
    let mut h = Sha256::new();
    match role {
        "user" => {
            field(&mut h, b"role", b"user");
            field(&mut h, b"text", text_blocks(m.get("content"), "\n").trim().as_bytes());
            for b in m.get("content").and_then(Value::as_array).into_iter().flatten() {
                if b.get("type").and_then(Value::as_str) == Some("image") {
                    let data = b.get("data").and_then(Value::as_str).unwrap_or("");
                    field(&mut h, b"image", &Sha256::digest(data.trim().as_bytes()));
                }
            }
        }
        "assistant" => {
            let stop = m.get("stopReason").and_then(Value::as_str);
            // A message that called client tools is what the client got back: its text and those calls.
            let handed_back = m.get(CLIENT_CALLS_FIELD).and_then(Value::as_array);
            if !client && handed_back.is_none() && (stop == Some("toolUse") || stop == Some("error")) {
                return None;
            }
            let shown = |b: &Value| handed_back.is_none_or(|ids| ids.iter().any(|id| Some(id) == b.get("id")));
            field(&mut h, b"role", b"assistant");
            field(&mut h, b"text", assistant_text(m).trim().as_bytes());
            for b in m.get("content").and_then(Value::as_array).into_iter().flatten() {
                if b.get("type").and_then(Value::as_str) == Some("toolCall") && shown(b) {
                    field(&mut h, b"call", b.get("id").and_then(Value::as_str).unwrap_or("").as_bytes());
                    field(&mut h, b"name", b.get("name").and_then(Value::as_str).unwrap_or("").as_bytes());
                    let args = b.get("arguments").cloned().unwrap_or_else(|| json!({}));
                    field(&mut h, b"args", args.to_string().as_bytes());
                }
            }
        }
        "toolResult" => {
            if !client {
                return None;
            }
            field(&mut h, b"role", b"tool");
            field(&mut h, b"call", m.get("toolCallId").and_then(Value::as_str).unwrap_or("").as_bytes());
            field(&mut h, b"text", text_blocks(m.get("content"), "\n").trim().as_bytes());
        }
        _ => return None,
    }
    Some(first_128(&h.finalize()))
}

/// A request's `messages`, converted.
#[derive(Debug, Default)]
pub struct Conversation {
    /// The `system` and `developer` messages, joined (`None`: there were none).
    pub system: Option<String>,
    /// Everything before the trailing user message(s), as Pi messages.
    pub history: Vec<Value>,
    /// The trailing user messages but the last, as Pi messages (written before the turn's row).
    pub extra_users: Vec<Value>,
    /// The last user message: its text and Pi image blocks (the turn's own row).
    pub text: String,
    pub images: Vec<Value>,
    /// The results of client tools the request ends with (then there is no new user message:
    /// `extra_users` and `text` are empty and the turn goes on from these).
    pub tool_results: Vec<Value>,
}

impl Conversation {
    /// The content hashes of `history` followed by the trailing user messages.
    pub fn hashes(&self) -> (Vec<Option<Hash>>, Vec<Option<Hash>>) {
        let history = self.history.iter().map(message_hash).collect();
        if !self.tool_results.is_empty() {
            return (history, self.tool_results.iter().map(message_hash).collect());
        }
        let mut trailing: Vec<Option<Hash>> = self.extra_users.iter().map(message_hash).collect();
        trailing.push(message_hash(&user_message(&self.text, &self.images)));
        (history, trailing)
    }
}

/// A Pi user message as the turn writes it (the hash of what `chat.send` will store).
pub fn user_message(text: &str, images: &[Value]) -> Value {
    if images.is_empty() {
        return json!({"role": "user", "content": text});
    }
    let mut blocks = Vec::new();
    if !text.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    blocks.extend(images.iter().cloned());
    json!({"role": "user", "content": blocks})
}

/// A client's request error: HTTP 400 naming what was wrong.
pub type Bad = String;

fn clean(text: &str, redactor: &dyn Redactor, at: &str) -> Result<String, Bad> {
    let s = sanitize_message(text).map_err(|e| format!("{at}: {}", e.message))?;
    Ok(redactor.redact_str(&s))
}

/// Text and images of an OpenAI `content` (a string or an array of parts).
fn parts(content: Option<&Value>, at: &str, redactor: &dyn Redactor) -> Result<(String, Vec<Value>), Bad> {
    match content {
        None | Some(Value::Null) => Ok((String::new(), vec![])),
        Some(Value::String(s)) => Ok((clean(s, redactor, at)?, vec![])),
        Some(Value::Array(list)) => {
            let (mut texts, mut images) = (Vec::new(), Vec::new());
            for (i, p) in list.iter().enumerate() {
                let at = format!("{at}.content[{i}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("text" | "input_text") => {
                        let t = p.get("text").and_then(Value::as_str).ok_or(format!("{at}.text must be a string"))?;
                        texts.push(clean(t, redactor, &at)?);
                    }
                    Some("image_url") => {
                        let url = p
                            .get("image_url")
                            .and_then(|u| u.get("url").or(Some(u)))
                            .and_then(Value::as_str)
                            .ok_or(format!("{at}.image_url.url must be a string"))?;
                        images.push(data_url_image(url, &at)?);
                    }
                    other => {
                        return Err(format!(
                            "{at}: content parts of type {} are not supported (text and image_url are)",
                            other.map_or("(none)".to_string(), |t| format!("{t:?}"))
                        ))
                    }
                }
            }
            Ok((texts.join("\n"), images))
        }
        Some(_) => Err(format!("{at}.content must be a string or an array of content parts")),
    }
}

/// A `data:image/…;base64,…` URL as a Pi image block (remote URLs are not fetched).
fn data_url_image(url: &str, at: &str) -> Result<Value, Bad> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(format!("{at}: only data: image URLs are accepted (the gateway does not fetch {url:.40})"));
    };
    let (mime, data) = rest.split_once(";base64,").ok_or(format!("{at}: the data URL must be base64"))?;
    if !mime.starts_with("image/") {
        return Err(format!("{at}: {mime:?} is not an image type"));
    }
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("{at}: the image is not base64: {e}"))?;
    if bytes.len() > crate::openclaw::chat::MAX_ATTACHMENT_BYTES {
        return Err(format!("{at}: the image is larger than {} bytes", crate::openclaw::chat::MAX_ATTACHMENT_BYTES));
    }
    Ok(json!({"type": "image", "data": data.trim(), "mimeType": mime}))
}

/// A client's assistant message (history) as a Pi assistant message.
fn assistant(m: &Value, at: &str, redactor: &dyn Redactor, now: u64) -> Result<Value, Bad> {
    let (text, _) = parts(m.get("content"), at, redactor)?;
    let mut blocks = Vec::new();
    if !text.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(c)) => c.clone(),
        Some(_) => return Err(format!("{at}.tool_calls must be an array")),
    };
    for (i, c) in calls.iter().enumerate() {
        let at = format!("{at}.tool_calls[{i}]");
        let id = c.get("id").and_then(Value::as_str).ok_or(format!("{at}.id must be a string"))?;
        let f = c.get("function").ok_or(format!("{at}.function is required"))?;
        let name = f.get("name").and_then(Value::as_str).ok_or(format!("{at}.function.name must be a string"))?;
        let args = match f.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) if s.trim().is_empty() => json!({}),
            Some(Value::String(s)) => {
                serde_json::from_str(s).map_err(|e| format!("{at}.function.arguments is not JSON: {e}"))?
            }
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => return Err(format!("{at}.function.arguments must be a JSON string")),
        };
        blocks.push(json!({"type": "toolCall", "id": id, "name": name, "arguments": args}));
    }
    let stop = if calls.is_empty() { "stop" } else { "toolUse" };
    Ok(json!({
        "role": "assistant",
        "content": blocks,
        "api": "openai-completions",
        "provider": "openai-client",
        "model": "client-history",
        "usage": crate::state::zero_usage(),
        "stopReason": stop,
        "timestamp": now,
        CLIENT_FIELD: true,
    }))
}

/// Converts a request's `messages`. Errors name the message at fault.
pub fn conversation(messages: &Value, redactor: &dyn Redactor) -> Result<Conversation, Bad> {
    let list = messages.as_array().ok_or("messages must be an array")?;
    if list.is_empty() {
        return Err("messages must not be empty".into());
    }
    let now = pincer_pi::now_ms();
    let mut system: Vec<String> = Vec::new();
    let mut converted: Vec<(bool, Value, Vec<Value>)> = Vec::new(); // (is user, message, images)
    let mut tool_names: std::collections::HashMap<String, String> = Default::default();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).ok_or(format!("{at}.role must be a string"))?;
        match role {
            "system" | "developer" => system.push(parts(m.get("content"), &at, redactor)?.0),
            "user" => {
                let (text, images) = parts(m.get("content"), &at, redactor)?;
                if text.trim().is_empty() && images.is_empty() {
                    return Err(format!("{at} has no content"));
                }
                let mut msg = user_message(&text, &images);
                msg["timestamp"] = json!(now);
                converted.push((true, msg, images));
            }
            "assistant" => {
                let msg = assistant(m, &at, redactor, now)?;
                for b in msg["content"].as_array().into_iter().flatten() {
                    if let (Some(id), Some(name)) = (b["id"].as_str(), b["name"].as_str()) {
                        tool_names.insert(id.to_owned(), name.to_owned());
                    }
                }
                converted.push((false, msg, vec![]));
            }
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or(format!("{at}.tool_call_id must be a string"))?;
                let (text, _) = parts(m.get("content"), &at, redactor)?;
                let msg = json!({
                    "role": "toolResult",
                    "toolCallId": id,
                    "toolName": tool_names.get(id).cloned().unwrap_or_default(),
                    "content": [{"type": "text", "text": text}],
                    "isError": false,
                    "timestamp": now,
                    CLIENT_FIELD: true,
                });
                converted.push((false, msg, vec![]));
            }
            other => return Err(format!("{at}.role {other:?} is not system, developer, user, assistant or tool")),
        }
    }
    let system = (!system.is_empty()).then(|| system.join("\n\n"));
    let results = converted.iter().rev().take_while(|(_, m, _)| m["role"] == "toolResult").count();
    if results > 0 {
        let tool_results: Vec<Value> =
            converted.split_off(converted.len() - results).into_iter().map(|c| c.1).collect();
        let asked = converted.last().is_some_and(|(_, m, _)| m["role"] == "assistant" && m["stopReason"] == "toolUse");
        if !asked {
            return Err("the tool messages at the end must follow an assistant message with tool_calls".into());
        }
        let history = converted.into_iter().map(|(_, m, _)| m).collect();
        return Ok(Conversation { system, history, tool_results, ..Conversation::default() });
    }
    let trailing = converted.iter().rev().take_while(|(user, _, _)| *user).count();
    if trailing == 0 {
        return Err("the last message must be a user message, or the tool messages answering the last assistant message's tool_calls".into());
    }
    let mut users: Vec<(bool, Value, Vec<Value>)> = converted.split_off(converted.len() - trailing);
    let Some((_, last, images)) = users.pop() else { return Err("messages must end with a user message".into()) };
    Ok(Conversation {
        system,
        history: converted.into_iter().map(|(_, m, _)| m).collect(),
        extra_users: users.into_iter().map(|(_, m, _)| m).collect(),
        text: text_blocks(last.get("content"), "\n"),
        images,
        tool_results: vec![],
    })
}

/// Pi usage as OpenAI usage (`prompt_tokens` counts cached input, as OpenAI's does).
pub fn usage(u: Option<&Value>) -> Value {
    let n = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("input") + n("cacheRead") + n("cacheWrite");
    let completion = n("output");
    let total = match n("totalTokens") {
        0 => prompt + completion,
        t => t,
    };
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": n("cacheRead")}})
}

/// OpenAI's `finish_reason` for a Pi assistant message (`tool_calls` when it called client tools).
pub fn finish_reason(message: &Value) -> &'static str {
    if message.get(CLIENT_CALLS_FIELD).and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
        return "tool_calls";
    }
    match message.get("stopReason").and_then(Value::as_str) {
        Some("length") => "length",
        _ => "stop",
    }
}

/// The calls of client tools a Pi assistant message made, as OpenAI's `tool_calls` (with `index`).
pub fn client_calls(message: &Value) -> Vec<Value> {
    let Some(ids) = message.get(CLIENT_CALLS_FIELD).and_then(Value::as_array) else { return vec![] };
    let blocks = message.get("content").and_then(Value::as_array).into_iter().flatten();
    blocks
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("toolCall"))
        .filter(|b| b.get("id").is_some_and(|id| ids.contains(id)))
        .enumerate()
        .map(|(i, b)| {
            let args = b.get("arguments").cloned().unwrap_or_else(|| json!({}));
            json!({"index": i, "id": b["id"], "type": "function",
                "function": {"name": b["name"], "arguments": args.to_string()}})
        })
        .collect()
}

/// [`client_calls`] as a whole message lists them (OpenAI's shape: no `index`, which only stream
/// deltas carry).
pub fn without_index(mut calls: Vec<Value>) -> Vec<Value> {
    for c in &mut calls {
        if let Some(o) = c.as_object_mut() {
            o.remove("index");
        }
    }
    calls
}

/// The client's tools of a request (`tools`, `tool_choice`) as specs offered to the model.
/// `tool_choice` `"auto"` (or absent) offers them, `"none"` does not; forcing a call is refused:
/// the agent's providers are not told to force one.
pub fn client_tools(req: &Value) -> Result<Vec<pincer_agent::ToolSpec>, Bad> {
    let list = match req.get("tools") {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(l)) => l,
        Some(_) => return Err("tools must be an array".into()),
    };
    match req.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(c)) if c == "auto" => {}
        Some(Value::String(c)) if c == "none" => return Ok(vec![]),
        Some(other) => {
            return Err(format!(
            "tool_choice {other} is not supported: send \"auto\" or \"none\" (the model is not forced to call a tool)"
        ))
        }
    }
    let mut out: Vec<pincer_agent::ToolSpec> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(format!("{at}.type must be \"function\""));
        }
        let f = t.get("function").filter(|f| f.is_object()).ok_or(format!("{at}.function must be an object"))?;
        let name = f.get("name").and_then(Value::as_str).filter(|n| !n.trim().is_empty());
        let name = name.ok_or(format!("{at}.function.name must be a non-empty string"))?;
        if out.iter().any(|s| s.name == name) {
            return Err(format!("{at}: two tools are named {name:?}"));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => "",
            Some(Value::String(d)) => d.as_str(),
            Some(_) => return Err(format!("{at}.function.description must be a string")),
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(format!("{at}.function.parameters must be a JSON schema object")),
        };
        out.push(pincer_agent::ToolSpec::new(name, description, parameters));
    }
    Ok(out)
}

/// An error in OpenAI's shape: HTTP status and `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, code: Option<&'static str>, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, code }
    }

    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_request_error", None, message)
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": Value::Null, "code": self.code}})
    }

    /// A failed run (a `chat` error event): provider errors keep the provider's status where it is
    /// the client's to fix (400, 404, 413, 422, 429), anything else is a 500.
    pub fn from_run(message: &str, kind: &str) -> ApiError {
        let provider_status = message
            .match_indices("HTTP ")
            .find_map(|(i, _)| message.get(i + 5..i + 8).and_then(|s| s.parse::<u16>().ok()));
        match (kind, provider_status) {
            ("rate_limit", _) | (_, Some(429)) => {
                ApiError::new(429, "rate_limit_error", Some("rate_limit_exceeded"), message)
            }
            ("context_length", _) => {
                ApiError::new(400, "invalid_request_error", Some("context_length_exceeded"), message)
            }
            (_, Some(s @ (400 | 404 | 413 | 422))) => ApiError::new(s, "invalid_request_error", None, message),
            ("persistence", _) => ApiError::new(500, "api_error", Some("persistence"), message),
            ("timeout", _) => ApiError::new(500, "api_error", Some("timeout"), message),
            _ => ApiError::new(500, "api_error", None, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pincer_store::redact::NoRedaction;

    #[test]
    fn a_request_and_the_transcript_it_becomes_hash_alike() {
        let req = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "assistant", "content": "Hi there!"},
            {"role": "user", "content": "and now?"},
        ]);
        let c = conversation(&req, &NoRedaction).expect("valid");
        assert_eq!(c.system.as_deref(), Some("Be brief."));
        assert_eq!(c.text, "and now?");
        assert_eq!(c.history.len(), 2);
        // The rows the gateway writes for that history: a user row, a reply from a provider.
        let user = json!({"role": "user", "content": "hello", "timestamp": 5, "idempotencyKey": "k:user"});
        let reply = json!({"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
            {"type": "text", "text": "Hi there!"}], "stopReason": "stop", "provider": "fake", "usage": {}});
        let (hist, trailing) = c.hashes();
        assert_eq!(hist, vec![message_hash(&user), message_hash(&reply)]);
        assert_eq!(trailing, vec![message_hash(&json!({"role": "user", "content": "and now?"}))]);
        assert_ne!(message_hash(&user), message_hash(&reply));
        // The gateway's own tool steps are not what a client resends.
        assert_eq!(message_hash(&json!({"role": "assistant", "content": [], "stopReason": "toolUse"})), None);
        assert_eq!(message_hash(&json!({"role": "toolResult", "toolCallId": "c", "content": []})), None);
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let bad = |v: Value| conversation(&v, &NoRedaction).expect_err("refused");
        assert_eq!(bad(json!([])), "messages must not be empty");
        assert!(bad(json!([{"role": "wizard", "content": "x"}])).contains("messages[0].role \"wizard\""));
        assert!(bad(json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]))
            .contains("the last message must be a user message"));
        assert!(bad(
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}])
        )
        .contains("only data: image URLs"));
    }

    #[test]
    fn run_errors_keep_the_providers_status_where_the_client_can_act() {
        assert_eq!(ApiError::from_run("fake/m: HTTP 400 Bad Request: told to fail", "unknown").status, 400);
        assert_eq!(ApiError::from_run("HTTP 429 Too Many Requests: slow down", "rate_limit").status, 429);
        assert_eq!(ApiError::from_run("HTTP 401 Unauthorized: bad key", "unknown").status, 500);
        assert_eq!(ApiError::from_run("the disk is full", "persistence").code, Some("persistence"));
    }
}
