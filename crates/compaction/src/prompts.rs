//! The summarization requests Pi's `compact()` sends for a preparation: the history summary
//! (`generateSummary`, with `<previous-summary>` and the UPDATE prompt on repeated compactions) and
//! the split-turn prefix summary (`generateTurnPrefixSummary`), with their `maxTokens` (§12.5).

use crate::prepare::Preparation;
use crate::serialize::{convert_to_llm, serialize_conversation};
use serde_json::{json, Value};

pub use crate::prompt_texts::{
    SUMMARIZATION_PROMPT, SUMMARIZATION_SYSTEM_PROMPT, TURN_PREFIX_SUMMARIZATION_PROMPT, UPDATE_SUMMARIZATION_PROMPT,
};

/// The literal history summary Pi uses when a split turn has no earlier history.
pub const NO_PRIOR_HISTORY: &str = "No prior history.";
/// What joins the history summary and the turn-prefix summary.
pub const SPLIT_TURN_SEPARATOR: &str = "\n\n---\n\n**Turn Context (split turn):**\n\n";

/// Which summary a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummaryKind {
    /// The conversation before the kept tail (or before the split turn).
    History,
    /// The beginning of a turn whose end is kept.
    TurnPrefix,
}

impl SummaryKind {
    /// The fixtures' spelling (`history` / `prefix`).
    pub fn as_str(self) -> &'static str {
        match self {
            SummaryKind::History => "history",
            SummaryKind::TurnPrefix => "prefix",
        }
    }
}

/// One summarization call: system prompt, the single user message's text, and `maxTokens`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRequest {
    pub kind: SummaryKind,
    pub system_prompt: &'static str,
    pub text: String,
    pub max_tokens: u64,
}

impl SummaryRequest {
    /// As the fixtures record a call: `{kind, systemPrompt, messages:[user text], options:{maxTokens}}`.
    pub fn to_pi_call(&self) -> Value {
        json!({"kind": self.kind.as_str(), "systemPrompt": self.system_prompt,
               "messages": [{"role": "user", "content": [{"type": "text", "text": self.text}]}],
               "options": {"maxTokens": self.max_tokens}})
    }

    /// The user message sent to the model (Pi stamps it with `Date.now()`).
    pub fn user_message(&self, timestamp_ms: u64) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": self.text}], "timestamp": timestamp_ms})
    }
}

/// `generateSummary`'s request for `messages` (Pi messages, before `convertToLlm`).
pub fn history_request(
    messages: &[Value],
    reserve_tokens: u64,
    previous_summary: Option<&str>,
    custom_instructions: Option<&str>,
) -> SummaryRequest {
    history_request_from_text(
        &serialize_conversation(&convert_to_llm(messages)),
        reserve_tokens,
        previous_summary,
        custom_instructions,
    )
}

/// [`history_request`] from an already serialized conversation.
pub fn history_request_from_text(
    conversation: &str,
    reserve_tokens: u64,
    previous_summary: Option<&str>,
    custom_instructions: Option<&str>,
) -> SummaryRequest {
    let previous_summary = previous_summary.filter(|s| !s.is_empty());
    let base = if previous_summary.is_some() { UPDATE_SUMMARIZATION_PROMPT } else { SUMMARIZATION_PROMPT };
    let mut text = format!("<conversation>\n{conversation}\n</conversation>\n\n");
    if let Some(prev) = previous_summary {
        text.push_str(&format!("<previous-summary>\n{prev}\n</previous-summary>\n\n"));
    }
    text.push_str(base);
    if let Some(ci) = custom_instructions.filter(|s| !s.is_empty()) {
        text.push_str(&format!("\n\nAdditional focus: {ci}"));
    }
    SummaryRequest {
        kind: SummaryKind::History,
        system_prompt: SUMMARIZATION_SYSTEM_PROMPT,
        text,
        max_tokens: (reserve_tokens as f64 * 0.8).floor() as u64,
    }
}

/// `generateTurnPrefixSummary`'s request.
pub fn turn_prefix_request(messages: &[Value], reserve_tokens: u64) -> SummaryRequest {
    let conversation = serialize_conversation(&convert_to_llm(messages));
    SummaryRequest {
        kind: SummaryKind::TurnPrefix,
        system_prompt: SUMMARIZATION_SYSTEM_PROMPT,
        text: format!("<conversation>\n{conversation}\n</conversation>\n\n{TURN_PREFIX_SUMMARIZATION_PROMPT}"),
        max_tokens: (reserve_tokens as f64 * 0.5).floor() as u64,
    }
}

/// The calls Pi's `compact()` makes for `prep`, in the order it starts them: a split turn with a
/// prefix gets a history call only when there is history, plus the prefix call; otherwise one
/// history call (even when there is nothing to summarize).
pub fn build_summary_request(prep: &Preparation, custom_instructions: Option<&str>) -> Vec<SummaryRequest> {
    let reserve = prep.settings.reserve_tokens;
    let history =
        || history_request(&prep.messages_to_summarize, reserve, prep.previous_summary.as_deref(), custom_instructions);
    if prep.is_split_turn && !prep.turn_prefix_messages.is_empty() {
        let mut calls = Vec::new();
        if !prep.messages_to_summarize.is_empty() {
            calls.push(history());
        }
        calls.push(turn_prefix_request(&prep.turn_prefix_messages, reserve));
        calls
    } else {
        vec![history()]
    }
}

/// Merges the summaries as `compact()` does: history (or [`NO_PRIOR_HISTORY`]) + separator + prefix
/// for a split turn, then the file lists.
pub fn merge_summaries(history: Option<&str>, turn_prefix: Option<&str>, file_ops_suffix: &str) -> String {
    let mut summary = match turn_prefix {
        Some(prefix) => format!("{}{SPLIT_TURN_SEPARATOR}{prefix}", history.unwrap_or(NO_PRIOR_HISTORY)),
        None => history.unwrap_or("").to_owned(),
    };
    summary.push_str(file_ops_suffix);
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_request_shapes() {
        let msgs = vec![json!({"role":"user","content":"hi"})];
        let first = history_request(&msgs, 16384, None, None);
        let update = history_request(&msgs, 16384, Some("OLD"), Some("focus on tests"));
        assert_eq!(first.text, format!("<conversation>\n[User]: hi\n</conversation>\n\n{SUMMARIZATION_PROMPT}"));
        assert_eq!(
            update.text,
            format!(
                "<conversation>\n[User]: hi\n</conversation>\n\n<previous-summary>\nOLD\n</previous-summary>\n\n\
                 {UPDATE_SUMMARIZATION_PROMPT}\n\nAdditional focus: focus on tests"
            )
        );
        assert_eq!((first.max_tokens, turn_prefix_request(&msgs, 16384).max_tokens), (13107, 8192));
    }

    #[test]
    fn merge() {
        assert_eq!(merge_summaries(None, Some("P"), "\n\nF"), format!("No prior history.{SPLIT_TURN_SEPARATOR}P\n\nF"));
        assert_eq!(merge_summaries(Some("H"), None, ""), "H");
    }
}
