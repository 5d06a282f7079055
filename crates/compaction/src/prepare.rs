//! Pi 0.73.1's pure preparation: `findCutPoint` and `prepareCompaction` over the entries of the
//! active path (`pi-session-format.md` §12.3–12.4), and the context messages of a path
//! (`buildSessionContext`, §10) that `tokensBefore` is estimated from.

use crate::serialize::FileOps;
use crate::serialize::{compute_file_lists, convert_to_llm, format_file_operations, serialize_conversation, FileLists};
use crate::tokens::{estimate_context_tokens, estimate_tokens};
use pincer_store::ids::js_date_ms;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// The settings `prepareCompaction` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrepareSettings {
    /// `reserveTokens`: sizes the summary calls (`maxTokens = 0.8 × reserve`, `0.5 ×` for a prefix).
    pub reserve_tokens: u64,
    /// `keepRecentTokens`: the recent tail kept verbatim.
    pub keep_recent_tokens: u64,
}

impl Default for PrepareSettings {
    fn default() -> Self {
        PrepareSettings { reserve_tokens: 16384, keep_recent_tokens: 20000 }
    }
}

fn entry_type(e: &Value) -> &str {
    e.get("type").and_then(Value::as_str).unwrap_or("")
}

fn message_role(e: &Value) -> &str {
    e.get("message").and_then(|m| m.get("role")).and_then(Value::as_str).unwrap_or("")
}

fn ts(e: &Value) -> Value {
    js_date_ms(e.get("timestamp")).map(Value::from).unwrap_or(Value::Null)
}

fn insert_opt(m: &mut Map<String, Value>, k: &str, v: Option<&Value>) {
    if let Some(v) = v {
        m.insert(k.into(), v.clone());
    }
}

/// `createCustomMessage(customType, content, display, details, timestamp)`.
fn custom_message(e: &Value) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), json!("custom"));
    for k in ["customType", "content", "display", "details"] {
        insert_opt(&mut m, k, e.get(k));
    }
    m.insert("timestamp".into(), ts(e));
    Value::Object(m)
}

/// `createBranchSummaryMessage(summary, fromId, timestamp)`.
fn branch_summary_message(e: &Value) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), json!("branchSummary"));
    insert_opt(&mut m, "summary", e.get("summary"));
    insert_opt(&mut m, "fromId", e.get("fromId"));
    m.insert("timestamp".into(), ts(e));
    Value::Object(m)
}

/// `createCompactionSummaryMessage(summary, tokensBefore, timestamp)`.
fn compaction_summary_message(e: &Value) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), json!("compactionSummary"));
    insert_opt(&mut m, "summary", e.get("summary"));
    insert_opt(&mut m, "tokensBefore", e.get("tokensBefore"));
    m.insert("timestamp".into(), ts(e));
    Value::Object(m)
}

/// `getMessageFromEntryForCompaction`: the message an entry contributes to a summary (compactions
/// are skipped in 0.73).
fn message_for_compaction(e: &Value) -> Option<Cow<'_, Value>> {
    match entry_type(e) {
        "message" => Some(Cow::Borrowed(e.get("message").unwrap_or(&Value::Null))),
        "custom_message" => Some(Cow::Owned(custom_message(e))),
        "branch_summary" => Some(Cow::Owned(branch_summary_message(e))),
        _ => None,
    }
}

/// `buildSessionContext`'s emit rule for one entry.
fn context_emit<'a>(e: &'a Value, out: &mut Vec<Cow<'a, Value>>) {
    match entry_type(e) {
        "message" => out.push(Cow::Borrowed(e.get("message").unwrap_or(&Value::Null))),
        "custom_message" => out.push(Cow::Owned(custom_message(e))),
        "branch_summary" if e.get("summary").is_some_and(pincer_pi::js::truthy) => {
            out.push(Cow::Owned(branch_summary_message(e)))
        }
        _ => {}
    }
}

/// The messages `buildSessionContext(pathEntries)` gives for a root→leaf path: the last compaction's
/// summary, the kept entries from its `firstKeptEntryId`, and everything after it.
pub fn path_context_messages(path: &[Value]) -> Vec<Cow<'_, Value>> {
    let mut out = Vec::new();
    let Some(cpos) = path.iter().rposition(|e| entry_type(e) == "compaction") else {
        for e in path {
            context_emit(e, &mut out);
        }
        return out;
    };
    let c = &path[cpos];
    out.push(Cow::Owned(compaction_summary_message(c)));
    // Pi finds the compaction again by id: the first compaction on the path with that id.
    let cid = c.get("id");
    let cidx = path.iter().position(|e| entry_type(e) == "compaction" && e.get("id") == cid).unwrap_or(cpos);
    let first_kept = c.get("firstKeptEntryId").filter(|v| !v.is_null());
    let mut found = false;
    for e in &path[..cidx] {
        if first_kept.is_some() && e.get("id") == first_kept {
            found = true;
        }
        if found {
            context_emit(e, &mut out);
        }
    }
    for e in &path[cidx + 1..] {
        context_emit(e, &mut out);
    }
    out
}

/// `findCutPoint`'s result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CutPoint {
    pub first_kept_entry_index: usize,
    /// The user (or bashExecution, custom_message, branch_summary) entry starting the split turn.
    pub turn_start_index: Option<usize>,
    pub is_split_turn: bool,
}

fn is_cut_point(e: &Value) -> bool {
    match entry_type(e) {
        "message" => matches!(
            message_role(e),
            "bashExecution" | "custom" | "branchSummary" | "compactionSummary" | "user" | "assistant"
        ),
        "branch_summary" | "custom_message" => true,
        _ => false,
    }
}

/// `findTurnStartIndex(entries, entryIndex, startIndex)`.
pub fn find_turn_start_index(entries: &[Value], entry_index: usize, start: usize) -> Option<usize> {
    (start..=entry_index.min(entries.len().saturating_sub(1))).rev().find(|&i| {
        let e = &entries[i];
        match entry_type(e) {
            "branch_summary" | "custom_message" => true,
            "message" => matches!(message_role(e), "user" | "bashExecution"),
            _ => false,
        }
    })
}

/// `findCutPoint(entries, start, end, keepRecentTokens)` with `tokens(i)` the estimate of the
/// message entry `i` (so a caller can reuse estimates).
fn find_cut_point_with(
    entries: &[Value],
    start: usize,
    end: usize,
    keep_recent_tokens: u64,
    tokens: &dyn Fn(usize) -> u64,
) -> CutPoint {
    let end = end.min(entries.len());
    let cut_points: Vec<usize> = (start..end).filter(|&i| is_cut_point(&entries[i])).collect();
    let Some(&first) = cut_points.first() else {
        return CutPoint { first_kept_entry_index: start, turn_start_index: None, is_split_turn: false };
    };
    let mut acc = 0u64;
    let mut cut = first;
    for i in (start..end).rev() {
        if entry_type(&entries[i]) != "message" {
            continue;
        }
        acc += tokens(i);
        if acc >= keep_recent_tokens {
            // The first cut point at or after i (cut_points is ascending).
            let k = cut_points.partition_point(|&c| c < i);
            if let Some(&c) = cut_points.get(k) {
                cut = c;
            }
            break;
        }
    }
    // Pull preceding non-message entries (settings, labels, custom…) into the kept range.
    while cut > start {
        let t = entry_type(&entries[cut - 1]);
        if t == "compaction" || t == "message" {
            break;
        }
        cut -= 1;
    }
    let cut_entry = &entries[cut];
    let is_user = entry_type(cut_entry) == "message" && message_role(cut_entry) == "user";
    let turn_start = if is_user { None } else { find_turn_start_index(entries, cut, start) };
    CutPoint {
        first_kept_entry_index: cut,
        turn_start_index: turn_start,
        is_split_turn: !is_user && turn_start.is_some(),
    }
}

/// `findCutPoint(entries, start, end, keepRecentTokens)` (§12.4).
pub fn find_cut_point(entries: &[Value], start: usize, end: usize, keep_recent_tokens: u64) -> CutPoint {
    let tokens = |i: usize| entries[i].get("message").map(estimate_tokens).unwrap_or(0);
    find_cut_point_with(entries, start, end, keep_recent_tokens, &tokens)
}

/// `prepareCompaction`'s result, plus what Pincer derives from it.
#[derive(Clone, Debug, PartialEq)]
pub struct Preparation {
    pub first_kept_entry_id: String,
    /// Index of the first kept entry on the path.
    pub first_kept_entry_index: usize,
    /// Its entry `type`.
    pub first_kept_entry_type: String,
    pub is_split_turn: bool,
    pub turn_start_index: Option<usize>,
    /// Where summarization starts on the path (the previous compaction's first kept entry, or 0).
    pub boundary_start: usize,
    pub tokens_before: u64,
    pub previous_summary: Option<String>,
    pub messages_to_summarize: Vec<Value>,
    pub turn_prefix_messages: Vec<Value>,
    pub file_ops: FileOps,
    pub settings: PrepareSettings,
}

impl Preparation {
    /// `computeFileLists(fileOps)`: the compaction entry's `details`.
    pub fn details(&self) -> FileLists {
        compute_file_lists(&self.file_ops)
    }

    /// `formatFileOperations(...)`: what is appended to the summary.
    pub fn file_ops_suffix(&self) -> String {
        let d = self.details();
        format_file_operations(&d.read_files, &d.modified_files)
    }

    /// The text inside `<conversation>` of the history request.
    pub fn serialized_history(&self) -> String {
        serialize_conversation(&convert_to_llm(&self.messages_to_summarize))
    }

    /// The text inside `<conversation>` of the turn-prefix request (empty without a split).
    pub fn serialized_turn_prefix(&self) -> String {
        serialize_conversation(&convert_to_llm(&self.turn_prefix_messages))
    }

    /// True when no LLM input exists at all (nothing before the kept tail).
    pub fn nothing_to_summarize(&self) -> bool {
        self.messages_to_summarize.is_empty() && self.turn_prefix_messages.is_empty()
    }
}

/// Per-entry token estimates of a path, as the oracle prints them: `{index, id, type}` for every
/// entry, plus `role` and `tokens` for `message` entries (the only ones `findCutPoint` counts).
pub fn entry_tokens(path: &[Value]) -> Vec<Value> {
    path.iter()
        .enumerate()
        .map(|(i, e)| {
            let mut m = Map::new();
            m.insert("index".into(), json!(i));
            insert_opt(&mut m, "id", e.get("id"));
            insert_opt(&mut m, "type", e.get("type"));
            if entry_type(e) == "message" {
                let msg = e.get("message").unwrap_or(&Value::Null);
                insert_opt(&mut m, "role", msg.get("role"));
                m.insert("tokens".into(), json!(estimate_tokens(msg)));
            }
            Value::Object(m)
        })
        .collect()
}

/// `prepareCompaction(pathEntries, settings)` of Pi 0.73.1: `None` when the path ends in a
/// compaction or the first kept entry has no id.
pub fn prepare_compaction(path: &[Value], settings: PrepareSettings) -> Option<Preparation> {
    if path.last().is_some_and(|e| entry_type(e) == "compaction") {
        return None;
    }
    let prev_idx = path.iter().rposition(|e| entry_type(e) == "compaction");
    let mut previous_summary = None;
    let mut boundary_start = 0;
    if let Some(pi) = prev_idx {
        let prev = &path[pi];
        previous_summary = prev.get("summary").and_then(Value::as_str).map(str::to_owned);
        let fk = prev.get("firstKeptEntryId");
        // `entry.id === prev.firstKeptEntryId`: undefined matches an entry without id.
        let found = path.iter().position(|e| match (e.get("id"), fk) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b,
            _ => false,
        });
        boundary_start = found.unwrap_or(pi + 1);
    }
    // Estimates of every message on the path, computed once and shared with the cut-point walk.
    let context = path_context_messages(path);
    let tokens_before = estimate_context_tokens(&context).tokens;
    drop(context);
    let cut = find_cut_point(path, boundary_start, path.len(), settings.keep_recent_tokens);
    let first_kept = path.get(cut.first_kept_entry_index)?;
    let first_kept_id = match first_kept.get("id") {
        Some(v) if pincer_pi::js::truthy(v) => match v {
            Value::String(s) => s.clone(),
            other => pincer_pi::js::stringify(other),
        },
        _ => return None,
    };
    let history_end = match (cut.is_split_turn, cut.turn_start_index) {
        (true, Some(t)) => t,
        _ => cut.first_kept_entry_index,
    };
    let messages_to_summarize: Vec<Value> = path[boundary_start.min(history_end)..history_end]
        .iter()
        .filter_map(message_for_compaction)
        .map(Cow::into_owned)
        .collect();
    let turn_prefix_messages: Vec<Value> = match (cut.is_split_turn, cut.turn_start_index) {
        (true, Some(t)) => {
            path[t..cut.first_kept_entry_index].iter().filter_map(message_for_compaction).map(Cow::into_owned).collect()
        }
        _ => Vec::new(),
    };
    let mut file_ops = FileOps::default();
    if let Some(pi) = prev_idx {
        let prev = &path[pi];
        if !prev.get("fromHook").is_some_and(pincer_pi::js::truthy) {
            if let Some(d) = prev.get("details").filter(|d| pincer_pi::js::truthy(d)) {
                for f in d.get("readFiles").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(f) = f.as_str() {
                        file_ops.read.insert(f);
                    }
                }
                for f in d.get("modifiedFiles").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(f) = f.as_str() {
                        file_ops.edited.insert(f);
                    }
                }
            }
        }
    }
    for m in messages_to_summarize.iter().chain(&turn_prefix_messages) {
        file_ops.add_from_message(m);
    }
    Some(Preparation {
        first_kept_entry_id: first_kept_id,
        first_kept_entry_index: cut.first_kept_entry_index,
        first_kept_entry_type: entry_type(first_kept).to_owned(),
        is_split_turn: cut.is_split_turn,
        turn_start_index: cut.turn_start_index,
        boundary_start,
        tokens_before,
        previous_summary,
        messages_to_summarize,
        turn_prefix_messages,
        file_ops,
        settings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, m: Value) -> Value {
        json!({"type":"message","id":id,"parentId":null,"timestamp":"2025-01-01T00:00:00.000Z","message":m})
    }
    fn user(id: &str, text: &str) -> Value {
        msg(id, json!({"role":"user","content":text}))
    }
    fn assistant(id: &str, text: &str) -> Value {
        msg(id, json!({"role":"assistant","content":[{"type":"text","text":text}],"stopReason":"stop"}))
    }
    fn tool_result(id: &str, text: &str) -> Value {
        msg(id, json!({"role":"toolResult","toolCallId":"t","content":[{"type":"text","text":text}]}))
    }
    fn cut(first: usize, turn: Option<usize>, split: bool) -> CutPoint {
        CutPoint { first_kept_entry_index: first, turn_start_index: turn, is_split_turn: split }
    }

    /// §15 case 43.
    #[test]
    fn cut_point_rules() {
        let x40 = "x".repeat(40); // 10 tokens
        let path = vec![
            user("u1", &x40),
            assistant("a1", &x40),
            user("u2", &x40),
            assistant("a2", &x40),
            tool_result("t2", &x40),
            assistant("a3", &x40),
        ];
        let settings = json!({"type":"thinking_level_change","id":"s","thinkingLevel":"high"});
        let got = vec![
            // Everything fits: the first cut point.
            find_cut_point(&path, 0, path.len(), 1000),
            // No cut point in range (a lone tool result): start.
            find_cut_point(&path, 4, 5, 5),
            // The budget is reached at the tool result: the next assistant, split, turn at u2.
            find_cut_point(&path, 0, path.len(), 20),
            // The budget is reached exactly at a user: no split.
            find_cut_point(&path, 0, path.len(), 40),
            // At a user preceded by a settings entry: the back-scan moves onto it (F05 quirk).
            find_cut_point(&[user("u0", &x40), settings, user("u1", &x40)], 0, 3, 10),
        ];
        assert_eq!(
            got,
            vec![
                cut(0, None, false),
                cut(4, None, false),
                cut(5, Some(2), true),
                cut(2, None, false),
                cut(1, Some(0), true)
            ]
        );
    }

    /// §15 case 44.
    #[test]
    fn huge_trailing_tool_result_keeps_everything() {
        let mut path = vec![user("u", "hi"), assistant("a", "ok"), tool_result("t", &"z".repeat(4000))];
        let keep_all = find_cut_point(&path, 0, path.len(), 100);
        path.push(assistant("a2", "done"));
        let with_final = find_cut_point(&path, 0, path.len(), 100);
        assert_eq!((keep_all, with_final), (cut(0, None, false), cut(3, Some(0), true)));
    }

    /// §15 case 48.
    #[test]
    fn prepare_on_compaction_leaf_and_small_session() {
        let compaction = json!({"type":"compaction","id":"c","parentId":"a","summary":"S","firstKeptEntryId":"u",
            "tokensBefore":10,"timestamp":"2025-01-01T00:00:00.000Z"});
        let small = vec![user("u", "hello"), assistant("a", "hi")];
        assert_eq!(
            prepare_compaction(&[small[0].clone(), small[1].clone(), compaction], PrepareSettings::default()),
            None
        );
        let p = prepare_compaction(&small, PrepareSettings::default()).unwrap();
        assert_eq!(
            (p.first_kept_entry_id.as_str(), p.is_split_turn, p.messages_to_summarize.len(), p.tokens_before),
            ("u", false, 0, 2 + 1)
        );
    }

    #[test]
    fn context_with_compaction_keeps_from_first_kept() {
        let path = vec![
            user("u1", "a"),
            assistant("a1", "b"),
            user("u2", "c"),
            assistant("a2", "d"),
            json!({"type":"compaction","id":"c","summary":"S","firstKeptEntryId":"u2","tokensBefore":10,
                   "timestamp":"2025-01-01T00:00:00.000Z"}),
            user("u3", "e"),
        ];
        let roles: Vec<Value> = path_context_messages(&path).iter().map(|m| m["role"].clone()).collect();
        assert_eq!(roles, vec![json!("compactionSummary"), json!("user"), json!("assistant"), json!("user")]);
    }
}
