//! A turn followed to its end, typed: the text of its reply as it streams, then how it ended
//! ([`TurnEvent`]). Read from the run's progress while it runs here, and from the transcript
//! when it is over (or ran before this look: a retry racing its original, a key answered before).
//! The OpenAI endpoint relays it; nothing here knows a wire format.

use crate::error::EngineError;
use crate::sessions::SessionRef;
use crate::state::{Engine, Progress, RunHandle, TurnOutcome};
use crate::turn::TurnHandle;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;

/// What a followed turn says, in order: its text, then one end.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEvent {
    /// Text added to the reply (a message after a tool step goes on where the last one stopped).
    Text(String),
    /// The turn ended with this message as written (its reply, or the partial it was stopped with;
    /// `Null`: stopped before it wrote one).
    Ended(Value),
    /// The turn failed: what was wrong, and its `errorKind`.
    Failed { message: String, kind: String },
    /// How the turn ended cannot be read back (the transcript is unreadable, or has no reply).
    Unknown(String),
}

/// The text of an assistant message: its text blocks, joined.
pub fn reply_text(message: &Value) -> String {
    pincer_pi::text_blocks(message.get("content")).concat()
}

/// A turn being followed ([`TurnHandle::follow`], [`TurnStream::over`]).
pub struct TurnStream {
    gw: Arc<Engine>,
    /// The run's progress; `None`: read the end from the transcript.
    progress: Option<tokio::sync::watch::Receiver<Progress>>,
    session: SessionRef,
    run_id: String,
    /// Text of the current message already given out.
    current: String,
    queue: VecDeque<TurnEvent>,
    ended: bool,
}

impl TurnHandle {
    /// The turn's events from now on, to its end.
    pub fn follow(&self, gw: &Arc<Engine>, session: &SessionRef, run_id: &str) -> TurnStream {
        TurnStream::new(gw, session, run_id, self.run.as_ref())
    }
}

impl TurnStream {
    fn new(gw: &Arc<Engine>, session: &SessionRef, run_id: &str, run: Option<&Arc<RunHandle>>) -> TurnStream {
        TurnStream {
            gw: gw.clone(),
            progress: run.map(|r| r.progress.subscribe()),
            session: session.clone(),
            run_id: run_id.to_owned(),
            current: String::new(),
            queue: VecDeque::new(),
            ended: false,
        }
    }

    /// Turn `run_id` of `session`, over: its end as the transcript has it.
    pub fn over(gw: &Arc<Engine>, session: &SessionRef, run_id: &str) -> TurnStream {
        TurnStream::new(gw, session, run_id, None)
    }

    /// Gives out what is new of a message whose text so far is `text`.
    fn piece(&mut self, text: &str) {
        let new = match text.strip_prefix(self.current.as_str()) {
            Some(rest) => rest.to_owned(),
            None => text.to_owned(), // the next assistant message of the run (after a tool step)
        };
        self.current = text.to_owned();
        if !new.is_empty() {
            self.queue.push_back(TurnEvent::Text(new));
        }
    }

    /// The next event; `None` after the end.
    pub async fn next(&mut self) -> Option<TurnEvent> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            let Some(rx) = self.progress.as_mut() else {
                self.read_end().await;
                continue;
            };
            let (text, end) = {
                let p = rx.borrow_and_update();
                (p.text.clone(), p.end.clone())
            };
            match end {
                Some(TurnOutcome::AnsweredBefore) => self.progress = None,
                Some(end) => self.finish(end),
                None => {
                    // Empty between messages (a row was just written): not a new message yet, or
                    // the next piece would repeat the whole text.
                    if !text.is_empty() {
                        self.piece(&text);
                    }
                    // A run sets its end before its handle goes; should the handle go without
                    // one (a panic), the transcript tells the end.
                    if let Some(rx) = self.progress.as_mut().filter(|_| self.queue.is_empty()) {
                        if rx.changed().await.is_err() {
                            self.progress = None;
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self, end: TurnOutcome) {
        self.ended = true;
        let msg = match end {
            TurnOutcome::Failed { message, kind } => {
                self.queue.push_back(TurnEvent::Failed { message, kind });
                return;
            }
            TurnOutcome::Replied(msg) | TurnOutcome::Aborted(Some(msg)) => msg,
            TurnOutcome::Aborted(None) | TurnOutcome::AnsweredBefore => Value::Null,
        };
        self.piece(&reply_text(&msg));
        self.queue.push_back(TurnEvent::Ended(msg));
    }

    /// The end of a turn that is over, read from its transcript: the text of its messages (tool
    /// steps and reply) not given out yet, then its reply.
    async fn read_end(&mut self) {
        self.ended = true;
        let (path, id) = (self.session.path.clone(), self.run_id.clone());
        let read = self.gw.blocking(move |gw| {
            crate::durable::replies(&gw.store, &path, &id).map_err(|e| EngineError::Persistence(e.to_string()))
        });
        let replies = match read.await {
            Ok(r) => r,
            Err(e) => return self.queue.push_back(TurnEvent::Unknown(format!("cannot read the transcript: {e}"))),
        };
        let Some(last) = replies.last().cloned() else {
            let why = format!("the turn {} has no reply in its transcript", self.run_id);
            return self.queue.push_back(TurnEvent::Unknown(why));
        };
        if last.get("stopReason").and_then(Value::as_str) == Some("error") {
            let message = last.get("errorMessage").and_then(Value::as_str).unwrap_or("the run failed").to_owned();
            return self.queue.push_back(TurnEvent::Failed { message, kind: "unknown".into() });
        }
        let text: String = replies.iter().map(reply_text).collect();
        let rest = text.strip_prefix(self.current.as_str()).unwrap_or(&text).to_owned();
        if !rest.is_empty() {
            self.queue.push_back(TurnEvent::Text(rest));
        }
        self.queue.push_back(TurnEvent::Ended(last));
    }
}
