//! Human-readable output of the CLI: aligned text tables that fit the terminal's width, local
//! dates, one-line message texts, and the choice between a table and JSON (`--json`/`--table`; by
//! default a table on a terminal and JSON when the output goes to a pipe or file, so scripts keep
//! getting JSON).

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

/// The width to fit tables to: the terminal's (stdout), else `$COLUMNS`; `None`: no limit.
pub fn terminal_width() -> Option<usize> {
    if let Ok(size) = rustix::termios::tcgetwinsize(std::io::stdout()) {
        if size.ws_col > 0 {
            return Some(usize::from(size.ws_col));
        }
    }
    std::env::var("COLUMNS").ok()?.trim().parse().ok().filter(|w| *w > 0)
}

/// The narrowest a column that gives way to the terminal's width gets.
const MIN_FLEX: usize = 12;

/// Columns aligned by character count, two spaces apart; the last column is not padded. One
/// column (the title or the text) gives way when the table is wider than the terminal: its cells
/// are cut with `…`.
pub struct Table {
    rows: Vec<Vec<String>>,
    flex: Option<usize>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table { rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()], flex: None }
    }

    /// The column that is cut to fit the width.
    pub fn flex(mut self, column: usize) -> Table {
        self.flex = Some(column);
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, fitted to [`terminal_width`].
    pub fn render(&self) -> String {
        self.render_within(terminal_width())
    }

    /// The table, its lines at most `max_width` characters when cutting the flexible column down
    /// to [`MIN_FLEX`] characters is enough.
    pub fn render_within(&self, max_width: Option<usize>) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width = |c: usize| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0);
        let mut widths: Vec<usize> = (0..cols).map(width).collect();
        let mut cut = None;
        if let (Some(max), Some(f)) = (max_width, self.flex.filter(|f| *f < cols)) {
            let total = widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
            if total > max {
                widths[f] = widths[f].saturating_sub(total - max).max(MIN_FLEX.min(widths[f]));
                cut = Some((f, widths[f]));
            }
        }
        let mut out = String::new();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                let cell = match cut {
                    Some((f, w)) if f == c && cell.chars().count() > w => one_line(cell, w),
                    _ => cell.clone(),
                };
                line.push_str(&cell);
                if c + 1 < r.len() {
                    line.push_str(&" ".repeat(widths[c].saturating_sub(cell.chars().count()) + 2));
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
        "toolResult" => {
            let failed = if m.get("isError").and_then(Value::as_bool) == Some(true) { " failed" } else { "" };
            format!("← {}{failed}: {text}", m.get("toolName").and_then(Value::as_str).unwrap_or("?"))
        }
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
        assert_eq!(
            t.render_within(None),
            "KEY        TITLE      N\nmain       hello th…  3\nagent:x:é  -          12\n"
        );
        let m = json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Let me look."},
            {"type": "toolCall", "id": "1", "name": "read_file", "arguments": {"path": "a.txt"}}]});
        assert_eq!(message_summary(&m), "Let me look. → read_file({\"path\":\"a.txt\"})");
        let r = json!({"role": "toolResult", "toolName": "read_file", "content": [{"type": "text", "text": "x"}]});
        assert_eq!(message_summary(&r), "← read_file: x");
    }

    #[test]
    fn the_flexible_column_gives_way_to_the_width() {
        let mut t = Table::new(&["KEY", "TITLE", "N"]).flex(1);
        t.row(vec!["main".into(), "a title of thirty-two characters".into(), "3".into()]);
        let wide = t.render_within(Some(80));
        assert_eq!(wide, t.render_within(None));
        let narrow = t.render_within(Some(30));
        assert_eq!(narrow, "KEY   TITLE                  N\nmain  a title of thirty-tw…  3\n");
        assert!(narrow.lines().all(|l| l.chars().count() <= 30));
        // Narrower than the other columns allow: the column keeps its minimum.
        let tight = t.render_within(Some(10));
        assert_eq!(tight.lines().nth(1).map(|l| l.chars().count()), Some(4 + 2 + MIN_FLEX + 2 + 1), "{tight}");
    }

    #[test]
    fn a_failed_tool_result_says_so() {
        let r = json!({"role": "toolResult", "toolName": "read", "isError": true,
            "content": [{"type": "text", "text": "missing.txt: not found"}]});
        assert_eq!(message_summary(&r), "← read failed: missing.txt: not found");
    }
}
