//! Pi's token arithmetic: `estimateTokens` (chars/4 over UTF-16 lengths), `calculateContextTokens`,
//! `estimateContextTokens` and `shouldCompact` (`pi-session-format.md` §12.1–12.2).

use pincer_pi::js::{stringify, truthy, utf16_len};
use serde_json::Value;

/// Pi's estimate for an image block in a tool result or custom message (1200 tokens).
pub const IMAGE_CHARS: usize = 4800;

fn str_len(v: Option<&Value>) -> usize {
    v.and_then(Value::as_str).map(utf16_len).unwrap_or(0)
}

fn block_type(b: &Value) -> Option<&str> {
    b.get("type").and_then(Value::as_str)
}

/// Text blocks that are truthy (`block.type === "text" && block.text`), plus images when asked.
fn blocks_chars(content: &Value, images: bool) -> usize {
    match content {
        Value::String(s) => utf16_len(s),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match block_type(b) {
                Some("text") if b.get("text").is_some_and(truthy) => str_len(b.get("text")),
                Some("image") if images => IMAGE_CHARS,
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// The number of characters Pi counts for a message (before `/4`).
pub fn estimate_chars(message: &Value) -> usize {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    let content = message.get("content").unwrap_or(&Value::Null);
    match role {
        "user" => blocks_chars(content, false),
        "assistant" => match content {
            Value::Array(blocks) => blocks
                .iter()
                .map(|b| match block_type(b) {
                    Some("text") => str_len(b.get("text")),
                    Some("thinking") => str_len(b.get("thinking")),
                    Some("toolCall") => {
                        str_len(b.get("name")) + b.get("arguments").map(|a| utf16_len(&stringify(a))).unwrap_or(0)
                    }
                    _ => 0,
                })
                .sum(),
            _ => 0,
        },
        "custom" | "toolResult" => blocks_chars(content, true),
        "bashExecution" => str_len(message.get("command")) + str_len(message.get("output")),
        "branchSummary" | "compactionSummary" => str_len(message.get("summary")),
        _ => 0,
    }
}

/// `estimateTokens(message)`: `ceil(chars / 4)`.
pub fn estimate_tokens(message: &Value) -> u64 {
    estimate_chars(message).div_ceil(4) as u64
}

fn num(u: &Value, k: &str) -> f64 {
    u.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

/// `calculateContextTokens(usage)`: `totalTokens || input + output + cacheRead + cacheWrite`.
pub fn calculate_context_tokens(usage: &Value) -> u64 {
    let total = num(usage, "totalTokens");
    let t = if total != 0.0 && !total.is_nan() {
        total
    } else {
        num(usage, "input") + num(usage, "output") + num(usage, "cacheRead") + num(usage, "cacheWrite")
    };
    if t.is_finite() && t > 0.0 {
        t as u64
    } else {
        0
    }
}

/// The usage of an assistant message that is neither aborted nor an error (`getAssistantUsage`).
pub fn assistant_usage(message: &Value) -> Option<&Value> {
    if message.get("role").and_then(Value::as_str) != Some("assistant") {
        return None;
    }
    let stop = message.get("stopReason").and_then(Value::as_str);
    if stop == Some("aborted") || stop == Some("error") {
        return None;
    }
    message.get("usage").filter(|u| truthy(u))
}

/// `estimateContextTokens(messages)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextEstimate {
    pub tokens: u64,
    pub usage_tokens: u64,
    pub trailing_tokens: u64,
    /// Index of the last assistant message with usable usage.
    pub last_usage_index: Option<usize>,
}

impl ContextEstimate {
    /// As Pi's oracle prints it (`{tokens, usageTokens, trailingTokens, lastUsageIndex}`).
    pub fn to_json(&self) -> Value {
        serde_json::json!({"tokens": self.tokens, "usageTokens": self.usage_tokens,
            "trailingTokens": self.trailing_tokens, "lastUsageIndex": self.last_usage_index})
    }
}

/// `estimateContextTokens(messages)`: the last usable assistant usage plus estimates of what follows
/// it, or the sum of estimates when no assistant reported usage.
pub fn estimate_context_tokens<M: std::borrow::Borrow<Value>>(messages: &[M]) -> ContextEstimate {
    let last = messages.iter().enumerate().rev().find_map(|(i, m)| assistant_usage(m.borrow()).map(|u| (i, u)));
    match last {
        None => {
            let t: u64 = messages.iter().map(|m| estimate_tokens(m.borrow())).sum();
            ContextEstimate { tokens: t, usage_tokens: 0, trailing_tokens: t, last_usage_index: None }
        }
        Some((i, usage)) => {
            let usage_tokens = calculate_context_tokens(usage);
            let trailing: u64 = messages[i + 1..].iter().map(|m| estimate_tokens(m.borrow())).sum();
            ContextEstimate {
                tokens: usage_tokens + trailing,
                usage_tokens,
                trailing_tokens: trailing,
                last_usage_index: Some(i),
            }
        }
    }
}

/// `shouldCompact(tokens, window, settings)`: `enabled && tokens > window − reserve` (strict).
pub fn should_compact(context_tokens: u64, context_window: u64, reserve_tokens: u64, enabled: bool) -> bool {
    enabled && (context_tokens as i128) > (context_window as i128) - (reserve_tokens as i128)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// §15 case 39.
    #[test]
    fn estimate_tokens_cases() {
        let got = vec![
            estimate_tokens(&json!({"role":"user","content":"abcde"})),
            estimate_tokens(&json!({"role":"user","content":"é😀"})),
            estimate_tokens(&json!({"role":"user","content":[{"type":"image","data":"AAAA","mimeType":"image/png"}]})),
            estimate_tokens(
                &json!({"role":"toolResult","content":[{"type":"image","data":"AAAA","mimeType":"image/png"}]}),
            ),
            estimate_tokens(
                &json!({"role":"assistant","content":[{"type":"toolCall","id":"t","name":"read","arguments":{"path":"a.ts"}}]}),
            ),
            estimate_tokens(&json!({"role":"custom","content":"abcd"})),
            estimate_tokens(&json!({"role":"bashExecution","command":"ls","output":"a b c"})),
            estimate_tokens(&json!({"role":"compactionSummary","summary":"12345"})),
            estimate_tokens(&json!({"role":"weird","content":"12345"})),
            estimate_tokens(
                &json!({"role":"assistant","content":[{"type":"toolCall","name":"x","arguments":{"n":1.0}}]}),
            ),
        ];
        // The last: "x" + `{"n":1}` = 8 chars (JS prints 1.0 as 1) → 2.
        assert_eq!(got, vec![2, 1, 0, 1200, 5, 1, 2, 2, 0, 2]);
    }

    /// §15 case 40.
    #[test]
    fn context_tokens_from_usage() {
        let got = vec![
            calculate_context_tokens(
                &json!({"input":1000,"output":500,"cacheRead":200,"cacheWrite":100,"totalTokens":1800}),
            ),
            calculate_context_tokens(
                &json!({"input":1000,"output":500,"cacheRead":200,"cacheWrite":100,"totalTokens":0}),
            ),
            calculate_context_tokens(&json!({"input":1000,"output":500,"cacheRead":200,"cacheWrite":100})),
        ];
        assert_eq!(got, vec![1800, 1800, 1800]);
    }

    /// §15 case 41 (the F09 figures are checked against the fixture in tests/fixtures.rs).
    #[test]
    fn estimate_skips_aborted_and_error_assistants() {
        let msgs = vec![
            json!({"role":"user","content":"abcd"}),
            json!({"role":"assistant","content":[{"type":"text","text":"ok"}],"stopReason":"stop","usage":{"totalTokens":100}}),
            json!({"role":"user","content":"abcdefgh"}),
            json!({"role":"assistant","content":[{"type":"text","text":"abcd"}],"stopReason":"aborted","usage":{"totalTokens":999}}),
            json!({"role":"assistant","content":[{"type":"text","text":"abcd"}],"stopReason":"error","usage":{"totalTokens":999}}),
        ];
        assert_eq!(
            estimate_context_tokens(&msgs),
            ContextEstimate { tokens: 104, usage_tokens: 100, trailing_tokens: 4, last_usage_index: Some(1) }
        );
        assert_eq!(
            estimate_context_tokens(&msgs[..1]),
            ContextEstimate { tokens: 1, usage_tokens: 0, trailing_tokens: 1, last_usage_index: None }
        );
    }

    /// §15 case 42.
    #[test]
    fn should_compact_is_strict() {
        let got = vec![
            should_compact(95000, 100000, 10000, true),
            should_compact(89000, 100000, 10000, true),
            should_compact(90000, 100000, 10000, true),
            should_compact(90001, 100000, 10000, true),
            should_compact(95000, 100000, 10000, false),
        ];
        assert_eq!(got, vec![true, false, false, true, false]);
    }
}
