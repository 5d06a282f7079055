//! Background requests: a client's housekeeping calls (Open WebUI's chat titles, tags, follow-up
//! suggestions, search queries, image prompts, autocomplete, emoji) are answered by the model but
//! are not conversations, so they are never kept as sessions. Told apart by the header
//! [`EPHEMERAL_HEADER`] (any client; `0` also overrides the recognition below), or by the prompt
//! templates Open WebUI 0.12 sends for them (`open_webui/config.py`, `DEFAULT_*_PROMPT_TEMPLATE`):
//! one user message, no assistant message, whose text opens as one of its templates does.

use super::wire::{ApiError, Conversation};
use axum::http::HeaderMap;
use serde_json::Value;

/// `x-pincer-ephemeral: 1` (or `true`): answer, keep nothing; `0` / `false`: a chat turn even if
/// the request looks like a background task.
pub const EPHEMERAL_HEADER: &str = "x-pincer-ephemeral";

/// How Open WebUI's task prompts open. The `### Task:` templates (title, tags, follow-ups, search
/// and retrieval queries, image prompt, autocomplete) all quote the chat in `<chat_history>`.
const TASK_OPENING: &str = "### Task:";
const TASK_CHAT: &str = "<chat_history>";
/// Its emoji and mixture-of-agents templates, which open otherwise.
const OTHER_TASK_OPENINGS: [&str; 2] = [
    "Your task is to reflect the speaker's likely facial expression through a fitting emoji.",
    "You have been provided with a set of responses from various models to the latest user query:",
];

/// Whether the request is a background request (see the module doc); `unstored`: the client asked
/// that nothing be kept (a Responses request's `store: false`), which only the header overrides. A
/// bad header value is an error.
pub fn is_background(headers: &HeaderMap, conv: &Conversation, unstored: bool) -> Result<bool, ApiError> {
    if let Some(v) = headers.get(EPHEMERAL_HEADER) {
        let v = v.to_str().unwrap_or_default().trim().to_ascii_lowercase();
        return match v.as_str() {
            "1" | "true" => Ok(true),
            "0" | "false" => Ok(false),
            _ => Err(ApiError::bad(format!("{EPHEMERAL_HEADER} must be 1 or 0 (true or false)"))),
        };
    }
    let lone = conv.extra_users.is_empty()
        && conv.tool_results.is_empty()
        && !conv.history.iter().any(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    let text = conv.text.trim_start();
    let task = (text.starts_with(TASK_OPENING) && text.contains(TASK_CHAT))
        || OTHER_TASK_OPENINGS.iter().any(|o| text.starts_with(o));
    Ok(unstored || (lone && task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pincer_store::redact::NoRedaction;
    use serde_json::json;

    fn conv(messages: Value) -> Conversation {
        super::super::wire::conversation(&messages, &NoRedaction).expect("valid")
    }

    #[test]
    fn task_prompts_and_the_header_make_a_background_request() {
        let none = HeaderMap::new();
        let title = "### Task:\nGenerate a concise title summarizing the chat history.\n### Chat History:\n<chat_history>\nUSER: hi\n</chat_history>";
        assert!(is_background(&none, &conv(json!([{"role": "user", "content": title}])), false).expect("ok"));
        // The same words inside a conversation are a chat turn.
        let inside = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": title}]);
        assert!(!is_background(&none, &conv(inside), false).expect("ok"));
        assert!(
            !is_background(&none, &conv(json!([{"role": "user", "content": "### Task: plan"}])), false).expect("ok")
        );
        let mut on = HeaderMap::new();
        on.insert(EPHEMERAL_HEADER, "1".parse().expect("value"));
        assert!(is_background(&on, &conv(json!([{"role": "user", "content": "x"}])), false).expect("ok"));
        let mut off = HeaderMap::new();
        off.insert(EPHEMERAL_HEADER, "0".parse().expect("value"));
        assert!(!is_background(&off, &conv(json!([{"role": "user", "content": title}])), false).expect("ok"));
        // A Responses request with `store: false` keeps nothing, unless the header says otherwise.
        assert!(is_background(&none, &conv(json!([{"role": "user", "content": "x"}])), true).expect("ok"));
        assert!(!is_background(&off, &conv(json!([{"role": "user", "content": "x"}])), true).expect("ok"));
        let mut bad = HeaderMap::new();
        bad.insert(EPHEMERAL_HEADER, "maybe".parse().expect("value"));
        assert!(is_background(&bad, &conv(json!([{"role": "user", "content": "x"}])), false).is_err());
    }
}
