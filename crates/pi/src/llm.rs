//! Pi's `convertToLlm` (pi-session-format §11) and `bashExecutionToText`, exactly as the
//! JavaScript behaves on whatever a file holds: truthiness for the flags, `String(v)` for the
//! values printed, `!== 0` for the exit code, and a missing `content` left out (not `[]`/`null`).

use crate::js::{to_js_string, truthy};
use serde_json::{json, Map, Value};

/// Pi's `COMPACTION_SUMMARY_PREFIX` (the user message a compaction summary becomes).
pub const COMPACTION_SUMMARY_PREFIX: &str =
    "The conversation history before this point was compacted into the following summary:\n\n<summary>\n";
/// Pi's `COMPACTION_SUMMARY_SUFFIX`.
pub const COMPACTION_SUMMARY_SUFFIX: &str = "\n</summary>";
/// Pi's `BRANCH_SUMMARY_PREFIX`.
pub const BRANCH_SUMMARY_PREFIX: &str =
    "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n";
/// Pi's `BRANCH_SUMMARY_SUFFIX` (no newline before the tag, unlike the compaction one).
pub const BRANCH_SUMMARY_SUFFIX: &str = "</summary>";

/// `bashExecutionToText(msg)`.
pub fn bash_execution_to_text(msg: &Value) -> String {
    let field = |k: &str| msg.get(k);
    let flag = |k: &str| field(k).is_some_and(truthy);
    let mut text = format!("Ran `{}`\n", to_js_string(field("command")));
    if flag("output") {
        text.push_str(&format!("```\n{}\n```", to_js_string(field("output"))));
    } else {
        text.push_str("(no output)");
    }
    if flag("cancelled") {
        text.push_str("\n\n(command cancelled)");
    } else if let Some(code) = field("exitCode").filter(|c| !c.is_null() && !is_js_zero(c)) {
        text.push_str(&format!("\n\nCommand exited with code {}", to_js_string(Some(code))));
    }
    if flag("truncated") && flag("fullOutputPath") {
        text.push_str(&format!("\n\n[Output truncated. Full output: {}]", to_js_string(field("fullOutputPath"))));
    }
    text
}

/// `v === 0` (a number; `"0"` is not).
fn is_js_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0) && v.is_number()
}

/// `{role: "user", content, timestamp}` with JavaScript's `undefined` fields left out.
fn user_message(content: Option<Value>, timestamp: Option<&Value>) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), "user".into());
    if let Some(c) = content {
        m.insert("content".into(), c);
    }
    if let Some(ts) = timestamp {
        m.insert("timestamp".into(), ts.clone());
    }
    Value::Object(m)
}

fn user_text(text: String, timestamp: Option<&Value>) -> Value {
    user_message(Some(json!([{"type": "text", "text": text}])), timestamp)
}

/// What `convertToLlm` makes of a message it keeps: the message itself (`user`, `assistant`,
/// `toolResult`; the caller need not copy it) or a new user message.
#[derive(Debug, Clone, PartialEq)]
pub enum Converted {
    /// Passed through unchanged.
    Same,
    /// Replaced by this user message.
    User(Value),
}

/// The roles of the messages Pi keeps in a transcript (its `AgentMessage`s): the ones
/// [`convert_one`] knows. A message with another role never reaches the model.
pub const MESSAGE_ROLES: [&str; 7] =
    ["user", "assistant", "toolResult", "bashExecution", "custom", "branchSummary", "compactionSummary"];

/// `convertToLlm` for one message (`None`: dropped).
pub fn convert_one(msg: &Value) -> Option<Converted> {
    let ts = msg.get("timestamp");
    match msg.get("role").and_then(Value::as_str)? {
        "user" | "assistant" | "toolResult" => Some(Converted::Same),
        "bashExecution" if msg.get("excludeFromContext").is_some_and(truthy) => None,
        "bashExecution" => Some(Converted::User(user_text(bash_execution_to_text(msg), ts))),
        "custom" => {
            let content = match msg.get("content") {
                Some(Value::String(s)) => Some(json!([{"type": "text", "text": s}])),
                other => other.cloned(),
            };
            Some(Converted::User(user_message(content, ts)))
        }
        "branchSummary" => Some(Converted::User(user_text(
            format!("{BRANCH_SUMMARY_PREFIX}{}{BRANCH_SUMMARY_SUFFIX}", to_js_string(msg.get("summary"))),
            ts,
        ))),
        "compactionSummary" => Some(Converted::User(user_text(
            format!("{COMPACTION_SUMMARY_PREFIX}{}{COMPACTION_SUMMARY_SUFFIX}", to_js_string(msg.get("summary"))),
            ts,
        ))),
        _ => None,
    }
}

/// `convertToLlm(messages)`.
pub fn convert_to_llm<M: std::borrow::Borrow<Value>>(messages: &[M]) -> Vec<Value> {
    messages
        .iter()
        .filter_map(|m| {
            let m = m.borrow();
            match convert_one(m)? {
                Converted::Same => Some(m.clone()),
                Converted::User(u) => Some(u),
            }
        })
        .collect()
}
