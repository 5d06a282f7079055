//! One WebSocket connection: `connect.challenge`, the `connect` handshake (first frame, at most
//! 64 KiB read from the socket before it, timeout, token and device checks, protocol 3–4) and
//! `hello-ok`; then requests are dispatched concurrently (at most [`MAX_IN_FLIGHT`] at once: the
//! socket is not read while they run) and bus events are forwarded with a per-connection `seq`.
//! Everything sent — responses and events — goes through one [`Outbox`] with a byte budget (the
//! advertised `maxBufferedBytes`): a slow consumer loses droppable events (deltas; the `seq` still
//! advances so the client sees the gap) and is closed with 1008 and a reason when anything else
//! does not fit. Every close the server initiates sends a close frame with a code and reason.

use super::{Ctx, Subs};
use crate::config::AuthMode;
use crate::conn::Conn;
use crate::hub::{Audience, BusEvent};
use crate::protocol::{self, RpcError};
use crate::state::Engine;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use pincer_pi::lock;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// Requests of one connection being answered at once; further frames wait in the socket.
pub const MAX_IN_FLIGHT: usize = 16;
/// Bytes counted per queued frame on top of its text (queue and allocation overhead).
const FRAME_OVERHEAD: usize = 64;
/// How long a close frame may take to go out.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

enum Out {
    Text(String),
    /// Resolved once the client has read the frames queued before it: a ping follows them and
    /// these fire on its pong ([`Outbox::read_back`]).
    Read(Vec<tokio::sync::oneshot::Sender<()>>),
    /// Sent after everything queued before it; then the connection ends.
    Close(u16, String),
}

/// What happened to a frame on its way to a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Forwarded {
    Queued,
    /// The connection is behind and the frame may be lost (a delta): skipped.
    Dropped,
    /// The connection is behind and the frame must not be lost: the connection is being closed.
    Close,
}

/// Everything a connection sends, with one byte budget for responses and events together.
pub struct Outbox {
    tx: mpsc::UnboundedSender<Out>,
    queued: AtomicUsize,
    budget: usize,
    /// Code and reason of a close that skips what is queued (slow consumer).
    abort: Mutex<Option<(u16, String)>>,
    aborted: CancellationToken,
    /// Pings sent after responses whose follow-ups wait for the client to have read them, oldest
    /// first, with those waiters; at most [`MAX_UNANSWERED_PINGS`].
    unanswered: Mutex<std::collections::VecDeque<(u64, Vec<tokio::sync::oneshot::Sender<()>>)>>,
    pings: AtomicU64,
}

/// Pings kept waiting for their pong; an older one is let go (its waiters fire) when a client
/// does not answer pings, so it costs no memory over time.
const MAX_UNANSWERED_PINGS: usize = 32;

impl Outbox {
    fn new(budget: usize) -> (Arc<Outbox>, mpsc::UnboundedReceiver<Out>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let ob = Outbox {
            tx,
            queued: AtomicUsize::new(0),
            budget,
            abort: Mutex::new(None),
            aborted: CancellationToken::new(),
            unanswered: Mutex::new(std::collections::VecDeque::new()),
            pings: AtomicU64::new(0),
        };
        (Arc::new(ob), rx)
    }

    /// Queues a frame within the budget.
    pub fn push(&self, frame: String, droppable: bool) -> Forwarded {
        if self.aborted.is_cancelled() {
            return Forwarded::Dropped;
        }
        let cost = frame.len() + FRAME_OVERHEAD;
        let before = self.queued.fetch_add(cost, Ordering::AcqRel);
        if before + cost > self.budget {
            self.queued.fetch_sub(cost, Ordering::AcqRel);
            if droppable {
                return Forwarded::Dropped;
            }
            self.close_now(1008, format!("slow consumer: more than {} bytes waiting to be sent", self.budget));
            return Forwarded::Close;
        }
        if self.tx.send(Out::Text(frame)).is_err() {
            self.queued.fetch_sub(cost, Ordering::AcqRel);
            return Forwarded::Close;
        }
        Forwarded::Queued
    }

    /// Resolves `acks` once the client has read what is queued now: a ping goes out after it, and
    /// they fire on its pong (or when the connection ends).
    ///
    /// Written is not enough. A client reads what arrived together in one go and handles the
    /// frames before its own code resumes after the awaited response: OpenClaw's TUI, given a
    /// `chat.send` ack and a fast run's whole stream in one read, handled the final before the ack
    /// and then waited for a run that had ended. Events sent after the pong reach a later read.
    fn after_read(&self, acks: Vec<tokio::sync::oneshot::Sender<()>>) {
        if !acks.is_empty() {
            let _ = self.tx.send(Out::Read(acks));
        }
    }

    /// Registers the waiters of a ping about to be sent; returns its payload.
    fn ping_for(&self, acks: Vec<tokio::sync::oneshot::Sender<()>>) -> u64 {
        let n = self.pings.fetch_add(1, Ordering::AcqRel) + 1;
        let mut waiting = lock(&self.unanswered);
        waiting.push_back((n, acks));
        while waiting.len() > MAX_UNANSWERED_PINGS {
            if let Some((_, mut old)) = waiting.pop_front() {
                fire(&mut old);
            }
        }
        n
    }

    /// A pong came back: the pings up to the one it answers have been read.
    fn read_back(&self, payload: &[u8]) {
        let Ok(bytes) = <[u8; 8]>::try_from(payload) else { return };
        let answered = u64::from_be_bytes(bytes);
        let mut waiting = lock(&self.unanswered);
        while waiting.front().is_some_and(|(n, _)| *n <= answered) {
            if let Some((_, mut acks)) = waiting.pop_front() {
                fire(&mut acks);
            }
        }
    }

    /// Closes after what is queued has been sent.
    fn close_after_queued(&self, code: u16, reason: impl Into<String>) {
        let _ = self.tx.send(Out::Close(code, reason.into()));
    }

    /// Closes at once, dropping what is queued.
    pub fn close_now(&self, code: u16, reason: impl Into<String>) {
        lock(&self.abort).get_or_insert((code, reason.into()));
        self.aborted.cancel();
    }

    /// Bytes waiting to be sent.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// A close reason cut to the 123 bytes a close frame allows.
fn clip_reason(reason: &str) -> Utf8Bytes {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Utf8Bytes::from(&reason[..end])
}

/// Sends queued frames until the connection ends; always ends with a close frame.
/// Most frames, and bytes, written before a flush (so a batch never holds much beyond the outbox's budget).
const MAX_BATCH_FRAMES: usize = 64;
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// Flushes the socket; `Ok(false)` when the connection is being aborted, `Err` when it failed.
async fn flush(sink: &mut SplitSink<WebSocket, Message>, outbox: &Outbox) -> Result<bool, ()> {
    tokio::select! {
        biased;
        _ = outbox.aborted.cancelled() => Ok(false),
        r = sink.flush() => r.map(|()| true).map_err(|_| ()),
    }
}

async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: mpsc::UnboundedReceiver<Out>,
    outbox: Arc<Outbox>,
) {
    let mut close = (1000u16, String::from("bye"));
    'frames: loop {
        let first = tokio::select! {
            biased;
            _ = outbox.aborted.cancelled() => break,
            o = rx.recv() => o,
        };
        // Frames queued together are written together and flushed once (one write, not one per frame).
        let mut next = first;
        let (mut batch, mut batch_bytes) = (0, 0);
        loop {
            match next {
                Some(Out::Text(t)) => {
                    let cost = t.len() + FRAME_OVERHEAD;
                    let fed = tokio::select! {
                        biased;
                        _ = outbox.aborted.cancelled() => break 'frames,
                        r = sink.feed(Message::Text(Utf8Bytes::from(t))) => r,
                    };
                    outbox.queued.fetch_sub(cost, Ordering::AcqRel);
                    if fed.is_err() {
                        return;
                    }
                    batch += 1;
                    batch_bytes += cost;
                }
                Some(Out::Read(acks)) => {
                    // The ping follows the frames before it in the same write.
                    let n = outbox.ping_for(acks);
                    let ping = Message::Ping(n.to_be_bytes().to_vec().into());
                    let fed = tokio::select! {
                        biased;
                        _ = outbox.aborted.cancelled() => break 'frames,
                        r = sink.feed(ping) => r,
                    };
                    if fed.is_err() {
                        return;
                    }
                    batch += 1;
                }
                Some(Out::Close(code, reason)) => {
                    close = (code, reason);
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.flush()).await;
                    break 'frames;
                }
                None => {
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.flush()).await;
                    break 'frames;
                }
            }
            let mut more = rx.try_recv();
            if more.is_err() && batch == 1 {
                // The task that queued this frame often queues the next ones before it yields
                // (a turn's status and lifecycle events): let it, so they share one write.
                tokio::task::yield_now().await;
                more = rx.try_recv();
            }
            match more {
                Ok(o) if batch < MAX_BATCH_FRAMES && batch_bytes < MAX_BATCH_BYTES => next = Some(o),
                Ok(o) => {
                    // Flush a long batch, then go on with the frame already taken.
                    if flush(&mut sink, &outbox).await.is_err() {
                        return;
                    }
                    (batch, batch_bytes) = (0, 0);
                    next = Some(o);
                }
                Err(_) => break,
            }
        }
        match flush(&mut sink, &outbox).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(()) => return,
        }
    }
    if let Some(c) = lock(&outbox.abort).take() {
        close = c;
    }
    drop(rx);
    let frame = CloseFrame { code: close.0, reason: clip_reason(&close.1) };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.send(Message::Close(Some(frame)))).await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.close()).await;
}

fn fire(written: &mut Vec<tokio::sync::oneshot::Sender<()>>) {
    for tx in written.drain(..) {
        let _ = tx.send(());
    }
}

/// The connection as a hub subscriber: forwards the events it wants, with the frame `seq`.
struct ConnSubscriber {
    outbox: Arc<Outbox>,
    subs: Arc<Subs>,
    seq: Arc<AtomicU64>,
    conn_id: u64,
    /// Hears `exec.approval.*` (granted `operator.approvals`).
    can_approve: bool,
}

impl crate::hub::Subscriber for ConnSubscriber {
    fn wants(&self, name: &'static str, session_key: Option<&str>, audience: Audience) -> bool {
        (self.can_approve || !name.starts_with("exec.approval.")) && wanted(session_key, audience, &self.subs)
    }

    fn deliver(&self, ev: &Arc<BusEvent>) -> bool {
        if !self.wants(ev.name, ev.session_key.as_deref(), ev.audience) {
            return true;
        }
        if ev.audience == Audience::SessionSubscribers {
            let mut catchup = lock(&self.subs.catchup);
            if let Some(c) = ev.session_key.as_ref().and_then(|k| catchup.get_mut(k)) {
                match c.hold(ev) {
                    crate::openclaw::subscribe::Held::Taken => return true,
                    crate::openclaw::subscribe::Held::Overflow => {
                        tracing::warn!(
                            conn = self.conn_id,
                            "closing a slow consumer: too many events during a catch-up"
                        );
                        return false;
                    }
                    crate::openclaw::subscribe::Held::Pass => {}
                }
            }
        }
        self.forward(ev)
    }
}

impl ConnSubscriber {
    /// Queues an event on the connection.
    fn forward(&self, ev: &Arc<BusEvent>) -> bool {
        let frame_seq = match ev.audience {
            Audience::All => Some(self.seq.fetch_add(1, Ordering::AcqRel) + 1),
            _ => None,
        };
        let frame = protocol::event_frame(ev.name, &ev.payload_json, frame_seq);
        if self.outbox.push(frame, ev.droppable) == Forwarded::Close {
            tracing::warn!(conn = self.conn_id, "closing a slow consumer: a {} event could not be queued", ev.name);
            return false;
        }
        true
    }

    /// Sends what waited for session `key`'s catch-up, in order, before any later live event.
    fn flush(&self, key: &str) {
        let mut catchup = lock(&self.subs.catchup);
        let Some(c) = catchup.get_mut(key) else { return };
        for ev in c.release() {
            if !self.forward(&ev) {
                self.outbox.aborted.cancel();
                return;
            }
        }
    }
}

/// Constant-time comparison of two secrets (the length is not hidden).
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Token check of `connect` (the token may come as `auth.token` or `auth.password`).
pub fn check_auth(mode: &AuthMode, params: &Value) -> Result<(), RpcError> {
    let AuthMode::Token(token) = mode else { return Ok(()) };
    let auth = params.get("auth");
    let given: Vec<&str> =
        ["token", "password"].iter().filter_map(|k| auth.and_then(|a| a.get(*k)).and_then(Value::as_str)).collect();
    if given.is_empty() {
        return Err(RpcError::invalid("unauthorized: gateway token missing (send it as auth.token)")
            .with_details(json!({"code": "AUTH_TOKEN_MISSING"})));
    }
    if given.iter().any(|g| same_secret(g, token)) {
        Ok(())
    } else {
        Err(RpcError::invalid("unauthorized: gateway token mismatch")
            .with_details(json!({"code": "AUTH_TOKEN_MISMATCH"})))
    }
}

fn negotiate(params: &Value) -> Result<u64, RpcError> {
    let min = params.get("minProtocol").and_then(Value::as_u64);
    let max = params.get("maxProtocol").and_then(Value::as_u64);
    let (Some(min), Some(max)) = (min, max) else {
        return Err(RpcError::invalid("connect params need integer minProtocol and maxProtocol"));
    };
    let chosen = max.min(protocol::PROTOCOL_MAX);
    if min > max || chosen < min || chosen < protocol::PROTOCOL_MIN {
        return Err(RpcError::invalid(format!(
            "protocol mismatch: client speaks {min}..{max}, server speaks {}..{}",
            protocol::PROTOCOL_MIN,
            protocol::PROTOCOL_MAX
        ))
        .with_details(json!({"expectedProtocol": [protocol::PROTOCOL_MIN, protocol::PROTOCOL_MAX]})));
    }
    Ok(chosen)
}

/// This process's id for `hello-ok`'s `server.bootId`: a client that sees it change knows the
/// gateway restarted (and re-reads what it cached).
fn boot_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().to_string())
}

fn hello(gw: &Engine, protocol: u64, conn_id: u64, params: &Value) -> Value {
    let scopes = protocol::granted_scopes(params);
    let auth_method = match gw.settings.auth {
        AuthMode::Token(_) => "token",
        AuthMode::None => "none",
    };
    json!({
        "type": "hello-ok",
        "protocol": protocol,
        // OpenClaw's schema is closed: the server is named by `status`, not here.
        "server": {"version": env!("CARGO_PKG_VERSION"), "bootId": boot_id(), "connId": format!("c-{conn_id}")},
        // No capability contract of OpenClaw's (board widgets, worker bundles, unread acks…) is offered.
        "features": {"methods": protocol::Method::names(), "events": protocol::EVENTS, "capabilities": []},
        "snapshot": {
            "presence": [], "health": {}, "stateVersion": {"presence": 0, "health": 0},
            "uptimeMs": gw.uptime_ms(),
            "sessionDefaults": {"defaultAgentId": "main", "mainKey": "main", "mainSessionKey": crate::sessions::MAIN_KEY},
            "authMode": auth_method,
        },
        "auth": {"method": auth_method, "role": "operator", "scopes": scopes},
        "policy": {"maxPayload": protocol::MAX_PAYLOAD_BYTES, "maxBufferedBytes": protocol::MAX_BUFFERED_BYTES,
            "tickIntervalMs": protocol::TICK_INTERVAL_MS,
            "attachments": {"maxBytes": crate::openclaw::chat::MAX_ATTACHMENTS_BYTES, "maxImageBytes": crate::openclaw::chat::MAX_ATTACHMENT_BYTES}},
    })
}

/// Why the handshake ended without a connection.
enum Refused {
    /// Close with this code and reason, after the error response when there is one.
    Close(Option<String>, u16, String),
    /// The socket is gone.
    Gone,
}

/// Reads and checks the `connect` frame.
async fn handshake(
    stream: &mut SplitStream<WebSocket>,
    gw: &Engine,
    logins: &crate::guard::Logins,
    peer: std::net::IpAddr,
    nonce: &str,
) -> Result<(protocol::Request, u64), Refused> {
    let limit = protocol::MAX_PREAUTH_PAYLOAD_BYTES;
    let first = tokio::time::timeout(Duration::from_millis(protocol::HANDSHAKE_TIMEOUT_MS), stream.next()).await;
    let text = match first {
        Err(_) => return Err(Refused::Close(None, 1008, "handshake timeout: send connect first".into())),
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(Some(Ok(Message::Binary(_)))) => {
            return Err(Refused::Close(None, 1003, "binary frames are not supported".into()))
        }
        Ok(Some(Err(e))) if crate::conn::is_read_limit(&e) || is_too_long(&e) => {
            return Err(Refused::Close(None, 1009, format!("more than {limit} bytes sent before connect")))
        }
        _ => return Err(Refused::Gone),
    };
    let fail = |id: Option<String>, e: RpcError| {
        tracing::info!("connect refused: {}", e.message);
        let frame = protocol::refusal(id.as_deref(), "connect", e);
        Refused::Close(Some(frame), 1008, "connect failed".into())
    };
    if text.len() > limit {
        let msg = format!("frame of {} bytes exceeds the {limit} byte limit before connect", text.len());
        return Err(fail(None, RpcError::invalid(msg)));
    }
    let req = protocol::parse_request(&text).map_err(|(id, e)| fail(id, e))?;
    let id = Some(Value::from(req.id.as_str()).to_string());
    if req.method != "connect" {
        return Err(fail(id, RpcError::invalid("the first request must be connect")));
    }
    let version = negotiate(&req.params).map_err(|e| fail(id.clone(), e))?;
    if let Err(wait) = logins.admit(peer) {
        let msg = format!("too many failed logins from this address; retry in {} s", wait.as_secs().max(1));
        return Err(fail(id, RpcError::invalid(msg).with_details(json!({"code": "AUTH_RATE_LIMITED"}))));
    }
    check_auth(&gw.settings.auth, &req.params).map_err(|e| {
        logins.failed(peer, &format!("WebSocket connect: {}", e.message));
        fail(id.clone(), e)
    })?;
    crate::openclaw::device::verify(&req.params, nonce)
        .map_err(|e| fail(id.clone(), RpcError::invalid(e.message).with_details(json!({"code": e.code}))))?;
    Ok((req, version))
}

/// A frame larger than the transport allows.
fn is_too_long(e: &axum::Error) -> bool {
    let s = e.to_string();
    s.contains("too long") || s.contains("Space limit exceeded")
}

/// Serves one upgraded socket until it closes or the gateway shuts down.
pub async fn serve(socket: WebSocket, gw: Arc<Engine>, logins: Arc<crate::guard::Logins>, conn: Arc<Conn>) {
    let (sink, mut stream) = socket.split();
    let (outbox, rx) = Outbox::new(protocol::MAX_BUFFERED_BYTES);
    let writer = tokio::spawn(write_loop(sink, rx, outbox.clone()));
    let close = match greet(&mut stream, &gw, &logins, &conn, &outbox).await {
        Ok(hello) => session(&mut stream, &gw, &outbox, hello).await,
        Err(close) => close,
    };
    // The one way a connection ends: the close frame after what is queued (or at once), the
    // socket dropped, the writer drained.
    match close {
        Close::AfterQueued(code, reason) => outbox.close_after_queued(code, reason),
        Close::Now => outbox.close_now(1000, "bye"),
    }
    drop(stream);
    let _ = writer.await;
}

/// How a connection ends.
enum Close {
    /// A close frame with this code and reason once the queued frames are sent.
    AfterQueued(u16, String),
    /// The socket is gone: close without waiting.
    Now,
}

/// Who connected: what the event loop needs from the handshake.
struct Hello {
    conn_id: u64,
    client_id: String,
    /// Granted `operator.write`.
    can_write: bool,
    /// May answer approvals, and hears `exec.approval.*` ([`super::Ctx::can_approve`]).
    can_approve: bool,
}

/// The challenge, the `connect` frame and its checks, and `hello-ok`.
async fn greet(
    stream: &mut SplitStream<WebSocket>,
    gw: &Engine,
    logins: &crate::guard::Logins,
    conn: &Conn,
    outbox: &Arc<Outbox>,
) -> Result<Hello, Close> {
    let conn_id = gw.next_conn_id();
    let nonce = uuid::Uuid::new_v4().to_string();
    let challenge = json!({"nonce": nonce, "ts": pincer_pi::now_ms()});
    outbox.push(protocol::event("connect.challenge", &challenge, None), false);
    let handshake = tokio::select! {
        h = handshake(stream, gw, logins, conn.peer, &nonce) => h,
        _ = conn.evicted() => Err(Refused::Close(None, 1013, "too many connections; try again later".into())),
        _ = gw.shutdown.cancelled() => Err(Refused::Close(None, 1012, "gateway stopping".into())),
    };
    let (req, protocol_version) = match handshake {
        Ok(ok) => ok,
        Err(Refused::Close(frame, code, reason)) => {
            if let Some(f) = frame {
                outbox.push(f, false);
            }
            return Err(Close::AfterQueued(code, reason));
        }
        Err(Refused::Gone) => return Err(Close::Now),
    };
    // Authenticated: the full frame size applies, and the connection is not evicted for newcomers.
    conn.authenticated();
    let client_id = req.params.get("client").and_then(|c| c.get("id")).and_then(Value::as_str).unwrap_or("").to_owned();
    outbox.push(protocol::response(&req.id, Ok(hello(gw, protocol_version, conn_id, &req.params))), false);
    tracing::debug!(conn = conn_id, client = %client_id, "connected");
    let granted = protocol::granted_scopes(&req.params);
    let can_write = granted.contains(&"operator.write");
    let asked_none = req.params.get("scopes").and_then(Value::as_array).is_none_or(Vec::is_empty);
    let can_approve = asked_none || granted.contains(&"operator.approvals") || granted.contains(&"operator.admin");
    Ok(Hello { conn_id, client_id, can_write, can_approve })
}

/// The connected loop: requests (at most [`MAX_IN_FLIGHT`] at once), events through the hub,
/// ticks, and the goodbye at shutdown.
async fn session(stream: &mut SplitStream<WebSocket>, gw: &Arc<Engine>, outbox: &Arc<Outbox>, who: Hello) -> Close {
    let Hello { conn_id, client_id, can_write, can_approve } = who;
    let subs = Arc::new(Subs::default());
    let seq = Arc::new(AtomicU64::new(0));
    let subscriber =
        Arc::new(ConnSubscriber { outbox: outbox.clone(), subs: subs.clone(), seq: seq.clone(), conn_id, can_approve });
    let weak = Arc::downgrade(&subscriber);
    let _ = subs.flush.set(Box::new(move |key: &str| {
        if let Some(s) = weak.upgrade() {
            s.flush(key);
        }
    }));
    let subscription = gw.hub.subscribe(subscriber);
    let _ = subs.route.set((gw.hub.clone(), subscription.id()));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // Large reads (history) of one connection run one at a time, so their answers cannot pile up.
    let heavy = Arc::new(tokio::sync::Mutex::new(()));
    let mut tick = tokio::time::interval(Duration::from_millis(protocol::TICK_INTERVAL_MS));
    tick.tick().await;
    loop {
        let free = in_flight.available_permits() > 0;
        tokio::select! {
            frame = stream.next(), if free => {
                let text = match frame {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(_))) => {
                        let e = RpcError::invalid("binary frames are not supported; send JSON text frames");
                        outbox.push(protocol::response("unknown", Err(e)), false);
                        continue;
                    }
                    Some(Err(e)) if is_too_long(&e) => {
                        let limit = protocol::MAX_PAYLOAD_BYTES;
                        let e = RpcError::invalid(format!("frame exceeds maxPayload ({limit} bytes): {e}"));
                        outbox.push(protocol::response("unknown", Err(e)), false);
                        return Close::AfterQueued(1009, format!("frame exceeds maxPayload ({limit} bytes)"));
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(Message::Pong(p))) => {
                        outbox.read_back(&p);
                        continue;
                    }
                    Some(Ok(_)) => continue,
                };
                let req = match protocol::parse_request(&text) {
                    Ok(req) => req,
                    Err((id, e)) => {
                        outbox.push(protocol::refusal(id.as_deref(), "unknown", e), false);
                        continue;
                    }
                };
                drop(text);
                let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                let (gw, outbox, subs, client_id, heavy) =
                    (gw.clone(), outbox.clone(), subs.clone(), client_id.clone(), heavy.clone());
                tokio::spawn(async move {
                    let (early, id) = (outbox.clone(), req.id.clone());
                    let interim: super::Interim =
                        Box::new(move |payload| {
                            early.push(protocol::response(&id, Ok(payload)), false);
                        });
                    let mut ctx = Ctx::new(conn_id, client_id, subs).with_interim(interim);
                    ctx.can_write = can_write;
                    ctx.can_approve = can_approve;
                    // Held until the answer is queued, so one connection builds one large answer at a time.
                    let serial = match protocol::Method::parse(&req.method) {
                        Some(protocol::Method::ChatHistory | protocol::Method::ChatStartup) => Some(heavy.lock().await),
                        _ => None,
                    };
                    if outbox.aborted.is_cancelled() {
                        return; // the connection is gone: no work for it
                    }
                    let result = crate::openclaw::methods::dispatch(&gw, &ctx, &req.method, &req.params).await;
                    outbox.push(protocol::response(&req.id, result), false);
                    drop(serial);
                    // A run this request started sends its first event once the client has read its
                    // ack, so the client handles the ack (and learns the runId) before the run's events.
                    outbox.after_read(ctx.take_acks());
                    drop(permit);
                });
            }
            _ = in_flight.acquire(), if !free => {}
            _ = tick.tick() => {
                let s = seq.fetch_add(1, Ordering::AcqRel) + 1;
                outbox.push(protocol::event("tick", &json!({"ts": pincer_pi::now_ms()}), Some(s)), true);
            }
            _ = outbox.aborted.cancelled() => break,
            _ = gw.shutdown.cancelled() => {
                // Requests still being answered (a search the shutdown stopped) queue their answers
                // first, for a moment.
                let all = MAX_IN_FLIGHT as u32;
                let _ = tokio::time::timeout(Duration::from_secs(2), in_flight.acquire_many(all)).await;
                // Runs have ended by now (their `aborted` events are queued): say goodbye.
                let s = seq.fetch_add(1, Ordering::AcqRel) + 1;
                let ev = protocol::event("shutdown", &json!({"reason": "gateway stopping"}), Some(s));
                outbox.push(ev, false);
                return Close::AfterQueued(1012, "gateway stopping".into());
            }
        }
    }
    drop(subscription);
    Close::AfterQueued(1000, "bye".into())
}

fn wanted(session_key: Option<&str>, audience: Audience, subs: &Subs) -> bool {
    match audience {
        // Session streams go to the connections that work with that session.
        Audience::All => match session_key {
            Some(k) => lock(&subs.chats).contains(k),
            None => true,
        },
        Audience::SessionsWatchers => subs.sessions.load(Ordering::Relaxed),
        Audience::SessionSubscribers => session_key.is_some_and(|k| lock(&subs.messages).contains(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_budget_for_responses_and_events() {
        let (ob, mut rx) = Outbox::new(3 * (10 + FRAME_OVERHEAD));
        assert_eq!(ob.push("a".repeat(10), true), Forwarded::Queued);
        assert_eq!(ob.push("b".repeat(10), false), Forwarded::Queued);
        assert_eq!(ob.push("c".repeat(10), false), Forwarded::Queued);
        assert_eq!(ob.queued_bytes(), 3 * (10 + FRAME_OVERHEAD));
        assert_eq!(ob.push("delta".into(), true), Forwarded::Dropped, "full: a delta is skipped");
        assert!(!ob.aborted.is_cancelled());
        assert_eq!(ob.push("final".into(), false), Forwarded::Close, "full: anything else closes");
        assert!(ob.aborted.is_cancelled());
        assert_eq!(lock(&ob.abort).as_ref().map(|c| c.0), Some(1008));
        assert!(lock(&ob.abort).as_ref().is_some_and(|c| c.1.contains("slow consumer")));
        assert!(matches!(rx.try_recv(), Ok(Out::Text(t)) if t == "a".repeat(10)));
        assert_eq!(ob.push("late".into(), false), Forwarded::Dropped, "nothing is queued once closing");
    }

    #[test]
    fn close_reasons_fit_a_close_frame() {
        assert_eq!(clip_reason(&"é".repeat(100)).len(), 122);
        assert_eq!(clip_reason("short").as_str(), "short");
    }

    #[test]
    fn auth_accepts_token_or_password_and_names_the_problem() {
        let mode = AuthMode::Token("s3cret".into());
        assert!(check_auth(&mode, &json!({"auth": {"token": "s3cret"}})).is_ok());
        assert!(check_auth(&mode, &json!({"auth": {"token": "x", "password": "s3cret"}})).is_ok());
        let e = check_auth(&mode, &json!({"auth": {"token": "nope"}})).expect_err("mismatch");
        assert_eq!(e.details.as_deref(), Some(&json!({"code": "AUTH_TOKEN_MISMATCH"})));
        let e = check_auth(&mode, &json!({})).expect_err("missing");
        assert_eq!(e.details.as_deref(), Some(&json!({"code": "AUTH_TOKEN_MISSING"})));
        assert!(check_auth(&AuthMode::None, &json!({})).is_ok());
        assert!(!same_secret("abc", "abd") && same_secret("abc", "abc") && !same_secret("abc", "abcd"));
    }

    /// A request that joins a session (`chat.abort`, `chat.send`, `chat.history`…) while an event of
    /// that session is published must not deadlock: the hub asks the connection's subscriber under
    /// the hub's lock whether it wants the event (which reads the connection's sessions), so joining
    /// must not hold the connection's sessions while it tells the hub. Both sides loop until done
    /// or stuck; a deadlock is seen as a side that never finishes.
    #[test]
    fn joining_a_session_while_its_events_are_published_does_not_deadlock() {
        let hub = Arc::new(crate::hub::Hub::default());
        let subs = Arc::new(Subs::default());
        let (outbox, _rx) = Outbox::new(protocol::MAX_BUFFERED_BYTES);
        let subscriber =
            ConnSubscriber { outbox, subs: subs.clone(), seq: Default::default(), conn_id: 1, can_approve: true };
        let subscription = hub.subscribe(Arc::new(subscriber));
        let _ = subs.route.set((hub.clone(), subscription.id()));
        subs.add_chat("k".into()).expect("joined");
        const ROUNDS: usize = 200_000;
        let (done, finished) = std::sync::mpsc::channel();
        let (joins, d) = (subs.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..ROUNDS {
                joins.add_chat("k".into()).expect("joined");
            }
            let _ = d.send("joining");
        });
        let publishes = hub.clone();
        std::thread::spawn(move || {
            for _ in 0..ROUNDS {
                assert!(publishes.wants("chat", Some("k"), Audience::All));
            }
            let _ = done.send("publishing");
        });
        let both = (0..2).all(|_| finished.recv_timeout(std::time::Duration::from_secs(120)).is_ok());
        if !both {
            // Dropping the subscription would wait for the hub's lock, held by a stuck side.
            std::mem::forget(subscription);
            panic!("deadlock: joining a session and publishing its events wait for each other");
        }
    }
}
