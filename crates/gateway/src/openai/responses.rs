//! The Responses API on the OpenAI-compatible endpoint: `POST /v1/responses` and
//! `GET /v1/responses/{id}`. A request's `instructions` and `input` items are put in the shape of
//! a Chat Completions request and go through the same validation, session placement, turn pipeline
//! and client tools ([`super::parse_request`], [`super::answer`]); only the answer is written
//! otherwise (a `response` object, or its stream of `response.*` events).
//!
//! A response is a turn of a session: its id names the session (`sessionId`) and the turn (its
//! run id, the idempotency key of the turn's first row: the user row, or the first client tool
//! result of a turn that goes on after them), so it is found again from the transcript after any
//! restart, and the response is the turn's last assistant row. `previous_response_id` names that
//! row as the parent of the new turn's rows: continuing from an older response is a branch.
//! `store: false` keeps nothing (a background request, [`super::background`]).

use super::wire::{self, ApiError};
use super::{authorize, internal, Reply, Step};
use crate::sessions::{Principal, SessionRef};
use crate::state::Engine;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;

/// What a Responses request adds to the Chat Completions request it is put as.
pub struct Extra {
    /// `store` (default true): false keeps nothing.
    pub store: bool,
    /// The response `previous_response_id` names.
    pub previous: Option<Previous>,
    /// Echoed in the response as the client sent them.
    pub metadata: Value,
    pub instructions: Value,
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: Value,
    pub created_at: u64,
}

/// A stored response a request continues.
pub struct Previous {
    pub id: String,
    pub session: SessionRef,
    /// Its assistant row (the new turn's parent).
    pub entry: String,
    /// That row's Pi message.
    pub message: Value,
}

const ID_PREFIX: &str = "resp_";

/// The id of the response of turn `run_id` in the session `session_id` (a stored one), or of an
/// unstored response (`session_id` none: it names nothing that can be found again).
fn response_id(session_id: Option<&str>, run_id: &str) -> String {
    match session_id {
        Some(s) => format!("{ID_PREFIX}{s}_{run_id}"),
        None => format!("{ID_PREFIX}{}", run_id.replace(['-', '_'], "")),
    }
}

/// (session id, run id) of a stored response's id. Run ids hold no `_`.
fn parse_id(id: &str) -> Option<(&str, &str)> {
    let (session, run) = id.strip_prefix(ID_PREFIX)?.rsplit_once('_')?;
    (!session.is_empty() && run.starts_with(super::index::KEY_PREFIX)).then_some((session, run))
}

fn not_found(id: &str, field: Option<&str>) -> ApiError {
    let what = field.map_or(String::new(), |f| format!("{f}: "));
    ApiError::new(
        404,
        "invalid_request_error",
        Some("not_found"),
        format!("{what}no response {id:?} here (an unknown id, one stored with store: false, one of another API key, or of a session since reset or deleted)"),
    )
}

/// A stored response: its session and its turn's assistant entries (the last is the response).
/// Blocking.
fn find(
    gw: &Engine,
    principal: &Principal,
    id: &str,
    field: Option<&str>,
) -> Result<(SessionRef, Vec<Value>), ApiError> {
    let (session_id, run_id) = parse_id(id).ok_or_else(|| not_found(id, field))?;
    let sessions = gw.sessions.list(None).map_err(internal)?;
    let session = sessions
        .into_iter()
        .find(|s| s.session_id == session_id && principal.reaches(s.owner()))
        .ok_or_else(|| not_found(id, field))?;
    let entries = crate::durable::reply_entries(gw.store.as_ref(), &session.path, run_id)
        .map_err(|e| ApiError::new(500, "api_error", None, format!("cannot read the transcript: {e}")))?;
    if entries.is_empty() {
        return Err(not_found(id, field));
    }
    Ok((session, entries))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `POST /v1/responses`.
pub async fn create(
    State(gw): State<Arc<Engine>>,
    State(idx): State<Arc<super::index::ConversationIndex>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match respond(&gw, &idx, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn respond(
    gw: &Arc<Engine>,
    idx: &Arc<super::index::ConversationIndex>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let principal = authorize(gw, headers)?;
    let req = super::json_object(&body)?;
    let store = match req.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("store must be a boolean")),
    };
    let metadata = match req.get("metadata") {
        None | Some(Value::Null) => json!({}),
        Some(m @ Value::Object(o)) if o.values().all(Value::is_string) => m.clone(),
        Some(_) => return Err(ApiError::bad("metadata must be an object of string values")),
    };
    let previous = match req.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if !store => {
            return Err(ApiError::bad(format!(
                "previous_response_id: {id:?} cannot be continued with store: false here (an unstored turn has no session to continue); send store: true, or the whole conversation as input"
            )))
        }
        Some(Value::String(id)) => {
            let (p, id) = (principal.clone(), id.clone());
            let found = gw.blocking(move |gw| Ok(find(gw, &p, &id, Some("previous_response_id")).map(|f| (id, f))));
            let (id, (session, entries)) = found.await.map_err(internal)??;
            let last = entries.last().cloned().unwrap_or(Value::Null);
            let entry = last.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
            Some(Previous { id, session, entry, message: last["message"].clone() })
        }
        Some(_) => return Err(ApiError::bad("previous_response_id must be a string")),
    };
    let (messages, origins) = messages(&req, previous.as_ref())?;
    if messages.len() > super::MAX_MESSAGES {
        return Err(ApiError::bad(format!(
            "input holds {} items; one request may carry at most {}",
            messages.len(),
            super::MAX_MESSAGES
        )));
    }
    let chat = json!({
        "model": req.get("model").cloned().unwrap_or(Value::Null),
        "stream": req.get("stream").cloned().unwrap_or(Value::Null),
        "messages": messages,
        "tools": function_tools(&req)?,
        "tool_choice": req.get("tool_choice").cloned().unwrap_or(Value::Null),
    });
    let continues = previous.is_some();
    let extra = Extra {
        store,
        previous,
        metadata,
        instructions: req.get("instructions").cloned().unwrap_or(Value::Null),
        tools: req.get("tools").filter(|t| t.is_array()).cloned().unwrap_or_else(|| json!([])),
        tool_choice: req.get("tool_choice").filter(|t| !t.is_null()).cloned().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: req.get("parallel_tool_calls").filter(|t| t.is_boolean()).cloned().unwrap_or(json!(true)),
        created_at: now_secs(),
    };
    let mut ask = super::parse_request(gw, headers, &chat, &body, principal, Some(extra))
        .map_err(|e| ApiError { message: renamed(&e.message, &origins), ..e })?;
    drop(body);
    if continues {
        // The previous response's row, put first to check the input against it: it is in the tree.
        ask.conversation.history.remove(0);
    }
    super::answer(gw, idx, Arc::new(ask)).await
}

/// An error about `messages[j]` of the request as put, about the input item it came from.
fn renamed(message: &str, origins: &[String]) -> String {
    if let Some(rest) = message.strip_prefix("messages[") {
        if let Some((j, tail)) = rest.split_once(']') {
            if let Some(origin) = j.parse::<usize>().ok().and_then(|j| origins.get(j)) {
                return format!("{origin}{tail}");
            }
        }
    }
    match message.strip_prefix("messages ") {
        Some(rest) => format!("input {rest}"),
        None => message.replace("tool messages", "function_call_output items").replace("tool_calls", "function calls"),
    }
}

/// Text of a `content` (a string, or parts of type `input_text` / `output_text` / `refusal`), and
/// its images as Chat Completions `image_url` parts.
fn content(c: Option<&Value>, at: &str) -> Result<Value, ApiError> {
    match c {
        None | Some(Value::Null) => Ok(json!("")),
        Some(Value::String(s)) => Ok(json!(s)),
        Some(Value::Array(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let at = format!("{at}.content[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        let t = p.get("text").and_then(Value::as_str);
                        let t = t.ok_or_else(|| ApiError::bad(format!("{at}.text must be a string")))?;
                        out.push(json!({"type": "text", "text": t}));
                    }
                    Some("refusal") => {
                        let t = p.get("refusal").and_then(Value::as_str).unwrap_or_default();
                        out.push(json!({"type": "text", "text": t}));
                    }
                    Some("input_image") => {
                        let url = p.get("image_url").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::bad(format!("{at}.image_url must be a data: URL (file_id is not supported)"))
                        })?;
                        out.push(json!({"type": "image_url", "image_url": {"url": url}}));
                    }
                    other => {
                        return Err(ApiError::bad(format!(
                            "{at}: content of type {} is not supported (input_text, output_text and input_image are)",
                            other.map_or("(none)".to_string(), |t| format!("{t:?}"))
                        )))
                    }
                }
            }
            Ok(Value::Array(out))
        }
        Some(_) => Err(ApiError::bad(format!("{at}.content must be a string or an array of content parts"))),
    }
}

/// A `function_call_output`'s `output` as text (a string, or `input_text` parts).
fn output_text(o: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match o {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text"), Some(t)) => texts.push(t),
                    _ => return Err(ApiError::bad(format!("{at}.output[{j}]: only input_text parts are supported"))),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::bad(format!("{at}.output must be a string"))),
    }
}

/// `instructions` and `input` as Chat Completions messages, each with the field it came from;
/// the previous response (its text and client calls) first when one is continued.
fn messages(req: &Value, previous: Option<&Previous>) -> Result<(Vec<Value>, Vec<String>), ApiError> {
    let mut out: Vec<Value> = Vec::new();
    let mut origins: Vec<String> = Vec::new();
    match req.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.push(json!({"role": "system", "content": s}));
            origins.push("instructions".into());
        }
        Some(_) => return Err(ApiError::bad("instructions must be a string")),
    }
    let input = match req.get("input") {
        None | Some(Value::Null) => return Err(ApiError::bad("input is required")),
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(items)) if !items.is_empty() => items.clone(),
        Some(Value::Array(_)) => return Err(ApiError::bad("input must not be empty")),
        Some(_) => return Err(ApiError::bad("input must be a string or an array of items")),
    };
    if let Some(p) = previous {
        let calls = wire::without_index(wire::client_calls(&p.message));
        let first = input[0].get("type").and_then(Value::as_str);
        if !calls.is_empty() && first != Some("function_call_output") {
            return Err(ApiError::bad(format!(
                "input: the previous response {:?} called functions; input must begin with their function_call_output items",
                p.id
            )));
        }
        let mut m = json!({"role": "assistant", "content": wire::assistant_text(&p.message)});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
        origins.push("previous_response_id".into());
    }
    // Function calls join the assistant message right before them (one Pi message).
    let mut open_assistant = false;
    for (i, item) in input.iter().enumerate() {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(ApiError::bad(format!("{at} must be an object")));
        }
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str);
                let role = role.ok_or_else(|| ApiError::bad(format!("{at}.role must be a string")))?;
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(ApiError::bad(format!(
                        "{at}.role {role:?} is not user, assistant, system or developer"
                    )));
                }
                out.push(json!({"role": role, "content": content(item.get("content"), &at)?}));
                origins.push(at);
                open_assistant = role == "assistant";
            }
            "function_call" => {
                let s = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad(format!("{at}.{k} must be a string")))
                };
                let call = json!({"id": s("call_id")?, "type": "function",
                    "function": {"name": s("name")?, "arguments": s("arguments")?}});
                if !open_assistant {
                    out.push(json!({"role": "assistant", "content": ""}));
                    origins.push(at);
                    open_assistant = true;
                }
                if let Some(last) = out.last_mut() {
                    match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    }
                }
            }
            "function_call_output" => {
                let id = item.get("call_id").and_then(Value::as_str);
                let id = id.ok_or_else(|| ApiError::bad(format!("{at}.call_id must be a string")))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output_text(item.get("output"), &at)?}));
                origins.push(at);
                open_assistant = false;
            }
            // Reasoning the client kept (Codex sends its items back): Pincer's models' reasoning
            // stays in the transcript, so there is nothing to take from them.
            "reasoning" => {}
            other => {
                return Err(ApiError::bad(format!(
                "{at}.type {other:?} is not supported (message, function_call, function_call_output and reasoning are)"
            )))
            }
        }
    }
    Ok((out, origins))
}

/// The request's function tools in Chat Completions' shape. Tools of other types (the hosted
/// `web_search`, `file_search`, Codex's `namespace` and `custom` tools…) are not offered to the
/// model: Pincer runs none of them.
fn function_tools(req: &Value) -> Result<Value, ApiError> {
    let list = match req.get("tools") {
        None | Some(Value::Null) => return Ok(Value::Null),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(ApiError::bad("tools must be an array")),
    };
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            continue;
        }
        let name = t.get("name").and_then(Value::as_str).filter(|n| !n.trim().is_empty());
        let name = name.ok_or_else(|| ApiError::bad(format!("tools[{i}].name must be a non-empty string")))?;
        let mut f = json!({"name": name});
        for k in ["description", "parameters"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                f[k] = v.clone();
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// Pi-derived usage (Chat Completions' shape, [`wire::usage`]) in the Responses shape.
fn usage(u: &Value) -> Value {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    json!({
        "input_tokens": n("/prompt_tokens"),
        "input_tokens_details": {"cached_tokens": n("/prompt_tokens_details/cached_tokens"), "cache_write_tokens": 0},
        "output_tokens": n("/completion_tokens"),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n("/total_tokens"),
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = match status {
        "in_progress" => json!([]),
        _ => json!([text_part(text)]),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A client call (Chat Completions' `tool_calls` shape) as a `function_call` item.
fn call_item(c: &Value, status: &str, arguments: &str) -> Value {
    let call_id = c["id"].as_str().unwrap_or_default();
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
        "name": c["function"]["name"], "arguments": arguments, "status": status})
}

fn arguments(c: &Value) -> String {
    c["function"]["arguments"].as_str().unwrap_or("{}").to_owned()
}

/// The output items of a finished response: its message (when it has text, or nothing else), then
/// its function calls.
fn output(msg_id: &str, text: &str, calls: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        out.push(message_item(msg_id, text, "completed"));
    }
    out.extend(calls.iter().map(|c| call_item(c, "completed", &arguments(c))));
    out
}

/// How a reply's id, model and echoed fields read.
struct Shape {
    id: String,
    msg_id: String,
    model: String,
    previous: Option<String>,
}

fn shape(reply: &Reply, extra: &Extra) -> Shape {
    let id = response_id(reply.session_id.as_deref().filter(|_| extra.store), &reply.run_id);
    Shape {
        msg_id: format!("msg_{}", id.trim_start_matches(ID_PREFIX)),
        id,
        model: reply.ask.model_name.clone(),
        previous: extra.previous.as_ref().map(|p| p.id.clone()),
    }
}

/// The `response` object.
fn object(
    s: &Shape,
    extra: &Extra,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    error: Value,
    finish: &str,
) -> Value {
    let incomplete = match finish {
        "length" if status == "incomplete" => json!({"reason": "max_output_tokens"}),
        _ => Value::Null,
    };
    json!({
        "id": s.id,
        "object": "response",
        "created_at": extra.created_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": extra.instructions,
        "max_output_tokens": null,
        "model": s.model,
        "output": output,
        "parallel_tool_calls": extra.parallel_tool_calls,
        "previous_response_id": s.previous,
        "reasoning": {"effort": null, "summary": null},
        "store": extra.store,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": extra.tool_choice,
        "tools": extra.tools,
        "top_p": null,
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": extra.metadata,
    })
}

fn status_of(finish: &str) -> &'static str {
    match finish {
        "length" => "incomplete",
        _ => "completed",
    }
}

/// A finished response, whole.
pub(super) fn whole(reply: &Reply, extra: &Extra, text: String, finish: &str, u: Value, calls: Vec<Value>) -> Value {
    let s = shape(reply, extra);
    let out = output(&s.msg_id, &text, &calls);
    object(&s, extra, status_of(finish), out, usage(&u), Value::Null, finish)
}

/// Writes the events of one response, numbered.
struct Events {
    shape: Shape,
    seq: u64,
    /// The text so far, while its message item is open.
    text: Option<String>,
    /// Output items done.
    done: Vec<Value>,
}

impl Events {
    fn frame(&mut self, mut event: Value) -> Bytes {
        event["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = event["type"].as_str().unwrap_or("error").to_owned();
        Bytes::from(format!("event: {kind}\ndata: {event}\n\n"))
    }

    fn open_message(&mut self, out: &mut Vec<Bytes>) {
        if self.text.is_some() {
            return;
        }
        let (id, index) = (self.shape.msg_id.clone(), self.done.len());
        let item = message_item(&id, "", "in_progress");
        out.push(self.frame(json!({"type": "response.output_item.added", "output_index": index, "item": item})));
        out.push(self.frame(json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
            "content_index": 0, "part": text_part("")})));
        self.text = Some(String::new());
    }

    fn close_message(&mut self, out: &mut Vec<Bytes>) {
        let Some(text) = self.text.take() else { return };
        let (id, index) = (self.shape.msg_id.clone(), self.done.len());
        out.push(self.frame(json!({"type": "response.output_text.done", "item_id": id, "output_index": index,
            "content_index": 0, "text": text, "logprobs": []})));
        out.push(self.frame(json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
            "content_index": 0, "part": text_part(&text)})));
        let item = message_item(&id, &text, "completed");
        out.push(self.frame(json!({"type": "response.output_item.done", "output_index": index, "item": item})));
        self.done.push(item);
    }

    fn step(&mut self, extra: &Extra, step: Step) -> Vec<Bytes> {
        let mut out = Vec::new();
        match step {
            Step::Text(t) => {
                self.open_message(&mut out);
                let index = self.done.len();
                out.push(self.frame(json!({"type": "response.output_text.delta", "item_id": self.shape.msg_id,
                    "output_index": index, "content_index": 0, "delta": t, "logprobs": []})));
                if let Some(text) = self.text.as_mut() {
                    text.push_str(&t);
                }
            }
            Step::Done { finish, usage: u, calls } => {
                if calls.is_empty() {
                    self.open_message(&mut out); // a reply with no text still has its message
                }
                self.close_message(&mut out);
                for c in &calls {
                    let (index, args) = (self.done.len(), arguments(c));
                    let item_id = call_item(c, "in_progress", "")["id"].clone();
                    let added = call_item(c, "in_progress", "");
                    out.push(
                        self.frame(json!({"type": "response.output_item.added", "output_index": index, "item": added})),
                    );
                    out.push(self.frame(json!({"type": "response.function_call_arguments.delta", "item_id": item_id,
                        "output_index": index, "delta": args})));
                    out.push(self.frame(json!({"type": "response.function_call_arguments.done", "item_id": item_id,
                        "output_index": index, "name": c["function"]["name"], "arguments": args})));
                    let item = call_item(c, "completed", &args);
                    out.push(
                        self.frame(json!({"type": "response.output_item.done", "output_index": index, "item": item})),
                    );
                    self.done.push(item);
                }
                let status = status_of(finish);
                let body = object(&self.shape, extra, status, self.done.clone(), usage(&u), Value::Null, finish);
                let kind = match status {
                    "incomplete" => "response.incomplete",
                    _ => "response.completed",
                };
                out.push(self.frame(json!({"type": kind, "response": body})));
            }
            Step::Failed(e) => {
                self.close_message(&mut out);
                let code = match e.status {
                    429 => "rate_limit_exceeded",
                    400..=499 => "invalid_prompt",
                    _ => "server_error",
                };
                let error = json!({"code": code, "message": e.message});
                let body = object(&self.shape, extra, "failed", self.done.clone(), Value::Null, error, "");
                out.push(self.frame(json!({"type": "response.failed", "response": body})));
            }
        }
        out
    }
}

/// A response as Server-Sent Events: `response.created`, `response.in_progress`, the items as they
/// come, then `response.completed` (or `response.incomplete`, `response.failed`).
pub(super) fn sse(reply: &Reply, steps: futures::stream::BoxStream<'static, Option<Step>>) -> Response {
    let Some(extra) = reply.ask.responses.as_ref() else {
        return ApiError::new(500, "api_error", None, "not a Responses request").into_response();
    };
    let mut events = Events { shape: shape(reply, extra), seq: 0, text: None, done: Vec::new() };
    let start = object(&events.shape, extra, "in_progress", vec![], Value::Null, Value::Null, "");
    let head = vec![
        events.frame(json!({"type": "response.created", "response": start})),
        events.frame(json!({"type": "response.in_progress", "response": start})),
    ];
    let ask = reply.ask.clone();
    let body = futures::stream::iter(head)
        .chain(steps.filter_map(|s| async move { s }).flat_map(move |step| {
            let out = match ask.responses.as_ref() {
                Some(extra) => events.step(extra, step),
                None => vec![],
            };
            futures::stream::iter(out)
        }))
        .map(Ok::<Bytes, std::convert::Infallible>);
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /v1/responses/{id}`: a stored response, read from its session's transcript.
pub async fn retrieve(State(gw): State<Arc<Engine>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let principal = match authorize(&gw, &headers) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let found = gw.blocking(move |gw| Ok(find(gw, &principal, &id, None).map(|f| (id, f)))).await;
    let (id, (session, entries)) = match found.map_err(internal).and_then(|r| r) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let last = entries.last().map(|e| &e["message"]).cloned().unwrap_or(Value::Null);
    let text: String = entries.iter().map(|e| wire::assistant_text(&e["message"])).collect();
    let calls = wire::client_calls(&last);
    let finish = wire::finish_reason(&last);
    let failed = last.get("stopReason").and_then(Value::as_str) == Some("error");
    let (status, error) = match failed {
        true => {
            let message = last.get("errorMessage").and_then(Value::as_str).unwrap_or("the run failed");
            ("failed", json!({"code": "server_error", "message": message}))
        }
        false => (status_of(finish), Value::Null),
    };
    let model = match (last.get("provider").and_then(Value::as_str), last.get("model").and_then(Value::as_str)) {
        (Some(p), Some(m)) => format!("{p}/{m}"),
        _ => "pincer".into(),
    };
    let s = Shape { msg_id: format!("msg_{}", id.trim_start_matches(ID_PREFIX)), id, model, previous: None };
    let extra = Extra {
        store: true,
        previous: None,
        metadata: json!({}),
        instructions: Value::Null,
        tools: json!([]),
        tool_choice: json!("auto"),
        parallel_tool_calls: json!(true),
        created_at: last.get("timestamp").and_then(Value::as_u64).map_or(0, |t| t / 1000),
    };
    let out = output(&s.msg_id, &text, &calls);
    let mut r =
        Json(object(&s, &extra, status, out, usage(&wire::usage(last.get("usage"))), error, finish)).into_response();
    if let Ok(v) = HeaderValue::from_str(&session.key) {
        r.headers_mut().insert("x-pincer-session-key", v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_the_session_and_the_turn() {
        let id = response_id(Some("0b6c-41d2"), "oai-b0123-17");
        assert_eq!(parse_id(&id), Some(("0b6c-41d2", "oai-b0123-17")));
        // An unstored response's id names nothing.
        assert_eq!(parse_id(&response_id(None, "oai-bg-1234-abcd")), None);
        assert_eq!(parse_id("resp_x"), None);
    }

    #[test]
    fn input_items_become_messages_and_errors_name_the_item() {
        let req = json!({"instructions": "Be brief.", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "look", "arguments": "{\"a\":1}"},
            {"type": "reasoning", "summary": []},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        ]});
        let (m, origins) = messages(&req, None).expect("valid");
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["tool_calls"].as_array().map(Vec::len), Some(2), "the calls join their message");
        assert_eq!(m[4], json!({"role": "tool", "tool_call_id": "c2", "content": "two"}));
        assert_eq!(origins[4], "input[6]");
        let bad = |input: Value| messages(&json!({"input": input}), None).expect_err("refused").message;
        assert!(bad(json!([{"role": "wizard", "content": "x"}])).starts_with("input[0].role"));
        assert!(bad(json!([{"type": "item_reference", "id": "x"}])).contains("input[0].type"));
        assert!(bad(json!([{"type": "function_call_output", "output": "x"}])).contains("input[0].call_id"));
        assert_eq!(bad(json!([])), "input must not be empty");
        assert_eq!(renamed("messages[2] has no content", &origins), "input[1] has no content");
    }
}
