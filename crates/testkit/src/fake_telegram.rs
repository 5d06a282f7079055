//! A fake Telegram Bot API server for the gateway's Telegram channel: real HTTP on 127.0.0.1:0
//! (axum), `/bot<token>/<method>` with the documented semantics of the methods the channel uses:
//!
//! - `getMe`;
//! - `getUpdates {offset, timeout, limit}`: an update is confirmed (and dropped) once `getUpdates`
//!   is called with an `offset` above its `update_id`; unconfirmed ones are delivered again on every
//!   call; with none waiting, the call is held up to `timeout` seconds for one to come;
//! - `sendMessage {chat_id, text, parse_mode?}`: the new message (its `message_id`, counting up per
//!   chat); refused with Telegram's errors for an empty text, a text over 4096 UTF-16 code units,
//!   and MarkdownV2 with a reserved character not escaped;
//! - `editMessageText {chat_id, message_id, text}`: "message is not modified" when the text is the
//!   same, "message to edit not found" for an unknown message;
//! - `sendPhoto {chat_id, photo, caption?}`: `photo` uploaded as a file part of a
//!   `multipart/form-data` request (also as `attach://<part>`), or a string: an HTTP(S) URL Telegram
//!   fetches (taken as fetchable unless [`FakeTelegram::unreachable_url`] says otherwise) or the
//!   `file_id` of a photo it has; the new message with its `photo` sizes (`PhotoSize`s: a 90 px
//!   thumbnail, a 320 px one and the original, from a PNG's or JPEG's real dimensions). Refused
//!   with Telegram's errors for no photo, an empty file, one over 10 MB (413), bytes that are not
//!   an image (`IMAGE_PROCESS_FAILED`), a wrong file id or URL, a caption over 1024 characters;
//!   `editMessageText` of a photo says there is no text to edit;
//! - `sendChatAction`, `getFile` and the file download (`/file/bot<token>/<path>`).
//!
//! Tests push users' messages ([`FakeTelegram::push_text`]), make the server answer 429 with
//! `retry_after` ([`FakeTelegram::fail_next`]), hold a method's answers while its effect stands
//! (the platform took it, the answer never came: [`FakeTelegram::hold`]), deliver an update again
//! ([`FakeTelegram::redeliver`]) and read everything the bot sent ([`FakeTelegram::messages`],
//! [`FakeTelegram::photos`], [`FakeTelegram::calls`]).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The fake bot's token.
pub const TOKEN: &str = "123456789:AAFakeTelegramBotTokenForTests_0123456";
/// The fake bot's user id and username.
pub const BOT_ID: i64 = 123_456_789;
pub const BOT_USERNAME: &str = "pincer_test_bot";

/// A message the bot sent, with every text it had (the first, then each edit).
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub chat_id: i64,
    pub message_id: i64,
    pub texts: Vec<String>,
}

impl Sent {
    /// The text it shows now.
    pub fn text(&self) -> &str {
        self.texts.last().map(String::as_str).unwrap_or("")
    }
}

/// How a photo came.
#[derive(Debug, Clone, PartialEq)]
pub enum PhotoSource {
    /// Uploaded: the file part's bytes, file name and content type.
    Upload { bytes: Vec<u8>, filename: String, content_type: String },
    /// An HTTP(S) URL for Telegram to fetch.
    Url(String),
    /// The `file_id` of a photo Telegram has.
    FileId(String),
}

/// A photo the bot sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Photo {
    pub chat_id: i64,
    pub message_id: i64,
    pub source: PhotoSource,
    pub caption: Option<String>,
}

/// Largest photo upload (`sendPhoto`: "The photo must be at most 10 MB in size").
pub const MAX_PHOTO: usize = 10 * 1024 * 1024;

#[derive(Default)]
struct Inner {
    /// Updates not yet confirmed, oldest first.
    pending: VecDeque<Value>,
    /// Every update ever pushed, by id (to deliver one again).
    all: BTreeMap<i64, Value>,
    next_update: i64,
    /// Per chat: the next message id.
    next_message: HashMap<i64, i64>,
    sent: Vec<Sent>,
    photos: Vec<Photo>,
    /// Methods whose answers are held (their effect stands) until released.
    held: std::collections::HashSet<String>,
    /// URLs Telegram cannot fetch.
    unreachable: std::collections::HashSet<String>,
    /// Every call: method and parameters.
    calls: Vec<(String, Value)>,
    /// Method → (how many more calls answer 429, retry_after).
    fail: HashMap<String, (usize, u64)>,
    /// Every `offset` `getUpdates` was called with.
    offsets: Vec<Option<i64>>,
    files: HashMap<String, Vec<u8>>,
    /// `setWebhook`: its URL and secret token (updates are then POSTed there, not polled).
    webhook: Option<(String, String)>,
    /// Where webhook requests really go (`host:port`), whatever host the URL names.
    webhook_target: Option<String>,
    /// Webhook requests made: the HTTP status each got.
    webhook_statuses: Vec<u16>,
}

struct Shared {
    inner: Mutex<Inner>,
    arrived: Notify,
}

/// The fake server; serves until its runtime ends.
#[derive(Clone)]
pub struct FakeTelegram {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeTelegram {
    /// Starts the server on the current tokio runtime.
    pub async fn start() -> FakeTelegram {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner { next_update: 100_000, ..Default::default() }),
            arrived: Notify::new(),
        });
        let app = axum::Router::new()
            .route("/{bot}/{method}", post(call).get(call))
            .route("/file/{bot}/{*path}", get(file))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        tokio::spawn(deliver_webhooks(shared.clone()));
        FakeTelegram { addr, shared }
    }

    /// Starts the server on a runtime of its own thread (for tests without one).
    pub fn start_in_thread() -> FakeTelegram {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
            rt.block_on(async {
                tx.send(FakeTelegram::start().await).expect("send");
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("the fake Telegram started")
    }

    /// `api_base_url` for `[channels.telegram]`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.inner.lock().expect("fake telegram state")
    }

    /// A user's message to the bot: in their private chat (`chat_id` = `user_id`) or, with a
    /// negative `chat_id`, in a group. Returns `(update_id, message_id)`.
    pub fn push_text(&self, chat_id: i64, user_id: i64, username: &str, text: &str) -> (i64, i64) {
        self.push_message(chat_id, user_id, username, json!({"text": text}))
    }

    /// A user's message with more fields (`text`, `caption`, `photo`, `reply_to_message`).
    pub fn push_message(&self, chat_id: i64, user_id: i64, username: &str, fields: Value) -> (i64, i64) {
        let (update_id, message_id) = {
            let mut s = self.inner();
            s.next_update += 1;
            let update_id = s.next_update;
            let next = s.next_message.entry(chat_id).or_insert(1);
            let message_id = *next;
            *next += 1;
            let chat = if chat_id > 0 {
                json!({"id": chat_id, "type": "private", "username": username, "first_name": username})
            } else {
                json!({"id": chat_id, "type": "supergroup", "title": format!("group {chat_id}")})
            };
            let mut message = json!({"message_id": message_id, "date": 1_765_000_000, "chat": chat,
                "from": {"id": user_id, "is_bot": false, "first_name": username, "username": username}});
            if let (Some(m), Value::Object(f)) = (message.as_object_mut(), fields) {
                m.extend(f);
            }
            let update = json!({"update_id": update_id, "message": message});
            s.all.insert(update_id, update.clone());
            s.pending.push_back(update);
            (update_id, message_id)
        };
        self.shared.arrived.notify_waiters();
        (update_id, message_id)
    }

    /// A photo the bot can download with `getFile`: its `photo` array for [`Self::push_message`].
    pub fn add_photo(&self, file_id: &str, bytes: Vec<u8>) -> Value {
        let size = bytes.len();
        self.inner().files.insert(file_id.to_owned(), bytes);
        json!([{"file_id": file_id, "file_unique_id": file_id, "width": 64, "height": 64, "file_size": size}])
    }

    /// Delivers update `update_id` again, as after it was confirmed (Telegram does after a lost
    /// acknowledgement; a restarted bot may read it again).
    pub fn redeliver(&self, update_id: i64) {
        {
            let mut s = self.inner();
            let u = s.all.get(&update_id).cloned().expect("a pushed update");
            s.pending.push_back(u);
        }
        self.shared.arrived.notify_waiters();
    }

    /// The next `n` calls of `method` are answered 429 with `retry_after` seconds.
    pub fn fail_next(&self, method: &str, n: usize, retry_after: u64) {
        self.inner().fail.insert(method.to_owned(), (n, retry_after));
    }

    /// From now on, calls of `method` take effect but are not answered until [`Self::release`]
    /// (as when Telegram took a request and the answer was lost on the way).
    pub fn hold(&self, method: &str) {
        self.inner().held.insert(method.to_owned());
    }

    /// Answers the held calls of `method`, and the later ones at once.
    pub fn release(&self, method: &str) {
        self.inner().held.remove(method);
    }

    /// `sendPhoto` with this URL fails as when Telegram cannot fetch it.
    pub fn unreachable_url(&self, url: &str) {
        self.inner().unreachable.insert(url.to_owned());
    }

    /// Every photo the bot sent, in order.
    pub fn photos(&self) -> Vec<Photo> {
        self.inner().photos.clone()
    }

    /// The photos the bot sent to one chat.
    pub fn photos_in(&self, chat_id: i64) -> Vec<Photo> {
        self.inner().photos.iter().filter(|p| p.chat_id == chat_id).cloned().collect()
    }

    /// Every message the bot sent, in order.
    pub fn messages(&self) -> Vec<Sent> {
        self.inner().sent.clone()
    }

    /// The messages the bot sent to one chat.
    pub fn messages_in(&self, chat_id: i64) -> Vec<Sent> {
        self.inner().sent.iter().filter(|m| m.chat_id == chat_id).cloned().collect()
    }

    /// Every call the bot made: method and parameters.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.inner().calls.clone()
    }

    /// Sends webhook requests to `host:port` (the gateway's address, known once it runs).
    pub fn set_webhook_target(&self, target: &str) {
        self.inner().webhook_target = Some(target.to_owned());
        self.shared.arrived.notify_waiters();
    }

    /// The webhook `setWebhook` set: URL and secret token.
    pub fn webhook(&self) -> Option<(String, String)> {
        self.inner().webhook.clone()
    }

    /// The HTTP status of every webhook request made so far.
    pub fn webhook_statuses(&self) -> Vec<u16> {
        self.inner().webhook_statuses.clone()
    }

    /// POSTs `body` to the webhook with `secret` as the secret token header: the HTTP status.
    pub async fn post_webhook(&self, body: &Value, secret: &str) -> u16 {
        let (url, target) = {
            let s = self.inner();
            (s.webhook.clone().expect("a webhook").0, s.webhook_target.clone().expect("a webhook target"))
        };
        post_json(&url, &target, secret, &body.to_string()).await.unwrap_or(0)
    }

    /// How many updates wait unconfirmed.
    pub fn unconfirmed(&self) -> usize {
        self.inner().pending.len()
    }

    /// The offsets `getUpdates` was called with.
    pub fn offsets(&self) -> Vec<Option<i64>> {
        self.inner().offsets.clone()
    }
}

fn ok(result: Value) -> Response {
    axum::Json(json!({"ok": true, "result": result})).into_response()
}

fn error(code: u16, description: &str) -> Response {
    let status = axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::BAD_REQUEST);
    (status, axum::Json(json!({"ok": false, "error_code": code, "description": description}))).into_response()
}

/// A file part of a `multipart/form-data` request.
#[derive(Debug, Clone)]
struct FilePart {
    bytes: Vec<u8>,
    filename: String,
    content_type: String,
}

/// The parts of a `multipart/form-data` body (RFC 7578): text fields, and file parts by name.
/// `Err` says what is malformed.
fn multipart(content_type: &str, body: &[u8]) -> Result<(Value, HashMap<String, FilePart>), String> {
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"'))
        .filter(|b| !b.is_empty())
        .ok_or("no boundary in the content type")?;
    let delimiter = format!("--{boundary}").into_bytes();
    let find = |hay: &[u8], needle: &[u8], from: usize| {
        hay.get(from..).and_then(|h| h.windows(needle.len()).position(|w| w == needle)).map(|i| i + from)
    };
    let mut fields = serde_json::Map::new();
    let mut files = HashMap::new();
    let mut at = find(body, &delimiter, 0).ok_or("no first boundary")? + delimiter.len();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok((Value::Object(fields), files));
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err("a boundary not followed by CRLF".into());
        }
        at += 2;
        let head_end = find(body, b"\r\n\r\n", at).ok_or("a part without the blank line after its headers")?;
        let head = String::from_utf8_lossy(&body[at..head_end]).into_owned();
        let mut end_marker = b"\r\n".to_vec();
        end_marker.extend_from_slice(&delimiter);
        let content_end = find(body, &end_marker, head_end + 4).ok_or("a part without a closing boundary")?;
        let content = body[head_end + 4..content_end].to_vec();
        at = content_end + end_marker.len();
        let mut name = None;
        let mut filename = None;
        let mut part_type = "text/plain".to_owned();
        for line in head.split("\r\n") {
            let (k, v) = line.split_once(':').unwrap_or((line, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "content-disposition" => {
                    for p in v.split(';').map(str::trim) {
                        if let Some(n) = p.strip_prefix("name=") {
                            name = Some(n.trim_matches('"').to_owned());
                        } else if let Some(f) = p.strip_prefix("filename=") {
                            filename = Some(f.trim_matches('"').to_owned());
                        }
                    }
                }
                "content-type" => part_type = v.trim().to_owned(),
                _ => {}
            }
        }
        let name = name.ok_or("a part without a name")?;
        match filename {
            Some(filename) => {
                files.insert(name, FilePart { bytes: content, filename, content_type: part_type });
            }
            None => {
                fields.insert(name, json!(String::from_utf8_lossy(&content)));
            }
        }
    }
}

/// The parameters of a call: a JSON body, or a query string / form (all values as strings).
fn params(query: Option<&str>, body: &[u8]) -> Value {
    if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(body) {
        return v;
    }
    let text = std::str::from_utf8(body).ok().filter(|b| !b.is_empty()).or(query).unwrap_or("");
    let mut m = serde_json::Map::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(k.to_owned(), json!(v));
    }
    Value::Object(m)
}

fn int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// Telegram's MarkdownV2 check: a reserved character outside an escape is refused; formatting
/// characters must come in pairs.
fn markdown_v2_error(text: &str) -> Option<String> {
    let mut chars = text.chars();
    let mut open: HashMap<char, usize> = HashMap::new();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '_' | '*' | '~' | '`' | '|' | '[' | ']' | '(' | ')' => *open.entry(c).or_default() += 1,
            '>' | '#' | '+' | '-' | '=' | '{' | '}' | '.' | '!' => {
                return Some(format!(
                    "Bad Request: can't parse entities: Character '{c}' is reserved and must be escaped with the preceding '\\'"
                ))
            }
            _ => {}
        }
    }
    for (c, n) in open {
        let paired = match c {
            '[' | '(' => true,
            ']' | ')' => true,
            _ => n % 2 == 0,
        };
        if !paired {
            return Some(format!(
                "Bad Request: can't parse entities: can't find end of the entity starting with '{c}'"
            ));
        }
    }
    None
}

/// The text of a send or edit, or Telegram's error description for it.
fn check_text(p: &Value) -> Result<String, String> {
    let text = p["text"].as_str().unwrap_or("").to_owned();
    if text.trim().is_empty() {
        return Err("Bad Request: message text is empty".into());
    }
    if text.encode_utf16().count() > 4096 {
        return Err("Bad Request: message is too long".into());
    }
    if p["parse_mode"].as_str() == Some("MarkdownV2") {
        if let Some(e) = markdown_v2_error(&text) {
            return Err(e);
        }
    }
    Ok(text)
}

async fn call(
    State(shared): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if bot != format!("bot{TOKEN}") {
        return error(401, "Unauthorized");
    }
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let (p, files) = if content_type.to_ascii_lowercase().starts_with("multipart/form-data") {
        match multipart(&content_type, &body) {
            Ok(parts) => parts,
            Err(e) => return error(400, &format!("Bad Request: can't parse multipart/form-data: {e}")),
        }
    } else {
        (params(uri.query(), &body), HashMap::new())
    };
    {
        let mut s = shared.inner.lock().expect("state");
        // Files are recorded by their name, type and size.
        let mut recorded = p.clone();
        for (name, f) in &files {
            recorded[name] = json!({"filename": f.filename, "contentType": f.content_type, "size": f.bytes.len()});
        }
        s.calls.push((method.clone(), recorded));
        if let Some((n, after)) = s.fail.get_mut(&method) {
            if *n > 0 {
                *n -= 1;
                let after = *after;
                return (
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    axum::Json(json!({"ok": false, "error_code": 429,
                        "description": format!("Too Many Requests: retry after {after}"),
                        "parameters": {"retry_after": after}})),
                )
                    .into_response();
            }
        }
    }
    let answer = answer(&shared, &method, &p, &files).await;
    // A held method: its effect stands, its answer waits (the connection may be gone by then).
    while shared.inner.lock().expect("state").held.contains(&method) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    answer
}

async fn answer(shared: &Arc<Shared>, method: &str, p: &Value, files: &HashMap<String, FilePart>) -> Response {
    match method {
        "getMe" => ok(json!({"id": BOT_ID, "is_bot": true, "first_name": "Pincer", "username": BOT_USERNAME,
            "can_join_groups": true, "can_read_all_group_messages": false, "supports_inline_queries": false})),
        "getUpdates" => {
            if shared.inner.lock().expect("state").webhook.is_some() {
                return error(
                    409,
                    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
                );
            }
            get_updates(shared, p).await
        }
        "setWebhook" => {
            let url = p["url"].as_str().unwrap_or("").to_owned();
            if !url.starts_with("http") {
                return error(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook");
            }
            let secret = p["secret_token"].as_str().unwrap_or("").to_owned();
            shared.inner.lock().expect("state").webhook = Some((url, secret));
            shared.arrived.notify_waiters();
            ok(json!(true))
        }
        "deleteWebhook" => {
            shared.inner.lock().expect("state").webhook = None;
            ok(json!(true))
        }
        "sendPhoto" => send_photo(shared, p, files),
        "sendMessage" => {
            let text = match check_text(p) {
                Ok(t) => t,
                Err(e) => return error(400, &e),
            };
            let Some(chat_id) = int(&p["chat_id"]) else { return error(400, "Bad Request: chat not found") };
            let mut s = shared.inner.lock().expect("state");
            let next = s.next_message.entry(chat_id).or_insert(1);
            let message_id = *next;
            *next += 1;
            s.sent.push(Sent { chat_id, message_id, texts: vec![text.clone()] });
            ok(json!({"message_id": message_id, "date": 1_765_000_000,
                "chat": {"id": chat_id, "type": if chat_id > 0 { "private" } else { "supergroup" }},
                "from": {"id": BOT_ID, "is_bot": true, "first_name": "Pincer", "username": BOT_USERNAME},
                "text": text}))
        }
        "editMessageText" => {
            let text = match check_text(p) {
                Ok(t) => t,
                Err(e) => return error(400, &e),
            };
            let (Some(chat_id), Some(message_id)) = (int(&p["chat_id"]), int(&p["message_id"])) else {
                return error(400, "Bad Request: message to edit not found");
            };
            let mut s = shared.inner.lock().expect("state");
            if s.photos.iter().any(|m| m.chat_id == chat_id && m.message_id == message_id) {
                return error(400, "Bad Request: there is no text in the message to edit");
            }
            let Some(m) = s.sent.iter_mut().find(|m| m.chat_id == chat_id && m.message_id == message_id) else {
                return error(400, "Bad Request: message to edit not found");
            };
            if m.text() == text {
                return error(
                    400,
                    "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
                );
            }
            m.texts.push(text.clone());
            ok(json!({"message_id": message_id, "chat": {"id": chat_id}, "text": text}))
        }
        "sendChatAction" => ok(json!(true)),
        "getFile" => {
            let id = p["file_id"].as_str().unwrap_or("").to_owned();
            let s = shared.inner.lock().expect("state");
            match s.files.get(&id) {
                Some(b) => ok(json!({"file_id": id, "file_unique_id": id, "file_size": b.len(),
                    "file_path": format!("photos/{id}.jpg")})),
                None => error(400, "Bad Request: invalid file_id"),
            }
        }
        _ => error(404, "Not Found"),
    }
}

/// The width and height of a PNG or JPEG (its header, or its first start-of-frame segment).
fn dimensions(b: &[u8]) -> Option<(u64, u64)> {
    let be = |x: &[u8]| x.iter().fold(0u64, |n, &d| n << 8 | u64::from(d));
    if b.starts_with(b"\x89PNG\r\n\x1a\n") && b.get(12..16) == Some(b"IHDR") {
        return Some((be(b.get(16..20)?), be(b.get(20..24)?)));
    }
    if b.starts_with(&[0xff, 0xd8]) {
        let mut i = 2;
        while i + 9 < b.len() && b[i] == 0xff {
            let marker = b[i + 1];
            let len = be(&b[i + 2..i + 4]) as usize;
            if matches!(marker, 0xc0..=0xc3 | 0xc5..=0xc7 | 0xc9..=0xcb | 0xcd..=0xcf) {
                return Some((be(&b[i + 7..i + 9]), be(&b[i + 5..i + 7])));
            }
            i += 2 + len;
        }
    }
    None
}

/// Whether `b` is an image Telegram can process as a photo.
fn is_image(b: &[u8]) -> bool {
    b.starts_with(b"\x89PNG\r\n\x1a\n")
        || b.starts_with(&[0xff, 0xd8, 0xff])
        || b.starts_with(b"GIF8")
        || (b.len() > 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP")
}

/// `sendPhoto`: the photo from an upload, a URL or a file id; the new message with its sizes.
fn send_photo(shared: &Arc<Shared>, p: &Value, files: &HashMap<String, FilePart>) -> Response {
    let Some(chat_id) = int(&p["chat_id"]) else { return error(400, "Bad Request: chat not found") };
    let caption = p["caption"].as_str().map(str::to_owned);
    if caption.as_ref().is_some_and(|c| c.encode_utf16().count() > 1024) {
        return error(400, "Bad Request: message caption is too long");
    }
    let upload = match p["photo"].as_str().and_then(|v| v.strip_prefix("attach://")) {
        Some(name) => files.get(name),
        None => files.get("photo"),
    };
    let mut s = shared.inner.lock().expect("state");
    let (source, dims, size) = match (upload, p["photo"].as_str()) {
        (Some(f), _) => {
            if f.bytes.is_empty() {
                return error(400, "Bad Request: file must be non-empty");
            }
            if f.bytes.len() > MAX_PHOTO {
                return error(413, "Request Entity Too Large");
            }
            if !is_image(&f.bytes) {
                return error(400, "Bad Request: IMAGE_PROCESS_FAILED");
            }
            let source = PhotoSource::Upload {
                bytes: f.bytes.clone(),
                filename: f.filename.clone(),
                content_type: f.content_type.clone(),
            };
            (source, dimensions(&f.bytes), f.bytes.len())
        }
        (None, Some(v)) if v.starts_with("https://") || v.starts_with("http://") => {
            if s.unreachable.contains(v) {
                return error(400, "Bad Request: failed to get HTTP URL content");
            }
            (PhotoSource::Url(v.to_owned()), None, 48_000)
        }
        (None, Some(v)) if !v.is_empty() => {
            let known = s.files.contains_key(v)
                || s.photos.iter().any(|ph| ph.chat_id.to_string() + "-" + &ph.message_id.to_string() == v);
            if !known {
                return error(400, "Bad Request: wrong file identifier/HTTP URL specified");
            }
            (PhotoSource::FileId(v.to_owned()), None, 48_000)
        }
        _ => return error(400, "Bad Request: there is no photo in the request"),
    };
    let next = s.next_message.entry(chat_id).or_insert(1);
    let message_id = *next;
    *next += 1;
    let (w, h) = dims.unwrap_or((800, 600));
    let file_id = format!("{chat_id}-{message_id}");
    // Telegram keeps the photo in a few sizes, the largest last.
    let mut sizes = Vec::new();
    for (k, side) in [(0, 90u64), (1, 320)] {
        let scale = side as f64 / w.max(h).max(1) as f64;
        if scale < 1.0 {
            sizes.push(json!({"file_id": format!("{file_id}-{k}"), "file_unique_id": format!("u{file_id}-{k}"),
                "width": ((w as f64 * scale).round() as u64).max(1), "height": ((h as f64 * scale).round() as u64).max(1),
                "file_size": ((size as f64) * scale * scale) as u64}));
        }
    }
    sizes.push(json!({"file_id": file_id, "file_unique_id": format!("u{file_id}"), "width": w, "height": h,
        "file_size": size}));
    s.photos.push(Photo { chat_id, message_id, source, caption: caption.clone() });
    let mut message = json!({"message_id": message_id, "date": 1_765_000_000,
        "chat": {"id": chat_id, "type": if chat_id > 0 { "private" } else { "supergroup" }},
        "from": {"id": BOT_ID, "is_bot": true, "first_name": "Pincer", "username": BOT_USERNAME},
        "photo": sizes});
    if let Some(c) = caption {
        message["caption"] = json!(c);
    }
    ok(message)
}

async fn get_updates(shared: &Arc<Shared>, p: &Value) -> Response {
    let offset = int(&p["offset"]);
    let timeout = int(&p["timeout"]).unwrap_or(0).clamp(0, 50) as u64;
    let limit = int(&p["limit"]).unwrap_or(100).clamp(1, 100) as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    {
        let mut s = shared.inner.lock().expect("state");
        s.offsets.push(offset);
        if let Some(o) = offset {
            // Confirmed: every update below the offset is gone for good.
            s.pending.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= o);
        }
    }
    loop {
        let arrived = shared.arrived.notified();
        {
            let s = shared.inner.lock().expect("state");
            if !s.pending.is_empty() {
                let mut list: Vec<Value> = s.pending.iter().take(limit).cloned().collect();
                list.sort_by_key(|u| u["update_id"].as_i64().unwrap_or(0));
                return ok(Value::Array(list));
            }
        }
        if tokio::time::timeout_at(deadline, arrived).await.is_err() {
            return ok(json!([]));
        }
    }
}

/// With a webhook set, POSTs the waiting updates there one at a time, oldest first; an update is
/// confirmed (dropped) when answered 200, and sent again otherwise.
async fn deliver_webhooks(shared: Arc<Shared>) {
    loop {
        let arrived = shared.arrived.notified();
        let next = {
            let s = shared.inner.lock().expect("state");
            match (&s.webhook, &s.webhook_target, s.pending.front()) {
                (Some((url, secret)), Some(target), Some(u)) => {
                    Some((url.clone(), target.clone(), secret.clone(), u.clone()))
                }
                _ => None,
            }
        };
        let Some((url, target, secret, update)) = next else {
            let _ = tokio::time::timeout(Duration::from_millis(200), arrived).await;
            continue;
        };
        let status = post_json(&url, &target, &secret, &update.to_string()).await.unwrap_or(0);
        {
            let mut s = shared.inner.lock().expect("state");
            s.webhook_statuses.push(status);
            if status == 200 {
                let id = update["update_id"].as_i64();
                if let Some(i) = s.pending.iter().position(|u| u["update_id"].as_i64() == id) {
                    s.pending.remove(i);
                }
            }
        }
        if status != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One HTTP/1.1 POST of a JSON body to `url`'s path at `target` (`host:port`); the status.
async fn post_json(url: &str, target: &str, secret: &str, body: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = url.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap_or_else(|| "/".into());
    let mut tcp = tokio::net::TcpStream::connect(target).await.ok()?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {target}\r\nContent-Type: application/json\r\n\
         X-Telegram-Bot-Api-Secret-Token: {secret}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), tcp.read_to_end(&mut answer)).await.ok()?.ok()?;
    let head = String::from_utf8_lossy(&answer);
    head.split_whitespace().nth(1)?.parse().ok()
}

async fn file(State(shared): State<Arc<Shared>>, Path((bot, path)): Path<(String, String)>) -> Response {
    if bot != format!("bot{TOKEN}") {
        return error(401, "Unauthorized");
    }
    let id = path.trim_start_matches("photos/").trim_end_matches(".jpg").to_owned();
    let s = shared.inner.lock().expect("state");
    match s.files.get(&id) {
        Some(b) => b.clone().into_response(),
        None => error(404, "Not Found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_bodies_are_parsed_into_fields_and_files() {
        let body = b"--xyz\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n\
--xyz\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\
\x89PNG\r\n--xy\r\n--xyz--\r\n";
        let (fields, files) = multipart("multipart/form-data; boundary=xyz", body).expect("parsed");
        assert_eq!(fields["chat_id"], "42");
        let f = &files["photo"];
        assert_eq!((f.filename.as_str(), f.content_type.as_str()), ("a.png", "image/png"));
        assert_eq!(f.bytes, b"\x89PNG\r\n--xy");
        assert!(multipart("multipart/form-data", body).is_err(), "no boundary");
        assert!(multipart("multipart/form-data; boundary=xyz", b"--xyz\r\nno end").is_err());
    }

    #[test]
    fn photo_dimensions_come_from_the_image() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&[0, 0, 2, 128, 0, 0, 1, 224]);
        assert_eq!(dimensions(&png), Some((640, 480)));
        let jpeg = [0xff, 0xd8, 0xff, 0xe0, 0, 4, 0, 0, 0xff, 0xc0, 0, 17, 8, 0, 100, 0, 200, 3];
        assert_eq!(dimensions(&jpeg), Some((200, 100)));
        assert_eq!(dimensions(b"nothing"), None);
    }

    #[test]
    fn markdown_v2_needs_reserved_characters_escaped() {
        assert!(markdown_v2_error("hello").is_none());
        assert!(markdown_v2_error("1\\.5 \\!").is_none());
        assert!(markdown_v2_error("*bold*").is_none());
        assert!(markdown_v2_error("1.5").is_some());
        assert!(markdown_v2_error("*open").is_some());
    }
}
