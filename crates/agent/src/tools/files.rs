//! Pi's file tools `read`, `write`, `edit` and `ls` (`dist/core/tools/*.js` of
//! `@mariozechner/pi-coding-agent` 0.73.1): the same names, parameter schemas, texts and `details`,
//! over the agent's [`Workspace`].

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::truncate::{format_size, truncate_head, MAX_BYTES, MAX_LINES};
use super::workspace::Workspace;
use super::{Tool, ToolError, ToolFuture, ToolOutput};

/// Largest base64 image `read` returns (Pi's `image-resize` limit: 4.5 MB, below Anthropic's 5 MB).
pub const MAX_IMAGE_BASE64_BYTES: usize = 4_718_592;

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// A non-negative whole number argument (the schemas say `number`; fractions are cut like JS `slice`).
fn count_arg(args: &Value, key: &str) -> Option<usize> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to >= 0, whole lines
    args.get(key).and_then(Value::as_f64).map(|n| n.max(0.0) as usize)
}

fn io_error(path: &str, e: &std::io::Error) -> ToolError {
    ToolError::failed(format!("{path}: {e}"))
}

/// The image type of `bytes` from its signature, for the four types Pi returns as images.
fn image_mime(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// `{details}` only when it has a key, like Pi's `Object.keys(details).length > 0 ? details : undefined`.
fn some_details(details: Map<String, Value>) -> Option<Value> {
    (!details.is_empty()).then_some(Value::Object(details))
}

/// `read {path, offset?, limit?}`.
pub struct ReadTool(pub Arc<Workspace>);

impl Tool for ReadTool {
    fn read_only(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "read"
    }
    fn description(&self) -> &str {
        "Read the contents of a file. Supports text files and images (jpg, png, gif, webp). Images are sent as attachments. For text files, output is truncated to 2000 lines or 50KB (whichever is hit first). Use offset/limit for large files. When you need the full file, continue with offset until complete."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "Path to the file to read (relative or absolute)"},
            "offset": {"type": "number", "description": "Line number to start reading from (1-indexed)"},
            "limit": {"type": "number", "description": "Maximum number of lines to read"}},
            "required": ["path"]})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let path = str_arg(&args, "path").unwrap_or_default();
            let real = self.0.resolve_existing(path).await?;
            let bytes = tokio::fs::read(&real).await.map_err(|e| io_error(path, &e))?;
            if let Some(mime) = image_mime(&bytes) {
                // Pi resizes images to fit; Pincer does not decode them, so one whose base64 would
                // pass Pi's inline limit is left out with Pi's own note (never written whole).
                if bytes.len().div_ceil(3) * 4 >= MAX_IMAGE_BASE64_BYTES {
                    return Ok(ToolOutput::text(format!(
                        "Read image file [{mime}]\n[Image omitted: could not be resized below the inline image size limit.]"
                    )));
                }
                let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
                return Ok(ToolOutput {
                    content: vec![
                        json!({"type": "text", "text": format!("Read image file [{mime}]")}),
                        json!({"type": "image", "data": data, "mimeType": mime}),
                    ],
                    details: None,
                });
            }
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.split('\n').collect();
            let offset = count_arg(&args, "offset");
            let start = offset.map_or(0, |o| o.saturating_sub(1));
            if start >= all.len() {
                return Err(ToolError::failed(format!(
                    "Offset {} is beyond end of file ({} lines total)",
                    offset.unwrap_or_default(),
                    all.len()
                )));
            }
            let limit = count_arg(&args, "limit");
            let end = limit.map_or(all.len(), |l| (start + l).min(all.len()));
            let t = truncate_head(&all[start..end].join("\n"), MAX_LINES, MAX_BYTES);
            let first = start + 1;
            let mut details = None;
            let out = if t.first_line_exceeds_limit {
                details = Some(json!({"truncation": t.to_value()}));
                format!(
                    "[Line {first} is {}, exceeds {} limit. Use bash: sed -n '{first}p' {path} | head -c {MAX_BYTES}]",
                    format_size(all[start].len()),
                    format_size(MAX_BYTES)
                )
            } else if t.truncated {
                details = Some(json!({"truncation": t.to_value()}));
                let last = first + t.output_lines - 1;
                let limit_note = if t.truncated_by == Some("lines") {
                    String::new()
                } else {
                    format!(" ({} limit)", format_size(MAX_BYTES))
                };
                format!(
                    "{}\n\n[Showing lines {first}-{last} of {}{limit_note}. Use offset={} to continue.]",
                    t.content,
                    all.len(),
                    last + 1
                )
            } else if limit.is_some() && end < all.len() {
                format!(
                    "{}\n\n[{} more lines in file. Use offset={} to continue.]",
                    t.content,
                    all.len() - end,
                    end + 1
                )
            } else {
                t.content
            };
            Ok(ToolOutput { content: vec![json!({"type": "text", "text": out})], details })
        })
    }
}

/// `write {path, content}`.
pub struct WriteTool(pub Arc<Workspace>);

impl Tool for WriteTool {
    fn name(&self) -> &str {
        "write"
    }
    fn description(&self) -> &str {
        "Write content to a file. Creates the file if it doesn't exist, overwrites if it does. Automatically creates parent directories."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "Path to the file to write (relative or absolute)"},
            "content": {"type": "string", "description": "Content to write to the file"}},
            "required": ["path", "content"]})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let path = str_arg(&args, "path").unwrap_or_default();
            let content = str_arg(&args, "content").unwrap_or_default();
            let real = self.0.resolve(path).await?;
            if tokio::fs::metadata(&real).await.is_ok_and(|m| m.is_dir()) {
                return Err(ToolError::failed(format!("{path}: is a directory")));
            }
            let lock = self.0.lock(&real);
            let _held = lock.lock().await;
            self.0.write(&real, content.as_bytes().to_vec()).await.map_err(|e| io_error(path, &e))?;
            // Pi counts JavaScript string length (UTF-16 units), not bytes.
            let n = content.encode_utf16().count();
            Ok(ToolOutput::text(format!("Successfully wrote {n} bytes to {path}")))
        })
    }
}

/// `edit {path, edits: [{oldText, newText}]}`.
pub struct EditTool(pub Arc<Workspace>);

impl Tool for EditTool {
    fn name(&self) -> &str {
        "edit"
    }
    fn description(&self) -> &str {
        "Edit a single file using exact text replacement. Every edits[].oldText must match a unique, non-overlapping region of the original file. If two changes affect the same block or nearby lines, merge them into one edit instead of emitting overlapping edits. Do not include large unchanged regions just to connect distant changes."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "Path to the file to edit (relative or absolute)"},
            "edits": {"type": "array", "description": "One or more targeted replacements. Each edit is matched against the original file, not incrementally. Do not include overlapping or nested edits. If two changes touch the same block or nearby lines, merge them into one edit instead.",
                "items": {"type": "object", "properties": {
                    "oldText": {"type": "string", "description": "Exact text for one targeted replacement. It must be unique in the original file and must not overlap with any other edits[].oldText in the same call."},
                    "newText": {"type": "string", "description": "Replacement text for this targeted edit."}},
                    "required": ["oldText", "newText"]}}},
            "required": ["path", "edits"], "additionalProperties": false})
    }
    fn prepare(&self, arguments: Value) -> Value {
        prepare_edit_arguments(arguments)
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let path = str_arg(&args, "path").unwrap_or_default();
            let edits = parse_edits(&args)?;
            let real = self.0.resolve(path).await?;
            let lock = self.0.lock(&real);
            let _held = lock.lock().await;
            let raw = tokio::fs::read(&real).await.map_err(|e| {
                let code = match e.kind() {
                    std::io::ErrorKind::NotFound => "ENOENT".to_owned(),
                    std::io::ErrorKind::PermissionDenied => "EACCES".to_owned(),
                    _ => e.to_string(),
                };
                ToolError::failed(format!("Could not edit file: {path}. Error code: {code}."))
            })?;
            let raw = String::from_utf8_lossy(&raw);
            let (bom, content) = raw.strip_prefix('\u{FEFF}').map_or(("", &*raw), |c| ("\u{FEFF}", c));
            let crlf = detect_crlf(content);
            let (base, new) = apply_edits(&normalize_to_lf(content), &edits, path)?;
            let restored = if crlf { new.replace('\n', "\r\n") } else { new.clone() };
            self.0.write(&real, format!("{bom}{restored}").into_bytes()).await.map_err(|e| io_error(path, &e))?;
            let (diff, first) = diff_string(&base, &new);
            Ok(ToolOutput {
                content: vec![
                    json!({"type": "text", "text": format!("Successfully replaced {} block(s) in {path}.", edits.len())}),
                ],
                details: Some(json!({"diff": diff, "firstChangedLine": first})),
            })
        })
    }
}

/// Pi's `prepareEditArguments`: `edits` sent as a JSON string becomes the array, and a legacy
/// top-level `oldText`/`newText` pair is appended to it.
fn prepare_edit_arguments(mut args: Value) -> Value {
    let Some(obj) = args.as_object_mut() else {
        return args;
    };
    if let Some(Value::String(s)) = obj.get("edits") {
        if let Ok(list @ Value::Array(_)) = serde_json::from_str::<Value>(s) {
            obj.insert("edits".into(), list);
        }
    }
    if let (Some(Value::String(_)), Some(Value::String(_))) = (obj.get("oldText"), obj.get("newText")) {
        let (old, new) = (obj.remove("oldText"), obj.remove("newText"));
        let mut list = match obj.remove("edits") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        list.push(json!({"oldText": old, "newText": new}));
        obj.insert("edits".into(), Value::Array(list));
    }
    args
}

/// The `edits` array as `(oldText, newText)` pairs; at least one.
fn parse_edits(args: &Value) -> Result<Vec<(String, String)>, ToolError> {
    let list = args.get("edits").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    if list.is_empty() {
        return Err(ToolError::failed("Edit tool input is invalid. edits must contain at least one replacement."));
    }
    list.iter()
        .enumerate()
        .map(|(i, e)| match (str_arg(e, "oldText"), str_arg(e, "newText")) {
            (Some(o), Some(n)) => Ok((o.to_owned(), n.to_owned())),
            _ => Err(ToolError::InvalidArguments {
                tool: "edit".into(),
                reason: format!("edits[{i}] must have string oldText and newText"),
            }),
        })
        .collect()
}

fn detect_crlf(content: &str) -> bool {
    match (content.find("\r\n"), content.find('\n')) {
        (Some(crlf), Some(lf)) => crlf < lf,
        _ => false,
    }
}

fn normalize_to_lf(text: &str) -> String {
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Pi's `normalizeForFuzzyMatch`: NFKC, trailing spaces of each line, typographic quotes, dashes and spaces.
fn fuzzy(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let nfkc: String = text.nfkc().collect();
    let trimmed: Vec<&str> = nfkc.split('\n').map(str::trim_end).collect();
    trimmed
        .join("\n")
        .chars()
        .map(|c| match c {
            '\u{2018}'..='\u{201B}' => '\'',
            '\u{201C}'..='\u{201F}' => '"',
            '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
            '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            c => c,
        })
        .collect()
}

/// Pi's `applyEditsToNormalizedContent`: each `oldText` found once (exactly, else after fuzzy
/// normalisation), no overlaps, applied to the original; returns `(base, new)`.
fn apply_edits(content: &str, edits: &[(String, String)], path: &str) -> Result<(String, String), ToolError> {
    let n = edits.len();
    let edits: Vec<(String, String)> = edits.iter().map(|(o, x)| (normalize_to_lf(o), normalize_to_lf(x))).collect();
    for (i, (old, _)) in edits.iter().enumerate() {
        if old.is_empty() {
            return Err(ToolError::failed(if n == 1 {
                format!("oldText must not be empty in {path}.")
            } else {
                format!("edits[{i}].oldText must not be empty in {path}.")
            }));
        }
    }
    let any_fuzzy = edits.iter().any(|(old, _)| !content.contains(old.as_str()));
    let base = if any_fuzzy && edits.iter().any(|(old, _)| fuzzy(content).contains(&fuzzy(old))) {
        fuzzy(content)
    } else {
        content.to_owned()
    };
    let fuzzy_base = fuzzy(&base);
    let mut matched = Vec::new();
    for (i, (old, new)) in edits.iter().enumerate() {
        let (at, len) = match base.find(old.as_str()) {
            Some(at) => (at, old.len()),
            None => {
                let f = fuzzy(old);
                match base.find(f.as_str()) {
                    Some(at) => (at, f.len()),
                    None => {
                        return Err(ToolError::failed(if n == 1 {
                            format!("Could not find the exact text in {path}. The old text must match exactly including all whitespace and newlines.")
                        } else {
                            format!("Could not find edits[{i}] in {path}. The oldText must match exactly including all whitespace and newlines.")
                        }));
                    }
                }
            }
        };
        let count = fuzzy_base.matches(fuzzy(old).as_str()).count();
        if count > 1 {
            return Err(ToolError::failed(if n == 1 {
                format!("Found {count} occurrences of the text in {path}. The text must be unique. Please provide more context to make it unique.")
            } else {
                format!("Found {count} occurrences of edits[{i}] in {path}. Each oldText must be unique. Please provide more context to make it unique.")
            }));
        }
        matched.push((i, at, len, new.as_str()));
    }
    matched.sort_by_key(|m| m.1);
    for w in matched.windows(2) {
        if w[0].1 + w[0].2 > w[1].1 {
            return Err(ToolError::failed(format!(
                "edits[{}] and edits[{}] overlap in {path}. Merge them into one edit or target disjoint regions.",
                w[0].0, w[1].0
            )));
        }
    }
    let mut new = base.clone();
    for &(_, at, len, text) in matched.iter().rev() {
        new.replace_range(at..at + len, text);
    }
    if new == base {
        return Err(ToolError::failed(if n == 1 {
            format!("No changes made to {path}. The replacement produced identical content. This might indicate an issue with special characters or the text not existing as expected.")
        } else {
            format!("No changes made to {path}. The replacements produced identical content.")
        }));
    }
    Ok((base, new))
}

/// Pi's `generateDiffString`: changed lines numbered (`+`/`-`), 4 lines of context, `...` for gaps;
/// and the first changed line of the new text.
pub fn diff_string(old: &str, new: &str) -> (String, Option<usize>) {
    const CONTEXT: usize = 4;
    let diff = similar::TextDiff::configure().algorithm(similar::Algorithm::Myers).diff_lines(old, new);
    // Group consecutive changes of one tag into parts, like jsdiff's `diffLines`.
    let mut parts: Vec<(similar::ChangeTag, Vec<String>)> = Vec::new();
    for change in diff.iter_all_changes() {
        let line = change.value().strip_suffix('\n').unwrap_or(change.value()).to_owned();
        match parts.last_mut() {
            Some((tag, lines)) if *tag == change.tag() => lines.push(line),
            _ => parts.push((change.tag(), vec![line])),
        }
    }
    let width = old.split('\n').count().max(new.split('\n').count()).to_string().len();
    let num = |n: usize| format!("{n:>width$}");
    let gap = format!(" {} ...", " ".repeat(width));
    let (mut old_n, mut new_n, mut last_change, mut first) = (1usize, 1usize, false, None);
    let mut out: Vec<String> = Vec::new();
    for (i, (tag, raw)) in parts.iter().enumerate() {
        match tag {
            similar::ChangeTag::Insert | similar::ChangeTag::Delete => {
                first.get_or_insert(new_n);
                for line in raw {
                    if *tag == similar::ChangeTag::Insert {
                        out.push(format!("+{} {line}", num(new_n)));
                        new_n += 1;
                    } else {
                        out.push(format!("-{} {line}", num(old_n)));
                        old_n += 1;
                    }
                }
                last_change = true;
            }
            similar::ChangeTag::Equal => {
                let next_change = parts.get(i + 1).is_some_and(|p| p.0 != similar::ChangeTag::Equal);
                let show = |lines: &[String], out: &mut Vec<String>, old_n: &mut usize, new_n: &mut usize| {
                    for line in lines {
                        out.push(format!(" {} {line}", num(*old_n)));
                        *old_n += 1;
                        *new_n += 1;
                    }
                };
                let len = raw.len();
                if last_change && next_change {
                    if len <= CONTEXT * 2 {
                        show(raw, &mut out, &mut old_n, &mut new_n);
                    } else {
                        show(&raw[..CONTEXT], &mut out, &mut old_n, &mut new_n);
                        out.push(gap.clone());
                        old_n += len - 2 * CONTEXT;
                        new_n += len - 2 * CONTEXT;
                        show(&raw[len - CONTEXT..], &mut out, &mut old_n, &mut new_n);
                    }
                } else if last_change {
                    let shown = len.min(CONTEXT);
                    show(&raw[..shown], &mut out, &mut old_n, &mut new_n);
                    if len > shown {
                        out.push(gap.clone());
                        old_n += len - shown;
                        new_n += len - shown;
                    }
                } else if next_change {
                    let skipped = len.saturating_sub(CONTEXT);
                    if skipped > 0 {
                        out.push(gap.clone());
                        old_n += skipped;
                        new_n += skipped;
                    }
                    show(&raw[skipped..], &mut out, &mut old_n, &mut new_n);
                } else {
                    old_n += len;
                    new_n += len;
                }
                last_change = false;
            }
        }
    }
    (out.join("\n"), first)
}

/// `ls {path?, limit?}`.
pub struct LsTool(pub Arc<Workspace>);

impl Tool for LsTool {
    fn read_only(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "ls"
    }
    fn description(&self) -> &str {
        "List directory contents. Returns entries sorted alphabetically, with '/' suffix for directories. Includes dotfiles. Output is truncated to 500 entries or 50KB (whichever is hit first)."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "Directory to list (default: current directory)"},
            "limit": {"type": "number", "description": "Maximum number of entries to return (default: 500)"}}})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let path = str_arg(&args, "path").filter(|p| !p.is_empty()).unwrap_or(".");
            let limit = count_arg(&args, "limit").unwrap_or(500);
            let real = self.0.resolve(path).await?;
            let meta =
                tokio::fs::metadata(&real).await.map_err(|_| ToolError::failed(format!("Path not found: {path}")))?;
            if !meta.is_dir() {
                return Err(ToolError::failed(format!("Not a directory: {path}")));
            }
            let mut names = Vec::new();
            let mut dir = tokio::fs::read_dir(&real)
                .await
                .map_err(|e| ToolError::failed(format!("Cannot read directory: {e}")))?;
            while let Some(entry) =
                dir.next_entry().await.map_err(|e| ToolError::failed(format!("Cannot read directory: {e}")))?
            {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
            names.sort_by_key(|n| n.to_lowercase());
            let mut results = Vec::new();
            let mut limit_reached = false;
            for name in names {
                if results.len() >= limit {
                    limit_reached = true;
                    break;
                }
                // Like Pi, `stat` follows symlinks; an entry that cannot be stat'ed is skipped.
                match tokio::fs::metadata(real.join(&name)).await {
                    Ok(m) if m.is_dir() => results.push(format!("{name}/")),
                    Ok(_) => results.push(name),
                    Err(_) => {}
                }
            }
            if results.is_empty() {
                return Ok(ToolOutput::text("(empty directory)"));
            }
            let (mut notices, mut details) = (Vec::new(), Map::new());
            if limit_reached {
                notices.push(format!("{limit} entries limit reached. Use limit={} for more", limit * 2));
                details.insert("entryLimitReached".into(), limit.into());
            }
            Ok(finish_listing(&results.join("\n"), notices, details, false))
        })
    }
}

/// The end of `ls`, `find` and `grep`: the 50 KB cap, notices in brackets, `details` when any;
/// `lines_cut` adds `grep`'s notice of lines cut at 500 characters (last, as in Pi).
pub(super) fn finish_listing(
    raw: &str,
    mut notices: Vec<String>,
    mut details: Map<String, Value>,
    lines_cut: bool,
) -> ToolOutput {
    let t = truncate_head(raw, usize::MAX, MAX_BYTES);
    let mut out = t.content.clone();
    if t.truncated {
        notices.push(format!("{} limit reached", format_size(MAX_BYTES)));
        details.insert("truncation".into(), t.to_value());
    }
    if lines_cut {
        notices.push(format!(
            "Some lines truncated to {} chars. Use read tool to see full lines",
            super::truncate::GREP_MAX_LINE_LENGTH
        ));
        details.insert("linesTruncated".into(), true.into());
    }
    if !notices.is_empty() {
        out.push_str(&format!("\n\n[{}]", notices.join(". ")));
    }
    ToolOutput { content: vec![json!({"type": "text", "text": out})], details: some_details(details) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn diff_numbers_lines_with_context_like_pi() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nb\nc\nd\ne\nF\ng\nh\ni\nj\n";
        let (diff, first) = diff_string(old, new);
        assert_eq!(first, Some(6));
        assert_eq!(diff, "    ...\n  2 b\n  3 c\n  4 d\n  5 e\n- 6 f\n+ 6 F\n  7 g\n  8 h\n  9 i\n 10 j");
    }

    #[test]
    fn edits_must_be_unique_and_disjoint() {
        let e = |o: &str, n: &str| (o.to_owned(), n.to_owned());
        assert_eq!(apply_edits("x y x", &[e("y", "z")], "f").unwrap().1, "x z x");
        assert_eq!(
            apply_edits("x y x", &[e("x", "z")], "f").unwrap_err().to_string(),
            "Found 2 occurrences of the text in f. The text must be unique. Please provide more context to make it unique."
        );
        assert_eq!(
            apply_edits("abcdef", &[e("abc", "1"), e("cde", "2")], "f").unwrap_err().to_string(),
            "edits[0] and edits[1] overlap in f. Merge them into one edit or target disjoint regions."
        );
        assert_eq!(apply_edits("it\u{2019}s  \nok", &[e("it's\nok", "fine")], "f").unwrap().1, "fine");
    }

    fn text(o: &ToolOutput) -> &str {
        o.content[0]["text"].as_str().unwrap()
    }

    #[tokio::test]
    async fn read_leaves_out_an_image_over_the_inline_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.resize(MAX_IMAGE_BASE64_BYTES / 4 * 3 + 3, 0);
        std::fs::write(dir.path().join("huge.png"), &png).unwrap();
        png.truncate(MAX_IMAGE_BASE64_BYTES / 4 * 3 - 3);
        std::fs::write(dir.path().join("big.png"), &png).unwrap();
        let read = ReadTool(Workspace::new(dir.path()));
        let huge = read.call(json!({"path": "huge.png"})).await.unwrap();
        assert_eq!(
            huge,
            ToolOutput::text(
                "Read image file [image/png]\n[Image omitted: could not be resized below the inline image size limit.]"
            )
        );
        let big = read.call(json!({"path": "big.png"})).await.unwrap();
        assert_eq!(big.content[1]["data"].as_str().unwrap().len(), MAX_IMAGE_BASE64_BYTES - 4);
    }

    #[tokio::test]
    async fn read_cuts_at_50_kb_and_names_a_long_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let line = "y".repeat(99);
        std::fs::write(dir.path().join("wide.txt"), format!("{line}\n").repeat(1000)).unwrap();
        std::fs::write(dir.path().join("one.txt"), "z".repeat(60 * 1024)).unwrap();
        let read = ReadTool(Workspace::new(dir.path()));
        let out = read.call(json!({"path": "wide.txt"})).await.unwrap();
        // 512 lines of 100 bytes fit in 51,200 bytes (the last without its newline).
        assert!(text(&out).ends_with("\n\n[Showing lines 1-512 of 1001 (50.0KB limit). Use offset=513 to continue.]"));
        let t = &out.details.as_ref().unwrap()["truncation"];
        assert_eq!(
            (&t["truncatedBy"], &t["outputLines"], &t["outputBytes"]),
            (&json!("bytes"), &json!(512), &json!(51199))
        );
        let out = read.call(json!({"path": "one.txt"})).await.unwrap();
        assert_eq!(
            text(&out),
            "[Line 1 is 60.0KB, exceeds 50.0KB limit. Use bash: sed -n '1p' one.txt | head -c 51200]"
        );
        assert_eq!(out.details.unwrap()["truncation"]["firstLineExceedsLimit"], true);
        assert_eq!(
            read.call(json!({"path": "wide.txt", "offset": 2000})).await.unwrap_err().to_string(),
            "Offset 2000 is beyond end of file (1001 lines total)"
        );
    }

    #[tokio::test]
    async fn edit_takes_pi_argument_variants_and_serialises_writes_to_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let markers: String = (0..24).map(|i| format!("m{i}\n")).collect();
        std::fs::write(dir.path().join("f.txt"), &markers).unwrap();
        let reg = super::super::ToolRegistry::with_builtins(dir.path());
        // `edits` as a JSON string, and the legacy top-level pair (Pi's prepareEditArguments).
        let as_string = json!({"path": "f.txt", "edits": json!([{"oldText": "m0\n", "newText": "x0\n"}]).to_string()});
        assert_eq!(text(&reg.execute("edit", as_string).await.unwrap()), "Successfully replaced 1 block(s) in f.txt.");
        let legacy = json!({"path": "f.txt", "oldText": "m1\n", "newText": "x1\n"});
        assert_eq!(text(&reg.execute("edit", legacy).await.unwrap()), "Successfully replaced 1 block(s) in f.txt.");
        // Concurrent read-modify-writes of one file: none is lost.
        let edits = (2..24).map(|i| {
            reg.execute(
                "edit",
                json!({"path": "f.txt", "edits": [{"oldText": format!("m{i}\n"), "newText": format!("x{i}\n")}]}),
            )
        });
        for r in futures::future::join_all(edits).await {
            r.unwrap();
        }
        let want: String = (0..24).map(|i| format!("x{i}\n")).collect();
        assert_eq!(std::fs::read_to_string(dir.path().join("f.txt")).unwrap(), want);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers, ["f.txt"], "no temporary file left behind");
    }
}
