//! `pincer/echo`: the built-in offline model. It needs no network and no key, says plainly
//! that it is the offline echo model, repeats the last user message, and streams its reply
//! word by word so the whole pipeline (deltas, persistence, abort) can be tried without a key.

use std::collections::VecDeque;

use serde_json::Value;

use super::wire::{block_type, blocks, content_string, joined_text};

/// The first words of every echo reply.
pub const ECHO_PREFIX: &str =
    "[pincer/echo] This is the offline echo model, not a real model: no model provider is configured.";

/// The reply for this context, split into streamable chunks (each word keeps its trailing space).
pub(crate) fn reply_chunks(messages: &crate::context::Messages) -> VecDeque<String> {
    let last_user =
        messages.iter().rev().map(|m| m.value()).find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    let said = match last_user {
        None => " There is no user message to echo.".to_owned(),
        Some(m) => {
            let (text, image_count) = match content_string(&m) {
                Some(s) => (s.to_owned(), 0),
                None => {
                    let content = blocks(&m);
                    (joined_text(content), content.iter().filter(|b| block_type(b) == "image").count())
                }
            };
            let images = match image_count {
                0 => String::new(),
                1 => " (with 1 image)".to_owned(),
                n => format!(" (with {n} images)"),
            };
            format!(" You said: {text}{images}")
        }
    };
    let full = format!("{ECHO_PREFIX}{said}");
    let mut chunks = VecDeque::new();
    let mut start = 0;
    for (i, ch) in full.char_indices() {
        if ch == ' ' && i > start {
            chunks.push_back(full[start..i].to_owned());
            start = i;
        }
    }
    chunks.push_back(full[start..].to_owned());
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn echoes_the_last_user_message_in_chunks() {
        let chunks = reply_chunks(&crate::Messages::from(vec![
            crate::ContextMessage::shared(json!({"role":"user","content":"first"})),
            crate::ContextMessage::shared(
                json!({"role":"user","content":[{"type":"text","text":"hello there"},{"type":"image","data":"AA==","mimeType":"image/png"}]}),
            ),
        ]));
        assert_eq!(
            chunks.iter().map(String::as_str).collect::<String>(),
            format!("{ECHO_PREFIX} You said: hello there (with 1 image)")
        );
        assert_eq!(
            chunks.iter().rev().take(3).map(String::as_str).collect::<Vec<_>>(),
            vec![" image)", " 1", " (with"]
        );
    }
}
