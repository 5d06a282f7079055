//! The OpenAI-compatible endpoint (`[gateway.openai_api] enabled = true`): `POST
//! /v1/chat/completions` (streamed in OpenAI's chunk format, or whole), the Responses API
//! ([`responses`]) and `GET /v1/models`, behind `Authorization: Bearer <gateway token or a
//! configured API key>`.
//!
//! A stateless client resends its whole conversation each time; the endpoint maps it onto one
//! session's tree. An explicit `x-openclaw-session-key` / `x-pincer-session-key` names the session
//! (or Open WebUI's forwarded chat id, [`OPEN_WEBUI_CHAT_HEADER`]); otherwise the [`index`] finds where the history ends: on a session's active branch (the new turn
//! is appended there), inside some branch (the turn branches from the last common entry, as an edit
//! in the WebChat does), or nowhere (a new session). The turn itself runs through `chat.send`'s
//! pipeline ([`crate::turn::start_turn`]): user row persisted before the model is called, live
//! events to every watcher of the session, the reply persisted before the final chunk, and the
//! idempotency key (from `Idempotency-Key` or `x-request-id`, with the body's hash) durable in the
//! transcript. Only such a key makes a request a retry: an identical body without one is a new
//! request, and when the whole request ends at a user row that already has a reply it is a
//! regenerate (a sibling reply under that row, no second user row).
//!
//! Client tools (`tools`) are offered to the model beside the agent's; a call of one ends the run
//! with the assistant row written, and goes back as `tool_calls`; the request that brings the
//! results (`tool` messages at the end) appends them and the run goes on ([`Graft::continues`]).

pub mod background;
pub mod index;
pub mod responses;
pub mod wire;

use crate::config::AuthMode;
use crate::error::EngineError;
use crate::follow::{TurnEvent, TurnStream};
use crate::protocol::{ErrorCode, RunStatus};
use crate::sessions::{Principal, SessionRef, DEFAULT_AGENT};
use crate::state::Engine;
use crate::turn::{start_turn, Graft, TurnRequest, SYSTEM_PROMPT_FIELD};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use index::ConversationIndex;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use wire::{ApiError, Conversation, Hash, ROOT};

/// Largest request body (room for 20 MB of images as base64).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// The header Open WebUI forwards its chat id in (`FORWARD_SESSION_INFO_HEADER_CHAT_ID`, sent with
/// `ENABLE_FORWARD_USER_INFO_HEADERS=true`): without a session key header, the session is
/// `agent:<agent>:openwebui:<chat id>`.
pub const OPEN_WEBUI_CHAT_HEADER: &str = "x-openwebui-chat-id";

/// The headers whose value makes a request's idempotency key, the first present wins.
pub const KEY_HEADERS: [&str; 2] = ["idempotency-key", "x-request-id"];
/// Longest `Idempotency-Key` / `x-request-id` taken as an idempotency key.
const MAX_REQUEST_ID: usize = 200;

/// The endpoint's routes (they answer 404 in OpenAI's shape while it is off), over any router
/// state that hands out the engine and the conversation index.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Arc<Engine>: axum::extract::FromRef<S>,
    Arc<ConversationIndex>: axum::extract::FromRef<S>,
{
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The endpoint is on, and the request carries the gateway token (the operator) or a configured
/// key (that key's principal).
pub(crate) fn authorize(gw: &Engine, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let Some(api) = &gw.settings.openai_api else {
        return Err(ApiError::new(
            404,
            "invalid_request_error",
            Some("not_found"),
            "the OpenAI-compatible API is off: set [gateway.openai_api] enabled = true in pincer.toml (or PINCER_OPENAI_API=1)",
        ));
    };
    let token = match &gw.settings.auth {
        AuthMode::Token(t) if !t.is_empty() => Some(t.as_str()),
        AuthMode::Token(_) => None,
        AuthMode::None if api.api_keys.is_empty() => return Ok(Principal::Operator),
        AuthMode::None => None,
    };
    let Some(given) = bearer(headers) else {
        return Err(ApiError::new(
            401,
            "invalid_request_error",
            Some("missing_api_key"),
            "no API key: send the gateway token (or a key of gateway.openai_api.api_keys) as Authorization: Bearer <key>",
        ));
    };
    // Every candidate is compared (in constant time each), so timing tells nothing about which matched.
    let operator = token.is_some_and(|t| crate::openclaw::ws::same_secret(given, t));
    let key = api.api_keys.iter().fold(None, |found, k| match crate::openclaw::ws::same_secret(given, k) {
        true => Some(k),
        false => found,
    });
    match (operator, key) {
        (true, _) => Ok(Principal::Operator),
        (false, Some(k)) => Ok(Principal::of_api_key(k)),
        (false, None) => {
            Err(ApiError::new(401, "invalid_request_error", Some("invalid_api_key"), "incorrect API key provided"))
        }
    }
}

/// The names `model` may take: `pincer`, the agent ids, and every configured `provider/model`.
fn model_names(gw: &Engine) -> Vec<(String, &'static str)> {
    let mut out = vec![("pincer".to_string(), "pincer"), (DEFAULT_AGENT.to_string(), "pincer")];
    let mut configured = gw.settings.providers.configured();
    if !configured.contains(&gw.settings.model) {
        configured.push(gw.settings.model.clone());
    }
    out.extend(configured.into_iter().filter(|m| !m.contains("/<")).map(|m| (m, "pincer-config")));
    out
}

fn model_object(id: &str, owner: &str, created: u64) -> Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": owner})
}

fn started_secs(gw: &Engine) -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    now.saturating_sub(gw.started.elapsed().as_secs())
}

async fn models(State(gw): State<Arc<Engine>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&gw, &headers) {
        return e.into_response();
    }
    let created = started_secs(&gw);
    let data: Vec<Value> = model_names(&gw).iter().map(|(id, owner)| model_object(id, owner, created)).collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(State(gw): State<Arc<Engine>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(e) = authorize(&gw, &headers) {
        return e.into_response();
    }
    match model_names(&gw).into_iter().find(|(m, _)| *m == id) {
        Some((m, owner)) => Json(model_object(&m, owner, started_secs(&gw))).into_response(),
        None => unknown_model(&id).into_response(),
    }
}

fn unknown_model(name: &str) -> ApiError {
    ApiError::new(
        404,
        "invalid_request_error",
        Some("model_not_found"),
        format!("the model {name:?} does not exist here; GET /v1/models lists pincer, the agent ids and the configured provider/model names"),
    )
}

/// The agent and the model override a request's `model` names.
fn resolve_model(gw: &Engine, name: &str) -> Result<(String, Option<String>), ApiError> {
    let lowered = name.trim().to_ascii_lowercase();
    if lowered.is_empty() || lowered == "pincer" || lowered == "pincer/default" || lowered == DEFAULT_AGENT {
        return Ok((DEFAULT_AGENT.into(), None));
    }
    if name.contains('/') && gw.settings.providers.resolve(name.trim()).is_ok() {
        return Ok((DEFAULT_AGENT.into(), Some(name.trim().to_owned())));
    }
    Err(unknown_model(name))
}

/// The request's idempotency key prefix: the key header ([`KEY_HEADERS`]) and the body, hashed;
/// and whether there was such a header (only then is the request looked up as a retry).
fn request_key(headers: &HeaderMap, body: &[u8]) -> Result<(String, bool), ApiError> {
    let id = match KEY_HEADERS.iter().find_map(|h| headers.get(*h).map(|v| (*h, v))) {
        None => None,
        Some((name, v)) => {
            let v = v.to_str().map_err(|_| ApiError::bad(format!("{name} must be ASCII")))?.trim();
            if v.len() > MAX_REQUEST_ID || v.is_empty() {
                return Err(ApiError::bad(format!("{name} must be 1 to {MAX_REQUEST_ID} characters")));
            }
            Some(v.to_owned())
        }
    };
    let mut h = Sha256::new();
    h.update(id.as_deref().unwrap_or("").as_bytes());
    h.update([0]);
    h.update(body);
    let hex: String = h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect();
    let by_id = id.is_some();
    Ok((format!("{}{}{hex}", index::KEY_PREFIX, if by_id { "r" } else { "b" }), by_id))
}

/// The validated request.
struct Ask {
    stream: bool,
    include_usage: bool,
    model_name: String,
    agent: String,
    model: Option<String>,
    conversation: Conversation,
    explicit_key: Option<String>,
    key_prefix: String,
    by_request_id: bool,
    /// Who asks: the sessions it may match, name and continue.
    principal: Principal,
    /// The tools the client runs itself (`tools`).
    client_tools: Vec<pincer_agent::ToolSpec>,
    /// A background request ([`background`]): answered, not kept.
    background: bool,
    /// A Responses API request (`/v1/responses`): what it adds, and the shape of its answer.
    responses: Option<responses::Extra>,
}

/// Most messages one request may carry: a history the tree lacks is written in one commit, and
/// every message costs memory while the request is read.
pub const MAX_MESSAGES: usize = 10_000;

/// Refuses a body with more than [`MAX_MESSAGES`] messages before building anything of it (the
/// count is taken over borrowed slices of the body).
fn check_message_count(body: &[u8]) -> Result<(), ApiError> {
    #[derive(serde::Deserialize)]
    struct Count<'a> {
        #[serde(borrow, default)]
        messages: Option<Vec<&'a serde_json::value::RawValue>>,
    }
    // A body that does not fit this shape gets its precise error from the full parse.
    if let Ok(Count { messages: Some(m) }) = serde_json::from_slice::<Count>(body) {
        if m.len() > MAX_MESSAGES {
            return Err(ApiError::bad(format!(
                "messages holds {} messages; one request may carry at most {MAX_MESSAGES}",
                m.len()
            )));
        }
    }
    Ok(())
}

fn parse(gw: &Engine, headers: &HeaderMap, body: &[u8], principal: Principal) -> Result<Ask, ApiError> {
    check_message_count(body)?;
    parse_request(gw, headers, &json_object(body)?, body, principal, None)
}

/// A request body: a JSON object.
fn json_object(body: &[u8]) -> Result<Value, ApiError> {
    let req: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("the request body is not JSON: {e}")))?;
    if !req.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    Ok(req)
}

/// A Chat Completions request (or a Responses request put in its shape, with what it adds in
/// `responses`), validated. `body`: the bytes it came as (its idempotency key hashes them).
fn parse_request(
    gw: &Engine,
    headers: &HeaderMap,
    req: &Value,
    body: &[u8],
    principal: Principal,
    responses: Option<responses::Extra>,
) -> Result<Ask, ApiError> {
    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("stream must be a boolean")),
    };
    let include_usage = match req.pointer("/stream_options/include_usage") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("stream_options.include_usage must be a boolean")),
    };
    match req.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(ApiError::bad("n must be 1: one session turn gives one reply")),
    }
    let client_tools = wire::client_tools(req).map_err(ApiError::bad)?;
    let model_name = match req.get("model") {
        None | Some(Value::Null) => "pincer".to_string(),
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(ApiError::bad("model must be a string")),
    };
    let (agent, model) = resolve_model(gw, &model_name)?;
    let own = gw.tools(&agent);
    if let Some(t) = client_tools.iter().find(|t| own.names().contains(&t.name)) {
        return Err(ApiError::bad(format!(
            "tools: {:?} is the name of one of the agent's own tools (run in the gateway); name the client's tool otherwise",
            t.name
        )));
    }
    let messages = req.get("messages").ok_or_else(|| ApiError::bad("messages is required"))?;
    let conversation = wire::conversation(messages, gw.redactor.as_ref()).map_err(ApiError::bad)?;
    // A response the client asks not to store (`store: false`) is kept as nothing, as a
    // background request (the ephemeral header says otherwise either way).
    let unstored = responses.as_ref().is_some_and(|r| !r.store);
    let background = background::is_background(headers, &conversation, unstored)?;
    let header = |name: &str| -> Result<Option<String>, ApiError> {
        let v = headers.get(name).map(|v| v.to_str().map(|s| s.trim().to_owned()));
        let v = v.transpose().map_err(|_| ApiError::bad(format!("the {name} header must be ASCII")))?;
        Ok(v.filter(|k| !k.is_empty()))
    };
    let explicit_key = match (header("x-pincer-session-key")?, header("x-openclaw-session-key")?) {
        (Some(k), _) | (None, Some(k)) => Some(k),
        // Open WebUI's chat, when it forwards it: each of its chats is one session.
        (None, None) => header(OPEN_WEBUI_CHAT_HEADER)?.map(|chat| format!("agent:{agent}:openwebui:{chat}")),
    };
    let (key_prefix, by_request_id) = request_key(headers, body)?;
    Ok(Ask {
        stream,
        include_usage,
        model_name,
        agent,
        model,
        conversation,
        explicit_key,
        key_prefix,
        by_request_id,
        principal,
        client_tools,
        background,
        responses,
    })
}

/// Where the turn goes.
struct Placement {
    session: SessionRef,
    run_id: String,
    graft: Graft,
    /// A regenerate: the user row answered again (no new user row).
    regenerate: Option<String>,
}

fn chains(c: &Conversation) -> (Vec<Hash>, Hash) {
    let (history, trailing) = c.hashes();
    let mut at = ROOT;
    let mut out = Vec::with_capacity(history.len());
    for h in history.iter().flatten() {
        at = wire::chain(at, *h);
        out.push(at);
    }
    let full = trailing.iter().flatten().fold(at, |c, h| wire::chain(c, *h));
    (out, full)
}

/// How far back [`sync_replicas`] looks before its last look: longer than an append's transaction
/// takes between its `updated_at` and its commit.
const SYNC_MARGIN_MICROS: i64 = 10_000_000;

/// Tells the conversation index which transcripts changed in the database since its last look
/// (the PostgreSQL store: other replicas' appends, and sessions they began), so a stateless
/// history resent to this replica finds them. One indexed query; its answer holds what changed
/// since, not every session.
fn sync_replicas(idx: &ConversationIndex, pg: &pincer_pg::PgStore) -> Result<(), ApiError> {
    let since = idx.sync_mark().map(|m| m - SYNC_MARGIN_MICROS);
    let (changed, now) =
        pg.changed_since(since).map_err(|e| ApiError::new(500, "api_error", None, format!("the store: {e}")))?;
    for c in changed {
        idx.touched(&c.path, c.end, c.rewrites);
    }
    idx.set_sync_mark(now);
    Ok(())
}

/// An engine failure on the way to a turn (reading the session index, a task): the server's fault.
fn internal(e: EngineError) -> ApiError {
    ApiError::new(500, "api_error", None, e.to_string())
}

/// Where a request's turn goes: after the response it names (`previous_response_id`), or where
/// its history leads ([`place`]). A Responses turn that goes on after client tools marks its first
/// result ([`crate::durable::results_key`]), so its reply is found from the transcript as a user
/// row's is.
fn placement(gw: &Engine, idx: &ConversationIndex, ask: &Ask, allow_retry: bool) -> Result<Placement, ApiError> {
    let mut placed = match ask.responses.as_ref().and_then(|r| r.previous.as_ref()) {
        Some(prev) => place_after(ask, prev, allow_retry),
        None => place(gw, idx, ask, allow_retry)?,
    };
    let results = ask.conversation.tool_results.len();
    let prelude = &mut placed.graft.prelude;
    if ask.responses.is_some() && placed.graft.continues && prelude.len() >= results && results > 0 {
        let first = prelude.len() - results;
        prelude[first]["idempotencyKey"] = json!(crate::durable::results_key(&placed.run_id));
    }
    Ok(placed)
}

/// A turn that goes on from an earlier response (its assistant row): the request's messages are
/// written under it, in a branch if the session has gone on since. With an explicit key, its run
/// id is the key's (a retry is the same turn, answered from the transcript by [`start_turn`]),
/// unless that turn failed (`allow_retry` false: it runs anew).
fn place_after(ask: &Ask, prev: &responses::Previous, allow_retry: bool) -> Placement {
    let conv = &ask.conversation;
    let mut prelude: Vec<Value> = conv.history.clone();
    prelude.extend(conv.extra_users.iter().cloned());
    prelude.extend(conv.tool_results.iter().cloned());
    let graft = Graft {
        at: Some(Some(prev.entry.clone())),
        leaf_seen: None,
        system_prompt: system_change(&prev.session, conv),
        prelude,
        continues: !conv.tool_results.is_empty(),
        client_tools: ask.client_tools.clone(),
    };
    let run_id = match ask.by_request_id && allow_retry {
        true => format!("{}-0", ask.key_prefix),
        false => format!("{}-{}", ask.key_prefix, pincer_pi::now_ms()),
    };
    Placement { session: prev.session.clone(), run_id, graft, regenerate: None }
}

/// The session's new system prompt, if the request's differs from the one it has.
fn system_change(s: &SessionRef, conv: &Conversation) -> Option<Option<String>> {
    let current = s.entry.get(SYSTEM_PROMPT_FIELD).and_then(Value::as_str).map(str::to_owned);
    (current != conv.system).then(|| conv.system.clone())
}

/// Finds (or makes) the session and the point of its tree the request continues. Blocking.
fn place(gw: &Engine, idx: &ConversationIndex, ask: &Ask, allow_retry: bool) -> Result<Placement, ApiError> {
    if let Some(pg) = &gw.pg {
        sync_replicas(idx, pg)?;
    }
    // Sessions another process added, removed or re-keyed (a CLI import, another gateway on the
    // same state dir, an edited sessions.json): one stat per agent tells, and only then is the
    // session list read again. The stamps are taken first: a change after them is seen next time.
    let changed = idx.index_changed(gw.sessions.index_stamps());
    if !idx.is_built() {
        let all = gw.sessions.list(None).map_err(internal)?;
        idx.build(all.into_iter().map(|s| (s.key, s.path)));
    } else if changed {
        idx.follow(gw.sessions.list(None).map_err(internal)?.into_iter().map(|s| (s.key, s.path)));
    }
    // What other replicas appended since the last request; sessions they began are looked up in
    // the session index once each.
    let unknown = idx.catch_up();
    if !unknown.is_empty() {
        for s in gw.sessions.list(None).map_err(internal)? {
            if unknown.contains(&s.path) {
                idx.track(&s.key, &s.path);
            }
        }
    }
    let conv = &ask.conversation;
    let (history, full) = chains(conv);
    let principal = &ask.principal;
    let explicit = match &ask.explicit_key {
        Some(k) => {
            let s = gw
                .sessions
                .resolve_for(k, true, principal)
                .map_err(|e| ApiError::bad(format!("the session named by the request's headers: {e}")))?
                .filter(|s| principal.reaches(s.owner()))
                .ok_or_else(|| {
                    ApiError::new(404, "invalid_request_error", None, format!("no session {k} for this API key"))
                })?;
            idx.track(&s.key, &s.path);
            Some(s)
        }
        None => None,
    };
    // Which indexed sessions this principal may land in (each key looked up once per request).
    let mut reach: HashMap<String, bool> = HashMap::new();
    let mut reaches = |key: &str| -> bool {
        if let Some(r) = reach.get(key) {
            return *r;
        }
        let r = matches!(principal, Principal::Operator)
            || gw.sessions.resolve(key, false).ok().flatten().is_some_and(|s| principal.reaches(s.owner()));
        reach.insert(key.to_owned(), r);
        r
    };
    let now = pincer_pi::now_ms();
    let run_id = format!("{}-{now}", ask.key_prefix);
    let system_change = |s: &SessionRef| system_change(s, conv);
    // A retry: the whole request already ended in a user row of this key.
    if allow_retry && ask.by_request_id {
        if let Some(t) = idx.keyed_turn(full, &ask.key_prefix, &mut reaches) {
            if explicit.as_ref().is_none_or(|s| s.path == t.path) {
                if let Some(s) = gw.sessions.resolve(&t.key, false).map_err(internal)?.filter(|s| s.path == t.path) {
                    return Ok(Placement { session: s, run_id: t.run_id, graft: Graft::default(), regenerate: None });
                }
            }
        }
    }
    // Tool results the session already holds (a resend of the same results, as a retry or a
    // regenerate of the reply after them): the run goes on from the last of them, as a sibling of
    // the reply it had (a tool call's id names one conversation, so no session key is needed).
    if !conv.tool_results.is_empty() {
        let mut whole = history.clone();
        for h in conv.tool_results.iter().filter_map(wire::message_hash) {
            whole.push(wire::chain(whole.last().copied().unwrap_or(ROOT), h));
        }
        let within = explicit.as_ref().map(|s| s.path.as_path());
        if let Some(m) = idx.deepest(&whole, within, &mut reaches).filter(|m| m.depth == whole.len()) {
            if let Some(s) = gw.sessions.resolve(&m.key, false).map_err(internal)?.filter(|s| s.path == m.path) {
                let graft = Graft {
                    at: Some(Some(m.entry)),
                    leaf_seen: m.leaf,
                    system_prompt: system_change(&s),
                    prelude: vec![],
                    continues: true,
                    client_tools: ask.client_tools.clone(),
                };
                return Ok(Placement { session: s, run_id, graft, regenerate: None });
            }
        }
    }
    // A regenerate: the whole request ends at a user row that has a reply. Without a session named,
    // only the last turn of a session's active branch (another conversation's leaf never moves),
    // and not a lone first message (two conversations may well open alike).
    let has_reply = conv.history.iter().any(|h| h.get("role").and_then(Value::as_str) == Some("assistant"));
    if let Some(u) = idx.answered_user(full, explicit.as_ref().map(|s| s.path.as_path()), &mut reaches) {
        if explicit.is_some() || (u.latest && has_reply) {
            if let Some(s) = gw.sessions.resolve(&u.key, false).map_err(internal)?.filter(|s| s.path == u.path) {
                let graft = Graft { client_tools: ask.client_tools.clone(), ..Graft::default() };
                return Ok(Placement { session: s, run_id, graft, regenerate: Some(u.entry) });
            }
        }
    }
    let mut scanned = false;
    for _ in 0..4 {
        let found = idx.deepest(&history, explicit.as_ref().map(|s| s.path.as_path()), &mut reaches);
        // A history that matches nowhere in full may be in a transcript another process grew
        // behind the index: every transcript's end is looked at once, then it is matched again.
        if !scanned && found.as_ref().map_or(0, |m| m.depth) < history.len() {
            scanned = true;
            idx.catch_up_all();
            continue;
        }
        let found = match (found, &explicit) {
            // Without a session key, a shared first message is not enough to join someone's
            // conversation: the common part must hold a reply, or be the whole history.
            (Some(m), None)
                if m.depth < history.len()
                    && !conv.history[..m.depth]
                        .iter()
                        .any(|h| h.get("role").and_then(Value::as_str) == Some("assistant")) =>
            {
                None
            }
            // Nor does it move a session's leaf: it joins only where it continues the active
            // branch (its history ends at the leaf); an edit or an older branch is a new session.
            (Some(m), None) if m.leaf.is_none() => None,
            (m, _) => m,
        };
        let (session, at, leaf_seen, depth) = match (found, &explicit) {
            (Some(m), _) => {
                let s = gw.sessions.resolve(&m.key, false).map_err(internal)?.filter(|s| s.path == m.path);
                let Some(s) = s else {
                    idx.forget(&m.path); // reset or deleted since: not a candidate any more
                    continue;
                };
                (s, Some(Some(m.entry)), m.leaf, m.depth)
            }
            (None, Some(s)) if conv.history.is_empty() => (s.clone(), None, None, 0),
            (None, Some(s)) => (s.clone(), Some(None), None, 0),
            (None, None) => {
                let key = format!("agent:{}:openai:{}", ask.agent, uuid::Uuid::new_v4());
                let s = gw
                    .sessions
                    .resolve_for(&key, true, principal)
                    .map_err(internal)?
                    .ok_or_else(|| ApiError::new(500, "api_error", None, format!("cannot create session {key}")))?;
                (s, None, None, 0)
            }
        };
        let mut prelude: Vec<Value> = conv.history[depth..].to_vec();
        prelude.extend(conv.extra_users.iter().cloned());
        prelude.extend(conv.tool_results.iter().cloned());
        let graft = Graft {
            at,
            leaf_seen,
            system_prompt: system_change(&session),
            prelude,
            continues: !conv.tool_results.is_empty(),
            client_tools: ask.client_tools.clone(),
        };
        return Ok(Placement { session, run_id: run_id.clone(), graft, regenerate: None });
    }
    Err(ApiError::new(500, "api_error", None, "the sessions changed while the request was matched; send it again"))
}

/// What a run's `chat` events say, as the endpoint relays them.
enum Step {
    Text(String),
    /// The end: why, usage, and the calls of client tools handed back (OpenAI's `tool_calls`).
    Done {
        finish: &'static str,
        usage: Value,
        calls: Vec<Value>,
    },
    Failed(ApiError),
}

/// A turn's events ([`TurnStream`]) as the endpoint relays them.
struct Relay(TurnStream);

impl Relay {
    /// The next piece of text, or the end (once).
    async fn next(&mut self) -> Option<Step> {
        Some(match self.0.next().await? {
            TurnEvent::Text(t) => Step::Text(t),
            TurnEvent::Ended(msg) => Step::Done {
                finish: wire::finish_reason(&msg),
                usage: wire::usage(msg.get("usage")),
                calls: wire::client_calls(&msg),
            },
            TurnEvent::Failed { message, kind } => Step::Failed(ApiError::from_run(&message, &kind)),
            TurnEvent::Unknown(why) => Step::Failed(ApiError::new(500, "api_error", None, why)),
        })
    }

    /// All that is left: the text, then the end's reason, usage and client tool calls.
    async fn whole(&mut self) -> Result<(String, &'static str, Value, Vec<Value>), ApiError> {
        let mut text = String::new();
        while let Some(step) = self.next().await {
            match step {
                Step::Text(t) => text.push_str(&t),
                Step::Done { finish, usage, calls } => return Ok((text, finish, usage, calls)),
                Step::Failed(e) => return Err(e),
            }
        }
        Err(ApiError::new(500, "api_error", None, "the run ended without a result"))
    }
}

async fn completions(
    State(gw): State<Arc<Engine>>,
    State(idx): State<Arc<ConversationIndex>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match complete(&gw, &idx, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn complete(
    gw: &Arc<Engine>,
    idx: &Arc<ConversationIndex>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let principal = authorize(gw, headers)?;
    let ask = Arc::new(parse(gw, headers, &body, principal)?);
    drop(body);
    answer(gw, idx, ask).await
}

/// Runs a validated request as a session turn (or, a background one, outside any session) and
/// answers it in its endpoint's shape.
async fn answer(gw: &Arc<Engine>, idx: &Arc<ConversationIndex>, ask: Arc<Ask>) -> Result<Response, ApiError> {
    if ask.background {
        return background_reply(gw, ask).await;
    }
    let mut allow_retry = true;
    loop {
        let a = ask.clone();
        let idx = idx.clone();
        let placed = gw.blocking(move |gw| Ok(placement(gw, &idx, &a, allow_retry))).await.map_err(internal)??;
        let Placement { session, run_id, graft, regenerate } = placed;
        // The run is held back until its handle was taken: its end cannot be missed.
        let (go, acked) = tokio::sync::oneshot::channel();
        let request = TurnRequest {
            session: session.clone(),
            run_id: run_id.clone(),
            text: ask.conversation.text.clone(),
            images: ask.conversation.images.clone(),
            regenerate,
            expected_leaf: None,
            graft: Some(graft),
            model: ask.model.clone(),
            conn_id: 0,
        };
        let started = start_turn(gw, request, acked).await.map_err(|e| match e {
            EngineError::Busy(m) => ApiError::new(429, "rate_limit_error", Some("session_busy"), m),
            e if e.code() == ErrorCode::InvalidRequest => ApiError::bad(e.to_string()),
            e => internal(e),
        })?;
        let relay = Relay(started.follow(gw, &session, &run_id));
        let _ = go.send(());
        let status = started.answer.status;
        let reply = Reply {
            gw: gw.clone(),
            session_key: Some(session.key.clone()),
            session_id: Some(session.session_id.clone()),
            run_id,
            ask: ask.clone(),
        };
        return match status {
            RunStatus::Started | RunStatus::InFlight => reply.relay(relay).await,
            RunStatus::Ok | RunStatus::Aborted | RunStatus::Blocked => {
                let (text, finish, usage, calls) = Relay(TurnStream::over(gw, &session, &reply.run_id)).whole().await?;
                Ok(reply.whole(text, finish, usage, calls))
            }
            // A retry of a turn that failed or was cut off runs anew (as a sibling of it).
            _ if allow_retry => {
                allow_retry = false;
                continue;
            }
            other => Err(ApiError::new(500, "api_error", None, format!("the turn ended as {:?}", other.as_str()))),
        };
    }
}

/// Answers a background request ([`background`]) with one model call outside any session: no
/// transcript, no session, no events to watchers; counted in the turn metrics like a turn.
async fn background_reply(gw: &Arc<Engine>, ask: Arc<Ask>) -> Result<Response, ApiError> {
    use futures::StreamExt;
    let spec = ask.model.clone().unwrap_or_else(|| gw.settings.agents.get(&ask.agent).model.clone());
    let model = gw.settings.providers.resolve(&spec).map_err(|e| ApiError::bad(e.to_string()))?;
    let conv = &ask.conversation;
    let mut messages: Vec<Value> =
        conv.history.iter().chain(&conv.extra_users).chain(&conv.tool_results).cloned().collect();
    if conv.tool_results.is_empty() {
        let mut last = wire::user_message(&conv.text, &conv.images);
        last["timestamp"] = json!(pincer_pi::now_ms());
        messages.push(last);
    }
    let run_id = format!("{}bg-{}", index::KEY_PREFIX, uuid::Uuid::new_v4());
    let rx = pincer_agent::start_run(pincer_agent::RunRequest {
        model,
        system_prompt: conv.system.clone(),
        messages: messages.into_iter().map(pincer_agent::ContextMessage::shared).collect(),
        tools: Arc::new(pincer_agent::ToolRegistry::new()),
        client_tools: ask.client_tools.as_slice().into(),
        sink: Arc::new(pincer_agent::MemorySink::new()),
        cancel: pincer_agent::CancellationToken::new(),
        max_turns: 1,
        run_id: run_id.clone(),
        max_reply_bytes: gw.settings.max_reply_bytes,
    });
    let started = std::time::Instant::now();
    let steps = futures::stream::unfold(Some(rx), move |rx| {
        let spec = spec.clone();
        async move {
            let mut rx = rx?;
            loop {
                let (step, status, msg) = match rx.recv().await? {
                    pincer_agent::RunEvent::TextDelta { delta } => return Some((Some(Step::Text(delta)), Some(rx))),
                    pincer_agent::RunEvent::Final { entry } => {
                        let msg = entry["message"].clone();
                        let step = Step::Done {
                            finish: wire::finish_reason(&msg),
                            usage: wire::usage(msg.get("usage")),
                            calls: wire::client_calls(&msg),
                        };
                        (step, "ok", msg)
                    }
                    pincer_agent::RunEvent::Error { entry, message, kind } => {
                        crate::metrics::turn_error(kind.as_str());
                        let msg = entry.map(|e| e["message"].clone()).unwrap_or(Value::Null);
                        (Step::Failed(ApiError::from_run(&message, kind.as_str())), "error", msg)
                    }
                    pincer_agent::RunEvent::Aborted { .. } => (
                        Step::Failed(ApiError::new(500, "api_error", None, "the request was cut")),
                        "aborted",
                        Value::Null,
                    ),
                    _ => continue,
                };
                let n = |k: &str| msg.pointer(&format!("/usage/{k}")).and_then(Value::as_u64).unwrap_or(0);
                crate::metrics::turn_finished(status);
                crate::metrics::model_turn(&spec, status, n("input") + n("cacheRead") + n("cacheWrite"), n("output"));
                crate::metrics::turn_seconds(started.elapsed());
                return Some((Some(step), None));
            }
        }
    });
    let mut steps = steps.boxed();
    let reply = Reply { gw: gw.clone(), session_key: None, session_id: None, run_id, ask: ask.clone() };
    if !ask.stream {
        let mut text = String::new();
        while let Some(step) = steps.next().await {
            match step {
                Some(Step::Text(t)) => text.push_str(&t),
                Some(Step::Done { finish, usage, calls }) => return Ok(reply.whole(text, finish, usage, calls)),
                Some(Step::Failed(e)) => return Err(e),
                None => {}
            }
        }
        return Err(ApiError::new(500, "api_error", None, "the model call ended without a result"));
    }
    // As a turn's relay: the status line waits for the first event.
    let first = steps.next().await.flatten();
    if let Some(Step::Failed(e)) = first {
        return Err(e);
    }
    Ok(reply.sse(futures::stream::once(async move { first }).chain(steps).boxed()))
}

/// Writes the answer of one turn.
struct Reply {
    gw: Arc<Engine>,
    /// The session it went to (none for a background request), by key and by id.
    session_key: Option<String>,
    session_id: Option<String>,
    run_id: String,
    ask: Arc<Ask>,
}

fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Reply {
    fn id(&self) -> String {
        format!("chatcmpl-{}", self.run_id)
    }

    fn with_session(&self, mut r: Response) -> Response {
        if let Some(Ok(v)) = self.session_key.as_deref().map(HeaderValue::from_str) {
            r.headers_mut().insert("x-pincer-session-key", v.clone());
            r.headers_mut().insert("x-openclaw-session-key", v);
        }
        r
    }

    /// A non-streamed answer, or the whole answer as a stream when one was asked for.
    fn whole(&self, text: String, finish: &'static str, usage: Value, calls: Vec<Value>) -> Response {
        if let Some(extra) = self.ask.responses.as_ref().filter(|_| !self.ask.stream) {
            return self.with_session(Json(responses::whole(self, extra, text, finish, usage, calls)).into_response());
        }
        if self.ask.stream {
            let mut steps = Vec::new();
            if !text.is_empty() {
                steps.push(Some(Step::Text(text)));
            }
            steps.push(Some(Step::Done { finish, usage, calls }));
            return self.sse(Box::pin(futures::stream::iter(steps)));
        }
        let mut message = json!({"role": "assistant", "content": text, "refusal": null});
        if !calls.is_empty() {
            // OpenAI's shape: no `index` in a whole message's calls, and no content when there was none.
            let calls = wire::without_index(calls);
            if text.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = Value::Array(calls);
        }
        let body = json!({
            "id": self.id(),
            "object": "chat.completion",
            "created": created(),
            "model": self.ask.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
            "usage": usage,
        });
        self.with_session(Json(body).into_response())
    }

    async fn relay(self, mut relay: Relay) -> Result<Response, ApiError> {
        if !self.ask.stream {
            let (text, finish, usage, calls) = relay.whole().await?;
            return Ok(self.whole(text, finish, usage, calls));
        }
        // The status line waits for the first event, so a run that fails at once gets its status.
        let first = relay.next().await;
        if let Some(Step::Failed(e)) = first {
            return Err(e);
        }
        let steps = futures::stream::unfold((first, relay), |(pending, mut relay)| async move {
            let step = match pending {
                Some(s) => Some(s),
                None => relay.next().await,
            };
            step.map(|s| (Some(s), (None, relay)))
        });
        Ok(self.sse(Box::pin(steps)))
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut c = json!({"id": self.id(), "object": "chat.completion.chunk", "created": created(),
            "model": self.ask.model_name, "system_fingerprint": null, "choices": choices});
        if self.ask.include_usage {
            c["usage"] = usage.unwrap_or(Value::Null);
        }
        Bytes::from(format!("data: {c}\n\n"))
    }

    fn sse(&self, steps: futures::stream::BoxStream<'static, Option<Step>>) -> Response {
        use futures::StreamExt;
        if self.ask.responses.is_some() {
            return self.with_session(responses::sse(self, steps));
        }
        let me = Arc::new(Reply {
            gw: self.gw.clone(),
            session_key: self.session_key.clone(),
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
            ask: self.ask.clone(),
        });
        let role = me.chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None);
        let m2 = me.clone();
        let body = futures::stream::once(async move { role })
            .chain(steps.filter_map(|s| async move { s }).flat_map(move |step| {
                let out: Vec<Bytes> = match step {
                    Step::Text(t) => vec![m2.chunk(
                        json!([{"index": 0, "delta": {"content": t}, "logprobs": null, "finish_reason": null}]),
                        None,
                    )],
                    Step::Done { finish, usage, calls } => {
                        // Each call whole in one delta (OpenAI splits the arguments; clients join them).
                        let mut v: Vec<Bytes> = calls
                            .into_iter()
                            .map(|c| {
                                m2.chunk(
                                    json!([{"index": 0, "delta": {"tool_calls": [c]}, "logprobs": null, "finish_reason": null}]),
                                    None,
                                )
                            })
                            .collect();
                        v.push(m2.chunk(
                            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish}]),
                            None,
                        ));
                        if m2.ask.include_usage {
                            v.push(m2.chunk(json!([]), Some(usage)));
                        }
                        v.push(Bytes::from_static(b"data: [DONE]\n\n"));
                        v
                    }
                    Step::Failed(e) => {
                        vec![Bytes::from(format!("data: {}\n\n", e.body())), Bytes::from_static(b"data: [DONE]\n\n")]
                    }
                };
                futures::stream::iter(out)
            }))
            .map(Ok::<Bytes, std::convert::Infallible>);
        let mut r = Response::new(Body::from_stream(body));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        self.with_session(r)
    }
}
