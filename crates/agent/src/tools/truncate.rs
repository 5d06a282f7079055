//! Pi's output caps (`dist/core/tools/truncate.js`): [`truncate_head`] keeps the first 2,000 lines
//! or 50 KB of a text, whichever comes first, and describes the cut with Pi's `details.truncation`
//! shape; [`truncate_tail`] keeps the last ones (`bash`); [`truncate_line`] cuts a `grep` line at 500 characters; [`format_size`] is Pi's size text.

use serde_json::{json, Value};

/// Most lines a tool result keeps (Pi's `DEFAULT_MAX_LINES`).
pub const MAX_LINES: usize = 2000;
/// Most bytes a tool result keeps (Pi's `DEFAULT_MAX_BYTES`).
pub const MAX_BYTES: usize = 50 * 1024;
/// Most characters of one `grep` line (Pi's `GREP_MAX_LINE_LENGTH`).
pub const GREP_MAX_LINE_LENGTH: usize = 500;

/// A text cut by [`truncate_head`], with Pi's `TruncationResult` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    pub content: String,
    pub truncated: bool,
    /// `"lines"` or `"bytes"` when truncated.
    pub truncated_by: Option<&'static str>,
    pub total_lines: usize,
    pub total_bytes: usize,
    pub output_lines: usize,
    pub output_bytes: usize,
    /// The kept text starts inside a line longer than the cap ([`truncate_tail`] only).
    pub last_line_partial: bool,
    pub first_line_exceeds_limit: bool,
    pub max_lines: usize,
    pub max_bytes: usize,
}

impl Truncation {
    /// Pi's `details.truncation` object.
    pub fn to_value(&self) -> Value {
        json!({
            "content": self.content,
            "truncated": self.truncated,
            "truncatedBy": self.truncated_by,
            "totalLines": self.total_lines,
            "totalBytes": self.total_bytes,
            "outputLines": self.output_lines,
            "outputBytes": self.output_bytes,
            "lastLinePartial": self.last_line_partial,
            "firstLineExceedsLimit": self.first_line_exceeds_limit,
            "maxLines": self.max_lines,
            "maxBytes": self.max_bytes,
        })
    }
}

/// Keeps whole lines from the start until `max_lines` or `max_bytes` is reached (Pi's `truncateHead`).
pub fn truncate_head(content: &str, max_lines: usize, max_bytes: usize) -> Truncation {
    let total_bytes = content.len();
    let lines: Vec<&str> = content.split('\n').collect();
    let total_lines = lines.len();
    let base = Truncation {
        content: String::new(),
        truncated: true,
        truncated_by: Some("bytes"),
        total_lines,
        total_bytes,
        output_lines: 0,
        output_bytes: 0,
        last_line_partial: false,
        first_line_exceeds_limit: false,
        max_lines,
        max_bytes,
    };
    if total_lines <= max_lines && total_bytes <= max_bytes {
        return Truncation {
            content: content.to_owned(),
            truncated: false,
            truncated_by: None,
            output_lines: total_lines,
            output_bytes: total_bytes,
            ..base
        };
    }
    if lines[0].len() > max_bytes {
        return Truncation { first_line_exceeds_limit: true, ..base };
    }
    let mut kept = 0usize;
    let mut bytes = 0usize;
    let mut by = "lines";
    for (i, line) in lines.iter().enumerate().take(max_lines) {
        let n = line.len() + usize::from(i > 0);
        if bytes + n > max_bytes {
            by = "bytes";
            break;
        }
        kept += 1;
        bytes += n;
    }
    if kept >= max_lines && bytes <= max_bytes {
        by = "lines";
    }
    let out = lines[..kept].join("\n");
    Truncation { output_lines: kept, output_bytes: out.len(), content: out, truncated_by: Some(by), ..base }
}

/// Keeps whole lines from the end until `max_lines` or `max_bytes` is reached (Pi's `truncateTail`);
/// when the last line alone is over `max_bytes`, its end is kept (`last_line_partial`).
pub fn truncate_tail(content: &str, max_lines: usize, max_bytes: usize) -> Truncation {
    let total_bytes = content.len();
    let lines: Vec<&str> = content.split('\n').collect();
    let total_lines = lines.len();
    let mut t = Truncation {
        content: content.to_owned(),
        truncated: false,
        truncated_by: None,
        total_lines,
        total_bytes,
        output_lines: total_lines,
        output_bytes: total_bytes,
        last_line_partial: false,
        first_line_exceeds_limit: false,
        max_lines,
        max_bytes,
    };
    if total_lines <= max_lines && total_bytes <= max_bytes {
        return t;
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut bytes = 0usize;
    let mut by = "lines";
    for line in lines.iter().rev() {
        if kept.len() >= max_lines {
            break;
        }
        let n = line.len() + usize::from(!kept.is_empty());
        if bytes + n > max_bytes {
            by = "bytes";
            if kept.is_empty() {
                let mut start = line.len() - max_bytes;
                while !line.is_char_boundary(start) {
                    start += 1;
                }
                kept.push(&line[start..]);
                t.last_line_partial = true;
            }
            break;
        }
        kept.push(line);
        bytes += n;
    }
    if kept.len() >= max_lines && bytes <= max_bytes {
        by = "lines";
    }
    kept.reverse();
    t.content = kept.join("\n");
    t.truncated = true;
    t.truncated_by = Some(by);
    t.output_lines = kept.len();
    t.output_bytes = t.content.len();
    t
}

/// Pi's `formatSize`: `512B`, `50.0KB`, `1.5MB`.
pub fn format_size(bytes: usize) -> String {
    #[allow(clippy::cast_precision_loss)] // sizes far below 2^52
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes}B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1}KB", b / 1024.0)
    } else {
        format!("{:.1}MB", b / (1024.0 * 1024.0))
    }
}

/// Cuts a line at [`GREP_MAX_LINE_LENGTH`] characters with Pi's `... [truncated]` mark; true when cut.
pub fn truncate_line(line: &str) -> (String, bool) {
    match line.char_indices().nth(GREP_MAX_LINE_LENGTH) {
        None => (line.to_owned(), false),
        Some((at, _)) => (format!("{}... [truncated]", &line[..at]), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_cuts_at_lines_or_bytes_like_pi() {
        let t = truncate_head("a\nb\nc", 2, 100);
        assert_eq!((t.content.as_str(), t.truncated_by, t.output_lines, t.total_lines), ("a\nb", Some("lines"), 2, 3));
        let t = truncate_head("aaaa\nbbbb\ncccc", 10, 9);
        assert_eq!((t.content.as_str(), t.truncated_by, t.output_bytes), ("aaaa\nbbbb", Some("bytes"), 9));
        let t = truncate_head("aaaaaaaaaaaa\nb", 10, 5);
        assert!(t.first_line_exceeds_limit && t.content.is_empty());
        assert!(!truncate_head("x", 1, 1).truncated);
        let t = truncate_tail("a\nb\nc", 2, 100);
        assert_eq!((t.content.as_str(), t.truncated_by, t.output_lines), ("b\nc", Some("lines"), 2));
        let t = truncate_tail("aaaa\nbbbb\ncccc", 10, 9);
        assert_eq!((t.content.as_str(), t.truncated_by), ("bbbb\ncccc", Some("bytes")));
        let t = truncate_tail("a\nxxxxxxé", 10, 3);
        assert!(t.last_line_partial && t.content == "xé", "{t:?}");
        assert_eq!(format_size(51200), "50.0KB");
        assert_eq!(truncate_line(&"é".repeat(501)).0, format!("{}... [truncated]", "é".repeat(500)));
    }
}
