//! One branch of a session as readable Markdown: a heading per message with its role, time
//! (UTC, from the entry's timestamp) and entry id, the text as it was written (Markdown stays
//! Markdown), tool calls and results in fenced blocks, images named, compaction and branch
//! summaries quoted, labels and model changes noted. The branch is the file's leaf or a given one.

use crate::{title, ExportError};
use pincer_pi::one_line;
use pincer_store::session::{Kind, Leaf, Session};
use pincer_store::LeafArg;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;

/// The branch ending at `leaf` as Markdown.
pub fn markdown(s: &Session, leaf: &LeafArg) -> Result<String, ExportError> {
    let leaf = match leaf {
        LeafArg::Default => s.leaf.clone(),
        LeafArg::Null => Leaf::Null,
        LeafArg::Id(id) => Leaf::Entry(*s.by_id.get(id.as_str()).ok_or_else(|| ExportError::UnknownLeaf(id.clone()))?),
    };
    let path = match leaf {
        Leaf::Entry(i) => s.path_from(i).0,
        _ => Vec::new(),
    };
    let labels = labels(s);
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", title(s).unwrap_or_else(|| "Untitled session".into()));
    if let Some(h) = &s.header {
        if let Some(id) = h.get("id").and_then(Value::as_str) {
            let _ = writeln!(out, "- Session: `{id}`");
        }
        if let Some(t) = h.get("timestamp").and_then(Value::as_str) {
            let _ = writeln!(out, "- Started: {}", time(t));
        }
        if let Some(cwd) = h.get("cwd").and_then(Value::as_str) {
            let _ = writeln!(out, "- Directory: `{}`", cwd.replace('`', "'"));
        }
    }
    let leaf_id = path.last().and_then(|&i| s.entries[i].id.as_deref());
    let _ = writeln!(out, "- Branch: {} entries, leaf `{}`\n", path.len(), leaf_id.unwrap_or("null"));
    for &i in &path {
        let Some(v) = s.value(i) else { continue };
        entry(&mut out, s.entries[i].kind, &v, &labels);
    }
    Ok(out)
}

/// Every label in the file: target id → label (the newest wins; an empty or null one removes it).
pub(crate) fn labels(s: &Session) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for i in (0..s.entries.len()).filter(|&i| s.entries[i].kind == Kind::Label) {
        let Some(v) = s.value(i) else { continue };
        let Some(target) = v.get("targetId").and_then(Value::as_str) else { continue };
        match v.get("label").and_then(Value::as_str).map(str::trim).filter(|l| !l.is_empty()) {
            Some(l) => out.insert(target.to_owned(), l.to_owned()),
            None => out.remove(target),
        };
    }
    out
}

/// `2026-12-01T18:57:33.123Z` → `2026-12-01 18:57:33 UTC`; anything else as it is.
fn time(iso: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(iso) {
        Ok(t) => t.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        Err(_) => iso.to_owned(),
    }
}

/// A fenced block whose fence is longer than any backtick run inside.
fn fenced(out: &mut String, lang: &str, body: &str) {
    let mut longest = 0;
    let mut run = 0;
    for c in body.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat((longest + 1).max(3));
    let _ = writeln!(out, "{fence}{lang}\n{}\n{fence}\n", body.trim_end_matches('\n'));
}

fn quoted(out: &mut String, body: &str) {
    for line in body.trim_end().lines() {
        let _ = writeln!(out, "> {line}");
    }
    out.push('\n');
}

fn heading(out: &mut String, who: &str, v: &Value, labels: &HashMap<String, String>) {
    let id = v.get("id").and_then(Value::as_str).unwrap_or("-");
    let when = v.get("timestamp").and_then(Value::as_str).map(time).unwrap_or_default();
    let _ = write!(out, "## {who}");
    if !when.is_empty() {
        let _ = write!(out, " · {when}");
    }
    let _ = writeln!(out, " · `{id}`\n");
    if let Some(l) = labels.get(id) {
        let _ = writeln!(out, "Label: **{}**\n", one_line(l, usize::MAX));
    }
}

fn entry(out: &mut String, kind: Kind, v: &Value, labels: &HashMap<String, String>) {
    match kind {
        Kind::Message => message(out, v, labels),
        Kind::Compaction => {
            heading(out, "Compaction summary", v, labels);
            if let Some(n) = v.get("tokensBefore").and_then(Value::as_u64) {
                let _ = writeln!(out, "*{n} tokens before compaction*\n");
            }
            quoted(out, v.get("summary").and_then(Value::as_str).unwrap_or(""));
        }
        Kind::BranchSummary => {
            heading(out, "Branch summary", v, labels);
            quoted(out, v.get("summary").and_then(Value::as_str).unwrap_or(""));
        }
        Kind::CustomMessage if v.get("display").and_then(Value::as_bool) != Some(false) => {
            let ty = v.get("customType").and_then(Value::as_str).unwrap_or("custom");
            heading(out, &format!("Custom message ({ty})"), v, labels);
            content(out, v.get("content"));
        }
        Kind::ModelChange => {
            let p = v.get("provider").and_then(Value::as_str).unwrap_or("?");
            let m = v.get("modelId").and_then(Value::as_str).unwrap_or("?");
            let _ = writeln!(out, "*Model changed to `{p}/{m}`*\n");
        }
        Kind::ThinkingLevelChange => {
            let l = v.get("thinkingLevel").and_then(Value::as_str).unwrap_or("?");
            let _ = writeln!(out, "*Thinking level changed to `{l}`*\n");
        }
        _ => {}
    }
}

fn message(out: &mut String, v: &Value, labels: &HashMap<String, String>) {
    let m = &v["message"];
    let role = m.get("role").and_then(Value::as_str).unwrap_or("?");
    match role {
        "user" => {
            heading(out, "User", v, labels);
            content(out, m.get("content"));
        }
        "assistant" => {
            let who = match (m.get("provider").and_then(Value::as_str), m.get("model").and_then(Value::as_str)) {
                (Some(p), Some(model)) => format!("Assistant ({p}/{model})"),
                (None, Some(model)) => format!("Assistant ({model})"),
                _ => "Assistant".to_owned(),
            };
            heading(out, &who, v, labels);
            content(out, m.get("content"));
            if let Some(e) = m.get("errorMessage").and_then(Value::as_str) {
                let _ = writeln!(out, "**Error:** {}\n", one_line(e, usize::MAX));
            }
        }
        "toolResult" => {
            let name = m.get("toolName").and_then(Value::as_str).unwrap_or("tool");
            let err = if m.get("isError").and_then(Value::as_bool) == Some(true) { " (error)" } else { "" };
            heading(out, &format!("Tool result: `{name}`{err}"), v, labels);
            // Tool output is shown as it is, not read as Markdown.
            match m.get("content") {
                Some(Value::String(t)) => fenced(out, "", t),
                Some(Value::Array(blocks)) => {
                    for b in blocks {
                        match b.get("type").and_then(Value::as_str) {
                            Some("text") => fenced(out, "", b.get("text").and_then(Value::as_str).unwrap_or("")),
                            _ => block(out, b),
                        }
                    }
                }
                _ => {}
            }
        }
        "bashExecution" => {
            heading(out, "Shell", v, labels);
            fenced(out, "sh", m.get("command").and_then(Value::as_str).unwrap_or(""));
            fenced(out, "", m.get("output").and_then(Value::as_str).unwrap_or(""));
        }
        "compactionSummary" | "branchSummary" => {
            heading(out, if role == "branchSummary" { "Branch summary" } else { "Compaction summary" }, v, labels);
            quoted(out, m.get("summary").and_then(Value::as_str).unwrap_or(""));
        }
        other => {
            heading(out, other, v, labels);
            content(out, m.get("content"));
        }
    }
}

/// A message's content: a string, or Pi's blocks (text, thinking, tool calls, images).
fn content(out: &mut String, c: Option<&Value>) {
    match c {
        Some(Value::String(s)) => {
            let _ = writeln!(out, "{}\n", s.trim_end());
        }
        Some(Value::Array(blocks)) => {
            for b in blocks {
                block(out, b);
            }
        }
        _ => {}
    }
}

fn block(out: &mut String, b: &Value) {
    match b.get("type").and_then(Value::as_str) {
        Some("text") => {
            let t = b.get("text").and_then(Value::as_str).unwrap_or("");
            if !t.trim().is_empty() {
                let _ = writeln!(out, "{}\n", t.trim_end());
            }
        }
        Some("thinking") => {
            let t = b.get("thinking").and_then(Value::as_str).unwrap_or("");
            if !t.trim().is_empty() {
                out.push_str("*Thinking:*\n\n");
                quoted(out, t);
            }
        }
        Some("toolCall") => {
            let name = b.get("name").and_then(Value::as_str).unwrap_or("?");
            let id = b.get("id").and_then(Value::as_str).unwrap_or("");
            let _ = writeln!(out, "**Tool call** `{name}` (`{id}`)\n");
            let args = b.get("arguments").map(|a| serde_json::to_string_pretty(a).unwrap_or_default());
            fenced(out, "json", &args.unwrap_or_default());
        }
        Some("image") => {
            let mime = b.get("mimeType").and_then(Value::as_str).unwrap_or("image");
            let bytes = b.get("data").and_then(Value::as_str).map_or(0, |d| d.len() / 4 * 3);
            let _ = writeln!(out, "*[image: {mime}, about {} KB]*\n", bytes.div_ceil(1024));
        }
        _ => {}
    }
}
