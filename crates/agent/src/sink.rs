//! Where a run's messages go: [`TranscriptSink`] appends one complete message and returns the
//! entry as written (the transcript store implements it in the gateway), and [`MemorySink`], an
//! in-memory implementation that builds Pi v3 `message` entries chained by `parentId`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use serde_json::{json, Value};

/// Why a message could not be appended: the transcript store's own error, kept as the source.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SinkError(Box<dyn std::error::Error + Send + Sync>);

impl SinkError {
    /// Wraps the sink's error (a store error, or a message).
    pub fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> SinkError {
        SinkError(e.into())
    }
}

/// What [`TranscriptSink::append_message`] returns.
pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, SinkError>> + Send + 'a>>;

/// Appends messages to a session's transcript.
pub trait TranscriptSink: Send + Sync {
    /// Appends one complete message (assistant or toolResult) as the child of the current leaf
    /// and returns the JSONL entry as written: `{type:"message",id,parentId,timestamp,message}`.
    fn append_message(&self, message: Value) -> SinkFuture<'_>;
}

/// In-memory transcript for tests and benches: 8-hex ids from a v4 uuid, chained by `parentId`.
#[derive(Debug, Default)]
pub struct MemorySink {
    entries: Mutex<Vec<Value>>,
    fail_with: Mutex<Option<String>>,
}

impl MemorySink {
    /// An empty transcript whose first entry is a root.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries written so far, in order.
    pub fn entries(&self) -> Vec<Value> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Makes every later append fail with this message (to test persistence failures).
    pub fn fail_appends(&self, message: impl Into<String>) {
        if let Ok(mut f) = self.fail_with.lock() {
            *f = Some(message.into());
        }
    }
}

impl TranscriptSink for MemorySink {
    fn append_message(&self, message: Value) -> SinkFuture<'_> {
        let result = (|| {
            if let Some(msg) = pincer_pi::lock(&self.fail_with).clone() {
                return Err(SinkError::new(msg));
            }
            let mut entries = pincer_pi::lock(&self.entries);
            let parent = entries.last().and_then(|e| e.get("id")).cloned().unwrap_or(Value::Null);
            let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
            let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let entry =
                json!({"type": "message", "id": id, "parentId": parent, "timestamp": timestamp, "message": message});
            entries.push(entry.clone());
            Ok(entry)
        })();
        Box::pin(std::future::ready(result))
    }
}
