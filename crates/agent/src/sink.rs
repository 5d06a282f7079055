//! Where a run's messages go: [`TranscriptSink`] appends one complete message and returns the
//! entry as written (the transcript store implements it in the gateway), and [`MemorySink`], an
//! in-memory implementation that builds Pi v3 `message` entries chained by `parentId`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use serde_json::{json, Value};

/// Appends messages to a session's transcript.
pub trait TranscriptSink: Send + Sync {
    /// Appends one complete message (assistant or toolResult) as the child of the current leaf
    /// and returns the JSONL entry as written: `{type:"message",id,parentId,timestamp,message}`.
    fn append_message(&self, message: Value) -> Pin<Box<dyn Future<Output = Result<Value, String>> + Send + '_>>;
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
    fn append_message(&self, message: Value) -> Pin<Box<dyn Future<Output = Result<Value, String>> + Send + '_>> {
        let result = (|| {
            if let Some(msg) = self.fail_with.lock().map_err(|e| e.to_string())?.clone() {
                return Err(msg);
            }
            let mut entries = self.entries.lock().map_err(|e| e.to_string())?;
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
