//! HTTP on the gateway port: a plain `GET /` is the WebChat page (its files under `/webchat/`,
//! [`crate::assets`]) and a WebSocket upgrade on any path
//! is the RPC socket (every route behind [`crate::guard`]'s Host, Origin and CORS checks: a web
//! page of another origin, or a rebound DNS name, gets 403); `/healthz`; `GET /api/sessions/{key}/events`, the session's `chat`
//! and `session.message` events as Server-Sent Events with catch-up from the store after
//! `Last-Event-ID` ([`crate::catchup`]);
//! `GET /api/sessions/{key}/export?format=html|md|jsonl&leaf=<id>` ([`crate::export`]); and,
//! when configured, OpenClaw's Control UI as static files under `/control/`.

use crate::catchup::Catchup;
use crate::config::AuthMode;
use crate::conn::Conn;
use crate::hub::{BusEvent, EventId, Subscriber};
use crate::state::Engine;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Extension, FromRef, Path, Query, State, WebSocketUpgrade};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::stream::{self, StreamExt};
use serde_json::json;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

/// What the HTTP routes share: the gateway, and the state the adapters keep over it (the
/// failed-login throttle, the OpenAI endpoint's conversation index, which follows the gateway's
/// appends as a [`crate::state::TranscriptObserver`]). Handlers take the part they need.
#[derive(Clone)]
pub struct AppState {
    pub gw: Arc<Engine>,
    pub logins: Arc<crate::guard::Logins>,
    pub conversations: Arc<crate::openai::index::ConversationIndex>,
    /// The messaging channels (their webhooks).
    pub channels: Arc<crate::channels::Channels>,
}

impl FromRef<AppState> for Arc<Engine> {
    fn from_ref(s: &AppState) -> Self {
        s.gw.clone()
    }
}

impl FromRef<AppState> for Arc<crate::guard::Logins> {
    fn from_ref(s: &AppState) -> Self {
        s.logins.clone()
    }
}

impl FromRef<AppState> for Arc<crate::channels::Channels> {
    fn from_ref(s: &AppState) -> Self {
        s.channels.clone()
    }
}

impl FromRef<AppState> for Arc<crate::openai::index::ConversationIndex> {
    fn from_ref(s: &AppState) -> Self {
        s.conversations.clone()
    }
}

/// The routes, over the engine and its started channels ([`crate::channels::start`]).
pub fn router(channels: Arc<crate::channels::Channels>) -> Router {
    let gw = channels.gw.clone();
    let conversations = Arc::new(crate::openai::index::ConversationIndex::new(gw.store.clone()));
    gw.observe(conversations.clone());
    let state = AppState { gw, logins: Arc::default(), conversations, channels };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/api/mcp", get(mcp))
        .route("/api/channels", get(channel_status))
        .route("/api/channels/{name}/webhook", axum::routing::post(channel_webhook))
        .route("/api/sessions/{key}/events", get(session_events))
        .route("/api/sessions/{key}/export", get(session_export))
        .merge(crate::openai::routes())
        .fallback(get(root))
        // Every route and the upgrade pass the guard first (Host, Origin, body type, CORS, throttle).
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::guard::layer))
        .with_state(state)
}

async fn healthz(State(gw): State<Arc<Engine>>) -> Json<serde_json::Value> {
    Json(json!({"ok": true, "uptimeMs": gw.uptime_ms(), "version": env!("CARGO_PKG_VERSION")}))
}

/// The ready-to-open WebChat address for a listening address: `http://host:port/#token=…` (the
/// page stores the token and removes it from the address bar). An unspecified bind address
/// (`0.0.0.0`, `::`) is shown as loopback, the one address sure to reach it from this machine.
pub fn webchat_url(addr: std::net::SocketAddr, auth: &AuthMode) -> String {
    let host = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        std::net::IpAddr::V4(ip) => ip.to_string(),
    };
    let base = format!("http://{host}:{}/", addr.port());
    match auth {
        AuthMode::Token(t) if !t.is_empty() => {
            let enc: String = t
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            format!("{base}#token={enc}")
        }
        _ => base,
    }
}

async fn root(
    State(gw): State<Arc<Engine>>,
    State(logins): State<Arc<crate::guard::Logins>>,
    conn: Option<Extension<Arc<Conn>>>,
    headers: HeaderMap,
    uri: Uri,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Ok(ws) = ws {
        let Some(Extension(conn)) = conn else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "no connection\n").into_response();
        };
        conn.before_connect();
        let gw = gw.clone();
        return ws
            .max_message_size(crate::protocol::MAX_PAYLOAD_BYTES)
            .max_frame_size(crate::protocol::MAX_PAYLOAD_BYTES)
            // Small buffers: an idle connection should cost kilobytes, not the 128 KiB default.
            .read_buffer_size(8 * 1024)
            .write_buffer_size(8 * 1024)
            .on_upgrade(move |socket| {
                let sockets = gw.sockets.clone();
                sockets.track_future(crate::openclaw::ws::serve(socket, gw, logins, conn))
            })
            .into_response();
    }
    let path = uri.path();
    if path == "/" || path == "/index.html" {
        return crate::assets::serve("index.html", &headers);
    }
    if let Some(rel) = path.strip_prefix(crate::assets::PREFIX) {
        return crate::assets::serve(rel, &headers);
    }
    if let (Some(rest), Some(dir)) = (path.strip_prefix("/control"), gw.settings.control_ui_dir.as_ref()) {
        return control_ui(dir, rest).await;
    }
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

/// Serves a file of the Control UI folder; unknown paths fall back to its `index.html` (an SPA).
async fn control_ui(dir: &std::path::Path, rest: &str) -> Response {
    let rel = rest.trim_start_matches('/');
    if rel.split('/').any(|c| c == ".." || c.starts_with('.')) || rel.contains('\\') || rel.contains('\0') {
        return (StatusCode::BAD_REQUEST, "bad path\n").into_response();
    }
    let mut file = dir.join(if rel.is_empty() { "index.html" } else { rel });
    if !file.is_file() {
        file = dir.join("index.html");
    }
    let Ok(bytes) = tokio::fs::read(&file).await else {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    };
    let mime = match file.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "webmanifest" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ico" => "image/x-icon",
        _ => "application/octet-stream",
    };
    if file.file_name().is_some_and(|n| n == "index.html") {
        // The UI reads its base path from the <html> tag. Its relative asset URLs ("./assets/…") are
        // made absolute, as OpenClaw's gateway does, so that a reload of a deep link (/control/chat/…)
        // still loads them instead of getting index.html back.
        let html = String::from_utf8_lossy(&bytes)
            .replacen("<html", "<html data-openclaw-control-ui-base-path=\"/control\"", 1)
            .replace("=\"./", "=\"/control/");
        return ([(header::CONTENT_TYPE, mime)], html).into_response();
    }
    ([(header::CONTENT_TYPE, mime)], bytes).into_response()
}

/// `GET /metrics`: Prometheus text ([`crate::metrics`]), behind the token like the event streams
/// (`Authorization: Bearer` or `?token=`, for scrapers that cannot send headers).
async fn metrics(_: Authorized) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], crate::metrics::render()).into_response()
}

/// `GET /api/mcp`: the MCP servers' states and each agent's MCP tools ([`Engine::mcp_status`];
/// `pincer mcp list` reads it), behind the gateway token.
async fn mcp(_: Authorized, State(gw): State<Arc<Engine>>) -> Response {
    Json(gw.mcp_status()).into_response()
}

/// `GET /api/channels`: each messaging channel's state and counters ([`crate::channels::Registry::status`];
/// `pincer channels status` reads it), behind the gateway token.
async fn channel_status(_: Authorized, State(gw): State<Arc<Engine>>) -> Response {
    Json(json!({"channels": gw.channels.status()})).into_response()
}

/// `POST /api/channels/{name}/webhook`: a platform's update for channel `name` ([`crate::channels::Webhook`]).
async fn channel_webhook(
    State(channels): State<Arc<crate::channels::Channels>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(hook) = channels.webhook(&name) else {
        return (StatusCode::NOT_FOUND, Json(json!({"error": format!("no webhook for channel {name:?} here")})))
            .into_response();
    };
    match hook.receive(&headers, &body).await {
        Ok(()) => Json(json!({"ok": true})).into_response(),
        Err((status, why)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, Json(json!({"error": why}))).into_response()
        }
    }
}

/// Proof that a request carries the gateway token (`Authorization: Bearer <token>` or `?token=`,
/// for scrapers and event streams that cannot send headers): the routes behind the token take it,
/// so none can forget the check. Refused with 401 and the way to send it.
pub struct Authorized;

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Authorized
where
    Arc<Engine>: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Response> {
        let gw = Arc::<Engine>::from_ref(state);
        let AuthMode::Token(token) = &gw.settings.auth else { return Ok(Authorized) };
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        let query = Query::<HashMap<String, String>>::try_from_uri(&parts.uri).map(|q| q.0).unwrap_or_default();
        let given = bearer.or_else(|| query.get("token").cloned());
        let auth = json!({"auth": {"token": given}});
        if crate::openclaw::ws::check_auth(&gw.settings.auth, &auth).is_ok() && !token.is_empty() {
            return Ok(Authorized);
        }
        Err((
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "unauthorized: send the gateway token as Authorization: Bearer <token> or ?token="})),
        )
            .into_response())
    }
}

/// A session's export as a download, behind the token. An HTML export is sandboxed (an opaque
/// origin: even opened here, its page can reach nothing of the gateway's).
async fn session_export(
    _: Authorized,
    State(gw): State<Arc<Engine>>,
    Path(raw_key): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let format = query.get("format").cloned().unwrap_or_else(|| "html".into());
    let leaf = query.get("leaf").cloned().filter(|l| !l.is_empty());
    let _held = match crate::export::admit(&gw, &raw_key, &format, false).await {
        Ok(h) => h,
        Err(e) => {
            return export_refused(e);
        }
    };
    let r = gw.blocking(move |gw| crate::export::export(gw, &raw_key, &format, leaf.as_deref())).await;
    match r {
        Ok(e) => (
            [
                (header::CONTENT_TYPE, e.format.mime().to_owned()),
                (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{}\"", e.file_name)),
                (header::CONTENT_SECURITY_POLICY, "sandbox allow-scripts".to_owned()),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
                (header::CACHE_CONTROL, "no-store".to_owned()),
            ],
            e.bytes,
        )
            .into_response(),
        Err(e) => export_refused(e),
    }
}

/// An export refused: 400 for a wrong request, 503 when the gateway cannot now.
fn export_refused(e: crate::protocol::RpcError) -> Response {
    let status = match e.code {
        crate::protocol::ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
        crate::protocol::ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(json!({"error": e.message}))).into_response()
}

async fn session_events(
    _: Authorized,
    State(gw): State<Arc<Engine>>,
    conn: Option<Extension<Arc<Conn>>>,
    Path(raw_key): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let key = match crate::sessions::canonical_key(&raw_key) {
        Ok((k, _)) => k,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({"error": e.to_string()}))).into_response(),
    };
    let given = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("(not ASCII)"))
        .or(query.get("lastEventId").map(String::as_str))
        .filter(|v| !v.trim().is_empty());
    let resume = given.map(EventId::parse);
    if let Some(Extension(c)) = conn {
        c.authenticated();
    }
    if let (Some(Ok(id)), Some(_)) = (&resume, &gw.pg) {
        // Rows of other replicas after the client's id are announced here even if this replica
        // starts watching the session only after the catch-up below read the store.
        gw.relay_from(&key, id.pos);
    }
    // Subscribed before the store is read: nothing appended after the read can be missed.
    let (tx, rx) = tokio::sync::mpsc::channel(SSE_QUEUE);
    let subscription = gw.hub.subscribe_to(&key, Arc::new(SseSubscriber { key: key.clone(), tx }));
    let (first, last) = match resume {
        None => (vec![], None),
        Some(Err(why)) => (vec![reset(&why)], None),
        Some(Ok(after)) => match crate::catchup::since(&gw, &key, &after).await {
            Ok(Catchup::Events(evs, last)) => (evs.iter().map(|e| to_sse(e)).collect(), Some(last)),
            Ok(Catchup::Reset(why)) => (vec![reset(&why)], None),
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": e.to_string()}))).into_response(),
        },
    };
    let live = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) }).filter_map(move |ev| {
        let dup = last.as_ref().is_some_and(|l| crate::catchup::covered(&ev, l));
        futures::future::ready((!dup).then(|| to_sse(&ev)))
    });
    let stream =
        stream::iter(first).chain(live).map(Ok::<_, Infallible>).take_until(gw.shutdown.clone().cancelled_owned());
    // The subscription lives as long as the response stream.
    let stream = stream.map(move |e| {
        let _ = &subscription;
        e
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// Events queued for one SSE stream; a stream that falls this far behind is ended (the client
/// reconnects with `Last-Event-ID` and catches up from the store).
const SSE_QUEUE: usize = 1024;

/// Forwards a session's `chat` and `session.message` events to one SSE stream.
struct SseSubscriber {
    key: String,
    tx: tokio::sync::mpsc::Sender<Arc<BusEvent>>,
}

impl Subscriber for SseSubscriber {
    fn wants(&self, name: &'static str, session_key: Option<&str>, _: crate::hub::Audience) -> bool {
        matches!(name, "chat" | "session.message") && session_key == Some(self.key.as_str())
    }

    fn deliver(&self, ev: &Arc<BusEvent>) -> bool {
        if !self.wants(ev.name, ev.session_key.as_deref(), ev.audience) {
            return !self.tx.is_closed();
        }
        self.tx.try_send(ev.clone()).is_ok()
    }
}

/// An event as SSE: `data` is `{"event", "payload"}`; events of persisted entries carry their
/// durable id (deltas none, so a reconnect resumes from the last entry).
fn to_sse(ev: &BusEvent) -> Event {
    let data = format!("{{\"event\":{},\"payload\":{}}}", json!(ev.name), ev.payload_json);
    let e = Event::default().event(ev.name).data(data);
    match &ev.id {
        Some(id) => e.id(id.to_string()),
        None => e,
    }
}

/// `reset`: the client's gap cannot be replayed; it refetches `chat.history`.
fn reset(why: &str) -> Event {
    Event::default().event("reset").data(json!({"reason": format!("{why}; refetch chat.history")}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webchat_url_is_ready_to_open() {
        let a: std::net::SocketAddr = "0.0.0.0:18789".parse().expect("addr");
        assert_eq!(webchat_url(a, &AuthMode::Token("ab+c/d=".into())), "http://127.0.0.1:18789/#token=ab%2Bc%2Fd%3D");
        let a: std::net::SocketAddr = "[::]:80".parse().expect("addr");
        assert_eq!(webchat_url(a, &AuthMode::None), "http://[::1]:80/");
        let a: std::net::SocketAddr = "[fe80::1]:8080".parse().expect("addr");
        assert_eq!(webchat_url(a, &AuthMode::Token("t".into())), "http://[fe80::1]:8080/#token=t");
    }
}
