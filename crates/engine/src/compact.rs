//! Compaction in the gateway: on demand (`sessions.compact`, `/compact`) and automatically (after a
//! turn whose context is over `context_window − reserve`, and on a provider context-length error,
//! after which the turn is retried once). Progress goes out as `agent` events on stream
//! `compaction` (start, end, error) and `sessions.changed`; a failed compaction writes nothing.

use crate::hub::Audience;
use crate::protocol::CompactionUpdate;
use crate::sessions::SessionRef;
use crate::state::Engine;
use pincer_agent::CancellationToken;
use pincer_compaction::{
    assistant_usage, calculate_context_tokens, estimate_context_tokens, CompactionOutcome, CompactionReason,
};
use serde_json::Value;
use std::sync::Arc;

fn event(gw: &Engine, session: &SessionRef, data: CompactionUpdate<'_>) {
    let p = crate::protocol::AgentEvent {
        run_id: None,
        seq: None,
        session_key: &session.key,
        agent_id: None,
        session_id: None,
        stream: "compaction",
        ts: pincer_pi::now_ms(),
        data: &data,
    };
    gw.hub.publish("agent", Some(&session.key), serde_json::to_value(p).unwrap_or_default(), false, Audience::All);
}

/// Writes a compaction's entry through the session's owner, like every append of the engine.
struct Writer {
    gw: Arc<Engine>,
    session: SessionRef,
}

impl pincer_compaction::CompactionWriter for Writer {
    fn append_at_leaf(
        &self,
        entry: pincer_store::NewEntry,
        leaf: Option<String>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<pincer_store::Appended, pincer_store::StoreError>> + Send + '_>,
    > {
        Box::pin(self.gw.owners.append_at_leaf(&self.session, entry, leaf))
    }
}

/// The model a session's compaction uses.
fn model_spec(gw: &Engine, session: &SessionRef) -> String {
    gw.settings.compaction.model.clone().unwrap_or_else(|| gw.session_model(session))
}

/// Compacts one session now. The caller holds the session's queue slot.
pub async fn run(
    gw: &Arc<Engine>,
    session: &SessionRef,
    reason: CompactionReason,
    instructions: Option<String>,
    cancel: CancellationToken,
) -> Result<CompactionOutcome, String> {
    let model = gw.settings.providers.resolve(&model_spec(gw, session)).map_err(|e| e.to_string())?;
    let mut settings = gw.settings.compaction.clone();
    if instructions.is_some() {
        settings.custom_instructions = instructions;
    }
    event(gw, session, CompactionUpdate::Start { reason: reason.as_str() });
    let writer = Writer { gw: gw.clone(), session: session.clone() };
    match pincer_compaction::compact_with(&session.path, &gw.store, &writer, &model, &settings, reason, cancel).await {
        Ok(o) => {
            let end = CompactionUpdate::End {
                reason: reason.as_str(),
                tokens_before: o.tokens_before,
                first_kept_entry_id: &o.first_kept_entry_id,
                entry_id: o.entry.get("id"),
            };
            event(gw, session, end);
            gw.hub.sessions_changed(&session.key, "compaction");
            Ok(o)
        }
        Err(e) => {
            let msg = e.to_string();
            tracing::warn!(session = %session.key, "compaction ({}) did not run: {msg}", reason.as_str());
            event(gw, session, CompactionUpdate::Error { reason: reason.as_str(), error: &msg });
            Err(msg)
        }
    }
}

/// Whether a session's context is over the threshold after a turn: tokens from the provider's
/// reported usage of the last assistant message when there is one, else Pi's estimate of the
/// session's context (the cached one, which the turn's appends extended).
pub async fn over_threshold(gw: &Arc<Engine>, session: &SessionRef, last_usage: Option<&Value>) -> bool {
    let Ok(model) = gw.settings.providers.resolve(&model_spec(gw, session)) else { return false };
    let Some(window) = model.model.context_window else { return false };
    let reported = last_usage.map(calculate_context_tokens).unwrap_or(0);
    let tokens = if reported > 0 {
        reported
    } else {
        let Ok(messages) = gw.context(session).await else { return false };
        // Pi's estimate needs only the messages from the last assistant usage on: decode those
        // (walking back), not the whole context.
        let mut tail: Vec<Value> = Vec::new();
        for m in messages.iter().rev() {
            let v = m.value();
            let has_usage = assistant_usage(&v).is_some();
            tail.push(v);
            if has_usage {
                break;
            }
        }
        tail.reverse();
        estimate_context_tokens(&tail).tokens
    };
    gw.settings.compaction.over_threshold(tokens, window)
}

/// A short sentence for the user about a compaction.
pub fn describe(o: &CompactionOutcome) -> String {
    format!(
        "Compacted: {} earlier message(s) summarised (about {} tokens before); the conversation continues from entry {}.",
        o.summarized_messages, o.tokens_before, o.first_kept_entry_id
    )
}
