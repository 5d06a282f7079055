//! `chat.history`: the active branch's last messages, read from a bounded tail of the file.
//!
//! Nothing here reads a whole large file: a window at the end of the file is indexed with the
//! light parse, the leaf's `parentId` chain is walked inside it (the window grows ×4 up to
//! [`MAX_WINDOW`] only while the chain leaves it before `limit` messages are found), and only the
//! entries that are returned are decoded. The projection follows OpenClaw's gateway (§2.2, §4):
//! compactions become a divider, images lose their data, long text is truncated, `details` and
//! thinking signatures are dropped, oversized lines and messages become placeholders, and the whole
//! answer stays under 6 MiB.

use crate::ids::js_date_ms;
use crate::parse::{self, Key, LineValue, Parent};
use pincer_pi::js::truthy;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Default and maximum number of messages.
pub const DEFAULT_LIMIT: usize = 200;
pub const MAX_LIMIT: usize = 1000;
/// Default per-text truncation.
pub const DEFAULT_MAX_CHARS: usize = 8000;
/// Lines longer than this are not decoded (their keys are read; they show as placeholders).
pub const MAX_LINE_BYTES: usize = 256 * 1024;
/// A single projected message larger than this is replaced by a placeholder.
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024;
/// The whole answer.
pub const MAX_RESPONSE_BYTES: usize = 6 * 1024 * 1024;
const FIRST_WINDOW: u64 = 128 * 1024;
/// The largest tail read.
pub const MAX_WINDOW: u64 = 64 * 1024 * 1024;
const OMITTED: &str = "[chat.history omitted: message too large]";

/// Options of a history read.
#[derive(Clone, Debug)]
pub struct HistoryOptions {
    pub limit: usize,
    pub max_chars: usize,
    /// A window further back: the messages on the branch that leads to this entry, before it (the
    /// entry itself left out). `None`: the active branch up to its leaf.
    pub before: Option<String>,
}

impl Default for HistoryOptions {
    fn default() -> Self {
        HistoryOptions { limit: DEFAULT_LIMIT, max_chars: DEFAULT_MAX_CHARS, before: None }
    }
}

/// What `chat.history` returns for one file.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    pub session_id: Option<String>,
    pub messages: Vec<Value>,
    pub thinking_level: Option<Value>,
    /// Older messages exist on the branch before the first one returned (ask again with `before`
    /// set to its id).
    pub has_older: bool,
}

struct Rec {
    id: Option<Key>,
    parent: Option<Parent>,
    ty: RecType,
    start: usize,
    end: usize,
    oversized: bool,
    /// For `leaf` controls: `Some(None)` = before the first entry.
    target: Option<Option<Key>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RecType {
    Message,
    Compaction,
    Leaf,
    Header,
    ThinkingLevel,
    Other,
}

/// Reads the history of `path`. A missing file has no history.
pub fn read_history(path: &Path, opts: HistoryOptions) -> std::io::Result<History> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(History { session_id: None, messages: vec![], thinking_level: None, has_older: false })
        }
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let session_id = read_session_id(&file, len)?;
    let mut window = FIRST_WINDOW;
    loop {
        let start = len.saturating_sub(window);
        let mut buf = vec![0u8; (len - start) as usize];
        file.read_exact_at(&mut buf, start)?;
        let skip = if start > 0 { memchr::memchr(b'\n', &buf).map(|p| p + 1).unwrap_or(buf.len()) } else { 0 };
        let last = start == 0 || window >= MAX_WINDOW;
        if let Some(h) = history_of_window(session_id.clone(), &buf[skip..], last, &opts) {
            return Ok(h);
        }
        window = window.saturating_mul(4);
    }
}

/// The history found in a window of a transcript's last lines (`buf`: whole lines). `None` when
/// the branch leaves the window before `limit` messages were found (or `opts.before` is not in it)
/// and `last` is false: the caller reads a larger window (×4, up to [`MAX_WINDOW`]) and asks again.
/// The one reading of `chat.history`, for files ([`read_history`]) and for other store backends alike.
pub fn history_of_window(session_id: Option<String>, buf: &[u8], last: bool, opts: &HistoryOptions) -> Option<History> {
    let limit = opts.limit.clamp(1, MAX_LIMIT);
    let recs = index_window(buf, 0);
    // One more than asked for, to know whether anything older is left.
    let (picked, complete) = select(&recs, limit + 1, opts.before.as_deref());
    if !(complete || last) {
        return None;
    }
    let thinking_level = picked_thinking(&recs, buf);
    let (messages, capped) = project_all(&recs, &picked, buf, limit, opts.max_chars);
    Some(History { session_id, messages, thinking_level, has_older: picked.len() > limit || capped })
}

/// The first window [`read_history`] reads (backends read their tail in the same steps).
pub const FIRST_HISTORY_WINDOW: u64 = FIRST_WINDOW;

fn read_session_id(file: &File, len: u64) -> std::io::Result<Option<String>> {
    // A first look at 4 KiB, which holds the header line as a rule; its complete lines decide as
    // they would in the 64 KiB read, which is made only when they do not.
    for size in [4 * 1024, 64 * 1024] {
        let n = len.min(size) as usize;
        let mut head = vec![0u8; n];
        file.read_exact_at(&mut head, 0)?;
        let complete = match (n as u64) < len && size < 64 * 1024 {
            true => memchr::memrchr(b'\n', &head).map_or(0, |p| p + 1),
            false => n,
        };
        if let Some(id) = session_id_in(&head[..complete]) {
            return Ok(id);
        }
        if complete == n {
            return Ok(None);
        }
    }
    Ok(None)
}

/// The session id the first JSON line of `head` gives (`Some(None)`: that line is no header);
/// `None` when no line of `head` is JSON.
fn session_id_in(head: &[u8]) -> Option<Option<String>> {
    parse::line_ranges(head).into_iter().find_map(|(s, e)| {
        let v = serde_json::from_slice::<Value>(&head[s..e]).ok()?;
        Some(match v.get("type").and_then(Value::as_str) {
            Some("session") => v.get("id").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        })
    })
}

fn index_window(buf: &[u8], skip: usize) -> Vec<Rec> {
    let mut recs = Vec::new();
    for (s, e) in parse::line_ranges(&buf[skip..]) {
        let (s, e) = (s + skip, e + skip);
        let line = &buf[s..e];
        // The light parse reads the keys wherever valid JSON puts them (any whitespace, any key
        // order) without decoding the rest, so a line too large to decode is indexed as well.
        let Some(LineValue::Object(h)) = parse::parse_line(line) else {
            continue;
        };
        let oversized = line.len() > MAX_LINE_BYTES;
        let ty = rec_type(h.ty.as_deref());
        let target = if ty == RecType::Leaf && !oversized {
            serde_json::from_slice::<Value>(line).ok().and_then(|v| match v.get("targetId") {
                Some(Value::Null) => Some(None),
                Some(t) => parse::value_key(t).map(Some),
                None => None,
            })
        } else {
            None
        };
        let (id, parent) = (h.id_key(), h.parent.is_some().then(|| h.parent_key()));
        recs.push(Rec { id, parent, ty, start: s, end: e, oversized, target });
    }
    recs
}

fn rec_type(ty: Option<&str>) -> RecType {
    match ty {
        Some("message") => RecType::Message,
        Some("compaction") => RecType::Compaction,
        Some("leaf") => RecType::Leaf,
        Some("session") => RecType::Header,
        Some("thinking_level_change") => RecType::ThinkingLevel,
        _ => RecType::Other,
    }
}

/// Indices of the records to show, oldest first, and whether the walk reached the branch's root
/// (or found enough messages) inside the window. With `before`, the walk starts at that entry's
/// parent (the window is incomplete while the entry is not in it).
fn select(recs: &[Rec], limit: usize, before: Option<&str>) -> (Vec<usize>, bool) {
    let tree_linked = recs.iter().any(|r| r.ty != RecType::Header && r.id.is_some() && r.parent.is_some());
    let shown = |r: &Rec| matches!(r.ty, RecType::Message | RecType::Compaction);
    if !tree_linked {
        // Linear (legacy) file: file order.
        let end = match before {
            None => recs.len(),
            Some(b) => match recs.iter().position(|r| r.id.as_deref() == Some(b)) {
                Some(i) => i,
                None => return (vec![], false),
            },
        };
        let all: Vec<usize> = (0..end).filter(|&i| shown(&recs[i])).collect();
        let complete = all.len() >= limit;
        let from = all.len().saturating_sub(limit);
        return (all[from..].to_vec(), complete);
    }
    let by_id: HashMap<&str, usize> =
        recs.iter().enumerate().filter_map(|(i, r)| r.id.as_deref().map(|id| (id, i))).collect();
    if let Some(b) = before {
        let Some(&at) = by_id.get(b) else {
            return (vec![], false);
        };
        return match &recs[at].parent {
            Some(Parent::Id(p)) => match by_id.get(p.as_ref()) {
                Some(&i) => walk(recs, &by_id, i, limit),
                None => (vec![], false),
            },
            _ => (vec![], true),
        };
    }
    // Leaf: the last tree-linked record, or a leaf control's target.
    let mut leaf = None;
    for (i, r) in recs.iter().enumerate().rev() {
        if r.ty == RecType::Header {
            continue;
        }
        match (&r.ty, &r.target) {
            (RecType::Leaf, Some(None)) => return (vec![], true),
            (RecType::Leaf, Some(Some(t))) => match by_id.get(t.as_ref()) {
                Some(&target) => {
                    leaf = Some(target);
                    break;
                }
                None => return (vec![], false),
            },
            _ => {}
        }
        if r.id.is_some() && r.parent.is_some() {
            leaf = Some(i);
            break;
        }
    }
    let Some(cur) = leaf else {
        return (vec![], true);
    };
    walk(recs, &by_id, cur, limit)
}

/// The `parentId` chain from `cur` up: the shown records, oldest first, and whether it reached the
/// root (or `limit` shown records) inside the window.
fn walk(recs: &[Rec], by_id: &HashMap<&str, usize>, mut cur: usize, limit: usize) -> (Vec<usize>, bool) {
    let shown = |r: &Rec| matches!(r.ty, RecType::Message | RecType::Compaction);
    let mut path = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut count = 0;
    loop {
        if !seen.insert(cur) {
            return (vec![], true); // a cycle: show nothing rather than loop
        }
        path.push(cur);
        if shown(&recs[cur]) {
            count += 1;
            if count >= limit {
                break;
            }
        }
        match &recs[cur].parent {
            Some(Parent::Id(p)) => match by_id.get(p.as_ref()) {
                Some(&i) => cur = i,
                // The chain leaves the window: read more, unless it is a real orphan at file start.
                None => {
                    path.reverse();
                    return (path.into_iter().filter(|&i| shown(&recs[i])).collect(), false);
                }
            },
            _ => break,
        }
    }
    path.reverse();
    (path.into_iter().filter(|&i| shown(&recs[i])).collect(), true)
}

fn picked_thinking(recs: &[Rec], buf: &[u8]) -> Option<Value> {
    let r = recs.iter().rev().find(|r| r.ty == RecType::ThinkingLevel)?;
    let v: Value = serde_json::from_slice(&buf[r.start..r.end]).ok()?;
    v.get("thinkingLevel").cloned()
}

/// The last `limit` of `picked`, projected, and whether the size cap dropped any.
fn project_all(recs: &[Rec], picked: &[usize], buf: &[u8], limit: usize, max_chars: usize) -> (Vec<Value>, bool) {
    let from = picked.len().saturating_sub(limit);
    // Each projected message with its length as compact JSON, measured once.
    let mut out: Vec<(Value, usize)> = Vec::with_capacity(picked.len() - from);
    for &i in &picked[from..] {
        let r = &recs[i];
        if r.oversized {
            let m = json!({"role": "assistant", "content": [{"type": "text", "text": OMITTED}],
                "__openclaw": {"id": r.id.as_deref(), "truncated": true, "reason": "oversized"}});
            let n = json_len(&m);
            out.push((m, n));
            continue;
        }
        let Ok(mut entry) = serde_json::from_slice::<Value>(&buf[r.start..r.end]) else {
            continue;
        };
        // The entry is ours: its message is projected in place, not copied.
        let message = entry.get_mut("message").map(Value::take);
        if let Some(m) = project(&entry, message, max_chars) {
            out.push(m);
        }
    }
    for (n, (m, len)) in out.iter_mut().enumerate() {
        if let Some(meta) = m.get_mut("__openclaw").and_then(Value::as_object_mut) {
            let seq = n + 1;
            // `,"seq":N` after the keys already there (every `__openclaw` has an `id` or a `kind`).
            *len += if meta.is_empty() { 6 } else { 7 } + seq.to_string().len();
            meta.insert("seq".into(), json!(seq));
        }
        debug_assert_eq!(*len, json_len(m), "the measured length of {m}");
    }
    cap_total(out)
}

/// One entry as `chat.history` shows it (`None`: not shown).
pub fn project_entry(entry: &Value, max_chars: usize) -> Option<Value> {
    project(entry, entry.get("message").cloned(), max_chars).map(|(m, _)| m)
}

/// [`project_entry`] with the entry's `message` handed over (taken out of `entry`, or a copy), and
/// the length of the result as compact JSON.
fn project(entry: &Value, message: Option<Value>, max_chars: usize) -> Option<(Value, usize)> {
    let id = entry.get("id").cloned().unwrap_or(Value::Null);
    let measured = |m: Value| {
        let n = json_len(&m);
        (m, n)
    };
    match entry.get("type").and_then(Value::as_str) {
        Some("compaction") => Some(measured(json!({
            "role": "system",
            "content": [{"type": "text", "text": "Compaction"}],
            "timestamp": js_date_ms(entry.get("timestamp")),
            "__openclaw": {"kind": "compaction", "id": id},
        }))),
        Some("message") => {
            let mut m = message?;
            let obj = m.as_object_mut()?;
            let role = obj.get("role").and_then(Value::as_str).unwrap_or("").to_owned();
            if role == "assistant" && is_silent(obj) {
                return None;
            }
            project_message(obj, &role, max_chars);
            let mut meta = Map::new();
            meta.insert("id".into(), id);
            if let Some(ms) = js_date_ms(entry.get("timestamp")) {
                meta.insert("recordTimestampMs".into(), json!(ms));
            }
            obj.insert("__openclaw".into(), Value::Object(meta));
            let (m, n) = measured(m);
            if n > MAX_MESSAGE_BYTES {
                let ts = m.get("timestamp").cloned().unwrap_or(Value::Null);
                return Some(measured(json!({"role": role, "timestamp": ts,
                    "content": [{"type": "text", "text": OMITTED}],
                    "__openclaw": {"id": entry.get("id"), "truncated": true, "reason": "oversized"}})));
            }
            Some((m, n))
        }
        _ => None,
    }
}

/// Display projection of one message, in place.
pub fn project_message(obj: &mut Map<String, Value>, role: &str, max_chars: usize) {
    obj.remove("details");
    if role != "assistant" {
        obj.remove("usage");
    }
    if let Some(Value::String(s)) = obj.get_mut("content") {
        truncate(s, max_chars);
    }
    if let Some(Value::Array(blocks)) = obj.get_mut("content") {
        for b in blocks.iter_mut() {
            let Some(b) = b.as_object_mut() else { continue };
            b.remove("thinkingSignature");
            match b.get("type").and_then(Value::as_str) {
                Some("image") => {
                    if let Some(Value::String(d)) = b.remove("data") {
                        b.insert("omitted".into(), json!(true));
                        b.insert("bytes".into(), json!(d.len() / 4 * 3));
                    }
                }
                Some("toolCall") => {
                    if let Some(args) = b.get_mut("arguments") {
                        let s = args.to_string();
                        if s.chars().count() > max_chars {
                            let mut s = s;
                            truncate(&mut s, max_chars);
                            *args = Value::String(s);
                        }
                    }
                }
                _ => {}
            }
            for k in ["text", "thinking", "partialJson"] {
                if let Some(Value::String(s)) = b.get_mut(k) {
                    truncate(s, max_chars);
                }
            }
        }
    }
}

fn truncate(s: &mut String, max_chars: usize) {
    if let Some((cut, _)) = s.char_indices().nth(max_chars) {
        s.truncate(cut);
        s.push_str("\n...(truncated)...");
    }
}

/// An assistant row whose only visible text is the silent token.
fn is_silent(obj: &Map<String, Value>) -> bool {
    let Some(Value::Array(blocks)) = obj.get("content") else {
        return false;
    };
    let texts: Vec<&str> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    !texts.is_empty()
        && texts.concat().trim() == "NO_REPLY"
        && !blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("toolCall") && truthy(b))
}

/// Drops the oldest messages until the JSON array fits [`MAX_RESPONSE_BYTES`] (each comes with its
/// length as compact JSON); says whether it dropped any.
fn cap_total(msgs: Vec<(Value, usize)>) -> (Vec<Value>, bool) {
    let mut total: usize = msgs.iter().map(|(_, n)| n + 1).sum::<usize>() + 2;
    let mut drop = 0;
    while total > MAX_RESPONSE_BYTES && drop < msgs.len() {
        total -= msgs[drop].1 + 1;
        drop += 1;
    }
    (msgs.into_iter().skip(drop).map(|(m, _)| m).collect(), drop > 0)
}

/// Length of `v` as compact JSON, counted without building the text.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    match serde_json::to_writer(&mut c, v) {
        Ok(()) => c.0,
        Err(_) => 0,
    }
}
