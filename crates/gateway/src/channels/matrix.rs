//! The Matrix channel: a bot account on a homeserver, spoken to over the client-server API.
//!
//! Plain HTTP with `reqwest` rather than `matrix-sdk`: the bot needs a handful of endpoints (`/sync`,
//! `send`, `typing`, `join`/`leave`, a room's state, the `m.direct` account data), refuses end-to-end
//! encrypted rooms instead of carrying a crypto stack (the SDK's Olm/Megolm, SQLite store and their
//! dependency tree would multiply the gateway's compile time on a 2-core machine), and its exactly-once
//! rules need control of the sync token and the transaction ids that an SDK keeps to itself.
//!
//! - **Inbound**: `/sync` long-polls with `since` and a filter (messages, membership, encryption).
//!   Each `m.text`/`m.emote` from a sender on `allow_from` becomes a turn whose idempotency key is the
//!   event id; the sync token (`next_batch`) is stored through the channel cursor store only after
//!   every turn of that batch has its user row on disk, so a crash replays the batch and the keys
//!   dedupe it. A `limited` timeline is filled from `/messages` back to the previous token, so
//!   nothing is skipped. The first start (no token) begins at the present: old history is not answered.
//! - **Invites** are accepted only from `allow_from` (the room is a DM when the invite says
//!   `is_direct`; the bot records it in its `m.direct` account data), rejected otherwise and logged.
//! - **Rooms** (not direct chats, nor rooms of the bot and one user) answer only messages addressed
//!   to the bot unless `require_mention = false` ([`Mention`]): its user id in `m.mentions`, its user
//!   id or display name in the text, a `matrix.to` pill link to it, or a reply to one of its events.
//!   Others get no turn (a debug line) and the sync position moves past them all the same.
//! - **Outbound** ([`Bot`], the seam's [`Outbound`]): the seam's deliverer sends a reply's first
//!   message when the run starts and streams into it with `m.replace` edits (throttled by the seam),
//!   the last one holding the final text. Each is an `m.text` event (markdown rendered to
//!   `formatted_body`, raw HTML escaped) sent with a transaction id derived from the delivery intent
//!   (an edit's also from its text), so a resend after a crash is the same event on the homeserver,
//!   never a second one. Typing notifications run while the reply streams.
//! - **Encrypted rooms** (`m.room.encryption` state, or `m.room.encrypted` events) are refused: a
//!   plain `m.notice` explains it in the room, the log says so, and the bot leaves.

use super::{Accepted, Address, BoxFuture, Channels, ChatKind, Event, Inbound, Outbound, SendError};
use crate::state::Engine;
pub use pincer_engine::config::channels::{MatrixSection, MatrixSettings, MATRIX_TOKEN_ENV as DEFAULT_TOKEN_ENV};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The channel's name (session keys, metrics, `deliveryContext.channel`).
pub const NAME: &str = "matrix";
/// Longest text of one message, in bytes: an event is at most 64 KiB, and it carries the text twice
/// (`body` and its HTML in `formatted_body`, and an edit's `m.new_content` twice more).
pub const MAX_MESSAGE: usize = 12 * 1024;

/// A path segment, percent-encoded (room ids hold `!` and `:`, transaction ids are ours).
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// What went wrong with a call to the homeserver.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status; `None` when no answer came (connect error, timeout).
    pub status: Option<u16>,
    /// Matrix's `errcode` (`M_FORBIDDEN`, `M_LIMIT_EXCEEDED`, …), if any.
    pub errcode: Option<String>,
    pub message: String,
    /// `retry_after_ms` of a rate limit.
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.status, &self.errcode) {
            (Some(s), Some(c)) => write!(f, "HTTP {s} {c}: {}", self.message),
            (Some(s), None) => write!(f, "HTTP {s}: {}", self.message),
            (None, _) => write!(f, "{}", self.message),
        }
    }
}

impl ApiError {
    /// Worth retrying: no answer, a rate limit, or a server error. A 4xx otherwise is final.
    pub fn transient(&self) -> bool {
        match self.status {
            None => true,
            Some(s) => s == 429 || s >= 500,
        }
    }

    /// The token was refused: no use going on.
    pub fn unauthorized(&self) -> bool {
        self.status == Some(401) || self.errcode.as_deref() == Some("M_UNKNOWN_TOKEN")
    }
}

/// The client-server API, as the bot.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// How long a request may take beyond a sync's own long-poll time.
const REQUEST_SLACK: Duration = Duration::from_secs(30);

impl Api {
    pub fn new(homeserver: &str, token: &str) -> Result<Api, String> {
        pincer_agent::provider::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("matrix: HTTP client: {e}"))?;
        Ok(Api { http, base: homeserver.to_owned(), token: token.to_owned() })
    }

    /// `method /_matrix/client/v3<path>`: the answer's JSON or the error. `wait` bounds the whole call.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        wait: Duration,
    ) -> Result<Value, ApiError> {
        let url = format!("{}/_matrix/client/v3{path}", self.base);
        let mut req = self.http.request(method, url).bearer_auth(&self.token).timeout(wait);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| ApiError {
            status: None,
            errcode: None,
            message: format!("no answer from the homeserver: {}", error_chain(&e)),
            retry_after: None,
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| ApiError {
            status: Some(status),
            errcode: None,
            message: format!("reading the answer: {}", error_chain(&e)),
            retry_after: None,
        })?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(v);
        }
        Err(ApiError {
            status: Some(status),
            errcode: v["errcode"].as_str().map(str::to_owned),
            message: v["error"].as_str().map(str::to_owned).unwrap_or_else(|| text.chars().take(200).collect()),
            retry_after: v["retry_after_ms"].as_u64().map(Duration::from_millis),
        })
    }

    /// [`Api::call`], retrying transient failures (rate limits after their `retry_after_ms`) up to
    /// `attempts` times.
    async fn call_retrying(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        attempts: u32,
    ) -> Result<Value, ApiError> {
        let mut n = 0;
        loop {
            match self.call(method.clone(), path, body, REQUEST_SLACK).await {
                Err(e) if e.transient() && n + 1 < attempts => {
                    n += 1;
                    let delay = e.retry_after.unwrap_or_else(|| backoff(n)).min(Duration::from_secs(30));
                    tracing::debug!(path = %redact_path(path), "matrix: {e}; retrying in {delay:?}");
                    tokio::time::sleep(delay).await;
                }
                r => return r,
            }
        }
    }

    /// `GET /account/whoami`: the user id the token belongs to.
    pub async fn whoami(&self) -> Result<String, ApiError> {
        let v = self.call_retrying(reqwest::Method::GET, "/account/whoami", None, 3).await?;
        Ok(v["user_id"].as_str().unwrap_or_default().to_owned())
    }

    /// `GET /sync` from `since` (none: an initial sync), long-polling `timeout`, with `filter` (JSON).
    pub async fn sync(&self, since: Option<&str>, timeout: Duration, filter: &str) -> Result<Value, ApiError> {
        let mut path = format!("/sync?timeout={}&filter={}", timeout.as_millis(), seg(filter));
        if let Some(s) = since {
            path.push_str(&format!("&since={}", seg(s)));
        }
        self.call(reqwest::Method::GET, &path, None, timeout + REQUEST_SLACK).await
    }

    /// `GET /rooms/{room}/messages` backwards from `from` down to `to` (sync tokens): up to `limit` events,
    /// newest first, and the token to go on from (none at the end).
    pub async fn messages_back(
        &self,
        room: &str,
        from: &str,
        to: &str,
        limit: u32,
    ) -> Result<(Vec<Value>, Option<String>), ApiError> {
        let path = format!("/rooms/{}/messages?dir=b&from={}&to={}&limit={limit}", seg(room), seg(from), seg(to));
        let v = self.call_retrying(reqwest::Method::GET, &path, None, 5).await?;
        let chunk = v["chunk"].as_array().cloned().unwrap_or_default();
        let end = v["end"].as_str().filter(|_| !chunk.is_empty()).map(str::to_owned);
        Ok((chunk, end))
    }

    /// `PUT /rooms/{room}/send/m.room.message/{txn}`: the event id. The same `txn` (from the same
    /// token) is the same event: the homeserver answers a resend with the first event's id.
    pub async fn send(&self, room: &str, txn: &str, content: &Value) -> Result<String, ApiError> {
        let path = format!("/rooms/{}/send/m.room.message/{}", seg(room), seg(txn));
        let v = self.call_retrying(reqwest::Method::PUT, &path, Some(content), 5).await?;
        v["event_id"].as_str().map(str::to_owned).ok_or_else(|| ApiError {
            status: Some(200),
            errcode: None,
            message: "the homeserver's answer to a send has no event_id".into(),
            retry_after: None,
        })
    }

    /// `PUT /rooms/{room}/typing/{user}`: typing on (for `timeout`) or off.
    pub async fn typing(&self, room: &str, user: &str, on: Option<Duration>) -> Result<(), ApiError> {
        let body = match on {
            Some(t) => json!({"typing": true, "timeout": t.as_millis() as u64}),
            None => json!({"typing": false}),
        };
        let path = format!("/rooms/{}/typing/{}", seg(room), seg(user));
        self.call(reqwest::Method::PUT, &path, Some(&body), REQUEST_SLACK).await.map(|_| ())
    }

    /// `POST /join/{room}`.
    pub async fn join(&self, room: &str) -> Result<(), ApiError> {
        self.call_retrying(reqwest::Method::POST, &format!("/join/{}", seg(room)), Some(&json!({})), 5)
            .await
            .map(|_| ())
    }

    /// `POST /rooms/{room}/leave` (also rejects an invite).
    pub async fn leave(&self, room: &str) -> Result<(), ApiError> {
        self.call_retrying(reqwest::Method::POST, &format!("/rooms/{}/leave", seg(room)), Some(&json!({})), 5)
            .await
            .map(|_| ())
    }

    /// The content of state event `kind` (empty state key) of `room`, `None` when the room has none.
    pub async fn state(&self, room: &str, kind: &str) -> Result<Option<Value>, ApiError> {
        match self
            .call_retrying(reqwest::Method::GET, &format!("/rooms/{}/state/{}/", seg(room), seg(kind)), None, 5)
            .await
        {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// How many members have joined `room`.
    pub async fn joined_member_count(&self, room: &str) -> Result<usize, ApiError> {
        let v =
            self.call_retrying(reqwest::Method::GET, &format!("/rooms/{}/joined_members", seg(room)), None, 5).await?;
        Ok(v["joined"].as_object().map_or(0, serde_json::Map::len))
    }

    /// The sender of event `event` of `room`; `None` when the bot may not see it or it is not there.
    pub async fn event_sender(&self, room: &str, event: &str) -> Result<Option<String>, ApiError> {
        let path = format!("/rooms/{}/event/{}", seg(room), seg(event));
        match self.call_retrying(reqwest::Method::GET, &path, None, 5).await {
            Ok(v) => Ok(v["sender"].as_str().map(str::to_owned)),
            Err(e) if matches!(e.status, Some(403 | 404)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The display name of `user`'s profile, if it has one.
    pub async fn display_name(&self, user: &str) -> Result<Option<String>, ApiError> {
        match self.call_retrying(reqwest::Method::GET, &format!("/profile/{}/displayname", seg(user)), None, 3).await {
            Ok(v) => Ok(v["displayname"].as_str().map(str::to_owned).filter(|n| !n.trim().is_empty())),
            Err(e) if e.status == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The bot's `m.direct` account data (`{user: [room, …]}`), empty when never set.
    pub async fn direct_rooms(&self, user: &str) -> Result<Value, ApiError> {
        let path = format!("/user/{}/account_data/m.direct", seg(user));
        match self.call_retrying(reqwest::Method::GET, &path, None, 5).await {
            Ok(v) => Ok(v),
            Err(e) if e.status == Some(404) => Ok(json!({})),
            Err(e) => Err(e),
        }
    }

    /// Replaces the bot's `m.direct` account data.
    pub async fn set_direct_rooms(&self, user: &str, direct: &Value) -> Result<(), ApiError> {
        let path = format!("/user/{}/account_data/m.direct", seg(user));
        self.call_retrying(reqwest::Method::PUT, &path, Some(direct), 5).await.map(|_| ())
    }
}

/// A path for a log line: sync tokens and filters are not secrets, but long; keep the endpoint.
fn redact_path(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// 1 s, 2 s, 4 s, … at most 30 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Markdown (CommonMark with tables, strikethrough, task lists) as the HTML of `formatted_body`. Raw
/// HTML in the text is escaped, never passed on: a reply is the model's text, and the room's clients
/// render `formatted_body`.
pub fn markdown_html(text: &str) -> String {
    use pulldown_cmark::{Event, Options, Parser};
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let events = Parser::new_ext(text, opts).map(|e| match e {
        Event::Html(h) | Event::InlineHtml(h) => Event::Text(h),
        e => e,
    });
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    pulldown_cmark::html::push_html(&mut out, events);
    out.trim_end().to_owned()
}

/// The content of a reply: `m.text` with the markdown and its HTML.
pub fn text_content(text: &str) -> Value {
    json!({
        "msgtype": "m.text",
        "body": text,
        "format": "org.matrix.custom.html",
        "formatted_body": markdown_html(text),
    })
}

/// An `m.replace` edit of event `target` to `text` (clients without edits show `* <text>`).
pub fn edit_content(target: &str, text: &str) -> Value {
    let new = text_content(text);
    json!({
        "msgtype": "m.text",
        "body": format!("* {text}"),
        "format": "org.matrix.custom.html",
        "formatted_body": format!("* {}", new["formatted_body"].as_str().unwrap_or_default()),
        "m.new_content": new,
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    })
}

/// The notice an encrypted room gets before the bot leaves it.
pub const ENCRYPTED_REFUSAL: &str = "This bot does not support end-to-end encrypted rooms, and is leaving this one. \
     Talk to it in a room without encryption.";

/// The sync filter: message, membership and encryption events of rooms; no presence, receipts or
/// typing. `timeline_limit` 0 for the first sync (start at the present).
pub fn sync_filter(timeline_limit: u32) -> String {
    json!({
        "presence": {"not_types": ["*"]},
        "account_data": {"types": ["m.direct"]},
        "room": {
            "ephemeral": {"not_types": ["*"]},
            "account_data": {"not_types": ["*"]},
            "state": {"types": ["m.room.encryption", "m.room.member", "m.room.create"], "lazy_load_members": true},
            "timeline": {
                "limit": timeline_limit,
                "types": ["m.room.message", "m.room.encrypted", "m.room.encryption", "m.room.member"],
            },
        },
    })
    .to_string()
}

/// An invite the bot received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invite {
    pub room: String,
    /// Who sent it (the sender of the bot's `invite` membership event).
    pub inviter: String,
    /// The invite says the room is a direct chat.
    pub is_direct: bool,
}

/// A message a user sent in a room the bot is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    pub room: String,
    pub event_id: String,
    pub sender: String,
    pub body: String,
    /// Its HTML (`formatted_body`), if any.
    pub formatted_body: Option<String>,
    /// The users it mentions on purpose (`m.mentions.user_ids`).
    pub mentions: Vec<String>,
    /// The event it replies to (`m.relates_to.m.in_reply_to`).
    pub reply_to: Option<String>,
}

/// What one sync answer holds for the bot.
#[derive(Debug, Default)]
pub struct Batch {
    pub next_batch: String,
    pub invites: Vec<Invite>,
    /// Text messages from others, in room order (rooms in the answer's order).
    pub messages: Vec<Incoming>,
    /// Other events from others that are not turns (edits, images, …): `(room, event id, why)`.
    pub ignored: Vec<(String, String, &'static str)>,
    /// Joined rooms that are (or became) encrypted.
    pub encrypted: Vec<String>,
    /// Joined rooms whose timeline was cut (`limited`), with their `prev_batch`.
    pub gaps: Vec<(String, String)>,
    /// The bot's `m.direct` account data, when it changed.
    pub direct: Option<Value>,
    /// Joined rooms whose membership changed (a member event), or that say how many joined
    /// (`summary`'s `m.joined_member_count`: `Some`).
    pub members: Vec<(String, Option<usize>)>,
}

/// Reads one sync answer (`bot`: the bot's user id, whose own events are skipped).
pub fn parse_sync(v: &Value, bot: &str) -> Batch {
    let mut b = Batch { next_batch: v["next_batch"].as_str().unwrap_or_default().to_owned(), ..Default::default() };
    if let Some(events) = v["account_data"]["events"].as_array() {
        b.direct = events.iter().rev().find(|e| e["type"] == "m.direct").map(|e| e["content"].clone());
    }
    if let Some(invites) = v["rooms"]["invite"].as_object() {
        for (room, r) in invites {
            let events = r["invite_state"]["events"].as_array().map(Vec::as_slice).unwrap_or_default();
            let me = events.iter().find(|e| e["type"] == "m.room.member" && e["state_key"] == bot);
            if let Some(me) = me.filter(|e| e["content"]["membership"] == "invite") {
                b.invites.push(Invite {
                    room: room.clone(),
                    inviter: me["sender"].as_str().unwrap_or_default().to_owned(),
                    is_direct: me["content"]["is_direct"] == true,
                });
            }
        }
    }
    if let Some(joined) = v["rooms"]["join"].as_object() {
        for (room, r) in joined {
            let state = r["state"]["events"].as_array().map(Vec::as_slice).unwrap_or_default();
            let timeline = r["timeline"]["events"].as_array().map(Vec::as_slice).unwrap_or_default();
            let encrypted = state
                .iter()
                .chain(timeline)
                .any(|e| e["type"] == "m.room.encryption" || e["type"] == "m.room.encrypted");
            if encrypted {
                b.encrypted.push(room.clone());
            }
            if r["timeline"]["limited"] == true {
                if let Some(prev) = r["timeline"]["prev_batch"].as_str() {
                    b.gaps.push((room.clone(), prev.to_owned()));
                }
            }
            let joined = r["summary"]["m.joined_member_count"].as_u64().map(|n| n as usize);
            if joined.is_some() || state.iter().chain(timeline).any(|e| e["type"] == "m.room.member") {
                b.members.push((room.clone(), joined));
            }
            for e in timeline {
                classify(room, e, bot, &mut b);
            }
        }
    }
    b
}

/// Puts a timeline event of `room` where it belongs in `b`: a message from someone else, or ignored.
pub fn classify(room: &str, e: &Value, bot: &str, b: &mut Batch) {
    if e["type"] != "m.room.message" || e["sender"] == bot {
        return;
    }
    let event_id = e["event_id"].as_str().unwrap_or_default().to_owned();
    let c = &e["content"];
    if c["m.relates_to"]["rel_type"] == "m.replace" {
        b.ignored.push((room.to_owned(), event_id, "an edit (only new messages start turns)"));
        return;
    }
    match c["msgtype"].as_str() {
        Some("m.text" | "m.emote") => {}
        Some("m.notice") => {
            b.ignored.push((room.to_owned(), event_id, "a notice (bots' messages are not answered)"));
            return;
        }
        _ => {
            b.ignored.push((room.to_owned(), event_id, "not a text message"));
            return;
        }
    }
    let Some(body) = c["body"].as_str().filter(|s| !s.trim().is_empty()) else {
        b.ignored.push((room.to_owned(), event_id, "an empty message"));
        return;
    };
    let mentions = c["m.mentions"]["user_ids"].as_array().map(Vec::as_slice).unwrap_or_default();
    b.messages.push(Incoming {
        room: room.to_owned(),
        event_id,
        sender: e["sender"].as_str().unwrap_or_default().to_owned(),
        body: body.to_owned(),
        formatted_body: c["formatted_body"].as_str().map(str::to_owned),
        mentions: mentions.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        reply_to: c["m.relates_to"]["m.in_reply_to"]["event_id"].as_str().map(str::to_owned),
    });
}

/// The rooms of `m.direct` account data (`{user: [room, …]}`).
pub fn direct_room_set(direct: &Value) -> BTreeSet<String> {
    direct
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// `direct` with `room` added under `user`.
pub fn with_direct_room(direct: &Value, user: &str, room: &str) -> Value {
    let mut d = direct.as_object().cloned().unwrap_or_default();
    let list = d.entry(user.to_owned()).or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(a) = list.as_array_mut() {
        if !a.iter().any(|r| r == room) {
            a.push(json!(room));
        }
    }
    Value::Object(d)
}

// ---------------------------------------------------------------------------------------------
// Mentions

/// How people address the bot in a room: its user id and display name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mention {
    pub user_id: String,
    pub display_name: Option<String>,
}

impl Mention {
    /// Whether `m` names the bot: its id in `m.mentions`, a `matrix.to` link to it in the HTML (a
    /// pill), or its user id or display name (as a word) in the text. (A reply to the bot is
    /// checked apart: it needs the homeserver.)
    pub fn names(&self, m: &Incoming) -> bool {
        let me = self.user_id.to_lowercase();
        if m.mentions.iter().any(|u| u.to_lowercase() == me) {
            return true;
        }
        let body = m.body.to_lowercase();
        if body.contains(&me) {
            return true;
        }
        if let Some(html) = &m.formatted_body {
            let html = html.to_lowercase();
            let encoded = me.replace('@', "%40").replace(':', "%3a");
            if html.contains(&format!("matrix.to/#/{me}")) || html.contains(&format!("matrix.to/#/{encoded}")) {
                return true;
            }
        }
        self.display_name.as_deref().is_some_and(|n| contains_word(&body, &n.to_lowercase()))
    }

    /// `text` without a leading mention of the bot (`Pincer: hi`, `@bot:example.org, hi` → `hi`).
    pub fn strip(&self, text: &str) -> String {
        let t = text.trim_start();
        for name in std::iter::once(self.user_id.as_str()).chain(self.display_name.as_deref()) {
            let head = t.get(..name.len());
            if head.is_some_and(|h| h.to_lowercase() == name.to_lowercase()) {
                let rest = &t[name.len()..];
                let after = rest.trim_start_matches([':', ',']);
                if after.len() < rest.len() || rest.starts_with(char::is_whitespace) {
                    let after = after.trim_start();
                    if !after.is_empty() {
                        return after.to_owned();
                    }
                }
            }
        }
        text.to_owned()
    }
}

/// Whether `needle` is in `hay` with no letter or digit right before or after it.
fn contains_word(hay: &str, needle: &str) -> bool {
    if needle.trim().is_empty() {
        return false;
    }
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let at = from + i;
        let before = hay[..at].chars().next_back();
        let after = hay[at + needle.len()..].chars().next();
        if !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric) {
            return true;
        }
        from = at + needle.chars().next().map_or(1, char::len_utf8);
    }
    false
}

// ---------------------------------------------------------------------------------------------
// Outbound

/// A transaction id for the seam's `txn` (stable across attempts of the same message): a hash, so
/// that it is short and the same after a restart. An edit's includes its text, since each edit of
/// one message is a new event (the seam names all of a run's streaming edits alike).
pub fn txn_id(txn: &str, edit_text: Option<&str>) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(txn.as_bytes());
    if let Some(t) = edit_text {
        h.update([0u8]);
        h.update(t.as_bytes());
    }
    let hex: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("pincer-{hex}")
}

/// Cuts `text` into pieces of at most [`MAX_MESSAGE`] bytes, at a line break or a space when there
/// is one in the second half of a piece.
pub fn split(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text.trim_end();
    while !rest.is_empty() {
        let mut end = rest.len();
        if end > MAX_MESSAGE {
            end = MAX_MESSAGE;
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            let head = &rest[..end];
            if let Some(i) = head.rfind('\n').or_else(|| head.rfind(' ')).filter(|&i| i > end / 2) {
                end = i + 1;
            }
        }
        let piece = rest[..end].trim_end();
        if !piece.is_empty() {
            out.push(piece.to_owned());
        }
        rest = rest[end..].trim_start_matches('\n');
    }
    out
}

/// How long a typing notification lasts unless renewed (each streaming edit renews it).
const TYPING: Duration = Duration::from_secs(20);

/// The bot: its client-server API client and identity.
pub struct Bot {
    api: Api,
    /// The bot's user id (checked with `whoami`).
    pub user_id: String,
}

fn send_error(e: ApiError) -> SendError {
    if e.transient() {
        SendError::Unknown(e.to_string())
    } else {
        SendError::Rejected(e.to_string())
    }
}

impl Bot {
    /// The user's event a reply's first message answers: the seam names that message
    /// `<run id>.first` (or `<run id>.final.0` when a reply is sent whole, with no message streamed
    /// into), and a turn's run id is [`super::run_id`] of the event (unless it was hashed).
    fn replied_event<'a>(&self, to: &Address, txn: &'a str) -> Option<&'a str> {
        let run = txn.strip_suffix(".first").or_else(|| txn.strip_suffix(".final.0"))?;
        let prefix = super::run_id(NAME, &self.user_id, &to.chat, "");
        run.strip_prefix(prefix.as_str()).filter(|e| e.starts_with('$'))
    }
}

impl Outbound for Bot {
    fn channel(&self) -> &'static str {
        NAME
    }

    fn account(&self) -> String {
        self.user_id.clone()
    }

    fn split(&self, text: &str) -> Vec<String> {
        split(text)
    }

    fn send<'a>(&'a self, to: &'a Address, text: &'a str, txn: &'a str) -> BoxFuture<'a, Result<String, SendError>> {
        Box::pin(async move {
            // The seam marks a message it sends again after a crash left its fate unknown; here the
            // transaction id settles that (the homeserver answers a repeat with the first event), so
            // the mark would only be noise.
            let text = text.strip_prefix(super::MAYBE_DUPLICATE).map(str::trim_start).unwrap_or(text);
            let mut content = text_content(text);
            // A reply's first message answers the user's (in a room, people see which message it answers).
            if let Some(event) = self.replied_event(to, txn) {
                content["m.relates_to"] = json!({"m.in_reply_to": {"event_id": event}});
            }
            self.api.send(&to.chat, &txn_id(txn, None), &content).await.map_err(send_error)
        })
    }

    fn edit<'a>(
        &'a self,
        to: &'a Address,
        id: &'a str,
        text: &'a str,
        txn: &'a str,
    ) -> BoxFuture<'a, Result<(), SendError>> {
        Box::pin(async move {
            self.api.send(&to.chat, &txn_id(txn, Some(text)), &edit_content(id, text)).await.map_err(send_error)?;
            // The final edit ends the reply: typing off. A streaming one renews it.
            let on = (!txn.contains(".final")).then_some(TYPING);
            if let Err(e) = self.api.typing(&to.chat, &self.user_id, on).await {
                tracing::debug!(room = %to.chat, "matrix: typing notification failed: {e}");
            }
            Ok(())
        })
    }

    fn typing<'a>(&'a self, to: &'a Address) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.api.typing(&to.chat, &self.user_id, Some(TYPING)).await {
                tracing::debug!(room = %to.chat, "matrix: typing notification failed: {e}");
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Inbound: the sync loop

/// Starts the bot (its sync loop) in the background.
pub fn start(ch: &Arc<Channels>, settings: MatrixSettings) {
    let ch = ch.clone();
    tokio::spawn(async move { run(ch, settings).await });
}

/// Waits `d`, or less when the gateway stops; false when it stops.
async fn pause(gw: &Engine, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = gw.shutdown.cancelled() => false,
    }
}

/// What the loop keeps between syncs.
struct Rooms {
    /// Rooms that are direct chats (the bot's `m.direct`).
    direct: BTreeSet<String>,
    /// The bot's `m.direct` content as last read.
    direct_data: Value,
    /// Encrypted rooms already refused by this process.
    refused: HashSet<String>,
    /// Joined members per room, as last known (dropped when its membership changes).
    members: HashMap<String, usize>,
    /// How people address the bot.
    mention: Mention,
}

async fn run(ch: Arc<Channels>, settings: MatrixSettings) {
    let gw = ch.gw.clone();
    let stats = gw.channels.stats(NAME);
    let api = match Api::new(&settings.homeserver, &settings.token) {
        Ok(a) => a,
        Err(e) => {
            stats.set_state(format!("error: {e}"));
            tracing::error!("{e}");
            return;
        }
    };
    // Who the token belongs to: it must be the configured bot.
    let mut wait = Duration::from_secs(1);
    loop {
        match api.whoami().await {
            Ok(who) if who == settings.user_id => break,
            Ok(who) => {
                let e = format!("the access token is {who}'s, not {}'s (user_id)", settings.user_id);
                stats.set_state(format!("error: {e}"));
                tracing::error!("matrix: {e}; the channel is stopped");
                return;
            }
            Err(e) => {
                stats.set_state(format!("error: whoami: {e}"));
                tracing::warn!("matrix: cannot reach the homeserver ({e}); trying again in {wait:?}");
            }
        }
        if !pause(&gw, wait).await {
            return;
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
    stats.set_account(settings.user_id.clone());
    // With replicas, one syncs (and delivers) at a time; the others stand by.
    let Ok(_lease) = super::lease(&ch, &stats, &format!("{NAME}:{}", settings.user_id)).await else { return };
    let bot = Arc::new(Bot { api: api.clone(), user_id: settings.user_id.clone() });
    ch.register(bot.clone());
    let me = settings.user_id.clone();
    let direct_data = loop {
        match api.direct_rooms(&me).await {
            Ok(d) => break d,
            Err(e) => {
                tracing::warn!("matrix: cannot read the bot's m.direct ({e}); trying again");
                if !pause(&gw, Duration::from_secs(2)).await {
                    return;
                }
            }
        }
    };
    // The display name people's clients show (and put in a mention's text); without one, the id.
    let display_name = match api.display_name(&me).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("matrix: cannot read the bot's display name ({e}); mentions by name are not recognised");
            None
        }
    };
    let mention = Mention { user_id: me.clone(), display_name };
    let mut rooms = Rooms {
        direct: direct_room_set(&direct_data),
        direct_data,
        refused: HashSet::new(),
        members: HashMap::new(),
        mention,
    };
    let mut since = match super::load_cursor(&ch, NAME, &me).await {
        Ok(c) => c,
        Err(e) => {
            // Without the position, a first sync would skip what came meanwhile: wait for it.
            stats.set_state(format!("error: {e}"));
            tracing::error!("matrix: {e}; the channel is stopped (fix the file and restart)");
            return;
        }
    };
    let filter = sync_filter(100);
    stats.set_state("running");
    tracing::info!(user = %me, "matrix: syncing");
    let mut wait = Duration::from_secs(1);
    loop {
        if gw.shutdown.is_cancelled() {
            return;
        }
        // The first start begins at the present: an initial sync without timelines.
        let first = since.is_none();
        let (timeout, f) =
            if first { (Duration::ZERO, sync_filter(0)) } else { (settings.sync_timeout, filter.clone()) };
        let synced = tokio::select! {
            r = api.sync(since.as_deref(), timeout, &f) => r,
            _ = gw.shutdown.cancelled() => return,
        };
        let answer = match synced {
            Ok(v) => v,
            Err(e) => {
                stats.count(NAME, Event::Failed);
                stats.set_state(format!("error: sync: {e}"));
                if e.unauthorized() {
                    tracing::error!("matrix: the homeserver refused the access token ({e}); trying again in 60 s");
                    wait = Duration::from_secs(60);
                } else {
                    tracing::warn!("matrix: sync failed ({e}); trying again in {wait:?}");
                }
                if !pause(&gw, wait).await {
                    return;
                }
                wait = (wait * 2).min(Duration::from_secs(60));
                continue;
            }
        };
        wait = Duration::from_secs(1);
        stats.set_state("running");
        let mut batch = parse_sync(&answer, &me);
        let next_batch = std::mem::take(&mut batch.next_batch);
        if next_batch.is_empty() {
            tracing::warn!("matrix: a sync answer without next_batch; trying again");
            if !pause(&gw, Duration::from_secs(1)).await {
                return;
            }
            continue;
        }
        if first {
            tracing::info!("matrix: first start: messages sent before now are not answered");
        }
        match handle_batch(&ch, &api, &bot, &settings, &mut rooms, since.as_deref(), batch).await {
            Ok(()) => {
                // Every turn of the batch is on disk: the position may move past it.
                if let Err(e) = super::save_cursor(&ch, NAME, &me, &next_batch).await {
                    tracing::warn!("matrix: {e}");
                }
                since = Some(next_batch);
            }
            Err(e) => {
                // Not durable: the same batch comes again from the same position.
                tracing::warn!("matrix: a message could not be taken in ({e}); it will be read again");
                if !pause(&gw, Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    }
}

/// Takes in one sync answer: `m.direct`, invites, encrypted rooms, then each message as a turn.
/// `Err` when a message could not be made durable.
async fn handle_batch(
    ch: &Arc<Channels>,
    api: &Api,
    bot: &Arc<Bot>,
    settings: &MatrixSettings,
    rooms: &mut Rooms,
    since: Option<&str>,
    mut batch: Batch,
) -> Result<(), String> {
    let gw = &ch.gw;
    let me = &settings.user_id;
    if let Some(d) = batch.direct.take() {
        rooms.direct = direct_room_set(&d);
        rooms.direct_data = d;
    }
    for (room, joined) in &batch.members {
        match joined {
            Some(n) => rooms.members.insert(room.clone(), *n),
            None => rooms.members.remove(room),
        };
    }
    for invite in &batch.invites {
        handle_invite(ch, api, settings, rooms, invite).await?;
    }
    for room in &batch.encrypted {
        refuse_encrypted(ch, api, rooms, room).await;
    }
    // A cut timeline: the events between the last position and the timeline's start, from
    // `/messages`, go before the timeline's.
    if let Some(since) = since {
        for (room, prev) in &batch.gaps {
            let mut older = Batch::default();
            let mut from = prev.clone();
            let mut events: Vec<Value> = Vec::new();
            loop {
                let (chunk, next) = match api.messages_back(room, &from, since, 100).await {
                    Ok(page) => page,
                    Err(e) if e.transient() => return Err(format!("cannot fill a gap in {room}: {e}")),
                    Err(e) => {
                        tracing::warn!(room = %room, "matrix: a gap in the room's timeline cannot be read: {e}");
                        break;
                    }
                };
                events.extend(chunk);
                match next {
                    Some(n) if n != from => from = n,
                    _ => break,
                }
            }
            events.reverse();
            for e in &events {
                classify(room, e, me, &mut older);
            }
            tracing::info!(room = %room, filled = older.messages.len(), "matrix: a gap in a room's timeline was filled");
            let at = batch.messages.iter().position(|m| m.room == *room).unwrap_or(batch.messages.len());
            batch.messages.splice(at..at, older.messages);
            batch.ignored.extend(older.ignored);
        }
    }
    for (room, event, why) in &batch.ignored {
        tracing::debug!(room = %room, event = %event, "matrix: not a turn: {why}");
    }
    for m in batch.messages {
        if rooms.refused.contains(&m.room) || batch.encrypted.contains(&m.room) {
            continue;
        }
        if !settings.policy.allows(&[&m.sender]) {
            super::refused(gw, NAME, &m.sender, None, &m.room);
            continue;
        }
        let kind = if rooms.direct.contains(&m.room) { ChatKind::Direct } else { ChatKind::Group };
        if kind == ChatKind::Group && settings.require_mention && !addressed(api, rooms, &m).await? {
            tracing::debug!(room = %m.room, event = %m.event_id, "matrix: not a turn: a room message not addressed to the bot (require_mention)");
            continue;
        }
        let text = crate::openclaw::chat::sanitize_message(&rooms.mention.strip(&m.body));
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(room = %m.room, event = %m.event_id, "matrix: a message was left out: {}", e.message);
                continue;
            }
        };
        let inbound = Inbound {
            channel: NAME,
            account: me.clone(),
            kind,
            chat: m.room.clone(),
            sender: m.sender.clone(),
            sender_name: None,
            chat_title: None,
            message_id: m.event_id.clone(),
            text,
            images: Vec::new(),
        };
        match super::inbound(ch, &settings.policy, inbound).await.map_err(|e| e.message)? {
            Accepted::Command { reply, .. } => {
                let to = Address { channel: NAME.into(), account: me.clone(), chat: m.room.clone() };
                let txn = format!("command.{}", m.event_id);
                if let Err(e) = bot.send(&to, &reply, &txn).await {
                    tracing::warn!("matrix: cannot answer a command: {e}");
                }
            }
            Accepted::Turn { .. } | Accepted::Duplicate { .. } => {}
        }
    }
    Ok(())
}

/// Whether room message `m` is for the bot: the room is the bot's and one user's, the message
/// names the bot ([`Mention::names`]), or it replies to one of the bot's events. `Err` when the
/// homeserver could not say (the batch is read again).
async fn addressed(api: &Api, rooms: &mut Rooms, m: &Incoming) -> Result<bool, String> {
    if rooms.mention.names(m) {
        return Ok(true);
    }
    let members = match rooms.members.get(&m.room) {
        Some(n) => *n,
        None => {
            let n = api
                .joined_member_count(&m.room)
                .await
                .map_err(|e| format!("cannot count the members of {}: {e}", m.room))?;
            rooms.members.insert(m.room.clone(), n);
            n
        }
    };
    if members <= 2 {
        return Ok(true);
    }
    let Some(event) = &m.reply_to else { return Ok(false) };
    let sender = api
        .event_sender(&m.room, event)
        .await
        .map_err(|e| format!("cannot read the event {event} a message replies to: {e}"))?;
    Ok(sender.as_deref() == Some(rooms.mention.user_id.as_str()))
}

/// An invite: accepted from an allowed user (a direct one recorded in the bot's `m.direct`),
/// declined and logged otherwise.
async fn handle_invite(
    ch: &Arc<Channels>,
    api: &Api,
    settings: &MatrixSettings,
    rooms: &mut Rooms,
    invite: &Invite,
) -> Result<(), String> {
    let gw = &ch.gw;
    let me = &settings.user_id;
    if !settings.policy.allows(&[&invite.inviter]) {
        tracing::warn!(
            channel = NAME,
            inviter = %invite.inviter,
            room = %invite.room,
            "an invite from a user not on allow_from was declined; add them to [channels.matrix] allow_from to let them talk to the agent"
        );
        gw.channels.count(NAME, Event::Refused);
        if let Err(e) = api.leave(&invite.room).await {
            tracing::warn!(room = %invite.room, "matrix: cannot decline an invite: {e}");
        }
        return Ok(());
    }
    match api.join(&invite.room).await {
        Ok(()) => {}
        // The homeserver is away: the batch is read again.
        Err(e) if e.transient() => return Err(format!("cannot join {}: {e}", invite.room)),
        // Withdrawn, or the room is gone: nothing to wait for.
        Err(e) => {
            tracing::warn!(room = %invite.room, inviter = %invite.inviter, "matrix: cannot join a room on an invite: {e}");
            return Ok(());
        }
    }
    tracing::info!(room = %invite.room, inviter = %invite.inviter, direct = invite.is_direct, "matrix: joined a room on an invite");
    if invite.is_direct && !rooms.direct.contains(&invite.room) {
        let d = with_direct_room(&rooms.direct_data, &invite.inviter, &invite.room);
        if let Err(e) = api.set_direct_rooms(me, &d).await {
            // Kept in memory all the same: only the next start would take the room for a group.
            tracing::warn!(room = %invite.room, "matrix: cannot record a direct room in m.direct: {e}");
        }
        rooms.direct = direct_room_set(&d);
        rooms.direct_data = d;
    }
    if api.state(&invite.room, "m.room.encryption").await.map_err(|e| e.to_string())?.is_some() {
        refuse_encrypted(ch, api, rooms, &invite.room).await;
    }
    Ok(())
}

/// Refuses an encrypted room: a notice in the room (the same event however often this runs: its
/// transaction id is the room's), a line in the log, and the bot leaves.
async fn refuse_encrypted(ch: &Arc<Channels>, api: &Api, rooms: &mut Rooms, room: &str) {
    let gw = &ch.gw;
    if !rooms.refused.insert(room.to_owned()) {
        return;
    }
    tracing::warn!(
        channel = NAME,
        room = %room,
        "an end-to-end encrypted room was refused (not supported): the bot says so in the room and leaves"
    );
    gw.channels.count(NAME, Event::Refused);
    let notice = json!({"msgtype": "m.notice", "body": ENCRYPTED_REFUSAL});
    if let Err(e) = api.send(room, &txn_id(&format!("encrypted.{room}"), None), &notice).await {
        tracing::warn!(room = %room, "matrix: cannot tell an encrypted room why the bot leaves: {e}");
    }
    if let Err(e) = api.leave(room).await {
        tracing::warn!(room = %room, "matrix: cannot leave an encrypted room: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_replies_are_cut_below_the_event_size_at_a_line_break() {
        assert!(split("").is_empty());
        assert_eq!(split("hi"), vec!["hi"]);
        let long = format!("{}\n{}", "a".repeat(8000), "b".repeat(8000));
        assert_eq!(split(&long), vec!["a".repeat(8000), "b".repeat(8000)]);
        let wide = "é".repeat(20_000);
        let parts = split(&wide);
        assert!(parts.iter().all(|p| p.len() <= MAX_MESSAGE));
        assert_eq!(parts.concat(), wide);
    }

    #[test]
    fn transaction_ids_are_stable_and_edits_differ_by_content() {
        assert_eq!(txn_id("r.first", None), txn_id("r.first", None));
        assert_ne!(txn_id("r.first", None), txn_id("r.final.0", None));
        assert_ne!(txn_id("r.edit", Some("a")), txn_id("r.edit", Some("ab")));
        assert_eq!(txn_id("r.edit", Some("a")), txn_id("r.edit", Some("a")));
    }

    #[test]
    fn markdown_renders_and_raw_html_is_escaped() {
        assert_eq!(markdown_html("**hi** `x`"), "<p><strong>hi</strong> <code>x</code></p>");
        let h = markdown_html("<script>alert(1)</script> and <b onclick=x>b</b>");
        assert!(!h.contains("<script") && !h.contains("<b "), "{h}");
        assert!(h.contains("&lt;script&gt;"), "{h}");
        let e = edit_content("$ev", "new *text*");
        assert_eq!(e["m.new_content"]["body"], "new *text*");
        assert_eq!(e["m.relates_to"]["rel_type"], "m.replace");
    }

    #[test]
    fn a_sync_answer_is_sorted_out() {
        let v = json!({
            "next_batch": "s2",
            "rooms": {
                "invite": {"!i:x": {"invite_state": {"events": [
                    {"type": "m.room.member", "state_key": "@bot:x", "sender": "@alice:x", "content": {"membership": "invite", "is_direct": true}}
                ]}}},
                "join": {
                    "!r:x": {"timeline": {"limited": true, "prev_batch": "p1", "events": [
                        {"type": "m.room.message", "event_id": "$1", "sender": "@alice:x", "content": {"msgtype": "m.text", "body": "hello"}},
                        {"type": "m.room.message", "event_id": "$2", "sender": "@bot:x", "content": {"msgtype": "m.text", "body": "mine"}},
                        {"type": "m.room.message", "event_id": "$3", "sender": "@alice:x", "content": {"msgtype": "m.text", "body": "* x", "m.relates_to": {"rel_type": "m.replace", "event_id": "$1"}}}
                    ]}},
                    "!e:x": {"state": {"events": [{"type": "m.room.encryption", "state_key": "", "content": {}}]}, "timeline": {"events": []}}
                }
            }
        });
        let b = parse_sync(&v, "@bot:x");
        assert_eq!(b.next_batch, "s2");
        assert!(b.members.is_empty(), "no membership news");
        assert_eq!(b.invites, vec![Invite { room: "!i:x".into(), inviter: "@alice:x".into(), is_direct: true }]);
        assert_eq!(b.messages.len(), 1);
        assert_eq!(b.messages[0].body, "hello");
        assert_eq!(b.ignored.len(), 1);
        assert_eq!(b.encrypted, vec!["!e:x".to_owned()]);
        assert_eq!(b.gaps, vec![("!r:x".to_owned(), "p1".to_owned())]);
        let d = with_direct_room(&json!({}), "@alice:x", "!i:x");
        assert!(direct_room_set(&d).contains("!i:x"));

        let v = json!({"next_batch": "s3", "rooms": {"join": {"!r:x": {
        "summary": {"m.joined_member_count": 3},
        "timeline": {"events": [
            {"type": "m.room.member", "state_key": "@carol:x", "sender": "@carol:x", "content": {"membership": "join"}},
            {"type": "m.room.message", "event_id": "$4", "sender": "@alice:x", "content": {"msgtype": "m.text",
                "body": "yes", "formatted_body": "<b>yes</b>", "m.mentions": {"user_ids": ["@bot:x"]},
                "m.relates_to": {"m.in_reply_to": {"event_id": "$2"}}}}
        ]}}}}});
        let b = parse_sync(&v, "@bot:x");
        assert_eq!(b.members, vec![("!r:x".to_owned(), Some(3))]);
        let m = &b.messages[0];
        assert_eq!((m.mentions.as_slice(), m.reply_to.as_deref()), (&["@bot:x".to_owned()][..], Some("$2")));
        assert_eq!(m.formatted_body.as_deref(), Some("<b>yes</b>"));
    }

    #[test]
    fn a_room_message_names_the_bot_by_mention_pill_id_or_display_name() {
        let me = Mention { user_id: "@pincer:example.org".into(), display_name: Some("Pincer Bot".into()) };
        let msg = |body: &str, html: Option<&str>, mentions: &[&str]| Incoming {
            room: "!r:x".into(),
            event_id: "$e".into(),
            sender: "@alice:x".into(),
            body: body.into(),
            formatted_body: html.map(str::to_owned),
            mentions: mentions.iter().map(|m| (*m).to_owned()).collect(),
            reply_to: None,
        };
        assert!(me.names(&msg("hi", None, &["@pincer:example.org"])), "m.mentions");
        assert!(me.names(&msg("ask @Pincer:example.org", None, &[])), "the user id");
        assert!(me.names(&msg(
            "PB: hi",
            Some("<a href=\"https://matrix.to/#/%40pincer%3Aexample.org\">PB</a>: hi"),
            &[]
        )));
        assert!(me.names(&msg("x", Some("<a href=\"https://matrix.to/#/@pincer:example.org\">x</a>"), &[])));
        assert!(me.names(&msg("pincer bot, what now?", None, &[])), "the display name");
        assert!(!me.names(&msg("the pincer botany club", None, &[])), "a word of it only");
        assert!(!me.names(&msg("hello all", None, &["@alice:x"])));
        assert!(!me.names(&msg(
            "see https://matrix.to/#/@other:x",
            Some("<a href=\"https://matrix.to/#/@other:x\">o</a>"),
            &[]
        )));
        assert_eq!(me.strip("Pincer Bot: what is up"), "what is up");
        assert_eq!(me.strip("@pincer:example.org, hi"), "hi");
        assert_eq!(me.strip("Pincer Bottle"), "Pincer Bottle");
        assert_eq!(me.strip("Pincer Bot:"), "Pincer Bot:", "nothing left: kept");
        assert_eq!(me.strip("tell Pincer Bot"), "tell Pincer Bot");
    }
}
