//! Pi message shapes (pi-session-format §5): `convert_to_llm` over context messages (the rule
//! itself is `pincer_pi::llm`), the assistant message under construction ([`AssistantDraft`])
//! that every provider fills, and usage with cost.
//!
//! Messages stay `serde_json::Value` with Pi's key order, so what is persisted is exactly what
//! Pi would write.

use serde_json::{json, Map, Value};

use crate::config::{ModelCost, ResolvedModel};
use crate::context::SharedMessage;
use pincer_pi::js::number_value as js_number;
use pincer_pi::now_ms;

/// Pi's `convertToLlm`: keeps `user`, `assistant`, `toolResult`; turns `bashExecution`,
/// `custom`, `branchSummary` and `compactionSummary` into user messages; drops the rest
/// (including `bashExecution` with `excludeFromContext`). Each message's result is computed
/// once and kept on it ([`ContextMessage::llm`]).
pub fn convert_to_llm(messages: &[SharedMessage]) -> Vec<Value> {
    messages.iter().filter_map(|m| m.llm()).collect()
}

/// Token counts of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Uncached input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from cache.
    pub cache_read: u64,
    /// Input tokens written to cache.
    pub cache_write: u64,
}

impl Usage {
    /// Pi's usage object, with cost from `prices` (USD per million tokens; zero when unknown).
    pub fn to_pi(self, prices: Option<&ModelCost>) -> Value {
        let p = prices.copied().unwrap_or_default();
        #[allow(clippy::cast_precision_loss)]
        let cost = |tokens: u64, per_million: f64| tokens as f64 * per_million / 1_000_000.0;
        let (ci, co, cr, cw) = (
            cost(self.input, p.input),
            cost(self.output, p.output),
            cost(self.cache_read, p.cache_read),
            cost(self.cache_write, p.cache_write),
        );
        json!({
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
            "totalTokens": self.input + self.output + self.cache_read + self.cache_write,
            "cost": {
                "input": js_number(ci),
                "output": js_number(co),
                "cacheRead": js_number(cr),
                "cacheWrite": js_number(cw),
                "total": js_number(ci + co + cr + cw),
            }
        })
    }
}

/// Pi's `stopReason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Normal end.
    Stop,
    /// Output token limit.
    Length,
    /// The model asked for tools.
    ToolUse,
    /// Failed.
    Error,
    /// Cancelled.
    Aborted,
}

impl StopReason {
    /// The JSON string.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Stop => "stop",
            StopReason::Length => "length",
            StopReason::ToolUse => "toolUse",
            StopReason::Error => "error",
            StopReason::Aborted => "aborted",
        }
    }
}

/// One content block being streamed.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftBlock {
    /// Visible text.
    Text(String),
    /// Reasoning.
    Thinking {
        /// The reasoning text (or summary).
        thinking: String,
        /// Opaque signature to send back (Anthropic signature, Responses reasoning item).
        signature: Option<String>,
        /// Anthropic `redacted_thinking`.
        redacted: bool,
    },
    /// A tool call; `arguments` is the raw JSON text accumulated so far.
    ToolCall {
        /// Provider's call id.
        id: String,
        /// Tool name.
        name: String,
        /// Raw JSON text.
        arguments: String,
    },
}

/// A tool call taken from a finished assistant message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Parsed arguments (`{}` when they did not parse).
    pub arguments: Value,
    /// Why the raw arguments did not parse as a JSON object, if they did not.
    pub arguments_error: Option<String>,
}

/// The assistant message a provider is building while it streams.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantDraft {
    /// Content blocks in order.
    pub blocks: Vec<DraftBlock>,
    /// Token counts.
    pub usage: Usage,
    /// Set by the provider when it knows (finish reason); `None` until then.
    pub stop_reason: Option<StopReason>,
    /// The provider's response id.
    pub response_id: Option<String>,
    /// When the call started (ms).
    pub timestamp: u64,
}

impl AssistantDraft {
    /// An empty draft stamped now.
    pub fn new() -> Self {
        Self { blocks: Vec::new(), usage: Usage::default(), stop_reason: None, response_id: None, timestamp: now_ms() }
    }

    /// Appends text, to the last block when it is text, else as a new block. Returns the
    /// index of the block.
    pub fn push_text(&mut self, delta: &str) -> usize {
        if let Some(DraftBlock::Text(t)) = self.blocks.last_mut() {
            t.push_str(delta);
        } else {
            self.blocks.push(DraftBlock::Text(delta.to_owned()));
        }
        self.blocks.len() - 1
    }

    /// Appends thinking, to the last block when it is thinking, else as a new block.
    pub fn push_thinking(&mut self, delta: &str) -> usize {
        if let Some(DraftBlock::Thinking { thinking, .. }) = self.blocks.last_mut() {
            thinking.push_str(delta);
        } else {
            self.blocks.push(DraftBlock::Thinking { thinking: delta.to_owned(), signature: None, redacted: false });
        }
        self.blocks.len() - 1
    }

    /// All text blocks concatenated.
    pub fn text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(|b| match b {
                DraftBlock::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    /// True when nothing was streamed yet.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The tool calls, with parsed arguments.
    pub fn tool_calls(&self) -> Vec<ToolCall> {
        self.blocks
            .iter()
            .filter_map(|b| match b {
                DraftBlock::ToolCall { id, name, arguments } => {
                    let (args, err) = parse_arguments(arguments);
                    Some(ToolCall { id: id.clone(), name: name.clone(), arguments: args, arguments_error: err })
                }
                _ => None,
            })
            .collect()
    }

    /// Pi's assistant message. `stop` overrides the draft's stop reason (error/aborted).
    pub fn to_message(&self, model: &ResolvedModel, stop: StopReason, error_message: Option<&str>) -> Value {
        let content: Vec<Value> = self
            .blocks
            .iter()
            .map(|b| match b {
                DraftBlock::Text(t) => json!({"type": "text", "text": t}),
                DraftBlock::Thinking { thinking, signature, redacted } => {
                    let mut m = Map::new();
                    m.insert("type".into(), "thinking".into());
                    m.insert("thinking".into(), thinking.clone().into());
                    if let Some(s) = signature {
                        m.insert("thinkingSignature".into(), s.clone().into());
                    }
                    if *redacted {
                        m.insert("redacted".into(), true.into());
                    }
                    Value::Object(m)
                }
                DraftBlock::ToolCall { id, name, arguments } => {
                    json!({"type": "toolCall", "id": id, "name": name, "arguments": parse_arguments(arguments).0})
                }
            })
            .collect();
        let mut m = Map::new();
        m.insert("role".into(), "assistant".into());
        m.insert("content".into(), Value::Array(content));
        m.insert("api".into(), model.provider.api.as_str().into());
        m.insert("provider".into(), model.provider.name.clone().into());
        m.insert("model".into(), model.model.id.clone().into());
        if let Some(id) = &self.response_id {
            m.insert("responseId".into(), id.clone().into());
        }
        m.insert("usage".into(), self.usage.to_pi(model.model.cost.as_ref()));
        m.insert("stopReason".into(), stop.as_str().into());
        m.insert("timestamp".into(), self.timestamp.into());
        if let Some(e) = error_message {
            m.insert("errorMessage".into(), e.into());
        }
        Value::Object(m)
    }
}

impl Default for AssistantDraft {
    fn default() -> Self {
        Self::new()
    }
}

fn parse_arguments(raw: &str) -> (Value, Option<String>) {
    if raw.trim().is_empty() {
        return (json!({}), None);
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => (v, None),
        Ok(_) => (json!({}), Some("tool arguments are not a JSON object".to_owned())),
        Err(e) => (json!({}), Some(format!("tool arguments are not valid JSON ({e})"))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::context::ContextMessage;
    use pretty_assertions::assert_eq;

    #[test]
    fn convert_to_llm_per_spec() {
        let input = vec![
            json!({"role":"user","content":"hi","timestamp":1}),
            json!({"role":"bashExecution","command":"ls","output":"a\nb","exitCode":0,"cancelled":false,"truncated":false,"timestamp":2}),
            json!({"role":"bashExecution","command":"make","output":"","exitCode":2,"cancelled":false,"truncated":true,"fullOutputPath":"/tmp/o","timestamp":3}),
            json!({"role":"bashExecution","command":"sleep 9","output":"x","exitCode":null,"cancelled":true,"truncated":false,"timestamp":4}),
            json!({"role":"bashExecution","command":"secret","output":"x","exitCode":0,"cancelled":false,"truncated":false,"excludeFromContext":true,"timestamp":5}),
            json!({"role":"custom","customType":"note","content":"remember","display":true,"timestamp":6}),
            json!({"role":"custom","customType":"img","content":[{"type":"image","data":"AA==","mimeType":"image/png"}],"display":false,"timestamp":7}),
            json!({"role":"branchSummary","summary":"went left","fromId":"abc","timestamp":8}),
            json!({"role":"compactionSummary","summary":"earlier","tokensBefore":10,"timestamp":9}),
            json!({"role":"toolResult","toolCallId":"c","toolName":"t","content":[],"isError":false,"timestamp":10}),
            json!({"role":"somethingNew","timestamp":11}),
        ];
        let expected = vec![
            json!({"role":"user","content":"hi","timestamp":1}),
            json!({"role":"user","content":[{"type":"text","text":"Ran `ls`\n```\na\nb\n```"}],"timestamp":2}),
            json!({"role":"user","content":[{"type":"text","text":"Ran `make`\n(no output)\n\nCommand exited with code 2\n\n[Output truncated. Full output: /tmp/o]"}],"timestamp":3}),
            json!({"role":"user","content":[{"type":"text","text":"Ran `sleep 9`\n```\nx\n```\n\n(command cancelled)"}],"timestamp":4}),
            json!({"role":"user","content":[{"type":"text","text":"remember"}],"timestamp":6}),
            json!({"role":"user","content":[{"type":"image","data":"AA==","mimeType":"image/png"}],"timestamp":7}),
            json!({"role":"user","content":[{"type":"text","text":"The following is a summary of a branch that this conversation came back from:\n\n<summary>\nwent left</summary>"}],"timestamp":8}),
            json!({"role":"user","content":[{"type":"text","text":"The conversation history before this point was compacted into the following summary:\n\n<summary>\nearlier\n</summary>"}],"timestamp":9}),
            json!({"role":"toolResult","toolCallId":"c","toolName":"t","content":[],"isError":false,"timestamp":10}),
        ];
        let shared: Vec<SharedMessage> = input.into_iter().map(ContextMessage::shared).collect();
        let out: Vec<Value> = convert_to_llm(&shared);
        assert_eq!(out, expected);
    }

    #[test]
    fn usage_cost_from_prices() {
        let u = Usage { input: 1000, output: 500, cache_read: 2000, cache_write: 100 };
        let prices = ModelCost { input: 3.0, output: 15.0, cache_read: 0.3, cache_write: 3.75 };
        assert_eq!(
            u.to_pi(Some(&prices)),
            json!({"input":1000,"output":500,"cacheRead":2000,"cacheWrite":100,"totalTokens":3600,
                   "cost":{"input":0.003,"output":0.0075,"cacheRead":0.0006,"cacheWrite":0.000375,"total":0.011474999999999999}})
        );
        assert_eq!(
            u.to_pi(None),
            json!({"input":1000,"output":500,"cacheRead":2000,"cacheWrite":100,"totalTokens":3600,
                   "cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}})
        );
    }

    #[test]
    fn text_and_thinking_blocks_merge_only_when_adjacent() {
        let mut d = AssistantDraft::new();
        d.push_thinking("a");
        d.push_thinking("b");
        d.push_text("x");
        d.push_text("y");
        d.blocks.push(DraftBlock::ToolCall { id: "1".into(), name: "t".into(), arguments: "{\"a\":".into() });
        d.push_text("z");
        assert_eq!(
            d.blocks,
            vec![
                DraftBlock::Thinking { thinking: "ab".into(), signature: None, redacted: false },
                DraftBlock::Text("xy".into()),
                DraftBlock::ToolCall { id: "1".into(), name: "t".into(), arguments: "{\"a\":".into() },
                DraftBlock::Text("z".into()),
            ]
        );
        assert_eq!(d.text(), "xyz");
        let calls = d.tool_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, json!({}));
        assert!(calls[0].arguments_error.as_deref().unwrap().starts_with("tool arguments are not valid JSON"));
    }
}
