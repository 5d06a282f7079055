//! One turn, from admission to its last event: [`start_turn`] dedupes its key (in memory, then
//! against the transcript), checks its branch point, registers the run (recording a message that
//! must wait behind another turn), and acks; then — in the session's queue, in order — the
//! [`Turn`] writes the user row through the store *before* the run starts, announces the very
//! entry written, runs the agent, streams `chat` deltas (throttled to one per 150 ms, flushed
//! before tools and the final) and the persisted final. Aborts persist the partial exactly once;
//! slash commands are answered without a model; a context overflow compacts and retries.

use crate::announce::{publish_agent_event, publish_session_message, with_meta, WithMeta};
use crate::commands::slash_command;
use crate::durable::OnDisk;
use crate::error::EngineError;
use crate::hook::{self, Decision};
use crate::protocol::{
    AgentUpdate, ChatEvent, ChatFailure, ChatState, ChatStatus, ErrorKind, Retry, RunAnswer, RunEnded, RunStatus,
    StatusPhase,
};
use crate::sessions::SessionRef;
use crate::state::{injected_message, Dedupe, Engine, RunHandle, TurnOutcome, MAX_QUEUED_PER_SESSION};
use pincer_agent::{start_run, RunEvent, RunRequest, SinkError, TranscriptSink};
use pincer_pi::now_ms;
use pincer_store::NewEntry;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Deltas go out at most this often per run.
const DELTA_INTERVAL: Duration = Duration::from_millis(150);

/// Longest a run waits for its client to have read its ack before it starts anyway (a client
/// that does not answer pings).
const ACK_WAIT: Duration = Duration::from_secs(1);

/// A validated turn, as `chat.send` and the OpenAI-compatible endpoint ask for one.
pub struct TurnRequest {
    pub session: SessionRef,
    /// The idempotency key (the run id).
    pub run_id: String,
    pub text: String,
    /// Pi image blocks.
    pub images: Vec<Value>,
    /// A user row to answer again (no new user row).
    pub regenerate: Option<String>,
    /// OpenClaw's guard: the turn is refused unless the leaf is this.
    pub expected_leaf: Option<Option<String>>,
    /// A stateless client's turn: where it joins the tree and what comes before its user row.
    pub graft: Option<Graft>,
    /// The model of this turn instead of the session's (`provider/model`).
    pub model: Option<String>,
    /// The connection that asked (0: none).
    pub conn_id: u64,
}

/// How a stateless client's turn (the OpenAI endpoint) joins the session's tree. Applied in the
/// session's queue, after the hook and before the user row, so nothing can slip in between.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graft {
    /// The entry the client's history ends at (`Some(None)`: before the first entry); `None`:
    /// wherever the leaf is.
    pub at: Option<Option<String>>,
    /// The leaf when the match was made, if the client's history ended on the active branch: the
    /// turn continues there without a leaf move while the leaf has not moved since.
    pub leaf_seen: Option<String>,
    /// A new system prompt for the session (`Some(None)`: back to the configured one).
    pub system_prompt: Option<Option<String>>,
    /// Pi messages the client sent that the tree lacks, written (chained) before the user row.
    pub prelude: Vec<Value>,
    /// The request ends with the results of client tools (the last of `prelude`): no user row, the
    /// run goes on from them.
    pub continues: bool,
    /// Tools the client runs itself, offered to the model beside the agent's
    /// ([`pincer_agent::RunRequest::client_tools`]).
    pub client_tools: Vec<pincer_agent::ToolSpec>,
}

/// `customType` of the entry recording a session's new system prompt (`data.systemPrompt`, `null`
/// for the configured one); the session row keeps the current one as [`SYSTEM_PROMPT_FIELD`].
pub const SYSTEM_PROMPT_CHANGE: &str = "pincer.system-prompt";

pub const SYSTEM_PROMPT_FIELD: &str = "pincerSystemPrompt";

/// What starting a turn gives its caller: the answer for its client, and the run when the turn
/// runs in this process (started by this call, or already running under the same key), whose
/// `progress` carries what it streams and, at its end, its typed [`TurnOutcome`]. A turn answered
/// from before (its key's result kept, or its reply on disk) has no run.
pub struct TurnHandle {
    pub answer: RunAnswer,
    pub run: Option<Arc<RunHandle>>,
}

impl TurnHandle {
    /// How the run ended, once it has (`None` without a run here).
    pub async fn outcome(&self) -> Option<TurnOutcome> {
        let mut progress = self.run.as_ref()?.progress.subscribe();
        let ended = progress.wait_for(|p| p.end.is_some()).await.ok()?;
        ended.end.clone()
    }
}

/// Dedupes a turn (in memory, then from the transcript), registers it in its session's queue and
/// runs it once `acked` fires: the one turn pipeline of the gateway.
pub async fn start_turn(
    gw: &Arc<Engine>,
    request: TurnRequest,
    acked: tokio::sync::oneshot::Receiver<()>,
) -> Result<TurnHandle, EngineError> {
    start_turn_in(gw, request, acked, None).await
}

/// [`start_turn`], in the session's queue slot `slot` when the caller holds it already (a resumed
/// turn keeps the place the recovery took, so no other turn comes between).
async fn start_turn_in(
    gw: &Arc<Engine>,
    request: TurnRequest,
    acked: tokio::sync::oneshot::Receiver<()>,
    slot: Option<crate::state::TurnSlot>,
) -> Result<TurnHandle, EngineError> {
    let TurnRequest { session, run_id, text: message, images, regenerate, expected_leaf, graft, model, conn_id } =
        request;
    let dedupe_key = format!("chat:{run_id}");
    match gw.dedupe_begin(&dedupe_key) {
        Some(Dedupe::InFlight) => {
            let run = gw.run(&run_id);
            return Ok(TurnHandle { answer: RunAnswer::new(&run_id, RunStatus::InFlight), run });
        }
        Some(Dedupe::Done(r, _)) => return r.map(|answer| TurnHandle { answer, run: None }),
        None => {}
    }
    // The transcript remembers every key that reached it, across restarts and crashes.
    let resume = match turn_on_disk(gw, &session, &run_id).await {
        Ok(OnDisk::New) => None,
        Ok(OnDisk::Resume(user)) => {
            tracing::info!(session = %session.key, run = %run_id, "resuming a turn whose reply was never written");
            Some(user)
        }
        Ok(OnDisk::Done(status)) => {
            let answer = RunAnswer::new(&run_id, status);
            gw.dedupe_finish(&dedupe_key, Ok(answer.clone()));
            return Ok(TurnHandle { answer, run: None });
        }
        Ok(OnDisk::Interrupted) => {
            let answer = RunAnswer::new(&run_id, RunStatus::Interrupted);
            gw.dedupe_finish(&dedupe_key, Ok(answer.clone()));
            return Ok(TurnHandle { answer, run: None });
        }
        Err(e) => {
            gw.dedupe_forget(&dedupe_key);
            return Err(e);
        }
    };
    if resume.is_none() && slot.is_none() {
        // A message for a model no provider has is refused before anything is written (its
        // queued record included); a command needs no model (`/new` gets such a session going).
        // (One taken up from its record after a restart fails in its turn, recording the drop.)
        let command = slash_command(&message).filter(|_| images.is_empty() && regenerate.is_none() && graft.is_none());
        let spec = model.clone().unwrap_or_else(|| gw.session_model(&session));
        if let (None, Err(e)) = (command, gw.settings.providers.resolve(&spec)) {
            gw.dedupe_forget(&dedupe_key);
            return Err(EngineError::Invalid(e.to_string()));
        }
    }
    if resume.is_none() {
        if let Err(e) = check_branch_point(gw, &session, expected_leaf.as_ref(), regenerate.as_deref()).await {
            gw.dedupe_forget(&dedupe_key);
            return Err(e);
        }
    }
    let Some((run, ahead)) = gw.register_run_bounded(&run_id, &session.key, conn_id, MAX_QUEUED_PER_SESSION) else {
        gw.dedupe_forget(&dedupe_key);
        return Err(EngineError::Busy(format!(
            "session busy: {MAX_QUEUED_PER_SESSION} turns are already running or waiting in {}; send again when one has finished",
            session.key
        )));
    };
    // A message acknowledged while it has to wait — another turn of its session is ahead, or the
    // turns the last stop cut are being taken up (not registered runs yet; new turns wait for
    // them) — is on disk before its ack (its user row is written only when its turn comes): a
    // crash meanwhile does not lose it, the next start runs it
    // ([`crate::takeup::recover_interrupted`]). A turn tied to the tree as it is now (a
    // regenerate, a leaf guard, a stateless client's history) is not kept: its client sends it
    // again.
    let waits = ahead > 0 || gw.recovering.try_read().is_err();
    let queued = waits
        && slot.is_none()
        && resume.is_none()
        && regenerate.is_none()
        && expected_leaf.is_none()
        && graft.is_none();
    // A turn taken up from its record after a restart ([`run_queued`]) has one on disk already.
    let recorded = slot.is_some() && resume.is_none();
    let mut session = session;
    if queued {
        let record = crate::durable::queued_marker(&run_id, &message, &images);
        let mut written = gw.append(&session, record.clone()).await;
        if let Err(pincer_store::StoreError::MovedAside(_)) = written {
            // The session was reset or deleted while the record waited for the transcript's lock:
            // the message belongs to the session as it is now (the turn follows it there too).
            written = match gw.session(&session.key, true).await {
                Ok(Some(now)) => {
                    session = now;
                    gw.append(&session, record).await
                }
                Ok(None) => Err(pincer_store::StoreError::MovedAside(session.path.display().to_string())),
                Err(e) => Err(pincer_store::StoreError::Internal(e.to_string())),
            };
        }
        if let Err(e) = written {
            gw.finish_run(&run_id);
            gw.dedupe_forget(&dedupe_key);
            return Err(EngineError::Persistence(format!("cannot queue the message: {}", EngineError::unsaved(&e))));
        }
    }
    let handle = TurnHandle { answer: RunAnswer::new(&run_id, RunStatus::Started), run: Some(run.clone()) };
    let turn = Turn {
        gw: gw.clone(),
        session,
        run,
        text: message,
        images,
        expected_leaf: expected_leaf.filter(|_| resume.is_none()),
        resume,
        regenerate,
        graft,
        model,
        queued: queued || recorded,
        slot: std::sync::Mutex::new(slot),
        ended: Default::default(),
        user_on_disk: Default::default(),
        tokens: Default::default(),
    };
    gw.tasks.spawn(async move {
        let mut turn = turn;
        // The ack goes out before any event of the run: the run starts once the client has read it
        // (its pong to the ping after the ack), or a second at most (a client that does not read
        // must not hold its turn back). Meanwhile the turn takes its place in its session's queue
        // at once, so work asked for after the ack (a compaction, another turn) comes after it.
        let read = tokio::time::timeout(ACK_WAIT, acked);
        if turn.slot.get_mut().map(|s| s.is_none()).unwrap_or(false) {
            let queue = async {
                // Turns cut by the last stop are taken up first ([`crate::takeup::recover_interrupted`]).
                turn.gw.recovered().await;
                turn.gw.turn_slot(&turn.session.key, &turn.run.cancel).await
            };
            let (slot, _) = tokio::join!(queue, read);
            // A slot that could not be had is asked for again by the turn, which reports why.
            if let (Ok(slot), Ok(held)) = (slot, turn.slot.get_mut()) {
                *held = Some(slot);
            }
        } else {
            let _ = read.await;
        }
        let (gw, session, run) = (turn.gw.clone(), turn.session.clone(), turn.run.clone());
        let span = tracing::info_span!("turn", session_key = %turn.session.key, run_id = %turn.run.run_id);
        if let Err(e) = tokio::spawn(turn.execute().instrument(span)).await {
            let what = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into()),
                Err(e) => e.to_string(),
            };
            Turn::bare(gw, session, run).crashed(&what).await;
        }
    });
    Ok(handle)
}

/// Runs turn `run_id` again for its user row `user`, written before a restart or a replica's death
/// without its reply ([`crate::takeup::recover`]): as if its client had sent the key again, with
/// no client waiting (the session's watchers see it). A resend of the key meanwhile joins it.
pub async fn resume(
    gw: &Arc<Engine>,
    session: SessionRef,
    run_id: &str,
    user: &Value,
    slot: crate::state::TurnSlot,
) -> Result<RunAnswer, EngineError> {
    // The text tells a slash command (which is not run again) from a message.
    let text = pincer_pi::text_blocks(user["message"].get("content")).join("\n");
    start_held(gw, session, run_id, text, Vec::new(), slot).await
}

/// Runs turn `run_id`, acknowledged while another turn ran and never started before a restart,
/// from its record `queued` ([`crate::durable::queued_unstarted`]), in the session's queue `slot`.
pub async fn run_queued(
    gw: &Arc<Engine>,
    session: SessionRef,
    run_id: &str,
    queued: &Value,
    slot: crate::state::TurnSlot,
) -> Result<RunAnswer, EngineError> {
    let text = queued["text"].as_str().unwrap_or_default().to_owned();
    let images = queued["images"].as_array().cloned().unwrap_or_default();
    start_held(gw, session, run_id, text, images, slot).await
}

/// A turn the gateway takes up by itself (no client waits for its ack), in a queue slot it holds.
async fn start_held(
    gw: &Arc<Engine>,
    session: SessionRef,
    run_id: &str,
    text: String,
    images: Vec<Value>,
    slot: crate::state::TurnSlot,
) -> Result<RunAnswer, EngineError> {
    let request = TurnRequest {
        session,
        run_id: run_id.to_owned(),
        text,
        images,
        regenerate: None,
        expected_leaf: None,
        graft: None,
        model: None,
        conn_id: 0,
    };
    let (acked, ack) = tokio::sync::oneshot::channel();
    let _ = acked.send(());
    start_turn_in(gw, request, ack, Some(slot)).await.map(|handle| handle.answer)
}

/// A session's system prompt: the one a client set ([`SYSTEM_PROMPT_FIELD`]), else the configured one.
pub fn session_system_prompt(gw: &Engine, session: &SessionRef) -> Option<String> {
    match session.entry.get(SYSTEM_PROMPT_FIELD) {
        Some(Value::String(p)) => Some(p.clone()),
        _ => gw.settings.agents.get(&session.agent_id).system_prompt.clone(),
    }
}

/// `expectedLeafEntryId` must be the session's leaf now; `regenerateEntryId` must be a user message
/// of this session. Nothing is written when either is wrong.
async fn check_branch_point(
    gw: &Arc<Engine>,
    session: &SessionRef,
    expected: Option<&Option<String>>,
    regenerate: Option<&str>,
) -> Result<(), EngineError> {
    if expected.is_none() && regenerate.is_none() {
        return Ok(());
    }
    let (s2, regen) = (session.clone(), regenerate.map(str::to_owned));
    let (leaf, target) = gw.blocking(move |gw| crate::tree::leaf_and_entry(gw, &s2, regen.as_deref())).await?;
    if let Some(want) = expected {
        if want != &leaf {
            return Err(EngineError::Conflict(format!(
                "the active branch of {} moved (its leaf is {}, expectedLeafEntryId is {}); reload and send again",
                session.key,
                leaf.as_deref().unwrap_or("null"),
                want.as_deref().unwrap_or("null"),
            )));
        }
    }
    if let Some(id) = regenerate {
        let role = target.as_ref().and_then(|e| e.get("message")).and_then(|m| m.get("role")).and_then(Value::as_str);
        match (target.is_some(), role) {
            (false, _) => {
                return Err(EngineError::NotFound(format!(
                    "regenerateEntryId {id} is not an entry of session {}",
                    session.key
                )))
            }
            (true, Some("user")) => {}
            (true, _) => return Err(EngineError::Invalid(format!("regenerateEntryId {id} is not a user message"))),
        }
    }
    Ok(())
}

/// [`crate::durable::on_disk`] off the async threads; errors name the transcript.
async fn turn_on_disk(gw: &Engine, session: &SessionRef, run_id: &str) -> Result<OnDisk, EngineError> {
    if crate::durable::known_new(gw.store.as_ref(), &session.path, run_id) {
        return Ok(OnDisk::New);
    }
    let (store, path, id, attempts) =
        (gw.store.clone(), session.path.clone(), run_id.to_owned(), gw.settings.resume_attempts);
    tokio::task::spawn_blocking(move || crate::durable::on_disk(&store, &path, &id, attempts))
        .await
        .map_err(EngineError::task)?
        .map_err(|e| EngineError::Persistence(format!("cannot read the transcript to check idempotencyKey: {e}")))
}

/// One `chat.send` from the queue to its last event.
struct Turn {
    gw: Arc<Engine>,
    session: SessionRef,
    run: Arc<RunHandle>,
    text: String,
    images: Vec<Value>,
    /// `expectedLeafEntryId`: checked again once the turn has its place in the session's queue
    /// (a turn queued before it may have moved the leaf since the check in [`start_turn`]).
    expected_leaf: Option<Option<String>>,
    /// The session's queue slot, when the turn was handed one (a resumed turn); in a mutex only to
    /// keep `Turn` `Sync` (it is taken once, by [`Turn::execute`]).
    slot: std::sync::Mutex<Option<crate::state::TurnSlot>>,
    /// The turn's user entry when it is being resumed after a restart (nothing new is written).
    resume: Option<Value>,
    /// A user row to answer again: the leaf moves there and no user row is written.
    regenerate: Option<String>,
    /// Where a stateless client's turn joins the tree (see [`Graft`]).
    graft: Option<Graft>,
    /// The model of this turn instead of the session's.
    model: Option<String>,
    /// Its record was written when it was acknowledged behind another turn
    /// ([`crate::durable::QUEUED`]; or it runs from such a record after a restart): ending
    /// without running says so ([`Turn::drop_queued`]).
    queued: bool,
    /// The lifecycle `end` went out (it comes before the final, once).
    ended: std::sync::atomic::AtomicBool,
    /// The turn's user row is on disk: written by this turn, or the row a resumed turn answers
    /// (once claimed). From then on a failure is written too ([`Turn::fail`]).
    user_on_disk: std::sync::atomic::AtomicBool,
    /// Tokens in and out of the replies written so far (their `usage`).
    tokens: [std::sync::atomic::AtomicU64; 2],
}

impl Turn {
    /// A turn with nothing to write (for gateway replies and crash records).
    fn bare(gw: Arc<Engine>, session: SessionRef, run: Arc<RunHandle>) -> Turn {
        Turn {
            gw,
            session,
            run,
            text: String::new(),
            images: vec![],
            expected_leaf: None,
            resume: None,
            regenerate: None,
            graft: None,
            model: None,
            queued: false,
            slot: Default::default(),
            ended: Default::default(),
            user_on_disk: Default::default(),
            tokens: Default::default(),
        }
    }

    /// A `chat` event. As OpenClaw numbers them, the final repeats the last delta's `seq` (a
    /// final without deltas, an abort or an error takes the next one).
    /// The `chat` event that ends the run (`final`, `aborted`, `error`).
    fn end_event(&self, state: ChatState, end: &RunEnded<'_>) {
        // An event carrying a persisted entry is that entry's `chat` event, under its durable id.
        let entry_id = end.message.and_then(|m| m.get("__openclaw")).and_then(|o| o.get("id"));
        self.chat_event_with(state, end, entry_id.and_then(Value::as_str));
    }

    /// A `status` `chat` event: what the run does before its first token.
    fn status(&self, phase: StatusPhase, retry: Option<Retry>) {
        self.chat_event_with(ChatState::Status, &ChatStatus { phase, retry }, None);
    }

    /// [`Turn::chat_event`] with the fields after `state` serialized from `extra` (flattened), and
    /// the id of the persisted entry the event carries, if any.
    fn chat_event_with(&self, state: ChatState, extra: &impl serde::Serialize, entry_id: Option<&str>) {
        let seq = match (state, self.run.last_seq()) {
            (ChatState::Final, last) if last > 0 => last,
            _ => self.run.next_seq(),
        };
        if !self.gw.hub.wants("chat", Some(&self.session.key), crate::hub::Audience::All) {
            return;
        }
        // Serialized straight from the turn's fields (no JSON tree built for it).
        let p = ChatEvent {
            run_id: &self.run.run_id,
            session_key: &self.session.key,
            agent_id: &self.session.agent_id,
            seq,
            state,
            extra,
        };
        let Some(json) = crate::hub::to_json(&p) else { return };
        // Deltas and startup phases are superseded by what follows: droppable for a slow client.
        let droppable = state.droppable();
        let id = entry_id.filter(|_| !droppable).and_then(|id| self.gw.event_id(&self.session, id, 1));
        self.gw.hub.publish_json("chat", &self.session.key, json, droppable, crate::hub::Audience::All, id);
    }

    /// Records how the run ended, for the client that follows it ([`RunHandle::progress`]).
    fn ended(&self, outcome: TurnOutcome) {
        self.run.progress.send_modify(|p| p.end = Some(outcome));
    }

    fn agent_event(&self, update: AgentUpdate) {
        publish_agent_event(&self.gw, &self.session, &self.run, update);
    }

    /// Another stream's `agent` event (usage, a tool's result).
    fn agent_data(&self, stream: &str, data: &Value) {
        self.agent_event(AgentUpdate::Other { stream, data });
    }

    /// The lifecycle `end`, once: before the final (as OpenClaw orders them), else when the turn is over.
    fn lifecycle_end(&self) {
        if !self.ended.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.agent_event(AgentUpdate::Ended);
        }
    }

    fn session_message(&self, entry: &Value) {
        // What streamed is in the row now: the next message streams from nothing.
        self.run.progress.send_if_modified(|p| {
            let had = !p.text.is_empty();
            p.text.clear();
            had
        });
        publish_session_message(&self.gw, &self.session, entry, None);
    }

    fn finish(&self, result: Result<RunStatus, EngineError>) {
        let status = result.as_ref().map_or("error", |s| s.as_str());
        crate::metrics::turn_finished(status);
        let model = self.session_model();
        let [tokens_in, tokens_out] = self.tokens.each_ref().map(|t| t.load(std::sync::atomic::Ordering::Relaxed));
        crate::metrics::model_turn(&model, status, tokens_in, tokens_out);
        tracing::info!(
            session = %self.session.key,
            run = %self.run.run_id,
            model = %model,
            status = %status,
            duration_ms = now_ms().saturating_sub(self.run.started_at),
            tokens_in,
            tokens_out,
            "turn finished"
        );
        let result = result.map(|status| RunAnswer::new(&self.run.run_id, status));
        self.gw.dedupe_finish_run(&format!("chat:{}", self.run.run_id), result, Some(self.run.started_at));
        self.gw.finish_run(&self.run.run_id);
        self.gw.sessions.touch(&self.session);
    }

    async fn execute(mut self) {
        let queued = crate::metrics::Live::queued();
        let handed = self.slot.get_mut().map(Option::take).unwrap_or_default();
        let slot = match handed {
            Some(held) => Ok(held),
            None => {
                // Turns cut by the last stop are taken up first ([`crate::takeup::recover_interrupted`]).
                self.gw.recovered().await;
                self.gw.turn_slot(&self.session.key, &self.run.cancel).await
            }
        };
        let guard = match slot {
            Ok(g) => g,
            Err(crate::state::SlotError::Unavailable(e)) => {
                // The database cannot be asked: nothing was written, nothing runs.
                self.fail(&e, ErrorKind::Persistence, None).await;
                return;
            }
            Err(crate::state::SlotError::Cancelled) => {
                // Aborted while waiting: no row was written.
                self.drop_queued("aborted while it waited").await;
                self.ended(TurnOutcome::Aborted(None));
                self.end_event(ChatState::Aborted, &RunEnded::stopped(self.run.origin(), None));
                self.finish(Ok(RunStatus::Aborted));
                return;
            }
        };
        drop(queued);
        let moved = guard.moved(&self.gw, &self.session).await;
        if !self.follow_reset(moved).await {
            return;
        }
        let (_running, started) = (crate::metrics::Live::run(), Instant::now());
        self.agent_event(AgentUpdate::Started);
        // A stateless client's text is never a command (its history would not say what it did).
        let command = slash_command(&self.text)
            .filter(|_| self.images.is_empty() && self.regenerate.is_none() && self.graft.is_none());
        let stale = match &self.expected_leaf {
            Some(want) => check_branch_point(&self.gw, &self.session, Some(want), None).await.err(),
            None => None,
        };
        if let Some(e) = stale {
            // Nothing was written: the client's view of the branch is stale (or could not be checked).
            self.fail_with(&e).await;
        } else if let (Some(_), Some(_)) = (command, &self.resume) {
            self.reply("This command was interrupted by a restart before it was answered; send it again.").await;
            self.finish(Ok(RunStatus::Interrupted));
        } else if let Some(cmd) = command {
            self.no_agent(cmd).await;
        } else {
            self.agent_turn().await;
        }
        self.lifecycle_end();
        crate::metrics::turn_seconds(started.elapsed());
        drop(guard);
    }

    /// A session reset or deleted while this turn waited for its queue (here or on another
    /// replica) has a new transcript: a plain turn goes there (as one sent now would). A turn tied
    /// to entries of the old one (a resume, a regenerate, a leaf guard, a stateless client's
    /// history) ends with a `chat` error instead (false). Nothing is written to the old transcript
    /// after it was moved aside. `moved`: [`crate::state::TurnSlot::moved`] of the turn's slot.
    async fn follow_reset(&mut self, moved: bool) -> bool {
        if !moved {
            return true; // nothing was moved aside since the session was read (the common case)
        }
        let now = match self.gw.session(&self.session.key, true).await {
            Ok(Some(now)) if now.path != self.session.path => now,
            _ => return true,
        };
        let tied =
            self.resume.is_some() || self.regenerate.is_some() || self.expected_leaf.is_some() || self.graft.is_some();
        if tied {
            let why = format!(
                "session {} was reset or deleted while this turn waited; nothing was written, send it again",
                self.session.key
            );
            self.fail(&why, ErrorKind::Conflict, None).await;
            return false;
        }
        self.session = now;
        true
    }

    /// A queued turn ([`Turn::queued`]) ends without its user row: recorded, so that no restart
    /// runs it ([`crate::durable::DROPPED`]). Best effort: a restart meanwhile runs it after all.
    async fn drop_queued(&self, why: &str) {
        if !self.queued {
            return;
        }
        if let Err(e) =
            self.gw.append(&self.session, crate::durable::marker(crate::durable::DROPPED, &self.run.run_id, why)).await
        {
            tracing::warn!(session = %self.session.key, run = %self.run.run_id, "cannot record a dropped queued turn: {e}");
        }
    }

    fn user_content(&self, text: &str) -> Value {
        if self.images.is_empty() {
            return json!(text);
        }
        let mut blocks = Vec::new();
        if !text.is_empty() {
            blocks.push(json!({"type": "text", "text": text}));
        }
        blocks.extend(self.images.iter().cloned());
        Value::Array(blocks)
    }

    /// Appends the user turn and announces it. When the append fails nothing is announced and
    /// nothing runs: the client gets a `chat` error naming the cause, and `None` comes back.
    async fn write_user(&self, text: &str, extra: Option<(&str, Value)>) -> Option<Value> {
        let mut msg = json!({
            "role": "user",
            "content": self.user_content(text),
            "timestamp": now_ms(),
            "idempotencyKey": crate::durable::user_key(&self.run.run_id),
        });
        if let Some((k, v)) = extra {
            msg[k] = v;
        }
        match self.gw.append(&self.session, NewEntry::message(msg)).await {
            Ok(a) if !a.appended => {
                // The row of this key was in the transcript already (another gateway process on
                // the same state dir got the same turn): that one answers it, this one must not.
                let state = turn_on_disk(&self.gw, &self.session, &self.run.run_id).await;
                let why = "another gateway process on this state dir wrote this turn's user row first and answers \
                           it; its reply will be in the session's history";
                self.settle(state.unwrap_or(OnDisk::Interrupted), why);
                None
            }
            Ok(a) => {
                self.user_on_disk.store(true, std::sync::atomic::Ordering::Relaxed);
                self.session_message(&a.entry);
                Some(a.entry["message"].clone())
            }
            Err(e) => {
                self.fail_with(&EngineError::unsaved(&e)).await;
                None
            }
        }
    }

    /// The run task panicked: a chained error row (keyed, so a resend sees the turn as done) and
    /// a `chat` error.
    async fn crashed(&self, what: &str) {
        let text = format!("internal error: the run stopped unexpectedly ({what})");
        let entry = self.record_error(&text).await;
        self.fail(&text, ErrorKind::Internal, entry.as_ref()).await;
        self.lifecycle_end();
    }

    /// Writes `text` as the turn's error reply (keyed `<runId>:assistant`, so a resend or a
    /// restart finds the turn answered) and announces the row; `None` when it could not be written.
    async fn record_error(&self, text: &str) -> Option<Value> {
        let mut msg = injected_message(text, Some(&crate::durable::reply_key(&self.run.run_id)), None);
        msg["stopReason"] = json!("error");
        msg["errorMessage"] = json!(text);
        match self.gw.append(&self.session, NewEntry::message(msg)).await {
            Ok(a) => {
                if a.appended {
                    self.session_message(&a.entry);
                }
                Some(a.entry)
            }
            Err(e) => {
                tracing::warn!(session = %self.session.key, run = %self.run.run_id, "cannot record the failed run: {e}");
                None
            }
        }
    }

    /// Appends a gateway-injected assistant row and sends it as the final.
    async fn reply(&self, text: &str) {
        let key = crate::durable::reply_key(&self.run.run_id);
        let msg = injected_message(text, Some(&key), None);
        let message = match self.gw.append(&self.session, NewEntry::message(msg.clone())).await {
            Ok(a) => {
                self.session_message(&a.entry);
                with_meta(&a.entry, &self.run.run_id)
            }
            Err(e) => {
                tracing::warn!(session = %self.session.key, "reply append failed: {e}");
                msg
            }
        };
        self.lifecycle_end();
        self.ended(TurnOutcome::Replied(message.clone()));
        self.end_event(ChatState::Final, &RunEnded::stopped("stop", Some(&message)));
    }

    /// `/new`: the session starts over (its transcript moved aside, in its owner's order).
    async fn new_session(&self) -> Result<(SessionRef, Option<std::path::PathBuf>), EngineError> {
        let (gw, k) = (self.gw.clone(), self.session.key.clone());
        let reset = async move { gw.index(move |s| s.reset(&k, "reset")).await };
        self.gw.with_transcript(&self.session.key, reset).await?
    }

    async fn no_agent(&self, cmd: &str) {
        if self.write_user(&self.text, None).await.is_none() {
            return;
        }
        let text = match cmd {
            "status" => {
                let runs = self.gw.runs_of(&self.session.key).len().saturating_sub(1);
                format!(
                    "Session {} ({}).\nModel: {}{}.\nTranscript: {}\nOther runs waiting: {runs}.",
                    self.session.key,
                    self.session.session_id,
                    self.gw.settings.model,
                    if self.gw.settings.model_is_fallback { " (offline echo model: no provider configured)" } else { "" },
                    self.session.path.display(),
                )
            }
            "help" => "Commands: /status — this session and model; /new — start a new session (the old transcript is archived); \
                       /compact — summarise older turns; /stop — stop the running reply; /help — this list."
                .to_string(),
            "new" => match self.new_session().await {
                Ok((fresh, archived)) => {
                    let text = match archived {
                        Some(p) => format!("Started a new session. The previous transcript was kept as {}.", p.display()),
                        None => "Started a new session.".into(),
                    };
                    let turn = Turn::bare(self.gw.clone(), fresh, self.run.clone());
                    self.gw.hub.sessions_changed(&self.session.key, "reset");
                    turn.reply(&text).await;
                    self.finish(Ok(RunStatus::Ok));
                    return;
                }
                Err(e) => format!("Could not start a new session: {e}"),
            },
            _ => {
                let focus = self.text.trim().strip_prefix("/compact").map(str::trim).filter(|t| !t.is_empty());
                let reason = pincer_compaction::CompactionReason::Manual;
                match crate::compact::run(&self.gw, &self.session, reason, focus.map(str::to_owned), self.run.cancel.clone())
                    .await
                {
                    Ok(o) => crate::compact::describe(&o),
                    Err(e) => format!("Compaction did not run: {e}"),
                }
            }
        };
        self.reply(&text).await;
        self.finish(Ok(RunStatus::Ok));
    }

    /// The hook, then the user row. False when the turn ends here (blocked, or not written).
    async fn admit_user(&self) -> bool {
        if self.graft.as_ref().is_some_and(|g| g.continues) {
            // Tool results the client ran: the turn it asked for goes on (no new user message).
            return self.apply_graft().await;
        }
        // The before_agent_run hook decides before anything is written or shown.
        if let Some(h) = &self.gw.settings.hook {
            match hook::decide(h, &self.session.key, &self.text).await {
                Decision::Allow => {}
                Decision::Failed(why) => {
                    // The gateway failed, not the user: nothing is written and the key stays
                    // usable, so the same message can be sent again once the hook works.
                    let message = format!(
                        "the before_agent_run hook could not decide ({why}); the message was not sent and nothing was saved: send it again once the hook works"
                    );
                    self.fail(&message, ErrorKind::Hook, None).await;
                    self.gw.dedupe_forget(&format!("chat:{}", self.run.run_id));
                    return false;
                }
                Decision::Block { reason, replacement } => {
                    let shown = replacement.unwrap_or_else(|| "[message blocked]".into());
                    let block = json!({"blocked": true, "reason": reason});
                    if !self.apply_graft().await {
                        return false;
                    }
                    if self.write_user(&shown, Some(("openclawHookBlock", block))).await.is_none() {
                        return false;
                    }
                    self.reply(&format!("This message was blocked before reaching the agent: {reason}")).await;
                    self.finish(Ok(RunStatus::Blocked));
                    return false;
                }
            }
        }
        self.apply_graft().await && self.write_user(&self.text, None).await.is_some()
    }

    /// Joins a stateless client's turn to the tree: moves the leaf to where its history ends
    /// (unless the leaf is still where the match found it), records a new system prompt, and
    /// writes the messages the tree lacks. False (after a `chat` error) when a write failed.
    async fn apply_graft(&self) -> bool {
        let Some(g) = &self.graft else { return true };
        if let Some(at) = &g.at {
            let (s, path) = (self.session.clone(), self.session.path.clone());
            let leaf = match self.gw.blocking(move |gw| crate::tree::leaf_and_entry(gw, &s, None)).await {
                Ok((leaf, _)) => leaf,
                Err(e) => {
                    let why = format!("cannot read the leaf of {}: {e}", path.display());
                    self.fail(&why, ErrorKind::Persistence, None).await;
                    return false;
                }
            };
            let stays = g.leaf_seen.is_some() && leaf == g.leaf_seen;
            if !stays && leaf != *at && !self.move_leaf(at.as_deref(), "branch").await {
                return false;
            }
        }
        if let Some(prompt) = &g.system_prompt {
            let mut payload = Map::new();
            payload.insert("customType".into(), json!(SYSTEM_PROMPT_CHANGE));
            payload.insert("data".into(), json!({"systemPrompt": prompt, "at": now_ms()}));
            if let Err(e) = self.gw.append(&self.session, NewEntry::of("custom", payload)).await {
                self.fail_with(&EngineError::unsaved(&e)).await;
                return false;
            }
            let (key, mut fields) = (self.session.key.clone(), Map::new());
            fields.insert(SYSTEM_PROMPT_FIELD.into(), json!(prompt));
            if let Err(e) = self.gw.index(move |s| s.patch(&key, &fields)).await {
                self.fail(&format!("the system prompt could not be saved: {e}"), ErrorKind::Persistence, None).await;
                return false;
            }
        }
        if g.prelude.is_empty() {
            return true;
        }
        // The messages the tree lacks, in one durable commit: all of them, or none.
        let entries = g.prelude.iter().map(|m| NewEntry::message(m.clone())).collect();
        match self.gw.append_all(&self.session, entries).await {
            Ok(all) => {
                for a in &all {
                    self.session_message(&a.entry);
                }
                true
            }
            Err(e) => {
                self.fail_with(&EngineError::unsaved(&e)).await;
                false
            }
        }
    }

    /// Moves the session's leaf (a `leaf` entry) and tells the session lists; false (after a `chat`
    /// error) when it could not be written.
    async fn move_leaf(&self, target: Option<&str>, reason: &str) -> bool {
        if let Err(e) = self.gw.append(&self.session, NewEntry::move_leaf(target)).await {
            self.fail_with(&EngineError::unsaved(&e)).await;
            return false;
        }
        self.gw.hub.sessions_changed_at(&self.session.key, reason, target);
        true
    }

    /// The system prompt of this turn's run: the one it sets, else the session's, else the configured one.
    fn system_prompt(&self) -> Option<String> {
        match self.graft.as_ref().and_then(|g| g.system_prompt.as_ref()) {
            Some(p) => p.clone().or_else(|| self.gw.settings.agents.get(&self.session.agent_id).system_prompt.clone()),
            None => session_system_prompt(&self.gw, &self.session),
        }
    }

    async fn agent_turn(&self) {
        // The model is known before anything is written: a turn for a model no provider has
        // writes nothing (a resumed one, its user row on disk, answers with the error once claimed).
        let model = self.gw.settings.providers.resolve(&self.session_model());
        if let (Err(e), None) = (&model, &self.resume) {
            self.fail(&format!("{e}"), ErrorKind::Provider("unknown"), None).await;
            return;
        }
        if let Some(target) = &self.regenerate {
            // A sibling reply: the leaf moves to the user row, the run answers from there.
            if !self.move_leaf(Some(target), "regenerate").await {
                return;
            }
        } else if self.resume.is_some() {
            if !self.claim_resume().await || !self.settle_cut_calls().await {
                return;
            }
        } else if !self.admit_user().await {
            return;
        }
        // OpenClaw's startup phases, shown by its Control UI while the reply has not begun.
        self.status(StatusPhase::PreparingContext, None);
        let mut messages = match self.gw.context(&self.session).await {
            Ok(m) => m,
            Err(e) => {
                self.fail(&format!("cannot read the transcript: {e}"), ErrorKind::Persistence, None).await;
                return;
            }
        };
        let model = match model {
            Ok(m) => m,
            Err(e) => {
                self.fail(&format!("{e}"), ErrorKind::Provider("unknown"), None).await;
                return;
            }
        };
        // Pi's overflow rule: one compact-and-retry, allowed again once a reply has come through
        // since (a tool loop whose results outgrow the window compacts and goes on, each time).
        // At most MAX_OVERFLOW_COMPACTIONS of them per turn: a model that keeps asking for more than
        // fits must not compact forever.
        let (mut may_recover, mut compactions) = (true, 0);
        loop {
            self.status(StatusPhase::StartingModel, None);
            let rx = start_run(RunRequest {
                model: model.clone(),
                system_prompt: self.system_prompt(),
                messages: messages.clone(),
                tools: Arc::new(crate::approvals::gated(&self.gw, &self.session, &self.run)),
                client_tools: self.graft.as_ref().map_or_else(|| Arc::from([]), |g| g.client_tools.as_slice().into()),
                sink: Arc::new(StoreSink { gw: self.gw.clone(), session: self.session.clone() }),
                cancel: self.run.cancel.clone(),
                max_turns: self.gw.settings.max_turns,
                run_id: self.run.run_id.clone(),
                max_reply_bytes: self.gw.settings.max_reply_bytes,
            });
            match self.stream(rx, may_recover).await {
                StreamEnd::Overflow { message, entry, may_recover: false } => {
                    let message = format!(
                        "{message} (the context is still too long after compacting it; the last tool result or \
                         message alone may not fit the model's context window: use a model with a larger \
                         window or ask for less)"
                    );
                    self.fail(&message, ErrorKind::Provider("context_length"), entry.as_deref()).await;
                    return;
                }
                StreamEnd::Overflow { message, entry, .. } if compactions == MAX_OVERFLOW_COMPACTIONS => {
                    let message = format!(
                        "{message} (the context overflowed again after {compactions} compactions in this turn; \
                         send another message to go on)"
                    );
                    self.fail(&message, ErrorKind::Provider("context_length"), entry.as_deref()).await;
                    return;
                }
                StreamEnd::Overflow { message, entry, may_recover: true } => {
                    // Pi's recovery: compact, rebuild the context (the error row is left out of it)
                    // and go on from where the run stopped.
                    may_recover = false;
                    compactions += 1;
                    let reason = pincer_compaction::CompactionReason::Overflow;
                    match crate::compact::run(&self.gw, &self.session, reason, None, self.run.cancel.clone()).await {
                        Ok(_) => match self.gw.context(&self.session).await {
                            Ok(m) => messages = m,
                            Err(e) => {
                                let why = format!("cannot read the transcript: {e}");
                                self.fail(&why, ErrorKind::Persistence, entry.as_deref()).await;
                                return;
                            }
                        },
                        Err(e) => {
                            self.fail(
                                &format!("{message} (compacting to make room failed: {e})"),
                                ErrorKind::Provider("context_length"),
                                entry.as_deref(),
                            )
                            .await;
                            return;
                        }
                    }
                }
                StreamEnd::Finished { usage } => {
                    if crate::compact::over_threshold(&self.gw, &self.session, usage.as_ref()).await {
                        let reason = pincer_compaction::CompactionReason::Threshold;
                        let _ = crate::compact::run(&self.gw, &self.session, reason, None, self.gw.stopping()).await;
                    }
                    return;
                }
                StreamEnd::Other => return,
            }
        }
    }

    /// Records that a turn whose user row is on disk from before a restart runs again (one attempt of
    /// `resume_attempts`). The
    /// check in [`start_turn`] was made before the turn waited for its queue, and another gateway
    /// process may share the state dir: the turn is read again here, in the queue and under the
    /// transcript's lock, and the marker is written under that lock. A turn answered or resumed
    /// meanwhile does not run (false; it is settled as the transcript has it); one the session
    /// moved past meanwhile is marked interrupted on disk (its message is not left without an
    /// answer there) and settled so.
    async fn claim_resume(&self) -> bool {
        let (store, path, id) = (self.gw.store.clone(), self.session.path.clone(), self.run.run_id.clone());
        let attempts = self.gw.settings.resume_attempts;
        let checked = tokio::task::spawn_blocking(move || {
            let held = store.lock(&path)?;
            crate::durable::on_disk_at(&store, &path, &id, attempts).map(|state| (held, state))
        })
        .await;
        let Some((held, (state, at_leaf))) = self.read_or_fail(checked).await else { return false };
        if !matches!(state, OnDisk::Resume(_)) {
            tracing::warn!(session = %self.session.key, run = %self.run.run_id, "not resumed: {state:?} by now");
            let why = "this turn was interrupted by a restart and is out of resume attempts (or the session moved \
                       on); send it again with a new idempotencyKey";
            // Marked only when moved past: at the leaf out of attempts, another process's claim
            // just took the last one and answers it (a restart marks it if that one is cut too).
            if state == OnDisk::Interrupted && !at_leaf {
                let marker = crate::durable::marker(crate::durable::INTERRUPTED, &self.run.run_id, why);
                if let Err(e) = self.gw.append(&self.session, marker).await {
                    tracing::warn!(session = %self.session.key, run = %self.run.run_id, "cannot mark an interrupted turn: {e}");
                }
            }
            drop(held);
            self.settle(state, why);
            return false;
        }
        let why = "the turn's reply was never written; running it again for the same user row";
        let marker = crate::durable::marker(crate::durable::RESUMED, &self.run.run_id, why);
        let written = self.gw.append(&self.session, marker).await;
        drop(held);
        if let Err(e) = written {
            self.fail_with(&EngineError::unsaved(&e)).await;
            return false;
        }
        self.user_on_disk.store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// A resumed turn cut while its tools ran: the calls of its last assistant message that have no
    /// result row get one, in the message's order, before the model is asked again. A read-only
    /// tool ([`pincer_agent::Tool::read_only`]) runs again; any other call gets an `isError` result
    /// saying it was interrupted and may or may not have taken effect, so a call with effects never
    /// runs twice and the model decides what to do. False (announced) when that failed.
    async fn settle_cut_calls(&self) -> bool {
        let messages = match self.gw.context(&self.session).await {
            Ok(m) => m,
            Err(e) => {
                self.fail(&format!("cannot read the transcript: {e}"), ErrorKind::Persistence, None).await;
                return false;
            }
        };
        let calls = crate::durable::unanswered_calls(&messages, true);
        let tools = self.gw.tools(&self.session.agent_id);
        // A call that was waiting for its approval (its request on disk, no decision) never ran:
        // it waits again and runs once allowed.
        let ids: std::collections::HashSet<String> =
            calls.iter().filter_map(|c| c["id"].as_str()).map(str::to_owned).collect();
        let (store, path) = (self.gw.store.clone(), self.session.path.clone());
        let asked = if ids.is_empty() {
            Default::default()
        } else {
            let read = tokio::task::spawn_blocking(move || crate::approvals::on_disk(&*store, &path, &ids)).await;
            let Some(asked) = self.read_or_fail(read).await else { return false };
            asked
        };
        for call in &calls {
            let (id, name) = (call["id"].as_str().unwrap_or_default(), call["name"].as_str().unwrap_or_default());
            let approval = asked.get(id);
            let denied = approval.and_then(|(_, d)| d.as_ref()).and_then(crate::approvals::denied_on_disk);
            let outcome = if let Some(denied) = denied {
                Err(denied)
            } else if let Some((request, None)) = approval {
                self.agent_event(AgentUpdate::ToolStarted { tool_call_id: id, name, args: &call["arguments"] });
                tokio::select! {
                    biased;
                    () = self.run.cancel.cancelled() => {
                        self.aborted("").await;
                        return false;
                    }
                    r = crate::approvals::resume_call(&self.gw, &self.session, &self.run, request, &tools, call) => r,
                }
            } else if tools.is_read_only(name) {
                self.agent_event(AgentUpdate::ToolStarted { tool_call_id: id, name, args: &call["arguments"] });
                tokio::select! {
                    biased;
                    () = self.run.cancel.cancelled() => {
                        self.aborted("").await;
                        return false;
                    }
                    r = tools.execute(name, call["arguments"].clone()) => r,
                }
            } else {
                Err(pincer_agent::ToolError::failed(
                    "This tool call was interrupted: the gateway stopped while it ran, so it may or may not have \
                     taken effect. It was not run again; check its effect before repeating it.",
                ))
            };
            let result = pincer_agent::run::tool_result_message(id, name, outcome);
            match self.gw.append(&self.session, NewEntry::message(result)).await {
                Ok(a) => {
                    self.session_message(&a.entry);
                    self.agent_event(AgentUpdate::ToolResult { message: &a.entry["message"] });
                }
                Err(e) => {
                    self.fail_with(&EngineError::unsaved(&e)).await;
                    return false;
                }
            }
        }
        true
    }

    /// Ends a turn that must not run, as the transcript has it: answered already (its final, the
    /// reply being in the history), else a `chat` error of kind `interrupted` saying `why`.
    fn settle(&self, state: OnDisk, why: &str) {
        let status = match state {
            OnDisk::Done(status) => {
                let stop = match status {
                    RunStatus::Aborted | RunStatus::Error => status.as_str(),
                    _ => "stop",
                };
                self.lifecycle_end();
                self.ended(TurnOutcome::AnsweredBefore);
                self.end_event(ChatState::Final, &RunEnded::stopped(stop, None));
                status
            }
            _ => {
                let kind = ErrorKind::Interrupted;
                self.ended(TurnOutcome::Failed { message: why.to_owned(), kind: kind.as_str().to_owned() });
                self.chat_event_with(ChatState::Error, &ChatFailure { error_message: why, error_kind: kind }, None);
                self.agent_event(AgentUpdate::Failed { error: why });
                RunStatus::Interrupted
            }
        };
        self.finish(Ok(status));
    }

    fn session_model(&self) -> String {
        if let Some(m) = &self.model {
            return m.clone();
        }
        self.gw.session_model(&self.session)
    }

    /// Ends the run with an error: announced, and — once the turn's user row is on disk — written,
    /// unless `entry` is the row that says it already: a message whose turn failed is answered by
    /// its error on disk, so no restart runs it again and no later turn leaves it unanswered.
    async fn fail(&self, message: &str, kind: ErrorKind<'_>, entry: Option<&Value>) {
        // Provider errors can echo credentials back: redact before anything leaves the process.
        let message = &self.gw.redactor.redact_str(message);
        crate::metrics::turn_error(kind.as_str());
        tracing::warn!(session = %self.session.key, run = %self.run.run_id, "run failed ({}): {message}", kind.as_str());
        let recorded = match entry {
            None if self.user_on_disk.load(std::sync::atomic::Ordering::Relaxed) => self.record_error(message).await,
            None => {
                // Its record, if it waited behind another turn, must not run it after a restart.
                self.drop_queued(&format!("it failed before it ran: {message}")).await;
                None
            }
            Some(_) => None,
        };
        let written = entry.or(recorded.as_ref()).map(|e| with_meta(e, &self.run.run_id));
        self.ended(TurnOutcome::Failed { message: message.clone(), kind: kind.as_str().to_owned() });
        self.end_event(ChatState::Error, &RunEnded::failed(message, kind, written.as_ref()));
        self.agent_event(AgentUpdate::Failed { error: message });
        self.finish(Err(EngineError::RunFailed { run_id: self.run.run_id.clone(), summary: message.clone() }));
    }

    /// [`Turn::fail`] with an engine error: its text and its kind.
    async fn fail_with(&self, e: &EngineError) {
        self.fail(&e.to_string(), e.kind(), None).await;
    }

    /// What a blocking read of the transcript gave; `None` (the run failed, announced) when it
    /// could not be read.
    async fn read_or_fail<T>(
        &self,
        read: Result<Result<T, pincer_store::StoreError>, tokio::task::JoinError>,
    ) -> Option<T> {
        match read {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.fail_with(&EngineError::unsaved(&e)).await;
                None
            }
            Err(e) => {
                self.fail(&format!("cannot read the transcript: {e}"), ErrorKind::Persistence, None).await;
                None
            }
        }
    }

    /// Relays the run's events: throttled deltas, persisted rows, the final, errors, aborts. A
    /// context-length error is handed back (not announced), saying whether the caller may still
    /// recover: `may_recover`, or a complete reply was written in this run since.
    async fn stream(&self, mut rx: tokio::sync::mpsc::Receiver<RunEvent>, mut may_recover: bool) -> StreamEnd {
        let mut text = String::new();
        let mut thinking = String::new();
        let mut pending = String::new();
        let mut last_sent: Option<Instant> = None;
        loop {
            let flush_at =
                (!pending.is_empty()).then(|| last_sent.map(|t| t + DELTA_INTERVAL).unwrap_or_else(Instant::now));
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = sleep_until(flush_at) => {
                    self.send_delta(&mut pending, &text, &thinking, &mut last_sent);
                    continue;
                }
            };
            let Some(ev) = ev else {
                self.fail("the run ended without a result", ErrorKind::Provider("unknown"), None).await;
                return StreamEnd::Other;
            };
            match ev {
                RunEvent::TextDelta { delta } => {
                    pending.push_str(&delta);
                    text.push_str(&delta);
                    if last_sent.is_none_or(|l| l.elapsed() >= DELTA_INTERVAL) {
                        self.send_delta(&mut pending, &text, &thinking, &mut last_sent);
                    }
                }
                RunEvent::ThinkingDelta { delta } => thinking.push_str(&delta),
                RunEvent::ToolCallStart { id, name, arguments } => {
                    self.send_delta(&mut pending, &text, &thinking, &mut last_sent);
                    self.agent_event(AgentUpdate::ToolStarted { tool_call_id: &id, name: &name, args: &arguments });
                }
                // A running tool's output so far (OpenClaw's shape); live only, like OpenClaw's.
                RunEvent::ToolCallUpdate { id, name, partial } => {
                    self.agent_event(AgentUpdate::ToolUpdated { tool_call_id: &id, name: &name, partial: &partial })
                }
                RunEvent::Persisted { entry } => {
                    if let Some(usage) =
                        entry["message"].get("usage").filter(|_| entry["message"]["role"] == "assistant")
                    {
                        for (total, field) in self.tokens.iter().zip(["input", "output"]) {
                            let n = usage.get(field).and_then(Value::as_u64).unwrap_or(0);
                            total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    if entry["message"]["role"] == "assistant" {
                        // The held-back delta belongs to this message: send it before the row, not
                        // after it with the text cleared.
                        self.send_delta(&mut pending, &text, &thinking, &mut last_sent);
                    }
                    self.session_message(&entry);
                    if entry["message"]["role"] == "toolResult" {
                        // Announced once the row is on disk, carrying what was written (OpenClaw's shape).
                        self.agent_event(AgentUpdate::ToolResult { message: &entry["message"] });
                    }
                    if entry["message"]["role"] == "assistant" {
                        // A new assistant message starts from scratch.
                        text.clear();
                        thinking.clear();
                        may_recover |= entry["message"]["stopReason"] != "error";
                    }
                }
                RunEvent::Usage(u) => self.agent_data("usage", &u),
                // As OpenClaw tells it: starting the model again, with the count when rate limited.
                RunEvent::Retrying(r) => {
                    let retry = r.rate_limited.then(|| Retry::rate_limited(r.attempt, r.max_retries));
                    self.status(StatusPhase::StartingModel, retry);
                }
                RunEvent::Final { entry } => {
                    self.send_delta(&mut pending, &text, &thinking, &mut last_sent);
                    let msg = &entry["message"];
                    #[derive(serde::Serialize)]
                    #[serde(rename_all = "camelCase")]
                    struct Final<'a> {
                        stop_reason: &'a Value,
                        message: WithMeta<'a>,
                        #[serde(skip_serializing_if = "Option::is_none")]
                        usage: Option<&'a Value>,
                    }
                    let extra = Final {
                        stop_reason: &msg["stopReason"],
                        message: WithMeta::run(&entry, &self.run.run_id),
                        usage: msg.get("usage"),
                    };
                    self.lifecycle_end();
                    self.ended(TurnOutcome::Replied(with_meta(&entry, &self.run.run_id)));
                    self.chat_event_with(ChatState::Final, &extra, entry.get("id").and_then(Value::as_str));
                    self.finish(Ok(RunStatus::Ok));
                    return StreamEnd::Finished { usage: msg.get("usage").cloned() };
                }
                RunEvent::Error { entry, message, kind } => {
                    self.send_delta(&mut pending, &text, &thinking, &mut last_sent);
                    if kind == pincer_agent::ErrorKind::ContextLength {
                        return StreamEnd::Overflow { message, entry, may_recover };
                    }
                    self.fail(&message, ErrorKind::Provider(kind.as_str()), entry.as_deref()).await;
                    return StreamEnd::Other;
                }
                RunEvent::Aborted { partial_text, .. } => {
                    self.aborted(&partial_text).await;
                    return StreamEnd::Other;
                }
            }
        }
    }

    fn send_delta(&self, pending: &mut String, text: &str, thinking: &str, last_sent: &mut Option<Instant>) {
        if pending.is_empty() {
            return;
        }
        // Serialized from the run's text as it is (no JSON tree built for each delta).
        #[derive(serde::Serialize)]
        #[serde(tag = "type", rename_all = "lowercase")]
        enum Block<'a> {
            Thinking { thinking: &'a str },
            Text { text: &'a str },
        }
        #[derive(serde::Serialize)]
        struct Message<'a> {
            role: &'static str,
            content: &'a [Block<'a>],
            timestamp: u64,
        }
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Delta<'a> {
            delta_text: &'a str,
            message: Message<'a>,
        }
        let blocks = [Block::Thinking { thinking }, Block::Text { text }];
        let content = if thinking.is_empty() { &blocks[1..] } else { &blocks[..] };
        let delta = Delta { delta_text: pending, message: Message { role: "assistant", content, timestamp: now_ms() } };
        self.chat_event_with(ChatState::Delta, &delta, None);
        self.run.progress.send_modify(|p| text.clone_into(&mut p.text));
        pending.clear();
        *last_sent = Some(Instant::now());
    }

    /// Persists the partial (once, keyed `<runId>:assistant`) and announces the abort.
    async fn aborted(&self, partial: &str) {
        let origin = self.run.origin();
        // Calls waiting for approval are denied (recorded), each with its denied result; at a
        // shutdown they stay waiting on disk, for the restarted gateway to take up.
        let waits = if origin == "shutdown" {
            vec![]
        } else {
            crate::approvals::abort_run(&self.gw, &self.run.run_id, origin).await
        };
        for (id, name, denied) in waits {
            let result = pincer_agent::run::tool_result_message(&id, &name, Err(denied));
            match self.gw.append(&self.session, NewEntry::message(result)).await {
                Ok(a) => {
                    self.session_message(&a.entry);
                    self.agent_event(AgentUpdate::ToolResult { message: &a.entry["message"] });
                }
                Err(e) => tracing::warn!(session = %self.session.key, "the denied result was not written: {e}"),
            }
        }
        let mut written = None;
        if !partial.trim().is_empty() {
            let key = crate::durable::reply_key(&self.run.run_id);
            let meta = json!({"aborted": true, "origin": origin, "runId": self.run.run_id});
            let msg = injected_message(partial, Some(&key), Some(meta));
            written = Some(match self.gw.append(&self.session, NewEntry::message(msg.clone())).await {
                Ok(a) => {
                    if a.appended {
                        self.session_message(&a.entry);
                    }
                    with_meta(&a.entry, &self.run.run_id)
                }
                Err(e) => {
                    tracing::warn!(session = %self.session.key, "chat.abort transcript append failed: {e}");
                    msg
                }
            });
        }
        let marks = written.is_none()
            && origin != "shutdown"
            && self.user_on_disk.load(std::sync::atomic::Ordering::Relaxed)
            && !self.run.moving_aside.load(std::sync::atomic::Ordering::Relaxed)
            && !self.gw.stopping().is_cancelled();
        if marks {
            // Stopped before any reply was written: marked on disk, so that no restart runs again
            // what its user stopped (a shutdown's turn is resumed: nobody asked it to stop; a
            // reset's or delete's transcript goes aside, where no restart looks).
            let why = format!("stopped ({origin}) before any reply was written");
            let marker = crate::durable::marker(crate::durable::INTERRUPTED, &self.run.run_id, &why);
            if let Err(e) = self.gw.append(&self.session, marker).await {
                tracing::warn!(session = %self.session.key, run = %self.run.run_id, "cannot mark a stopped turn: {e}");
            }
        }
        self.ended(TurnOutcome::Aborted(written.clone()));
        self.end_event(ChatState::Aborted, &RunEnded::stopped(origin, written.as_ref()));
        // The lifecycle `end` goes out before the run lets go of its key: whoever waits for the
        // run (`agent.wait`) has heard every event of it once it returns.
        self.lifecycle_end();
        self.finish(Ok(RunStatus::Aborted));
    }
}

/// Most compactions for context overflows in one turn.
const MAX_OVERFLOW_COMPACTIONS: usize = 4;

/// How a streamed run ended.
enum StreamEnd {
    /// Final sent; the last assistant message's usage.
    Finished { usage: Option<Value> },
    /// The provider said the context is too long (not announced yet); whether compacting may
    /// still help.
    Overflow { message: String, entry: Option<Arc<Value>>, may_recover: bool },
    /// Error or abort, already announced.
    Other,
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Appends a run's assistant and toolResult messages through the store.
struct StoreSink {
    gw: Arc<Engine>,
    session: SessionRef,
}

impl TranscriptSink for StoreSink {
    fn append_message(&self, message: Value) -> pincer_agent::SinkFuture<'_> {
        Box::pin(async move {
            self.gw.append(&self.session, NewEntry::message(message)).await.map(|a| a.entry).map_err(SinkError::new)
        })
    }
}
