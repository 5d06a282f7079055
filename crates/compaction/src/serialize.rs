//! What the summarizer reads: `serializeConversation`
//! (the text inside `<conversation>`), and the file-operation lists (`extractFileOpsFromMessage`,
//! `computeFileLists`, `formatFileOperations`) appended to every summary (§11, §12.5).

use pincer_pi::js::{js_cmp, js_entries, stringify, utf16_len, utf16_prefix};
use pincer_pi::text_blocks;
use serde_json::{json, Value};
use std::collections::HashSet;

/// Tool results longer than this (UTF-16 units) are truncated in the serialized conversation.
pub const TOOL_RESULT_MAX_CHARS: usize = 2000;

/// Pi's `convertToLlm` (the one rule, `pincer_pi::llm`), as the summarizer calls it.
pub use pincer_pi::llm::convert_to_llm;

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// `truncateForSummary(text, max)`.
fn truncate_for_summary(text: &str, max: usize) -> String {
    let len = utf16_len(text);
    if len <= max {
        return text.to_owned();
    }
    format!("{}\n\n[... {} more characters truncated]", utf16_prefix(text, max), len - max)
}

/// `serializeConversation(llmMessages)`: `[User]:`, `[Assistant thinking]:`, `[Assistant]:`,
/// `[Assistant tool calls]:` and `[Tool result]:` parts joined with a blank line.
pub fn serialize_conversation<M: std::borrow::Borrow<Value>>(llm_messages: &[M]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for m in llm_messages {
        let m = m.borrow();
        match m.get("role").and_then(Value::as_str) {
            Some("user") => {
                let content = text_blocks(m.get("content")).concat();
                if !content.is_empty() {
                    parts.push(format!("[User]: {content}"));
                }
            }
            Some("assistant") => {
                let (mut texts, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
                for b in m.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => texts.push(s(b, "text")),
                        Some("thinking") => thinking.push(s(b, "thinking")),
                        Some("toolCall") => {
                            let args = match b.get("arguments") {
                                Some(Value::Object(a)) => js_entries(a)
                                    .into_iter()
                                    .map(|(k, v)| format!("{k}={}", stringify(v)))
                                    .collect::<Vec<_>>()
                                    .join(", "),
                                _ => String::new(),
                            };
                            calls.push(format!("{}({args})", s(b, "name")));
                        }
                        _ => {}
                    }
                }
                if !thinking.is_empty() {
                    parts.push(format!("[Assistant thinking]: {}", thinking.join("\n")));
                }
                if !texts.is_empty() {
                    parts.push(format!("[Assistant]: {}", texts.join("\n")));
                }
                if !calls.is_empty() {
                    parts.push(format!("[Assistant tool calls]: {}", calls.join("; ")));
                }
            }
            Some("toolResult") => {
                let content = text_blocks(m.get("content")).concat();
                if !content.is_empty() {
                    parts.push(format!("[Tool result]: {}", truncate_for_summary(&content, TOOL_RESULT_MAX_CHARS)));
                }
            }
            _ => {}
        }
    }
    parts.join("\n\n")
}

/// An insertion-ordered set of paths (a JavaScript `Set<string>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathSet {
    items: Vec<String>,
    seen: HashSet<String>,
}

impl PathSet {
    pub fn insert(&mut self, p: &str) {
        if !self.seen.contains(p) {
            self.seen.insert(p.to_owned());
            self.items.push(p.to_owned());
        }
    }
    pub fn contains(&self, p: &str) -> bool {
        self.seen.contains(p)
    }
    /// In insertion order.
    pub fn items(&self) -> &[String] {
        &self.items
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Pi's `FileOperations`: `{read, written, edited}` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileOps {
    pub read: PathSet,
    pub written: PathSet,
    pub edited: PathSet,
}

impl FileOps {
    /// `extractFileOpsFromMessage`: `read`/`write`/`edit` tool calls with a string `path`.
    pub fn add_from_message(&mut self, message: &Value) {
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            return;
        }
        let Some(blocks) = message.get("content").and_then(Value::as_array) else {
            return;
        };
        for b in blocks {
            if b.get("type").and_then(Value::as_str) != Some("toolCall") || b.get("name").is_none() {
                continue;
            }
            let Some(path) = b.get("arguments").and_then(|a| a.get("path")).and_then(Value::as_str) else {
                continue;
            };
            if path.is_empty() {
                continue;
            }
            match b.get("name").and_then(Value::as_str) {
                Some("read") => self.read.insert(path),
                Some("write") => self.written.insert(path),
                Some("edit") => self.edited.insert(path),
                _ => {}
            }
        }
    }

    /// `{read, written, edited}` as arrays in insertion order (the oracle's `fileOps`).
    pub fn to_json(&self) -> Value {
        json!({"read": self.read.items(), "written": self.written.items(), "edited": self.edited.items()})
    }
}

/// `computeFileLists`: `modifiedFiles = sort(edited ∪ written)`, `readFiles = sort(read − modified)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileLists {
    #[serde(rename = "readFiles")]
    pub read_files: Vec<String>,
    #[serde(rename = "modifiedFiles")]
    pub modified_files: Vec<String>,
}

/// `computeFileLists(fileOps)`.
pub fn compute_file_lists(ops: &FileOps) -> FileLists {
    let mut modified = PathSet::default();
    for p in ops.edited.items().iter().chain(ops.written.items()) {
        modified.insert(p);
    }
    let mut read_files: Vec<String> = ops.read.items().iter().filter(|p| !modified.contains(p)).cloned().collect();
    read_files.sort_by(|a, b| js_cmp(a, b));
    let mut modified_files = modified.items;
    modified_files.sort_by(|a, b| js_cmp(a, b));
    FileLists { read_files, modified_files }
}

/// `formatFileOperations(readFiles, modifiedFiles)`: `""`, or `\n\n<read-files>…` and/or
/// `<modified-files>…` sections.
pub fn format_file_operations(read_files: &[String], modified_files: &[String]) -> String {
    let mut sections = Vec::new();
    if !read_files.is_empty() {
        sections.push(format!("<read-files>\n{}\n</read-files>", read_files.join("\n")));
    }
    if !modified_files.is_empty() {
        sections.push(format!("<modified-files>\n{}\n</modified-files>", modified_files.join("\n")));
    }
    if sections.is_empty() {
        return String::new();
    }
    format!("\n\n{}", sections.join("\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// §15 case 49.
    #[test]
    fn tool_results_are_truncated_and_text_is_not() {
        let long = "x".repeat(5000);
        let mid = "y".repeat(1500);
        let msgs = vec![
            json!({"role":"toolResult","content":[{"type":"text","text":long}]}),
            json!({"role":"toolResult","content":[{"type":"text","text":mid}]}),
            json!({"role":"user","content":long}),
            json!({"role":"assistant","content":[{"type":"text","text":long}]}),
        ];
        let want = [
            format!("[Tool result]: {}\n\n[... 3000 more characters truncated]", "x".repeat(2000)),
            format!("[Tool result]: {mid}"),
            format!("[User]: {long}"),
            format!("[Assistant]: {long}"),
        ]
        .join("\n\n");
        assert_eq!(serialize_conversation(&msgs), want);
    }

    #[test]
    fn assistant_parts_in_fixed_order() {
        let msgs = vec![json!({"role":"assistant","content":[
            {"type":"toolCall","id":"1","name":"edit","arguments":{"path":"a.ts","n":2.0}},
            {"type":"text","text":"t1"},
            {"type":"thinking","thinking":"th"},
            {"type":"text","text":"t2"},
            {"type":"toolCall","id":"2","name":"ls","arguments":{}}]})];
        assert_eq!(
            serialize_conversation(&msgs),
            "[Assistant thinking]: th\n\n[Assistant]: t1\nt2\n\n[Assistant tool calls]: edit(path=\"a.ts\", n=2); ls()"
        );
    }

    /// §15 case 50.
    #[test]
    fn file_lists() {
        let mut ops = FileOps::default();
        for p in ["b", "a"] {
            ops.read.insert(p);
        }
        ops.edited.insert("b");
        ops.written.insert("c");
        assert_eq!(
            compute_file_lists(&ops),
            FileLists { read_files: vec!["a".into()], modified_files: vec!["b".into(), "c".into()] }
        );
        assert_eq!(format_file_operations(&[], &[]), "");
        assert_eq!(
            format_file_operations(&["a".into()], &["b".into(), "c".into()]),
            "\n\n<read-files>\na\n</read-files>\n\n<modified-files>\nb\nc\n</modified-files>"
        );
    }
}
