//! The Telegram channel: a bot on the Bot API (long polling with `getUpdates`), its messages made
//! turns through the channel seam ([`super::inbound`]) and its replies sent as `sendMessage` and
//! streamed as throttled `editMessageText` of that message ([`super::Outbound`]). Images a reply
//! names ([`super::media`]) follow as `sendPhoto`: a workspace file uploaded as
//! `multipart/form-data`, an `https://` URL handed to Telegram to fetch.
//!
//! Replies are sent as plain text (no `parse_mode`): the model's Markdown reaches the user as
//! typed, and no reply can be refused for a malformed entity or cut in the middle of one at the
//! 4096-character limit (MarkdownV2 needs every one of `_*[]()~\`>#+-=|{}.!` escaped outside
//! entities, and a model's text is not valid MarkdownV2).
//!
//! The bot token is in every Bot API URL: URLs are never logged, and errors of the HTTP client are
//! stripped of theirs.

use super::media::OutImage;
use super::{Accepted, Address, BoxFuture, Channels, ChatKind, Event, Inbound, Outbound, SendError};
use crate::state::Engine;
use base64::Engine as _;
pub use pincer_engine::config::channels::{
    TelegramSection, TelegramSettings, TELEGRAM_DEFAULT_API as DEFAULT_API, TELEGRAM_TOKEN_ENV as DEFAULT_TOKEN_ENV,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The channel's name (session keys, metrics, `deliveryContext.channel`).
pub const NAME: &str = "telegram";
/// Longest text of one message, in UTF-16 code units (as Telegram counts).
pub const MAX_MESSAGE: usize = 4096;

/// Longest wait a 429's `retry_after` is honoured for (a longer one is waited in these steps).
const MAX_RETRY_AFTER: u64 = 300;
/// Largest image taken from a message (Pi's and `chat.send`'s limit).
const MAX_IMAGE: usize = crate::openclaw::chat::MAX_ATTACHMENT_BYTES;
/// Largest photo the Bot API takes as an upload (`sendPhoto`: "The photo must be at most 10 MB").
pub const MAX_PHOTO: usize = 10 * 1024 * 1024;
/// Longest caption of a photo, in UTF-16 code units.
const MAX_CAPTION: usize = 1024;

/// The body of a Bot API call.
enum Body<'a> {
    Json(&'a Value),
    /// `multipart/form-data`: its content type (with the boundary) and bytes.
    Form(String, axum::body::Bytes),
}

/// The bot: its Bot API client and identity.
pub struct Bot {
    http: reqwest::Client,
    api: String,
    token: String,
    /// The bot's user id (from `getMe`).
    pub id: i64,
    /// Its `@username`, without the `@` (mentions in groups).
    pub username: String,
    gw: std::sync::Weak<Engine>,
}

/// A Bot API call that failed.
#[derive(Debug, Clone)]
pub enum CallError {
    /// Telegram answered `ok: false` (not a 429: those are waited out and retried).
    Api { code: i64, description: String },
    /// No usable answer (connection, timeout, not JSON): the call may or may not have taken effect.
    Transport(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Api { code, description } => write!(f, "Telegram answered {code}: {description}"),
            CallError::Transport(m) => write!(f, "{m}"),
        }
    }
}

impl Bot {
    /// A client of the Bot API at `api` with `token` (not yet asked who it is: [`Bot::get_me`]).
    pub fn new(gw: &Arc<Engine>, api: &str, token: &str) -> Result<Bot, String> {
        pincer_agent::provider::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("cannot build the Telegram HTTP client: {}", e.without_url()))?;
        Ok(Bot {
            http,
            api: api.to_owned(),
            token: token.to_owned(),
            id: 0,
            username: String::new(),
            gw: Arc::downgrade(gw),
        })
    }

    /// Calls Bot API method `method` with a JSON body; a 429 is waited out (`retry_after`) and the
    /// call made again. The URL (which holds the token) is never part of an error.
    pub async fn call(&self, method: &str, body: &Value, timeout: Duration) -> Result<Value, CallError> {
        self.call_with(method, Body::Json(body), timeout).await
    }

    async fn call_with(&self, method: &str, body: Body<'_>, timeout: Duration) -> Result<Value, CallError> {
        let url = format!("{}/bot{}/{method}", self.api, self.token);
        loop {
            let req = match &body {
                Body::Json(v) => self.http.post(&url).json(v),
                Body::Form(content_type, bytes) => self
                    .http
                    .post(&url)
                    .header(reqwest::header::CONTENT_TYPE, content_type.as_str())
                    .body(bytes.clone()),
            };
            let sent = req.timeout(timeout).send().await;
            let resp = sent.map_err(|e| CallError::Transport(format!("{method}: {}", e.without_url())))?;
            let answer: Value = resp
                .json()
                .await
                .map_err(|e| CallError::Transport(format!("{method}: the answer is not JSON: {}", e.without_url())))?;
            if answer["ok"] == json!(true) {
                return Ok(answer["result"].clone());
            }
            let code = answer["error_code"].as_i64().unwrap_or(0);
            let description = answer["description"].as_str().unwrap_or("no description").to_owned();
            if code == 429 {
                let after = answer["parameters"]["retry_after"].as_u64().unwrap_or(1).clamp(1, MAX_RETRY_AFTER);
                if let Some(gw) = self.gw.upgrade() {
                    gw.channels.count(NAME, Event::Failed);
                    if gw.shutdown.is_cancelled() {
                        return Err(CallError::Api { code, description });
                    }
                }
                tracing::warn!(method, retry_after = after, "Telegram asked to slow down (429); waiting");
                tokio::time::sleep(Duration::from_secs(after)).await;
                continue;
            }
            return Err(CallError::Api { code, description });
        }
    }

    /// `getMe`: fills in the bot's id and username.
    pub async fn get_me(&mut self) -> Result<(), CallError> {
        let me = self.call("getMe", &json!({}), Duration::from_secs(30)).await?;
        self.id = me["id"].as_i64().ok_or_else(|| CallError::Transport("getMe: no id in the answer".into()))?;
        self.username = me["username"].as_str().unwrap_or_default().to_owned();
        Ok(())
    }

    /// Downloads a file by its `file_id` (`getFile`, then the file URL), at most `max` bytes.
    async fn download(&self, file_id: &str, max: usize) -> Result<Vec<u8>, String> {
        let f = self
            .call("getFile", &json!({"file_id": file_id}), Duration::from_secs(30))
            .await
            .map_err(|e| e.to_string())?;
        if f["file_size"].as_u64().is_some_and(|n| n as usize > max) {
            return Err(format!("the file is larger than {max} bytes"));
        }
        let path = f["file_path"].as_str().ok_or("getFile gave no file_path")?;
        let url = format!("{}/file/bot{}/{path}", self.api, self.token);
        let resp = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| format!("cannot download the file: {}", e.without_url()))?;
        if !resp.status().is_success() {
            return Err(format!("cannot download the file: HTTP {}", resp.status()));
        }
        let bytes = resp.bytes().await.map_err(|e| format!("cannot download the file: {}", e.without_url()))?;
        if bytes.len() > max {
            return Err(format!("the file is larger than {max} bytes"));
        }
        Ok(bytes.to_vec())
    }
}

/// `sendPhoto`'s `multipart/form-data` body uploading `bytes`: its content type and bytes.
fn photo_form(chat: &str, bytes: &[u8], mime: &str, name: &str, caption: Option<&str>) -> (String, Vec<u8>) {
    let boundary = format!("pincer-{}", uuid::Uuid::new_v4().simple());
    let mut body = Vec::with_capacity(bytes.len() + 512);
    let mut field = |name: &str, value: &str| {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    };
    field("chat_id", chat);
    if let Some(c) = caption {
        field("caption", c);
    }
    // The name is the file's, kept to characters that need no quoting.
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"{name}\"\r\nContent-Type: {mime}\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A chat id as the Bot API takes it: a number, or `@channelusername`.
fn chat_id(chat: &str) -> Value {
    chat.parse::<i64>().map_or_else(|_| json!(chat), |n| json!(n))
}

/// Cuts `text` into pieces of at most [`MAX_MESSAGE`] UTF-16 code units, at a line break or a space
/// when there is one in the second half of a piece.
pub fn split(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text.trim_end();
    while !rest.is_empty() {
        let mut units = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            if units + c.len_utf16() > MAX_MESSAGE {
                end = i;
                break;
            }
            units += c.len_utf16();
        }
        if end < rest.len() {
            let head = &rest[..end];
            let cut = head.rfind('\n').or_else(|| head.rfind(' ')).filter(|&i| i > end / 2);
            if let Some(i) = cut {
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

impl Outbound for Bot {
    fn channel(&self) -> &'static str {
        NAME
    }

    fn account(&self) -> String {
        self.id.to_string()
    }

    fn split(&self, text: &str) -> Vec<String> {
        split(text)
    }

    fn send<'a>(&'a self, to: &'a Address, text: &'a str, _txn: &'a str) -> BoxFuture<'a, Result<String, SendError>> {
        Box::pin(async move {
            let body = json!({"chat_id": chat_id(&to.chat), "text": text});
            match self.call("sendMessage", &body, Duration::from_secs(30)).await {
                Ok(m) => m["message_id"]
                    .as_i64()
                    .map(|id| id.to_string())
                    .ok_or_else(|| SendError::Unknown("sendMessage: no message_id in the answer".into())),
                Err(CallError::Api { code, description }) => Err(SendError::Rejected(format!("{code}: {description}"))),
                Err(CallError::Transport(m)) => Err(SendError::Unknown(m)),
            }
        })
    }

    fn edit<'a>(
        &'a self,
        to: &'a Address,
        id: &'a str,
        text: &'a str,
        _txn: &'a str,
    ) -> BoxFuture<'a, Result<(), SendError>> {
        Box::pin(async move {
            let message_id = id.parse::<i64>().map_err(|_| SendError::Rejected(format!("bad message id {id}")))?;
            let body = json!({"chat_id": chat_id(&to.chat), "message_id": message_id, "text": text});
            match self.call("editMessageText", &body, Duration::from_secs(30)).await {
                Ok(_) => Ok(()),
                // The text is there already (an edit made before a crash, or a repeated one).
                Err(CallError::Api { description, .. }) if description.contains("message is not modified") => Ok(()),
                Err(CallError::Api { code, description }) => Err(SendError::Rejected(format!("{code}: {description}"))),
                Err(CallError::Transport(m)) => Err(SendError::Unknown(m)),
            }
        })
    }

    fn typing<'a>(&'a self, to: &'a Address) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let body = json!({"chat_id": chat_id(&to.chat), "action": "typing"});
            let _ = self.call("sendChatAction", &body, Duration::from_secs(10)).await;
        })
    }

    fn max_image_bytes(&self) -> usize {
        MAX_PHOTO
    }

    fn send_image<'a>(
        &'a self,
        to: &'a Address,
        image: &'a OutImage,
        caption: Option<&'a str>,
        _txn: &'a str,
    ) -> BoxFuture<'a, Result<String, SendError>> {
        Box::pin(async move {
            let caption = caption.filter(|c| c.encode_utf16().count() <= MAX_CAPTION);
            let answer = match image {
                OutImage::Url(url) => {
                    let mut body = json!({"chat_id": chat_id(&to.chat), "photo": url});
                    if let Some(c) = caption {
                        body["caption"] = json!(c);
                    }
                    self.call("sendPhoto", &body, Duration::from_secs(60)).await
                }
                OutImage::Upload { bytes, mime, name } => {
                    let (content_type, form) = photo_form(&to.chat, bytes, mime, name, caption);
                    self.call_with("sendPhoto", Body::Form(content_type, form.into()), Duration::from_secs(120)).await
                }
            };
            match answer {
                Ok(m) => m["message_id"]
                    .as_i64()
                    .map(|id| id.to_string())
                    .ok_or_else(|| SendError::Unknown("sendPhoto: no message_id in the answer".into())),
                Err(CallError::Api { code, description }) => Err(SendError::Rejected(format!("{code}: {description}"))),
                Err(CallError::Transport(m)) => Err(SendError::Unknown(m)),
            }
        })
    }
}

/// Starts the bot (long polling) in the background.
pub fn start(ch: &Arc<Channels>, settings: TelegramSettings) {
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

async fn run(ch: Arc<Channels>, settings: TelegramSettings) {
    let gw = ch.gw.clone();
    let stats = gw.channels.stats(NAME);
    let mut bot = match Bot::new(&gw, &settings.api_base_url, &settings.token) {
        Ok(b) => b,
        Err(e) => {
            stats.set_state(format!("error: {e}"));
            tracing::error!("telegram: {e}");
            return;
        }
    };
    let mut wait = Duration::from_secs(1);
    while let Err(e) = bot.get_me().await {
        stats.set_state(format!("error: getMe: {e}"));
        tracing::warn!("telegram: cannot reach the Bot API ({e}); trying again in {wait:?}");
        if !pause(&gw, wait).await {
            return;
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
    stats.set_account(format!("@{} ({})", bot.username, bot.id));
    // With replicas, one polls (and delivers) at a time; the others stand by.
    let Ok(_lease) = super::lease(&ch, &stats, &format!("{NAME}:{}", bot.id)).await else { return };
    tracing::info!(bot = %bot.username, id = bot.id, "telegram: polling for messages");
    let bot = Arc::new(bot);
    ch.register(bot.clone());
    if let Some((url, secret)) = settings.webhook.clone() {
        webhook(&ch, &bot, &settings, &url, secret).await;
        return;
    }
    // A webhook left set (by an earlier config) makes getUpdates fail: polling mode removes it.
    let _ = bot.call("deleteWebhook", &json!({"drop_pending_updates": false}), Duration::from_secs(30)).await;
    let account = bot.id.to_string();
    let mut offset: Option<i64> = match super::load_cursor(&ch, NAME, &account).await {
        Ok(c) => c.and_then(|c| c.parse().ok()),
        Err(e) => {
            tracing::warn!("telegram: {e}; starting from Telegram's unconfirmed updates");
            None
        }
    };
    stats.set_state("running");
    let mut wait = Duration::from_secs(1);
    loop {
        if gw.shutdown.is_cancelled() {
            return;
        }
        let mut body = json!({"timeout": settings.poll_timeout.as_secs(), "allowed_updates": ["message"]});
        if let Some(o) = offset {
            body["offset"] = json!(o);
        }
        let polled = tokio::select! {
            r = bot.call("getUpdates", &body, settings.poll_timeout + Duration::from_secs(15)) => r,
            _ = gw.shutdown.cancelled() => return,
        };
        let updates = match polled {
            Ok(Value::Array(u)) => u,
            Ok(_) => Vec::new(),
            Err(e) => {
                stats.count(NAME, Event::Failed);
                stats.set_state(format!("error: getUpdates: {e}"));
                tracing::warn!("telegram: getUpdates failed ({e}); trying again in {wait:?}");
                if !pause(&gw, wait).await {
                    return;
                }
                wait = (wait * 2).min(Duration::from_secs(60));
                continue;
            }
        };
        wait = Duration::from_secs(1);
        stats.set_state("running");
        let mut next = offset;
        for u in &updates {
            let Some(id) = u["update_id"].as_i64() else { continue };
            if let Err(e) = handle(&ch, &bot, &settings, u).await {
                // Not durable: this update and the ones after it come again with the next poll.
                tracing::warn!(update = id, "telegram: a message could not be taken in ({e}); it will be read again");
                let _ = pause(&gw, Duration::from_secs(1)).await;
                break;
            }
            next = Some(id + 1);
        }
        if next != offset {
            if let Some(n) = next {
                // Saved before the next getUpdates confirms it to Telegram.
                if let Err(e) = super::save_cursor(&ch, NAME, &account, &n.to_string()).await {
                    tracing::warn!("telegram: {e}");
                }
            }
            offset = next;
        }
    }
}

/// Webhook mode: `setWebhook` (tried until Telegram takes it), then updates come to
/// [`TelegramHook`] until the gateway stops (the lease is held meanwhile). Telegram sends an update
/// again until it is answered 200, which it is once the update is durable.
async fn webhook(ch: &Arc<Channels>, bot: &Arc<Bot>, settings: &TelegramSettings, url: &str, secret: String) {
    let gw = &ch.gw;
    let stats = gw.channels.stats(NAME);
    ch.register_webhook(
        NAME,
        Arc::new(TelegramHook {
            ch: Arc::downgrade(ch),
            bot: bot.clone(),
            settings: settings.clone(),
            secret: secret.clone(),
        }),
    );
    let body = json!({"url": url, "secret_token": secret, "allowed_updates": ["message"]});
    let mut wait = Duration::from_secs(1);
    while let Err(e) = bot.call("setWebhook", &body, Duration::from_secs(30)).await {
        stats.set_state(format!("error: setWebhook: {e}"));
        tracing::warn!("telegram: setWebhook failed ({e}); trying again in {wait:?}");
        if !pause(gw, wait).await {
            return;
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
    stats.set_state("running (webhook)");
    tracing::info!("telegram: receiving updates by webhook");
    gw.shutdown.cancelled().await;
}

/// The webhook's receiving end.
struct TelegramHook {
    ch: std::sync::Weak<Channels>,
    bot: Arc<Bot>,
    settings: TelegramSettings,
    secret: String,
}

/// Equal, in a time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl super::Webhook for TelegramHook {
    fn receive<'a>(
        &'a self,
        headers: &'a axum::http::HeaderMap,
        body: &'a [u8],
    ) -> BoxFuture<'a, Result<(), (u16, String)>> {
        Box::pin(async move {
            let given = headers.get("x-telegram-bot-api-secret-token").map(|v| v.as_bytes()).unwrap_or_default();
            if !same_secret(given, self.secret.as_bytes()) {
                tracing::warn!("telegram: a webhook request without the right secret token was refused");
                return Err((401, "wrong or missing X-Telegram-Bot-Api-Secret-Token".into()));
            }
            let update: Value =
                serde_json::from_slice(body).map_err(|e| (400, format!("the update is not JSON: {e}")))?;
            let ch = self.ch.upgrade().ok_or((503, "the gateway is stopping".to_owned()))?;
            handle(&ch, &self.bot, &self.settings, &update).await.map_err(|e| {
                tracing::warn!("telegram: a webhook update could not be taken in ({e}); Telegram sends it again");
                (500, e)
            })
        })
    }
}

/// One update: a message from an allowed sender (in a group: one that mentions or answers the bot)
/// becomes a turn; `Err` when it could not be made durable (it is read again).
async fn handle(ch: &Arc<Channels>, bot: &Arc<Bot>, settings: &TelegramSettings, u: &Value) -> Result<(), String> {
    let gw = &ch.gw;
    let Some(msg) = u.get("message") else { return Ok(()) };
    let from = &msg["from"];
    if from["is_bot"] == json!(true) {
        return Ok(());
    }
    let (Some(chat), Some(sender), Some(message_id)) =
        (msg["chat"]["id"].as_i64(), from["id"].as_i64(), msg["message_id"].as_i64())
    else {
        return Ok(());
    };
    let (chat, sender) = (chat.to_string(), sender.to_string());
    let username = from["username"].as_str().map(|u| format!("@{u}"));
    let kind = match msg["chat"]["type"].as_str() {
        Some("private") => ChatKind::Direct,
        Some("group" | "supergroup") => ChatKind::Group,
        _ => return Ok(()), // channels' posts are not conversations with the bot
    };
    let mut ids: Vec<&str> = vec![sender.as_str()];
    if let Some(n) = &username {
        ids.push(n.as_str());
    }
    if !settings.policy.allows(&ids) {
        super::refused(gw, NAME, &sender, username.as_deref(), &chat);
        return Ok(());
    }
    let mut text = msg["text"].as_str().or_else(|| msg["caption"].as_str()).unwrap_or_default().to_owned();
    let mention = format!("@{}", bot.username);
    if kind == ChatKind::Group && settings.require_mention {
        let mentioned = !bot.username.is_empty() && text.to_lowercase().contains(&mention.to_lowercase());
        let replied = msg["reply_to_message"]["from"]["id"].as_i64() == Some(bot.id);
        if !mentioned && !replied {
            return Ok(()); // group chatter not for the bot
        }
    }
    if !bot.username.is_empty() {
        // `/new@bot` is `/new`; "@bot hello" is "hello".
        text = remove_ignoring_case(&text, &mention).trim().to_owned();
    }
    let mut images = Vec::new();
    if let Some(photos) = msg["photo"].as_array() {
        // The largest size that fits.
        let best = photos
            .iter()
            .filter(|p| p["file_size"].as_u64().is_none_or(|n| n as usize <= MAX_IMAGE))
            .max_by_key(|p| p["width"].as_u64().unwrap_or(0) * p["height"].as_u64().unwrap_or(0));
        match best.and_then(|p| p["file_id"].as_str()) {
            Some(file_id) => match bot.download(file_id, MAX_IMAGE).await {
                Ok(bytes) => images
                    .push(json!({"type": "image", "mimeType": super::media::sniff(&bytes).unwrap_or("image/jpeg"),
                    "data": base64::engine::general_purpose::STANDARD.encode(&bytes)})),
                Err(e) => tracing::warn!(chat = %chat, "telegram: an image was left out: {e}"),
            },
            None => tracing::warn!(chat = %chat, "telegram: an image larger than {MAX_IMAGE} bytes was left out"),
        }
    }
    if text.trim().is_empty() && images.is_empty() {
        return Ok(());
    }
    let inbound = Inbound {
        channel: NAME,
        account: bot.id.to_string(),
        kind,
        chat: chat.clone(),
        sender,
        sender_name: username,
        chat_title: msg["chat"]["title"].as_str().map(str::to_owned),
        message_id: message_id.to_string(),
        text: crate::openclaw::chat::sanitize_message(&text).map_err(|e| e.message)?,
        images,
    };
    match super::inbound(ch, &settings.policy, inbound).await.map_err(|e| e.message)? {
        Accepted::Command { reply, .. } => {
            let to = Address { channel: NAME.into(), account: bot.id.to_string(), chat };
            if let Err(e) = bot.send(&to, &reply, "").await {
                tracing::warn!("telegram: cannot answer a command: {e}");
            }
        }
        Accepted::Turn { .. } | Accepted::Duplicate { .. } => {}
    }
    Ok(())
}

/// `text` without any occurrence of `needle` (ASCII case ignored).
fn remove_ignoring_case(text: &str, needle: &str) -> String {
    if needle.is_empty() {
        return text.to_owned();
    }
    let lower = text.to_ascii_lowercase();
    let n = needle.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(i) = lower[at..].find(&n) {
        out.push_str(&text[at..at + i]);
        at += i + n.len();
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_cut_at_4096_utf16_units_at_a_line_break() {
        assert!(split("").is_empty());
        assert_eq!(split("hi"), vec!["hi"]);
        let long = format!("{}\n{}", "a".repeat(3000), "b".repeat(3000));
        assert_eq!(split(&long), vec!["a".repeat(3000), "b".repeat(3000)]);
        // Astral characters count twice.
        let emoji = "😀".repeat(3000);
        let parts = split(&emoji);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= MAX_MESSAGE), "{:?}", parts.len());
        assert_eq!(parts.concat(), emoji);
    }

    #[test]
    fn mentions_are_removed_whatever_their_case() {
        assert_eq!(remove_ignoring_case("/new@PincerBot", "@pincerbot"), "/new");
        assert_eq!(remove_ignoring_case("@pincerbot hi @PincerBot", "@pincerbot"), " hi ");
    }
}
