//! Human-readable output of the CLI: aligned text tables, local dates, one-line message texts, and
//! the choice between a table and JSON (`--json`/`--table`; by default a table on a terminal and
//! JSON when the output goes to a pipe or file, so scripts keep getting JSON).

use clap::Args;
use serde_json::Value;
use std::io::IsTerminal;

/// `--json` / `--table`.
#[derive(Args, Debug, Clone, Copy)]
pub struct OutputArgs {
    /// Machine-readable JSON (the default when stdout is not a terminal).
    #[arg(long, conflicts_with = "table")]
    pub json: bool,
    /// A human-readable table (the default on a terminal).
    #[arg(long)]
    pub table: bool,
}

impl OutputArgs {
    /// Whether to print JSON.
    pub fn json(self) -> bool {
        self.json || (!self.table && !std::io::stdout().is_terminal())
    }
}

/// Columns aligned by character count; the last column is not padded.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table { rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width = |c: usize| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols).map(width).collect();
        let mut out = String::new();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c + 1 == r.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Milliseconds since the epoch as a local date and time (`2026-12-01 16:20`; `-` when unknown).
pub fn local_time(ms: Option<i64>) -> String {
    use chrono::TimeZone;
    match ms.and_then(|ms| chrono::Local.timestamp_millis_opt(ms).single()) {
        Some(t) => t.format("%Y-%m-%d %H:%M").to_string(),
        None => "-".into(),
    }
}

/// A cell's text on one line, at most so many characters (the one rule of `pincer_pi`).
pub use pincer_pi::one_line;

/// What a projected message says, for one table cell: its text, tool calls as `→ name(args)`, a
/// tool result as `← name: text`, other blocks by their type (`[image]`).
pub fn message_summary(m: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    match m.get("content") {
        Some(Value::String(t)) => parts.push(t.clone()),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(b.get("text").and_then(Value::as_str).unwrap_or_default().to_owned()),
                    Some("thinking") => {}
                    Some("toolCall") => parts.push(format!(
                        "→ {}({})",
                        b.get("name").and_then(Value::as_str).unwrap_or("?"),
                        b.get("arguments").map(Value::to_string).unwrap_or_default()
                    )),
                    Some(other) => parts.push(format!("[{other}]")),
                    None => {}
                }
            }
        }
        _ => {}
    }
    let text = parts.join(" ");
    match role {
        "toolResult" => format!("← {}: {text}", m.get("toolName").and_then(Value::as_str).unwrap_or("?")),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_align_and_texts_are_cut() {
        let mut t = Table::new(&["KEY", "TITLE", "N"]);
        t.row(vec!["main".into(), one_line("hello\n  there   world", 9), "3".into()]);
        t.row(vec!["agent:x:é".into(), "-".into(), "12".into()]);
        assert_eq!(t.render(), "KEY        TITLE      N\nmain       hello th…  3\nagent:x:é  -          12\n");
        let m = json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Let me look."},
            {"type": "toolCall", "id": "1", "name": "read_file", "arguments": {"path": "a.txt"}}]});
        assert_eq!(message_summary(&m), "Let me look. → read_file({\"path\":\"a.txt\"})");
        let r = json!({"role": "toolResult", "toolName": "read_file", "content": [{"type": "text", "text": "x"}]});
        assert_eq!(message_summary(&r), "← read_file: x");
    }
}
