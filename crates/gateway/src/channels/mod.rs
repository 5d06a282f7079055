//! Messaging channels (Telegram, Matrix, …): the seam between a chat platform and the gateway's
//! one turn pipeline ([`crate::turn::start_turn`]), exactly once both ways.
//!
//! # The interface an adapter uses
//!
//! An adapter (`channels/telegram.rs`, `channels/matrix.rs`) owns the platform's protocol: it reads
//! messages (long polling, a sync loop, a webhook) and knows how to send and edit. Everything else
//! is here, shared:
//!
//! - **Config**: its section of `[channels.<name>]` is parsed by the adapter; the parts every
//!   channel has (`allow_from`, `agent`, `bindings`) are validated into a [`Policy`]
//!   ([`Policy::parse`]): who may talk to the agent (**nobody** by default) and which agent answers.
//! - **Registering and starting**: [`start`] (called by the server after the turn recovery was
//!   launched) starts each configured adapter; an adapter calls [`Registry::register`] with its
//!   [`Outbound`] (send/edit on the platform) once it knows its account (a bot id, a user id), which
//!   also reconciles its deliveries left over by the last process ([`reconcile`]).
//! - **Inbound**: the adapter turns a platform message into an [`Inbound`] and calls [`inbound`],
//!   after checking the sender against [`Policy::allows`] (a refused sender gets no turn and is
//!   logged: [`refused`]). [`inbound`] routes it ([`session_key`]: a direct message →
//!   `agent:<agentId>:<channel>:dm:<peer>`, a group → `agent:<agentId>:<channel>:group:<chat>`),
//!   labels the session for the WebChat and OpenClaw clients (`label`, OpenClaw's `origin`,
//!   `deliveryContext`, `chatType` in its `sessions.json` row), answers `/stop` itself, and starts a
//!   turn whose idempotency key ([`run_id`]) is made of the platform's message id, so the
//!   transcript's durable dedupe makes a redelivered message never a second turn. It returns once
//!   the turn is durable (its user row, or its queued record, is on disk): only then may the
//!   adapter advance its read position ([`load_cursor`] / [`save_cursor`]: a file written
//!   atomically through the store crate, or a row in PostgreSQL).
//! - **Outbound**: the reply of every channel turn is delivered by the seam's deliverer
//!   ([`deliver`]), from the transcript and the live run — never from the request — so a turn the
//!   gateway resumed after a crash, or ran from its queued record, is delivered too. Every send is
//!   recorded in a ledger of chained `custom` entries ([`DELIVERY`], outside the LLM context): an
//!   `intent` before the platform is asked, a `receipt` with the platform's message ids after it
//!   accepted. Streaming is one message sent when the run starts and edited as text arrives
//!   (throttled), so the final is an idempotent edit of a message whose id is on disk; only a
//!   message whose intent has no receipt (the process died while the platform was answering) is
//!   sent again, marked "(may be a duplicate)" when it carries reply text. Images the reply names
//!   (`MEDIA:` lines, [`media`]) follow its text on platforms that take them, each between an
//!   intent and a receipt of its own; the final receipt says how many follow, so a crash between
//!   them leaves the run undelivered until the rest is sent.
//! - **Status and metrics**: [`Registry::status`] (the `status` RPC's `channels`, `pincer channels
//!   status`) and the per-channel counters ([`Event`]: received, deduplicated, refused, sent,
//!   failed), also exported as `pincer_channel_messages_total{channel, event}`.

pub mod matrix;
pub mod media;
pub mod telegram;

use crate::board::{ChannelStats, Event};
use crate::durable::OnDisk;
use crate::protocol::RpcError;
use crate::sessions::{AgentId, SessionRef};
use crate::state::Engine;
use crate::turn::TurnRequest;
pub use pincer_engine::config::channels::{ChannelSettings, ChannelsSection, Policy};
use pincer_pi::lock;
use pincer_store::{NewEntry, TranscriptsExt};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `customType` of the delivery ledger's entries: `data` is `{runId, channel, chat, phase: "intent" |
/// "receipt", part: "first" | "final" | "media", messageIds?, at}`; a final receipt has `media: n`
/// when n images follow the text, and a `media` entry its `index` (an intent its `source`, a receipt
/// of an image that could not be sent `failed: why`). Chained in the session's transcript (so it is
/// as durable as the turn, on files and on PostgreSQL, and moves with the session), outside the LLM
/// context.
pub const DELIVERY: &str = "pincer.channel-delivery";

/// The session row's fields a channel sets (OpenClaw's names): where replies go.
pub const DELIVERY_CONTEXT: &str = "deliveryContext";
/// The session row's `origin` (OpenClaw's): `{label, provider, surface, chatType, from, to, accountId}`.
pub const ORIGIN: &str = "origin";

/// Longest a streamed reply waits between two edits of its message.
pub const EDIT_INTERVAL: Duration = Duration::from_millis(1000);
/// How often the deliverer looks at a run that is not this process's (or not yet, or no more).
const POLL: Duration = Duration::from_millis(200);
/// Longest [`inbound`] waits for its turn to be on disk before it gives up (the platform
/// redelivers the message later).
const DURABLE_WAIT: Duration = Duration::from_secs(60);
/// Longest a deliverer waits for a turn that is neither running nor answered (another replica's,
/// or one a restart will resume) before it leaves it to the next start's [`reconcile`].
const ORPHAN_WAIT: Duration = Duration::from_secs(120);
/// Bytes of a transcript's tail [`reconcile`] reads for undelivered channel turns.
const RECONCILE_TAIL: u64 = 1024 * 1024;
/// Bytes read after a turn's user row for its ledger.
const LEDGER_WINDOW: u64 = 64 * 1024 * 1024;
/// What a reply message shows before the first text streams in.
pub const PLACEHOLDER: &str = "…";
/// The mark on a message sent again after a crash left it unknown whether it was sent.
pub const MAYBE_DUPLICATE: &str = "(may be a duplicate)";

// ---------------------------------------------------------------------------------------------
// Routing

/// A direct conversation with one person, or a group/room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatKind {
    Direct,
    Group,
}

impl ChatKind {
    fn as_str(self) -> &'static str {
        match self {
            ChatKind::Direct => "direct",
            ChatKind::Group => "group",
        }
    }
}

/// Where a conversation's replies go: a platform, the account that answers, the chat (as the
/// platform spells it: session keys are folded to lowercase, this is not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub channel: String,
    pub account: String,
    pub chat: String,
}

/// A platform message, as an adapter hands it to [`inbound`].
#[derive(Debug, Clone)]
pub struct Inbound {
    /// The channel's name (`telegram`).
    pub channel: &'static str,
    /// The account that received it (a bot id).
    pub account: String,
    pub kind: ChatKind,
    /// The conversation (where the reply goes), as the platform spells it.
    pub chat: String,
    /// The sender's platform id.
    pub sender: String,
    /// How people know the sender (`@alice`), for the session's label.
    pub sender_name: Option<String>,
    /// The conversation's title (a group's name), for the session's label.
    pub chat_title: Option<String>,
    /// The platform's id of the message, unique within `chat`.
    pub message_id: String,
    pub text: String,
    /// Pi image blocks (`{"type":"image","data","mimeType"}`), already size-checked.
    pub images: Vec<Value>,
}

/// The session key of a conversation: `agent:<agent>:<channel>:dm:<peer>` or
/// `agent:<agent>:<channel>:group:<chat>`.
pub fn session_key(agent: &AgentId, channel: &str, kind: ChatKind, conversation: &str) -> String {
    let kind = match kind {
        ChatKind::Direct => "dm",
        ChatKind::Group => "group",
    };
    format!("agent:{}:{channel}:{kind}:{conversation}", agent.as_str())
}

/// The idempotency key (run id) of the turn of a platform message: `<prefix>-<account>-<chat>-<message>`
/// (at most [`crate::openclaw::chat::MAX_KEY_CHARS`]: longer ids are hashed).
pub fn run_id(prefix: &str, account: &str, chat: &str, message_id: &str) -> String {
    let id = format!("{prefix}-{account}-{chat}-{message_id}");
    if id.chars().count() <= 200 && !id.chars().any(char::is_control) {
        return id;
    }
    use sha2::Digest;
    let h = sha2::Sha256::digest(id.as_bytes());
    let hex: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{hex}")
}

// ---------------------------------------------------------------------------------------------
// Registry, status and metrics

/// Sends and edits messages on a platform: what an adapter gives the seam's deliverer.
pub trait Outbound: Send + Sync + 'static {
    /// The channel's name (`telegram`).
    fn channel(&self) -> &'static str;

    /// The account (as in [`Inbound::account`]).
    fn account(&self) -> String;

    /// `text` cut into the platform's message size, in order (never empty pieces).
    fn split(&self, text: &str) -> Vec<String>;

    /// Sends a new message; its platform id. `txn` is stable across attempts of the same message
    /// (a platform with transaction ids makes the resend idempotent with it).
    fn send<'a>(&'a self, to: &'a Address, text: &'a str, txn: &'a str) -> BoxFuture<'a, Result<String, SendError>>;

    /// Replaces the text of message `id` (an edit that changes nothing is a success).
    fn edit<'a>(
        &'a self,
        to: &'a Address,
        id: &'a str,
        text: &'a str,
        txn: &'a str,
    ) -> BoxFuture<'a, Result<(), SendError>>;

    /// Shows "typing…" (best effort; the default does nothing).
    fn typing<'a>(&'a self, _to: &'a Address) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The largest image the platform takes ([`Outbound::send_image`]). 0, the default: it takes
    /// none, and a reply's `MEDIA:` lines stay part of its text.
    fn max_image_bytes(&self) -> usize {
        0
    }

    /// Sends an image (with a caption, when there is one); its platform id. `txn` as for
    /// [`Outbound::send`].
    fn send_image<'a>(
        &'a self,
        _to: &'a Address,
        _image: &'a media::OutImage,
        _caption: Option<&'a str>,
        _txn: &'a str,
    ) -> BoxFuture<'a, Result<String, SendError>> {
        Box::pin(async { Err(SendError::Rejected("this channel sends no images".into())) })
    }
}

/// A channel's webhook: the platform POSTs its updates to `/api/channels/<name>/webhook` (served by
/// the gateway's port, behind the Host and body-type checks of every route, not the gateway token:
/// the adapter checks the platform's own secret).
pub trait Webhook: Send + Sync + 'static {
    /// One request (its headers and body): `Ok` answers 200 (the update is durable, or ignored);
    /// `Err((status, why))` answers that status (a platform retries a 5xx).
    fn receive<'a>(
        &'a self,
        headers: &'a axum::http::HeaderMap,
        body: &'a [u8],
    ) -> BoxFuture<'a, Result<(), (u16, String)>>;
}

/// A boxed future (adapters implement [`Outbound`] with `Box::pin(async move { … })`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a send or edit failed.
#[derive(Debug, Clone, PartialEq)]
pub enum SendError {
    /// The platform answered no: nothing was sent.
    Rejected(String),
    /// No answer (connection lost, timeout): it may or may not have been sent.
    Unknown(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Rejected(m) => write!(f, "refused: {m}"),
            SendError::Unknown(m) => write!(f, "unknown outcome: {m}"),
        }
    }
}

/// The gateway's channels: the engine they bring turns to, and the adapters' [`Outbound`]s,
/// webhooks and running deliveries (what each channel reports is the engine's
/// [`crate::board::Board`]).
pub struct Channels {
    pub gw: Arc<Engine>,
    outbound: Mutex<HashMap<&'static str, Arc<dyn Outbound>>>,
    /// Runs a deliverer of this process is delivering now.
    delivering: Mutex<HashSet<String>>,
    /// Runs of slash commands (answered whole: no message streams).
    commands: Mutex<HashSet<String>>,
    /// Webhooks by channel name.
    webhooks: Mutex<HashMap<&'static str, Arc<dyn Webhook>>>,
}

impl Channels {
    /// Registers an adapter's outbound side (once it knows its account) and delivers what its
    /// turns left undelivered ([`reconcile`]).
    pub fn register(self: &Arc<Self>, out: Arc<dyn Outbound>) {
        lock(&self.outbound).insert(out.channel(), out.clone());
        let ch = self.clone();
        tokio::spawn(async move { reconcile(&ch, out).await });
    }

    /// Serves `/api/channels/<name>/webhook` with `hook` from now on.
    pub fn register_webhook(&self, name: &'static str, hook: Arc<dyn Webhook>) {
        lock(&self.webhooks).insert(name, hook);
    }

    /// The webhook of channel `name`, when one is registered.
    pub fn webhook(&self, name: &str) -> Option<Arc<dyn Webhook>> {
        lock(&self.webhooks).get(name).cloned()
    }

    /// The outbound side of channel `name`, once registered.
    pub fn outbound(&self, name: &str) -> Option<Arc<dyn Outbound>> {
        lock(&self.outbound).get(name).cloned()
    }
}

/// Starts the configured channels (the server calls it once, after launching the turn recovery);
/// what the HTTP routes need of them (webhooks).
pub fn start(gw: &Arc<Engine>) -> Arc<Channels> {
    let ch = Arc::new(Channels {
        gw: gw.clone(),
        outbound: Mutex::default(),
        delivering: Mutex::default(),
        commands: Mutex::default(),
        webhooks: Mutex::default(),
    });
    if let Some(t) = gw.settings.channels.telegram.clone() {
        gw.channels.stats(telegram::NAME);
        telegram::start(&ch, t);
    }
    if let Some(m) = gw.settings.channels.matrix.clone() {
        gw.channels.stats(matrix::NAME);
        matrix::start(&ch, m);
    }
    ch
}

/// With PostgreSQL replicas, waits until this replica holds the lease of channel account `name`
/// (one replica polls an account at a time; a survivor takes over when the holder dies): the held
/// lease, to keep while polling. `None` (at once) on the JSONL store, where the state directory's
/// lock already makes the gateway the only one; `Err` when the gateway stops meanwhile.
pub async fn lease(ch: &Arc<Channels>, stats: &ChannelStats, name: &str) -> Result<Option<pincer_store::Held>, ()> {
    let gw = &ch.gw;
    let Some(pg) = &gw.pg else { return Ok(None) };
    let mut logged = false;
    loop {
        match pg.try_lease(name).await {
            Ok(Some(held)) => {
                // The turns a dead holder left unanswered are claimed by a survivor once its
                // heartbeat is stale; a message read before that would start a turn ahead of them
                // (and leave them behind, unanswered). So new messages wait until that is done.
                let settle = crate::relay::STALE_AFTER + crate::relay::HEARTBEAT * 3;
                tracing::info!(lease = name, "took the channel lease; polling once dead replicas' turns are claimed");
                tokio::select! {
                    _ = tokio::time::sleep(settle) => {}
                    _ = gw.shutdown.cancelled() => return Err(()),
                }
                return Ok(Some(held));
            }
            Ok(None) => {
                if !logged {
                    tracing::info!(lease = name, "another replica polls this channel account; standing by");
                    logged = true;
                }
                stats.set_state("standby (another replica polls)");
            }
            Err(e) => {
                tracing::warn!(lease = name, "cannot take the channel lease: {e}");
                stats.set_state(format!("error: lease: {e}"));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = gw.shutdown.cancelled() => return Err(()),
        }
    }
}

/// A message from a sender not on the allowlist: no turn; logged (without its text) and counted.
pub fn refused(gw: &Engine, channel: &'static str, sender: &str, sender_name: Option<&str>, chat: &str) {
    tracing::warn!(
        channel,
        sender,
        sender_name = sender_name.unwrap_or(""),
        chat,
        "a message from a sender not on allow_from was ignored (no turn); add the sender to [channels.{channel}] allow_from to let them talk to the agent"
    );
    gw.channels.count(channel, Event::Refused);
}

// ---------------------------------------------------------------------------------------------
// Inbound

/// What became of an inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Accepted {
    /// A new turn, durable now (its user row or queued record is on disk).
    Turn { session_key: String, run_id: String },
    /// The message was a turn already (redelivered): nothing new.
    Duplicate { session_key: String, run_id: String },
    /// A command answered without a turn (`/stop`).
    Command { session_key: String, reply: String },
}

/// Makes a platform message a turn (see the module docs). `Err`: nothing durable happened (the
/// adapter must not advance its read position; the platform will redeliver it).
pub async fn inbound(ch: &Arc<Channels>, policy: &Policy, msg: Inbound) -> Result<Accepted, RpcError> {
    let gw = &ch.gw;
    let mut ids: Vec<&str> = vec![msg.chat.as_str(), msg.sender.as_str()];
    if let Some(n) = &msg.sender_name {
        ids.push(n.as_str());
    }
    let agent = policy.agent_for(&ids).clone();
    let conversation = match msg.kind {
        ChatKind::Direct => &msg.sender,
        ChatKind::Group => &msg.chat,
    };
    let key = session_key(&agent, msg.channel, msg.kind, conversation);
    let session = gw.session(&key, true).await?.ok_or_else(|| RpcError::invalid("session not found"))?;
    let session = label(ch, session, &msg).await?;
    let stats = gw.channels.stats(msg.channel);
    if msg.images.is_empty() && crate::commands::is_stop(&msg.text) {
        let ids = crate::abort::abort(gw, &session.key, None, "stop-command").await?;
        stats.count(msg.channel, Event::Received);
        let reply = if ids.is_empty() { "Nothing is running." } else { "Stopped." };
        return Ok(Accepted::Command { session_key: session.key, reply: reply.into() });
    }
    let run = run_id(msg.channel, &msg.account, &msg.chat, &msg.message_id);
    let request = TurnRequest {
        session: session.clone(),
        run_id: run.clone(),
        text: msg.text.clone(),
        images: msg.images.clone(),
        regenerate: None,
        expected_leaf: None,
        graft: None,
        model: None,
        conn_id: 0,
    };
    let (ack, acked) = tokio::sync::oneshot::channel();
    let _ = ack.send(());
    let answer = crate::turn::start_turn(gw, request, acked).await?.answer;
    if answer.status != crate::protocol::RunStatus::Started {
        stats.count(msg.channel, Event::Deduplicated);
        let status = answer.status.as_str();
        tracing::info!(channel = msg.channel, session = %session.key, run = %run, status, "a redelivered message: no second turn");
        spawn_delivery(ch, &session.key, &run);
        return Ok(Accepted::Duplicate { session_key: session.key, run_id: run });
    }
    stats.count(msg.channel, Event::Received);
    if msg.images.is_empty() && crate::commands::slash_command(&msg.text).is_some() {
        lock(&ch.commands).insert(run.clone());
    }
    spawn_delivery(ch, &session.key, &run);
    wait_durable(ch, &session, &run).await?;
    Ok(Accepted::Turn { session_key: session.key, run_id: run })
}

/// Sets the session row's label (unless someone named it), `origin`, `deliveryContext` and
/// `chatType` when they differ from what the message says.
async fn label(ch: &Arc<Channels>, session: SessionRef, msg: &Inbound) -> Result<SessionRef, RpcError> {
    let gw = &ch.gw;
    let who = msg.sender_name.clone().unwrap_or_else(|| msg.sender.clone());
    let shown = match (msg.kind, &msg.chat_title) {
        (ChatKind::Group, Some(t)) => format!("{} · {t}", msg.channel),
        (ChatKind::Group, None) => format!("{} · group {}", msg.channel, msg.chat),
        (ChatKind::Direct, _) => format!("{} · {who}", msg.channel),
    };
    let delivery = json!({"channel": msg.channel, "to": msg.chat, "accountId": msg.account});
    let origin = json!({"label": shown, "provider": msg.channel, "surface": msg.channel,
        "chatType": msg.kind.as_str(), "from": format!("{}:{}", msg.channel, msg.sender),
        "to": format!("{}:{}", msg.channel, msg.chat), "accountId": msg.account});
    let mut fields = Map::new();
    if session.entry.get(DELIVERY_CONTEXT) != Some(&delivery) {
        fields.insert(DELIVERY_CONTEXT.into(), delivery);
    }
    if session.entry.get(ORIGIN) != Some(&origin) {
        fields.insert(ORIGIN.into(), origin);
        fields.insert("chatType".into(), json!(msg.kind.as_str()));
    }
    if !session.entry.contains_key("label") {
        fields.insert("label".into(), json!(shown));
    }
    if fields.is_empty() {
        return Ok(session);
    }
    let key = session.key.clone();
    Ok(gw.index(move |s| s.patch(&key, &fields)).await?)
}

/// Waits until turn `run_id` is durable: its rows are on disk, or its queued record is, or it ended
/// (refused before writing anything: nothing will be).
async fn wait_durable(ch: &Arc<Channels>, session: &SessionRef, run_id: &str) -> Result<(), RpcError> {
    let gw = &ch.gw;
    let deadline = Instant::now() + DURABLE_WAIT;
    loop {
        let live = gw.run(run_id).is_some();
        if !crate::durable::known_new(gw.store.as_ref(), &session.path, run_id) || !live {
            let (store, path, id) = (gw.store.clone(), session.path.clone(), run_id.to_owned());
            let written = tokio::task::spawn_blocking(move || -> Result<bool, pincer_store::StoreError> {
                if crate::durable::on_disk(store.as_ref(), &path, &id, usize::MAX)? != OnDisk::New {
                    return Ok(true);
                }
                let tail = store.tail_entries(&path, 256 * 1024)?;
                Ok(tail.iter().any(|e| custom_run(e, crate::durable::QUEUED) == Some(id.as_str())))
            })
            .await
            .map_err(|e| RpcError::unavailable(format!("transcript check failed: {e}")))?
            .map_err(|e| RpcError::unavailable(format!("cannot read the transcript: {e}")))?;
            if written || !live {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(RpcError::unavailable(format!("turn {run_id} was not written within {DURABLE_WAIT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `data.runId` of a custom entry of this type.
fn custom_run<'a>(e: &'a Value, custom_type: &str) -> Option<&'a str> {
    if e.get("type")?.as_str()? != "custom" || e.get("customType")?.as_str()? != custom_type {
        return None;
    }
    e.get("data")?.get("runId")?.as_str()
}

// ---------------------------------------------------------------------------------------------
// Cursors

/// The stored read position of a channel account (a Telegram update offset, a Matrix sync token),
/// `None` before the first one was saved.
pub async fn load_cursor(ch: &Arc<Channels>, channel: &str, account: &str) -> Result<Option<String>, String> {
    let gw = &ch.gw;
    let name = cursor_name(channel, account);
    if let Some(pg) = &gw.pg {
        return pg.channel_cursor(name).await.map_err(|e| format!("cannot read the channel cursor: {e}"));
    }
    let path = cursor_path(gw, &name);
    tokio::task::spawn_blocking(move || match std::fs::read_to_string(&path) {
        Ok(text) => {
            let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(v.get("cursor").and_then(Value::as_str).map(str::to_owned))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    })
    .await
    .map_err(|e| format!("cursor task failed: {e}"))?
}

/// Saves the read position (durably: fsynced before it returns). Call it only once every message
/// before the position is durable ([`inbound`] returned).
pub async fn save_cursor(ch: &Arc<Channels>, channel: &str, account: &str, cursor: &str) -> Result<(), String> {
    let gw = &ch.gw;
    let name = cursor_name(channel, account);
    if let Some(pg) = &gw.pg {
        return pg
            .set_channel_cursor(name, cursor.to_owned())
            .await
            .map_err(|e| format!("cannot save the channel cursor: {e}"));
    }
    let path = cursor_path(gw, &name);
    let bytes = serde_json::to_vec(&json!({"cursor": cursor, "at": pincer_pi::now_ms()})).unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        // The store crate owns every file write (temp, fsync, rename, directory fsync, 0600).
        pincer_store::files::write_channel_state(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))
    })
    .await
    .map_err(|e| format!("cursor task failed: {e}"))?
}

fn cursor_name(channel: &str, account: &str) -> String {
    let safe: String =
        account.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    format!("{channel}-{safe}")
}

fn cursor_path(gw: &Engine, name: &str) -> std::path::PathBuf {
    gw.settings.state_dir.join("channels").join(format!("{name}.json"))
}

// ---------------------------------------------------------------------------------------------
// The delivery ledger

/// What the ledger of one run says.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Ledger {
    /// The first message's intent is on disk.
    pub first_intent: bool,
    /// The first message's receipt: its platform id.
    pub first: Option<String>,
    /// The final's intent is on disk (how many attempts).
    pub final_intents: usize,
    /// The final's receipt is on disk: the reply's text is delivered.
    pub final_sent: bool,
    /// How many images follow the text (the final receipt's `media`).
    pub media: usize,
    /// Image index → how many intents were written for it.
    pub media_intents: BTreeMap<usize, usize>,
    /// Images settled: sent (a receipt with the platform's id), or given up (a receipt saying why).
    pub media_done: BTreeSet<usize>,
    /// The gateway gave the turn up (a `pincer.turn-interrupted` marker): it gets no reply.
    pub interrupted: bool,
}

impl Ledger {
    /// The reply is delivered: its text, and every image after it.
    pub fn delivered(&self) -> bool {
        self.final_sent && (0..self.media).all(|i| self.media_done.contains(&i))
    }

    /// Takes in one of the run's [`DELIVERY`] entries.
    fn apply(&mut self, e: &Value) {
        let d = &e["data"];
        let index = d["index"].as_u64().map(|i| i as usize);
        match (d["phase"].as_str(), d["part"].as_str()) {
            (Some("intent"), Some("first")) => self.first_intent = true,
            (Some("receipt"), Some("first")) => {
                self.first = d["messageIds"].get(0).and_then(Value::as_str).map(str::to_owned);
            }
            (Some("intent"), Some("final")) => self.final_intents += 1,
            (Some("receipt"), Some("final")) => {
                self.final_sent = true;
                self.media = d["media"].as_u64().unwrap_or(0) as usize;
            }
            (Some("intent"), Some("media")) => {
                if let Some(i) = index {
                    *self.media_intents.entry(i).or_default() += 1;
                }
            }
            (Some("receipt"), Some("media")) => {
                if let Some(i) = index {
                    self.media_done.insert(i);
                }
            }
            _ => {}
        }
    }
}

/// Reads the ledger of run `run_id` from the session's transcript (blocking).
pub fn read_ledger(
    store: &dyn pincer_store::Transcripts,
    path: &std::path::Path,
    run_id: &str,
) -> Result<Ledger, pincer_store::StoreError> {
    let entries = match store.find_keyed(path, &crate::durable::user_key(run_id))? {
        Some((_, offset)) => store.entries_from(path, offset, LEDGER_WINDOW)?,
        None => store.tail_entries(path, RECONCILE_TAIL)?,
    };
    let mut l = Ledger::default();
    for e in &entries {
        if custom_run(e, crate::durable::INTERRUPTED) == Some(run_id) {
            l.interrupted = true;
        }
        if custom_run(e, DELIVERY) == Some(run_id) {
            l.apply(e);
        }
    }
    Ok(l)
}

/// A ledger entry of run `run_id`.
fn ledger_entry(run_id: &str, to: &Address, phase: &str, part: &str, ids: &[String]) -> NewEntry {
    ledger_entry_with(run_id, to, phase, part, ids, Map::new())
}

/// A ledger entry of run `run_id` with more fields in its `data`.
fn ledger_entry_with(
    run_id: &str,
    to: &Address,
    phase: &str,
    part: &str,
    ids: &[String],
    more: Map<String, Value>,
) -> NewEntry {
    let mut data = json!({"runId": run_id, "channel": to.channel, "chat": to.chat, "phase": phase, "part": part,
        "at": pincer_pi::now_ms()});
    if phase == "receipt" {
        data["messageIds"] = json!(ids);
    }
    if let Some(d) = data.as_object_mut() {
        d.extend(more);
    }
    let mut payload = Map::new();
    payload.insert("customType".into(), json!(DELIVERY));
    payload.insert("data".into(), data);
    NewEntry::of("custom", payload)
}

// ---------------------------------------------------------------------------------------------
// Outbound

/// Starts delivering run `run_id` of session `key` unless this process delivers it already.
pub fn spawn_delivery(ch: &Arc<Channels>, key: &str, run_id: &str) {
    if !lock(&ch.delivering).insert(run_id.to_owned()) {
        return;
    }
    let (ch, key, run) = (ch.clone(), key.to_owned(), run_id.to_owned());
    tokio::spawn(async move {
        if let Err(e) = deliver(&ch, &key, &run).await {
            tracing::warn!(session = %key, run = %run, "channel delivery stopped: {e}");
        }
        lock(&ch.delivering).remove(&run);
    });
}

/// Where a session's replies go: its row's `deliveryContext`.
fn address(s: &SessionRef) -> Option<Address> {
    let d = s.entry.get(DELIVERY_CONTEXT)?;
    Some(Address {
        channel: d.get("channel")?.as_str()?.to_owned(),
        chat: d.get("to")?.as_str()?.to_owned(),
        account: d.get("accountId").and_then(Value::as_str).unwrap_or_default().to_owned(),
    })
}

/// The turn's final text from the transcript: the last reply's text (an error or an abort said so);
/// `None` while it has no reply.
fn final_text(gw: &Engine, s: &SessionRef, run_id: &str) -> Result<Option<String>, pincer_store::StoreError> {
    let replies = crate::durable::replies(gw.store.as_ref(), &s.path, run_id)?;
    let Some(last) = replies.last() else { return Ok(None) };
    let text: String = replies
        .iter()
        .flat_map(|m| pincer_pi::text_blocks(m.get("content")))
        .filter(|t| !t.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    let text = match last.get("stopReason").and_then(Value::as_str) {
        Some("error") => {
            let why = last.get("errorMessage").and_then(Value::as_str).unwrap_or("the model call failed");
            if text.is_empty() {
                format!("⚠️ {why}")
            } else {
                format!("{text}\n\n⚠️ {why}")
            }
        }
        Some("aborted") => format!("{text} (stopped)").trim().to_owned(),
        _ if last.get("openclawAbort").is_some() => format!("{text} (stopped)").trim().to_owned(),
        _ => text,
    };
    Ok(Some(if text.trim().is_empty() { "(no reply)".into() } else { text }))
}

/// Delivers run `run_id`'s reply to the session's conversation, exactly once (see the module docs):
/// a first message sent when the run starts, edits while it streams, the final as an edit of it
/// (plus more messages when it is longer than one), each send between an intent and a receipt.
pub async fn deliver(ch: &Arc<Channels>, key: &str, run_id: &str) -> Result<(), String> {
    let gw = &ch.gw;
    gw.recovered().await;
    // A slash command's answer comes whole (and `/new` writes it to the next transcript): no
    // message to stream into.
    let told = lock(&ch.commands).remove(run_id);
    let command = told
        || match gw.session(key, false).await {
            Ok(Some(s)) => {
                let (store, path, k) = (gw.store.clone(), s.path.clone(), crate::durable::user_key(run_id));
                let user = tokio::task::spawn_blocking(move || store.find_keyed(&path, &k)).await;
                let text = match &user {
                    Ok(Ok(Some((e, _)))) => pincer_pi::text_blocks(e["message"].get("content")).join("\n"),
                    _ => String::new(),
                };
                crate::commands::slash_command(&text).is_some()
            }
            _ => false,
        };
    let mut orphan_since: Option<Instant> = None;
    let mut last_edit: Option<(Instant, String)> = None;
    loop {
        if gw.shutdown.is_cancelled() {
            return Ok(());
        }
        let s = gw.session(key, false).await.map_err(|e| e.to_string())?.ok_or("the session is gone")?;
        let to = address(&s).ok_or("the session has no deliveryContext")?;
        let out = match ch.outbound(&to.channel) {
            Some(o) => o,
            None => {
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        let (store, path, id) = (gw.store.clone(), s.path.clone(), run_id.to_owned());
        let ledger = tokio::task::spawn_blocking(move || read_ledger(store.as_ref(), &path, &id))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if ledger.delivered() {
            return Ok(());
        }
        if ledger.final_sent {
            // The text went out; a crash came before every image after it was settled.
            let text = reply_text(ch, &s, run_id).await?;
            let (_, sources) = media_of(out.as_ref(), &text);
            return send_media(ch, &s, out.as_ref(), &to, run_id, &ledger, &sources).await;
        }
        // The text streamed so far, when the run runs in this process.
        let live = gw.run(run_id).map(|r| r.streamed());
        let state = {
            let (store, path, id) = (gw.store.clone(), s.path.clone(), run_id.to_owned());
            let attempts = gw.settings.resume_attempts;
            tokio::task::spawn_blocking(move || crate::durable::on_disk(store.as_ref(), &path, &id, attempts))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?
        };
        match (&state, &live) {
            (OnDisk::Done(_), _) if live.is_none() => {
                let text = reply_text(ch, &s, run_id).await?;
                return send_final(ch, &s, out.as_ref(), &to, run_id, &ledger, &text).await;
            }
            // Given up for good (marked so), or left unanswered while the session went on past it
            // for longer than any replica takes to resume a turn. (With replicas, a turn another
            // replica writes may look moved past for a moment: this replica's leaf can lag.)
            (OnDisk::Interrupted, None)
                if ledger.interrupted || orphan_since.is_some_and(|t| t.elapsed() > ORPHAN_WAIT) =>
            {
                let text = "⚠️ This reply was not finished (stopped, or cut by a restart); send the message again.";
                return send_final(ch, &s, out.as_ref(), &to, run_id, &ledger, text).await;
            }
            // A command is answered whole; a turn waiting behind another one of its session gets
            // its message when it starts (its ledger then follows its user row).
            (_, Some(_)) if command => orphan_since = None,
            (OnDisk::New, Some(_)) => orphan_since = None,
            (_, Some(text)) => {
                orphan_since = None;
                // The run is here: its message first, then edits as it streams.
                let first = match &ledger.first {
                    Some(id) => id.clone(),
                    None => send_first(ch, &s, out.as_ref(), &to, run_id, &ledger).await?,
                };
                // `MEDIA:` lines are not for the eye (they become images once the reply is whole).
                let text = if out.max_image_bytes() > 0 { media::visible(text) } else { text.clone() };
                let shown = out.split(&text).into_iter().next().unwrap_or_else(|| PLACEHOLDER.to_owned());
                let due = last_edit.as_ref().is_none_or(|(at, t)| at.elapsed() >= EDIT_INTERVAL && *t != shown);
                if !text.trim().is_empty() && due {
                    match out.edit(&to, &first, &shown, &format!("{run_id}.edit")).await {
                        Ok(()) => gw.channels.count(out.channel(), Event::Sent),
                        Err(e) => {
                            gw.channels.count(out.channel(), Event::Failed);
                            tracing::debug!(run = %run_id, "a streaming edit failed: {e}");
                        }
                    }
                    last_edit = Some((Instant::now(), shown));
                }
            }
            _ => {
                // Not running here and not answered: waiting behind another turn of its session,
                // running on another replica, or left for a restart to resume.
                if !gw.runs_of(&s.key).is_empty() {
                    orphan_since = None;
                }
                let since = *orphan_since.get_or_insert_with(Instant::now);
                if since.elapsed() > ORPHAN_WAIT && state != OnDisk::Interrupted {
                    return Err(format!(
                        "turn {run_id} is neither running here nor answered; the next start delivers it"
                    ));
                }
            }
        }
        let next_edit = last_edit.as_ref().map(|(at, _)| *at + EDIT_INTERVAL);
        wait_for_run(gw, run_id, next_edit).await;
    }
}

/// Waits before [`deliver`] looks again: for a run of this process, until it ends (or its handle
/// goes) or, while it streams, until its next edit is due (`next_edit`); for any other, [`POLL`].
async fn wait_for_run(gw: &Engine, run_id: &str, next_edit: Option<Instant>) {
    let Some(mut progress) = gw.run(run_id).map(|r| r.progress.subscribe()) else {
        tokio::time::sleep(POLL).await;
        return;
    };
    if progress.borrow().end.is_some() {
        // Over: its handle is let go of right after; the transcript has its reply by then.
        let _ = tokio::time::timeout(POLL, async { while progress.changed().await.is_ok() {} }).await;
        return;
    }
    let due = next_edit.unwrap_or_else(|| Instant::now() + POLL).max(Instant::now() + POLL);
    let ended = async {
        // Deltas wake it too; only the end (or the run's handle going) ends the wait.
        while progress.borrow_and_update().end.is_none() {
            if progress.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = ended => {}
        _ = tokio::time::sleep_until(due.into()) => {}
    }
}

/// Sends the first message of a run's reply (the placeholder edits stream into), between an intent
/// and a receipt; its platform id.
async fn send_first(
    ch: &Arc<Channels>,
    s: &SessionRef,
    out: &dyn Outbound,
    to: &Address,
    run_id: &str,
    ledger: &Ledger,
) -> Result<String, String> {
    let gw = &ch.gw;
    if ledger.first_intent {
        // The last process died between asking the platform and recording its answer: a placeholder
        // may be there already; this one replaces it for the reply (the other stays a bare "…").
        tracing::warn!(run = %run_id, "a reply's first message may have been sent before a crash; sending it again");
    }
    gw.append(s, ledger_entry(run_id, to, "intent", "first", &[])).await.map_err(|e| e.to_string())?;
    out.typing(to).await;
    let id = send_retrying(ch, out, to, PLACEHOLDER, &format!("{run_id}.first")).await?;
    gw.append(s, ledger_entry(run_id, to, "receipt", "first", std::slice::from_ref(&id)))
        .await
        .map_err(|e| e.to_string())?;
    Ok(id)
}

/// The turn's final text from the transcript (its last reply's, or what says it has none).
async fn reply_text(ch: &Arc<Channels>, s: &SessionRef, run_id: &str) -> Result<String, String> {
    let gw = &ch.gw;
    let (gw, s, id) = (gw.clone(), s.clone(), run_id.to_owned());
    let text = tokio::task::spawn_blocking(move || final_text(&gw, &s, &id))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(text.unwrap_or_else(|| "(no reply)".into()))
}

/// A reply's text without its `MEDIA:` lines and the images they name, on a platform that takes
/// images; the text as it is (and none) elsewhere.
fn media_of(out: &dyn Outbound, text: &str) -> (String, Vec<String>) {
    if out.max_image_bytes() == 0 {
        return (text.to_owned(), Vec::new());
    }
    let (text, mut sources) = media::split_directives(text);
    if sources.len() > media::MAX_IMAGES {
        tracing::warn!(
            channel = out.channel(),
            named = sources.len(),
            "a reply names more than {} images; the rest are not sent",
            media::MAX_IMAGES
        );
        sources.truncate(media::MAX_IMAGES);
    }
    (text, sources)
}

/// Sends `text` as the final reply: an edit of the first message (when there is one) and new
/// messages for the rest, between an intent and a receipt; then the images it names.
async fn send_final(
    ch: &Arc<Channels>,
    s: &SessionRef,
    out: &dyn Outbound,
    to: &Address,
    run_id: &str,
    ledger: &Ledger,
    text: &str,
) -> Result<(), String> {
    let gw = &ch.gw;
    let (text, sources) = media_of(out, text);
    let mut pieces = out.split(&text);
    if pieces.is_empty() {
        pieces.push(match sources.len() {
            0 => "(no reply)".into(),
            1 => "(an image follows)".into(),
            n => format!("({n} images follow)"),
        });
    }
    let uncertain = ledger.final_intents > 0;
    gw.append(s, ledger_entry(run_id, to, "intent", "final", &[])).await.map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let txn = format!("{run_id}.final.{i}");
        if let (0, Some(first)) = (i, &ledger.first) {
            // An edit: idempotent, whatever the last process managed.
            edit_retrying(ch, out, to, first, piece, &txn).await?;
            ids.push(first.clone());
            continue;
        }
        let piece = if uncertain { format!("{MAYBE_DUPLICATE} {piece}") } else { piece.clone() };
        let piece = out.split(&piece).into_iter().next().unwrap_or(piece);
        ids.push(send_retrying(ch, out, to, &piece, &txn).await?);
    }
    let mut more = Map::new();
    if !sources.is_empty() {
        more.insert("media".into(), json!(sources.len()));
    }
    gw.append(s, ledger_entry_with(run_id, to, "receipt", "final", &ids, more)).await.map_err(|e| e.to_string())?;
    tracing::info!(channel = out.channel(), session = %s.key, run = %run_id, messages = ids.len(), "reply delivered");
    let ledger = Ledger { final_sent: true, media: sources.len(), ..Ledger::default() };
    send_media(ch, s, out, to, run_id, &ledger, &sources).await
}

/// Sends the images a reply names, after its text, in order: each between an intent and a receipt.
/// An image that cannot be sent (refused or missing, too large, not an image, refused by the
/// platform) is logged and gets a receipt saying why, so it is not tried again. One whose intent
/// has no receipt (a crash while the platform was answering) is sent again captioned "(may be a
/// duplicate)": the platform cannot say whether it got it.
async fn send_media(
    ch: &Arc<Channels>,
    s: &SessionRef,
    out: &dyn Outbound,
    to: &Address,
    run_id: &str,
    ledger: &Ledger,
    sources: &[String],
) -> Result<(), String> {
    let gw = &ch.gw;
    let workspace = gw.settings.agents.get(&s.agent_id).workspace.clone();
    let channel = out.channel();
    let fail = |i: usize, source: &str, why: String| {
        tracing::warn!(channel, session = %s.key, run = %run_id, image = source, "a reply's image was not sent: {why}");
        gw.channels.count(channel, Event::Failed);
        let mut more = Map::new();
        more.insert("index".into(), json!(i));
        more.insert("failed".into(), json!(why));
        ledger_entry_with(run_id, to, "receipt", "media", &[], more)
    };
    let mut sent = 0;
    for i in (0..ledger.media).filter(|i| !ledger.media_done.contains(i)) {
        let Some(source) = sources.get(i) else {
            let entry = fail(i, "", "the reply no longer names it".into());
            gw.append(s, entry).await.map_err(|e| e.to_string())?;
            continue;
        };
        let loaded = match media::source(source) {
            Ok(src) => media::load(&workspace, &src, out.max_image_bytes()).await,
            Err(why) => Err(why),
        };
        let image = match loaded {
            Ok(image) => image,
            Err(why) => {
                gw.append(s, fail(i, source, why)).await.map_err(|e| e.to_string())?;
                continue;
            }
        };
        let uncertain = ledger.media_intents.get(&i).is_some_and(|&n| n > 0);
        if uncertain {
            tracing::warn!(channel, run = %run_id, image = %source, "a reply's image may have been sent before a crash; sending it again, marked");
        }
        let mut more = Map::new();
        more.insert("index".into(), json!(i));
        more.insert("source".into(), json!(source));
        gw.append(s, ledger_entry_with(run_id, to, "intent", "media", &[], more)).await.map_err(|e| e.to_string())?;
        let caption = uncertain.then_some(MAYBE_DUPLICATE);
        let txn = format!("{run_id}.media.{i}");
        match retrying(ch, out, || out.send_image(to, &image, caption, &txn)).await {
            Ok(id) => {
                let mut more = Map::new();
                more.insert("index".into(), json!(i));
                gw.append(s, ledger_entry_with(run_id, to, "receipt", "media", &[id], more))
                    .await
                    .map_err(|e| e.to_string())?;
                sent += 1;
            }
            // Only a restart, with the intent on disk, may send it again (marked).
            Err(SendError::Unknown(e)) => return Err(format!("cannot send an image to {channel} {}: {e}", to.chat)),
            Err(SendError::Rejected(e)) => {
                let entry = fail(i, source, format!("{channel} refused it: {e}"));
                gw.append(s, entry).await.map_err(|e| e.to_string())?;
            }
        }
    }
    if sent > 0 {
        tracing::info!(channel, session = %s.key, run = %run_id, images = sent, "a reply's images delivered");
    }
    Ok(())
}

/// Attempts before a send is given up (the platform refused it each time).
const SEND_ATTEMPTS: usize = 5;

async fn send_retrying(
    ch: &Arc<Channels>,
    out: &dyn Outbound,
    to: &Address,
    text: &str,
    txn: &str,
) -> Result<String, String> {
    retrying(ch, out, || out.send(to, text, txn))
        .await
        .map_err(|e| format!("cannot send to {} {}: {e}", to.channel, to.chat))
}

/// Makes a send (`send` makes each attempt): a refusal is retried a few times; an unknown outcome
/// is not (only a restart, with its intent on disk, may send again, marked). The last error.
async fn retrying<'a>(
    ch: &Arc<Channels>,
    out: &dyn Outbound,
    send: impl Fn() -> BoxFuture<'a, Result<String, SendError>>,
) -> Result<String, SendError> {
    let gw = &ch.gw;
    let mut wait = Duration::from_millis(500);
    let mut attempt = 1;
    loop {
        match send().await {
            Ok(id) => {
                gw.channels.count(out.channel(), Event::Sent);
                return Ok(id);
            }
            Err(e) => {
                gw.channels.count(out.channel(), Event::Failed);
                if matches!(e, SendError::Unknown(_)) || attempt >= SEND_ATTEMPTS || gw.shutdown.is_cancelled() {
                    return Err(e);
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
                attempt += 1;
            }
        }
    }
}

async fn edit_retrying(
    ch: &Arc<Channels>,
    out: &dyn Outbound,
    to: &Address,
    id: &str,
    text: &str,
    txn: &str,
) -> Result<(), String> {
    let gw = &ch.gw;
    let mut wait = Duration::from_millis(500);
    for attempt in 1.. {
        match out.edit(to, id, text, txn).await {
            Ok(()) => {
                gw.channels.count(out.channel(), Event::Sent);
                return Ok(());
            }
            Err(e) => {
                gw.channels.count(out.channel(), Event::Failed);
                // An edit is idempotent: an unknown outcome is retried too.
                if attempt >= SEND_ATTEMPTS || gw.shutdown.is_cancelled() {
                    return Err(format!("cannot edit message {id} in {} {}: {e}", to.channel, to.chat));
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
        }
    }
    Err("unreachable".into())
}

/// At an adapter's registration: every turn of its sessions whose reply is not delivered (no final
/// receipt, or images after it not settled; in the transcripts' tails) gets a deliverer — replies finished while the last process was dying,
/// turns the recovery resumed or runs from their queued records.
pub async fn reconcile(ch: &Arc<Channels>, out: Arc<dyn Outbound>) {
    let gw = &ch.gw;
    gw.recovered().await;
    let channel = out.channel();
    let prefix = format!("{channel}-{}-", out.account());
    let list = {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || gw.sessions.list(None)).await
    };
    let Ok(Ok(sessions)) = list else {
        tracing::warn!(channel, "cannot list the sessions to reconcile deliveries");
        return;
    };
    let mut pending = 0;
    for s in sessions {
        if address(&s).is_none_or(|a| a.channel != channel) {
            continue;
        }
        let (store, path, prefix2) = (gw.store.clone(), s.path.clone(), prefix.clone());
        let found = tokio::task::spawn_blocking(move || undelivered(store.as_ref(), &path, &prefix2)).await;
        let runs = match found {
            Ok(Ok(r)) => r,
            _ => {
                tracing::warn!(channel, session = %s.key, "cannot read a transcript to reconcile deliveries");
                continue;
            }
        };
        for run in runs {
            pending += 1;
            spawn_delivery(ch, &s.key, &run);
        }
    }
    if pending > 0 {
        tracing::warn!(channel, pending, "delivering replies the last process had not delivered");
    }
}

/// The runs of this channel account in a transcript's tail (user rows, queued records, gateway
/// replies) whose reply is not delivered ([`Ledger::delivered`]).
fn undelivered(
    store: &dyn pincer_store::Transcripts,
    path: &std::path::Path,
    prefix: &str,
) -> Result<Vec<String>, pincer_store::StoreError> {
    let tail = store.tail_entries(path, RECONCILE_TAIL)?;
    let mut runs: Vec<String> = Vec::new();
    let mut ledgers: HashMap<String, Ledger> = HashMap::new();
    for e in &tail {
        let key = e.get("message").and_then(|m| m.get("idempotencyKey")).and_then(Value::as_str);
        let run = key
            .and_then(|k| crate::durable::run_of_user_key(k).or_else(|| crate::durable::run_of_reply_key(k)))
            .or_else(|| custom_run(e, crate::durable::QUEUED));
        if let Some(r) = run.filter(|r| r.starts_with(prefix)) {
            if !runs.iter().any(|x| x == r) {
                runs.push(r.to_owned());
            }
        }
        if let Some(r) = custom_run(e, DELIVERY) {
            ledgers.entry(r.to_owned()).or_default().apply(e);
        }
    }
    Ok(runs.into_iter().filter(|r| !ledgers.get(r).is_some_and(Ledger::delivered)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversations_route_to_their_session_keys_and_bound_agents() {
        let bindings = BTreeMap::from([("-100".to_owned(), "ops".to_owned())]);
        let p = Policy::parse("[channels.x]", &[], Some("main"), &bindings).expect("policy");
        assert_eq!(p.agent_for(&["-100", "5"]).as_str(), "ops");
        assert_eq!(p.agent_for(&["5"]).as_str(), "main");
        assert_eq!(session_key(p.agent_for(&["5"]), "telegram", ChatKind::Direct, "5"), "agent:main:telegram:dm:5");
        assert_eq!(
            session_key(p.agent_for(&["-100"]), "telegram", ChatKind::Group, "-100"),
            "agent:ops:telegram:group:-100"
        );
        assert_eq!(run_id("telegram", "9", "-100", "7"), "telegram-9--100-7");
        assert!(run_id("m", "a", &"x".repeat(300), "1").len() < 100);
    }

    #[test]
    fn a_reply_is_delivered_once_its_text_and_every_image_after_it_are_settled() {
        let to = Address { channel: "telegram".into(), account: "9".into(), chat: "5".into() };
        let entry = |phase: &str, part: &str, ids: &[&str], more: Value| {
            let ids: Vec<String> = ids.iter().map(|i| (*i).to_owned()).collect();
            let more = more.as_object().cloned().unwrap_or_default();
            let e = ledger_entry_with("r", &to, phase, part, &ids, more);
            json!({"type": "custom", "customType": DELIVERY, "data": e.payload["data"].clone()})
        };
        let mut l = Ledger::default();
        for e in [
            entry("intent", "first", &[], json!({})),
            entry("receipt", "first", &["10"], json!({})),
            entry("intent", "final", &[], json!({})),
            entry("receipt", "final", &["10"], json!({"media": 2})),
            entry("intent", "media", &[], json!({"index": 0, "source": "a.png"})),
        ] {
            l.apply(&e);
        }
        assert_eq!((l.first.as_deref(), l.final_sent, l.media), (Some("10"), true, 2));
        assert!(!l.delivered(), "the images are not settled");
        assert_eq!(l.media_intents.get(&0), Some(&1), "the first one's fate is unknown");
        l.apply(&entry("receipt", "media", &["11"], json!({"index": 0})));
        l.apply(&entry("receipt", "media", &[], json!({"index": 1, "failed": "not an image"})));
        assert!(l.delivered(), "sent or given up, each settled");
        // A final receipt from before images existed: the text alone.
        let mut old = Ledger::default();
        old.apply(&entry("receipt", "final", &["10"], json!({})));
        assert!(old.delivered());
    }
}
