//! Pi's rules as plain functions over JSON values, in one place for every crate: the message
//! conversion the model sees ([`llm::convert_to_llm`], `bashExecutionToText`, the summary
//! wrappers), the JavaScript semantics they depend on ([`js`]: truthiness, `String(v)`,
//! `JSON.stringify`, UTF-16 lengths, number printing, sort order), and the two tiny helpers every
//! crate needs alike ([`now_ms`], [`lock`]). No I/O, no async: the agent, the compaction and the
//! gateway all call these, so they cannot disagree.

pub mod js;
pub mod llm;

pub use llm::MESSAGE_ROLES;

use std::sync::{Mutex, MutexGuard};

/// `Date.now()`: milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Locks a mutex, ignoring poisoning: a panic elsewhere must not take the gateway down with it,
/// and every value guarded this way stays consistent between statements.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Longest session title or message headline shown, in characters (OpenClaw's
/// `BRANCH_HEADLINE_MAX_CHARS`).
pub const HEADLINE_CHARS: usize = 120;

/// A message's text as one line for a title or a headline: its text blocks joined, as [`one_line`].
pub fn headline(content: Option<&serde_json::Value>, max_chars: usize) -> String {
    one_line(&text_blocks(content).concat(), max_chars)
}

/// `text` with whitespace runs as one space, trimmed, at most `max_chars` characters (`…` ending
/// one that was cut).
pub fn one_line(text: &str, max_chars: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.chars().count() > max_chars {
        true => text.chars().take(max_chars.saturating_sub(1)).collect::<String>() + "…",
        false => text,
    }
}

/// The text blocks of a message's `content` in order: a string content is one block; blocks of
/// another type are skipped; a text block without a string `text` counts as `""`.
pub fn text_blocks(content: Option<&serde_json::Value>) -> Vec<&str> {
    use serde_json::Value;
    match content {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .map(|b| b.get("text").and_then(Value::as_str).unwrap_or(""))
            .collect(),
        _ => Vec::new(),
    }
}
