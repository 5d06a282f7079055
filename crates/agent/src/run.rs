//! Agent runs: [`start_run`] drives model calls and the tool-call loop for one chat turn and
//! streams [`RunEvent`]s.
//!
//! Order of effects in a run:
//! 1. call the model on the context (system prompt, Pi context messages, tools), streaming
//!    `TextDelta`/`ThinkingDelta` (each only the new piece: a consumer that wants the whole text
//!    accumulates it, so a long reply costs O(chunk) per chunk, not O(text));
//! 2. when the message is complete, append it through the [`TranscriptSink`] and announce the
//!    entry as written (`Usage`, then `Persisted`);
//! 3. if it asked for tools: announce each (`ToolCallStart`, in call order), run them all
//!    concurrently, and append their `toolResult` entries in call order (Pi's rule), each announced
//!    once written (`Persisted`); then go back to 1 (at most `max_turns` model calls). While a
//!    tool runs, its partial results are announced (`ToolCallUpdate`, at most one per call every
//!    [`UPDATE_INTERVAL`], the newest kept when the reader is slow); they are never appended;
//! 4. else end with `Final` (the last assistant entry); also after 2–3 when the message called a
//!    client tool ([`RunRequest::client_tools`]): those calls are handed back, not run.
//!
//! A failed model call appends the assistant message with `stopReason: "error"` and ends with
//! `Error`. So does a reply whose text and thinking grow past `max_reply_bytes`: the run stops
//! reading the provider and appends what it has (`ErrorKind::ReplyTooLarge`). A run that panics is
//! still ended by [`start_run`]: an error assistant message is appended if the sink can take it,
//! then `Error` with `ErrorKind::Internal`. Cancelling the token at any point drops the stream (or the tool) and ends with
//! `Aborted` carrying the partial text; the run appends nothing after that.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::ResolvedModel;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};

use crate::message::{AssistantDraft, StopReason};
use crate::provider::{ErrorKind, ModelRequest, ModelStream, StreamDelta};
use crate::sink::TranscriptSink;
use crate::tools::ToolRegistry;
use pincer_pi::now_ms;

/// Everything a run needs.
pub struct RunRequest {
    /// The model to call.
    pub model: ResolvedModel,
    /// System prompt.
    pub system_prompt: Option<String>,
    /// Pi context messages (active branch, compaction applied), ending with the new user message.
    /// Shared with the caller's cache: a run never copies the history.
    pub messages: crate::context::Messages,
    /// Tools offered to the model.
    pub tools: Arc<ToolRegistry>,
    /// Tools a client runs itself (the OpenAI endpoint's `tools`), offered beside `tools`: a
    /// message calling any of them ends the run (see [`CLIENT_CALLS_FIELD`]). Empty for most runs.
    pub client_tools: Arc<[crate::provider::ToolSpec]>,
    /// Where assistant and toolResult messages are appended.
    pub sink: Arc<dyn TranscriptSink>,
    /// Aborts the run.
    pub cancel: CancellationToken,
    /// Most model calls in this run (tool loops included); at least 1.
    pub max_turns: usize,
    /// For logs.
    pub run_id: String,
    /// Most bytes of text plus thinking one assistant message may stream; beyond it the run is cut
    /// ([`DEFAULT_MAX_REPLY_BYTES`] unless configured).
    pub max_reply_bytes: usize,
}

/// Field of an assistant message that called client tools ([`RunRequest::client_tools`]): the ids
/// of those calls, handed back to the client instead of run. When one message calls both kinds, the
/// agent's calls run first (their results written in source order), then the run ends with
/// `Final` on that message; the client's results come with its next request.
pub const CLIENT_CALLS_FIELD: &str = "clientToolCalls";

/// Default of [`RunRequest::max_reply_bytes`]: 4 MiB.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// What a run reports, in order. Every append is announced by `Persisted` with the entry as
/// written; the run ends with exactly one of `Final`, `Error`, `Aborted`.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// Text streamed: the new piece of the current assistant message (the consumer accumulates).
    TextDelta {
        /// New text.
        delta: String,
    },
    /// Reasoning streamed: the new piece.
    ThinkingDelta {
        /// New reasoning.
        delta: String,
    },
    /// A tool is about to run.
    ToolCallStart {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        arguments: Value,
    },
    /// A running tool's partial result (live only: never in the transcript). Always after its
    /// `ToolCallStart` and before its toolResult's `Persisted`; each replaces the previous one.
    ToolCallUpdate {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Pi's partial tool result, `{content, details?}`.
        partial: Value,
    },
    /// An assistant or toolResult message was appended; the entry as written.
    Persisted {
        /// `{type:"message",id,parentId,timestamp,message}`, shared with the events after it.
        entry: Arc<Value>,
    },
    /// Pi usage object of the assistant message just completed.
    Usage(Value),
    /// The model request failed and is about to be sent again (after `retry.delay`).
    Retrying(crate::provider::Retry),
    /// The run ended normally; the last assistant entry (already announced by `Persisted`).
    Final {
        /// The entry.
        entry: Arc<Value>,
    },
    /// The run failed.
    Error {
        /// The persisted assistant message with `stopReason: "error"`, if it could be appended.
        entry: Option<Arc<Value>>,
        /// What happened, naming the provider.
        message: String,
        /// Classification for `errorKind`.
        kind: ErrorKind,
    },
    /// The run was cancelled. Nothing of it is persisted by the run; the caller persists the partial.
    Aborted {
        /// Text of the assistant message in flight ("" when none).
        partial_text: String,
        /// That message with `stopReason: "aborted"`, when something had streamed.
        partial_message: Option<Value>,
    },
}

/// Capacity of the event channel; a slow reader slows the run rather than growing memory.
pub const EVENT_BUFFER: usize = 256;

/// Least time between two `ToolCallUpdate`s of one call (OpenClaw's live tool update interval,
/// `LIVE_EXEC_UPDATE_MIN_INTERVAL_MS`); partials reported in between are coalesced into the newest.
pub const UPDATE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Starts the run on the tokio runtime and returns its events. The run goes on if the
/// receiver is dropped; cancel the token to stop it. A panic inside the run does not leave the
/// receiver hanging: it gets `Error` (kind `Internal`, "the run panicked: …"), preceded by the
/// `Persisted` error assistant entry when the sink could append it.
pub fn start_run(req: RunRequest) -> mpsc::Receiver<RunEvent> {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let (sink, model, run_id) = (req.sink.clone(), req.model.clone(), req.run_id.clone());
    tokio::spawn(async move {
        let outcome = std::panic::AssertUnwindSafe(run(req, tx.clone())).catch_unwind().await;
        if let Err(panic) = outcome {
            let what = panic_text(panic.as_ref());
            let message = format!("the run panicked: {what}");
            tracing::error!(run_id = %run_id, "{message}");
            let msg = AssistantDraft::new().to_message(&model, StopReason::Error, Some(&message));
            let entry = match std::panic::AssertUnwindSafe(sink.append_message(msg)).catch_unwind().await {
                Ok(Ok(entry)) => Some(Arc::new(entry)),
                Ok(Err(e)) => {
                    tracing::warn!(run_id = %run_id, "cannot append the error message of a panicked run: {e}");
                    None
                }
                Err(_) => None,
            };
            if let Some(entry) = &entry {
                let _ = tx.send(RunEvent::Persisted { entry: entry.clone() }).await;
            }
            let _ = tx.send(RunEvent::Error { entry, message, kind: ErrorKind::Internal }).await;
        }
    });
    rx
}

/// The message of a panic payload (`panic!` with a literal or a formatted string).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Runs to the end on the current task, sending events to `tx`.
pub async fn run(req: RunRequest, tx: mpsc::Sender<RunEvent>) {
    tracing::debug!(run_id = %req.run_id, model = %req.model.spec(), "run started");
    let run_id = req.run_id.clone();
    match (Runner { req, tx }).go().await {
        RunEvent::Error { message, kind, .. } => {
            tracing::warn!(run_id = %run_id, kind = kind.as_str(), "run failed: {message}");
        }
        other => tracing::debug!(run_id = %run_id, "run ended: {}", end_name(&other)),
    }
}

fn end_name(ev: &RunEvent) -> &'static str {
    match ev {
        RunEvent::Final { .. } => "final",
        RunEvent::Aborted { .. } => "aborted",
        RunEvent::Error { .. } => "error",
        RunEvent::TextDelta { .. }
        | RunEvent::ThinkingDelta { .. }
        | RunEvent::ToolCallStart { .. }
        | RunEvent::ToolCallUpdate { .. }
        | RunEvent::Persisted { .. }
        | RunEvent::Usage(_)
        | RunEvent::Retrying(_) => "other",
    }
}

struct Runner {
    req: RunRequest,
    tx: mpsc::Sender<RunEvent>,
}

enum Step<T> {
    Done(T),
    Cancelled,
}

impl Runner {
    async fn emit(&self, ev: RunEvent) {
        let _ = self.tx.send(ev).await;
    }

    async fn unless_cancelled<T>(&self, fut: impl std::future::Future<Output = T>) -> Step<T> {
        tokio::select! {
            biased;
            () = self.req.cancel.cancelled() => Step::Cancelled,
            v = fut => Step::Done(v),
        }
    }

    async fn aborted(&self, draft: Option<&AssistantDraft>) -> RunEvent {
        let (partial_text, partial_message) = match draft.filter(|d| !d.is_empty()) {
            Some(d) => (d.text(), Some(d.to_message(&self.req.model, StopReason::Aborted, None))),
            None => (String::new(), None),
        };
        let ev = RunEvent::Aborted { partial_text, partial_message };
        self.emit(ev.clone()).await;
        ev
    }

    /// Appends and announces; `Err` carries the terminal error event already emitted.
    async fn persist(&self, message: Value) -> Result<Arc<Value>, RunEvent> {
        match self.req.sink.append_message(message).await {
            Ok(entry) => {
                let entry = Arc::new(entry);
                self.emit(RunEvent::Persisted { entry: entry.clone() }).await;
                Ok(entry)
            }
            Err(e) => {
                let ev = RunEvent::Error {
                    entry: None,
                    message: format!("cannot append to the transcript: {e}"),
                    kind: ErrorKind::Unknown,
                };
                self.emit(ev.clone()).await;
                Err(ev)
            }
        }
    }

    async fn fail(&self, draft: &AssistantDraft, message: String, kind: ErrorKind) -> RunEvent {
        let msg = draft.to_message(&self.req.model, StopReason::Error, Some(&message));
        let entry = match self.persist(msg).await {
            Ok(entry) => entry,
            Err(ev) => return ev,
        };
        let ev = RunEvent::Error { entry: Some(entry), message, kind };
        self.emit(ev.clone()).await;
        ev
    }

    /// Announces a running call's partials (the newest, at most every [`UPDATE_INTERVAL`]) until
    /// the call ends; waiting on a slow reader holds up the announcements, never the tool.
    async fn forward_updates(
        &self,
        mut rx: tokio::sync::watch::Receiver<Option<crate::tools::ToolOutput>>,
        id: &str,
        name: &str,
    ) -> std::convert::Infallible {
        loop {
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            let partial = rx.borrow_and_update().as_ref().map(crate::tools::ToolOutput::to_value);
            if let Some(partial) = partial {
                self.emit(RunEvent::ToolCallUpdate { id: id.to_owned(), name: name.to_owned(), partial }).await;
                tokio::time::sleep(UPDATE_INTERVAL).await;
            }
        }
    }

    async fn go(self) -> RunEvent {
        let mut context = self.req.messages.clone();
        let specs: Arc<[crate::provider::ToolSpec]> = match self.req.client_tools.is_empty() {
            true => self.req.tools.specs(),
            false => self.req.tools.specs().iter().chain(self.req.client_tools.iter()).cloned().collect(),
        };
        let max_turns = self.req.max_turns.max(1);
        for turn in 1..=max_turns {
            let request = ModelRequest {
                system_prompt: self.req.system_prompt.clone(),
                messages: context.clone(),
                tools: specs.clone(),
            };
            // A full event buffer drops the notice, never the retry.
            let tx = self.tx.clone();
            let on_retry = move |r| drop(tx.try_send(RunEvent::Retrying(r)));
            let opened = match self.unless_cancelled(ModelStream::open_with(&self.req.model, &request, &on_retry)).await
            {
                Step::Cancelled => return self.aborted(None).await,
                Step::Done(r) => r,
            };
            let mut stream = match opened {
                Ok(s) => s,
                Err(e) => return self.fail(&AssistantDraft::new(), e.to_string(), e.kind).await,
            };
            // Bytes of text and thinking this message has streamed (the draft holds the text itself).
            let mut streamed = 0usize;
            loop {
                let next = match self.unless_cancelled(stream.next()).await {
                    Step::Cancelled => return self.aborted(Some(stream.draft())).await,
                    Step::Done(n) => n,
                };
                match next {
                    Ok(Some(StreamDelta::Text(delta))) => {
                        streamed += delta.len();
                        self.emit(RunEvent::TextDelta { delta }).await;
                    }
                    Ok(Some(StreamDelta::Thinking(delta))) => {
                        streamed += delta.len();
                        self.emit(RunEvent::ThinkingDelta { delta }).await;
                    }
                    Ok(None) => break,
                    Err(e) => return self.fail(stream.draft(), e.to_string(), e.kind).await,
                }
                if streamed > self.req.max_reply_bytes {
                    let message = format!(
                        "provider {}: reply exceeded the {}-byte limit (max_reply_bytes); the stream was cut",
                        self.req.model.provider.name, self.req.max_reply_bytes
                    );
                    // Returning drops the stream, which closes the connection.
                    return self.fail(stream.draft(), message, ErrorKind::ReplyTooLarge).await;
                }
            }
            if self.req.cancel.is_cancelled() {
                return self.aborted(Some(stream.draft())).await;
            }
            let draft = stream.into_draft();
            let stop = draft.stop_reason.unwrap_or(StopReason::Stop);
            let mut message = draft.to_message(&self.req.model, stop, None);
            self.emit(RunEvent::Usage(message.get("usage").cloned().unwrap_or(Value::Null))).await;
            let mut calls = draft.tool_calls();
            let is_client = |name: &str| self.req.client_tools.iter().any(|t| t.name == name);
            let handed_back: Vec<Value> =
                calls.iter().filter(|c| is_client(&c.name)).map(|c| Value::from(c.id.as_str())).collect();
            if !handed_back.is_empty() {
                message[CLIENT_CALLS_FIELD] = Value::Array(handed_back.clone());
                calls.retain(|c| !is_client(&c.name));
            }
            // The next model call's context, needed only when the loop goes on.
            let goes_on = stop == StopReason::ToolUse && !calls.is_empty();
            let shared = goes_on.then(|| crate::context::ContextMessage::shared(&message));
            let entry = match self.persist(message).await {
                Ok(e) => e,
                Err(ev) => return ev,
            };
            let Some(shared) = shared.filter(|_| !calls.is_empty()) else {
                let ev = RunEvent::Final { entry };
                self.emit(ev.clone()).await;
                return ev;
            };
            context.push(shared);
            // Pi's rule: the calls are announced in order, run concurrently, and their results
            // chained in the assistant's source order, each written before it is announced.
            for call in &calls {
                self.emit(RunEvent::ToolCallStart {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                })
                .await;
            }
            let tools = &self.req.tools;
            let this = &self;
            let mut running: FuturesOrdered<_> = calls
                .iter()
                .map(|call| async move {
                    let Some(e) = &call.arguments_error else {
                        let (updates, rx) = crate::tools::ToolUpdates::channel();
                        let tool = crate::tools::CALL_ID.scope(
                            Arc::from(call.id.as_str()),
                            tools.execute_with_updates(&call.name, call.arguments.clone(), updates),
                        );
                        // The forwarder ends with the tool: a partial not yet sent is superseded by the result.
                        return tokio::select! {
                            biased;
                            out = tool => out,
                            never = this.forward_updates(rx, &call.id, &call.name) => match never {},
                        };
                    };
                    Err(crate::tools::ToolError::InvalidArguments { tool: call.name.clone(), reason: e.clone() })
                })
                .collect();
            for call in &calls {
                let outcome = match self.unless_cancelled(running.next()).await {
                    Step::Cancelled => return self.aborted(None).await,
                    Step::Done(Some(o)) => o,
                    Step::Done(None) => break,
                };
                let result = tool_result_message(&call.id, &call.name, outcome);
                if self.req.cancel.is_cancelled() {
                    return self.aborted(None).await;
                }
                let shared = crate::context::ContextMessage::shared(&result);
                if let Err(ev) = self.persist(result).await {
                    return ev;
                }
                context.push(shared);
            }
            if !handed_back.is_empty() {
                // The client runs the rest: the run ends on the message that called them.
                let ev = RunEvent::Final { entry };
                self.emit(ev.clone()).await;
                return ev;
            }
            if turn == max_turns {
                let message = format!(
                    "turn limit reached: the model asked for tools again after {max_turns} model calls; send another message to continue"
                );
                return self.fail(&AssistantDraft::new(), message, ErrorKind::Unknown).await;
            }
        }
        // Unreachable: the loop returns on its last turn.
        self.fail(&AssistantDraft::new(), "turn loop ended unexpectedly".to_owned(), ErrorKind::Unknown).await
    }
}

/// Pi's toolResult message.
pub fn tool_result_message(
    id: &str,
    name: &str,
    outcome: Result<crate::tools::ToolOutput, crate::tools::ToolError>,
) -> Value {
    let (content, details, is_error) = match outcome {
        Ok(out) => (Value::Array(out.content), out.details, false),
        Err(e) => (serde_json::json!([{"type": "text", "text": e.to_string()}]), None, true),
    };
    let mut m = Map::new();
    m.insert("role".into(), "toolResult".into());
    m.insert("toolCallId".into(), id.into());
    m.insert("toolName".into(), name.into());
    m.insert("content".into(), content);
    if let Some(d) = details {
        m.insert("details".into(), d);
    }
    m.insert("isError".into(), is_error.into());
    m.insert("timestamp".into(), now_ms().into());
    Value::Object(m)
}
