//! `sessions.compact {maxLines}`: OpenClaw's compaction without a model. The transcript keeps its
//! header and its last `maxLines - 1` lines; links into what was cut are re-rooted (a `parentId`
//! that names a dropped entry becomes `null`, a `leaf` entry's dropped target is cleared, a
//! compaction's `firstKeptEntryId` off its own branch moves to the branch's first kept entry), as
//! OpenClaw 2026.9.6 normalizes them. Lines kept unchanged keep their bytes. The file is replaced
//! atomically under the session lock, and the whole old file stays beside it as `<file>.bak.<ts>`:
//! nothing is lost, the live file is only shorter.

use crate::lock::LockRegistry;
use crate::{StoreError, StoreOptions};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// What a trim did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trimmed {
    /// Whether the file was shortened.
    pub compacted: bool,
    /// Lines the file has now (header included); for a declined trim, the lines it has.
    pub kept: usize,
    /// The old file, kept whole (`None` when nothing changed).
    pub backup: Option<PathBuf>,
}

/// Trims `path` to `max_lines` lines (at least 1: the header) under the session lock.
pub(crate) fn trim(
    path: &Path,
    opts: &StoreOptions,
    locks: &LockRegistry,
    max_lines: usize,
) -> Result<Trimmed, StoreError> {
    let _guard = locks.acquire(path, &opts.lock)?;
    let data = std::fs::read(path).map_err(|source| StoreError::Io { path: path.display().to_string(), source })?;
    match trimmed(&data, max_lines.max(1)) {
        Err(kept) => Ok(Trimmed { compacted: false, kept, backup: None }),
        Ok(lines) => {
            let kept = lines.len();
            let mut content = lines.join(&b'\n');
            content.push(b'\n');
            let backup = crate::rewrite::replace_atomically(path, &content)?;
            Ok(Trimmed { compacted: true, kept, backup: Some(backup) })
        }
    }
}

/// The lines a trimmed file holds, or `Err(lines it has)` when there is nothing to trim (or no
/// valid header to keep).
fn trimmed(data: &[u8], max_lines: usize) -> Result<Vec<Vec<u8>>, usize> {
    let lines: Vec<&[u8]> = data.split(|b| *b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).collect();
    let kept = trim_lines(&lines, max_lines)?;
    Ok(kept.into_iter().map(|k| k.changed.unwrap_or_else(|| lines[k.index].to_vec())).collect())
}

/// One line a trim keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its index in the lines trimmed (0: the header).
    pub index: usize,
    /// Its new bytes when a link into the cut was re-rooted (`None`: kept as it was).
    pub changed: Option<Vec<u8>>,
}

/// The trim of a transcript's non-blank `lines` (the header first) to `max_lines` (at least 1):
/// the lines kept, in order, or `Err(lines it has)` when there is nothing to trim (or no valid
/// header to keep). The one rule for every store (files here, rows in `pincer-pg`).
pub fn trim_lines(lines: &[&[u8]], max_lines: usize) -> Result<Vec<Kept>, usize> {
    let max_lines = max_lines.max(1);
    if lines.len() <= max_lines {
        return Err(lines.len());
    }
    let header: Option<Map<String, Value>> = serde_json::from_slice(lines[0]).ok();
    if !header.is_some_and(|h| h.get("type").and_then(Value::as_str) == Some("session") && h["id"].is_string()) {
        return Err(0);
    }
    let first_kept = lines.len() - (max_lines - 1);
    let tail = &lines[first_kept..];
    let mut out = vec![Kept { index: 0, changed: None }];
    let mut retained: HashSet<String> = HashSet::new();
    // `leaf` entries with an unusable target pass their own parent on (OpenClaw's "transparent" ones).
    let mut transparent: HashMap<String, Value> = HashMap::new();
    let mut parents: HashMap<String, Option<String>> = HashMap::new();
    for (index, line) in tail.iter().enumerate().map(|(i, l)| (first_kept + i, l)) {
        let Ok(mut record) = serde_json::from_slice::<Map<String, Value>>(line) else { continue };
        let original = record.clone();
        let mut parent = record.get("parentId").cloned().unwrap_or(Value::Null);
        let mut seen = HashSet::new();
        while let Some(p) = parent.as_str().map(str::to_owned) {
            match transparent.get(&p) {
                Some(next) if seen.insert(p) => parent = next.clone(),
                _ => break,
            }
        }
        if parent.as_str().is_some_and(|p| !retained.contains(p)) {
            parent = Value::Null;
        }
        if record.contains_key("parentId") || !parent.is_null() {
            record.insert("parentId".into(), parent.clone());
        }
        let id = record.get("id").and_then(Value::as_str).map(str::to_owned);
        let kind = record.get("type").and_then(Value::as_str).unwrap_or_default().to_owned();
        if kind == "leaf" {
            let target = record.get("targetId").cloned().unwrap_or(Value::Null);
            let valid = target.is_null() || target.as_str().is_some_and(|t| !t.trim().is_empty());
            if let (false, Some(id)) = (valid, &id) {
                transparent.insert(id.clone(), parent.clone());
            }
            if target.as_str().is_some_and(|t| !t.trim().is_empty() && !retained.contains(t)) {
                record.insert("targetId".into(), Value::Null);
                record.insert("appendParentId".into(), Value::Null);
            } else if valid
                && record.get("appendParentId").and_then(Value::as_str).is_some_and(|a| !retained.contains(a))
            {
                record.insert("appendParentId".into(), target);
            }
        }
        if let (true, Some(id)) = (kind == "compaction" || kind == "reset", &id) {
            let first = record.get("firstKeptEntryId").and_then(Value::as_str).map(str::to_owned);
            if let Some(first) = first.filter(|f| f != id) {
                // The branch from the root of what is kept down to this entry.
                let mut path = Vec::new();
                let mut at = parent.as_str().map(str::to_owned);
                while let Some(p) = at {
                    at = parents.get(&p).cloned().flatten();
                    path.push(p);
                }
                if !path.contains(&first) {
                    let root = path.last().cloned().unwrap_or_else(|| id.clone());
                    record.insert("firstKeptEntryId".into(), Value::String(root));
                }
            }
        }
        if let Some(id) = id.filter(|i| !i.trim().is_empty()) {
            parents.insert(id.clone(), parent.as_str().map(str::to_owned));
            retained.insert(id);
        }
        let changed = (record != original).then(|| serde_json::to_vec(&record).ok()).flatten();
        out.push(Kept { index, changed });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::trimmed;

    fn lines(v: &[serde_json::Value]) -> Vec<u8> {
        v.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes()
    }

    #[test]
    fn keeps_the_header_and_the_tail_and_re_roots_cut_links() {
        use serde_json::json;
        let file = lines(&[
            json!({"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"}),
            json!({"type": "message", "id": "a", "parentId": null, "message": {"role": "user", "content": "1"}}),
            json!({"type": "message", "id": "b", "parentId": "a", "message": {"role": "assistant", "content": []}}),
            json!({"type": "compaction", "id": "c", "parentId": "b", "summary": "s", "firstKeptEntryId": "a",
                "tokensBefore": 9}),
            json!({"type": "message", "id": "d", "parentId": "c", "message": {"role": "user", "content": "2"}}),
            json!({"type": "leaf", "id": "e", "parentId": "d", "targetId": "b"}),
        ]);
        let out = trimmed(&file, 4).expect("trimmed");
        let text: Vec<serde_json::Value> = out.iter().map(|l| serde_json::from_slice(l).expect("json")).collect();
        assert_eq!(text.len(), 4);
        assert_eq!(text[0]["id"], "s");
        // The compaction is now the root, and its first kept entry (cut) becomes itself's branch root.
        assert_eq!((text[1]["id"].as_str(), &text[1]["parentId"]), (Some("c"), &json!(null)));
        assert_eq!(text[1]["firstKeptEntryId"], "c");
        // An untouched line keeps its bytes.
        assert_eq!(out[2], file.split(|b| *b == b'\n').nth(4).expect("line d"));
        // The leaf's target was cut.
        assert_eq!((&text[3]["targetId"], &text[3]["appendParentId"]), (&json!(null), &json!(null)));
        // Nothing to trim, or no header to keep: declined with the count.
        assert_eq!(trimmed(&file, 6), Err(6));
        assert_eq!(trimmed(&file[file.iter().position(|b| *b == b'\n').expect("nl") + 1..], 2), Err(0));
    }
}
