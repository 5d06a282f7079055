//! `chat.history` in windows: `before` pages back along the branch that leads to an entry, window
//! after window, down to the first message, with `has_older` true until then; the windows of a file
//! larger than the first tail read and of a linear (legacy) file join up without gaps or repeats;
//! an entry on another branch pages back along its own branch; an unknown entry gives nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)] // tests fail loudly; they write their fixture files directly

use pincer_store::history::{read_history, HistoryOptions};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;

fn write(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).expect("write fixture");
}

fn header() -> String {
    json!({"type": "session", "version": 3, "id": "w", "timestamp": "2025-01-01T00:00:00.000Z", "cwd": "/"}).to_string()
}

/// A message entry; `parent` is left out entirely for a linear (pre-tree) file.
fn entry(id: &str, parent: Option<Option<&str>>, text: &str) -> String {
    let mut e = json!({"type": "message", "id": id, "timestamp": "2025-01-01T00:00:00.000Z",
        "message": {"role": if id.ends_with(['0', '2', '4', '6', '8']) { "user" } else { "assistant" },
            "content": [{"type": "text", "text": text}], "timestamp": 1}});
    if let Some(p) = parent {
        e["parentId"] = json!(p);
    }
    e.to_string()
}

fn texts(msgs: &[Value]) -> Vec<String> {
    msgs.iter().map(|m| m["content"][0]["text"].as_str().unwrap_or("?").to_owned()).collect()
}

fn id_of(m: &Value) -> String {
    m["__openclaw"]["id"].as_str().expect("id").to_owned()
}

/// Pages back from the leaf with `limit` until `has_older` is false; every message once, in order.
fn all_windows(path: &Path, limit: usize) -> (Vec<String>, usize) {
    let mut opts = HistoryOptions { limit, ..HistoryOptions::default() };
    let mut got: Vec<String> = Vec::new();
    let mut windows = 0;
    loop {
        let h = read_history(path, opts.clone()).expect("history");
        windows += 1;
        assert!(h.messages.len() <= limit, "a window holds at most the limit");
        let mut t = texts(&h.messages);
        t.append(&mut got);
        got = t;
        if !h.has_older {
            break;
        }
        assert!(!h.messages.is_empty(), "has_older with an empty window would never end");
        opts.before = Some(id_of(&h.messages[0]));
        assert!(windows < 10_000, "paging does not end");
    }
    (got, windows)
}

#[test]
fn windows_reach_the_first_message_of_a_long_branch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("long.jsonl");
    // 2,500 messages of ~200 bytes: about 0.6 MB, well past the first 128 KiB tail read.
    let mut lines = vec![header()];
    for i in 0..2500 {
        let parent = (i > 0).then(|| format!("m{}", i - 1));
        lines.push(entry(&format!("m{i}"), Some(parent.as_deref()), &format!("message {i} {}", "x".repeat(120))));
    }
    write(&path, &lines);
    let want: Vec<String> = (0..2500).map(|i| format!("message {i} {}", "x".repeat(120))).collect();
    let (got, windows) = all_windows(&path, 1000);
    assert_eq!(got.len(), 2500);
    assert!(got == want, "the windows join up in order, without gaps or repeats");
    assert_eq!(windows, 3);
    let (got, windows) = all_windows(&path, 200);
    assert!(got == want);
    assert_eq!(windows, 13);
    // The last window: exactly the first messages, nothing older.
    let h = read_history(&path, HistoryOptions { limit: 10, before: Some("m10".into()), ..HistoryOptions::default() })
        .expect("history");
    assert_eq!(h.messages.iter().map(id_of).collect::<Vec<_>>(), (0..10).map(|i| format!("m{i}")).collect::<Vec<_>>());
    assert!(!h.has_older);
    let h = read_history(&path, HistoryOptions { limit: 10, before: Some("m11".into()), ..HistoryOptions::default() })
        .expect("history");
    assert_eq!(h.messages.len(), 10);
    assert!(h.has_older, "m0 is still before the window");
    // Before the first message: nothing. An unknown entry: nothing either.
    for before in ["m0", "nope"] {
        let h = read_history(&path, HistoryOptions { before: Some(before.into()), ..HistoryOptions::default() })
            .expect("history");
        assert_eq!((h.messages.len(), h.has_older), (0, false), "before {before}");
    }
}

#[test]
fn a_window_before_an_entry_on_another_branch_follows_that_branch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("branched.jsonl");
    let mut lines = vec![header()];
    for i in 0..20 {
        let parent = (i > 0).then(|| format!("m{}", i - 1));
        lines.push(entry(&format!("m{i}"), Some(parent.as_deref()), &format!("main {i}")));
    }
    // A second branch from m9; the leaf is its last entry.
    for i in 0..6 {
        let parent = if i == 0 { "m9".to_owned() } else { format!("b{}", i * 2 - 2) };
        lines.push(entry(&format!("b{}", i * 2), Some(Some(&parent)), &format!("side {i}")));
    }
    write(&path, &lines);
    let h = read_history(&path, HistoryOptions::default()).expect("history");
    assert_eq!(h.messages.len(), 16, "the active branch: m0..m9 and six side entries");
    assert!(!h.has_older);
    let h = read_history(&path, HistoryOptions { limit: 4, before: Some("m15".into()), ..HistoryOptions::default() })
        .expect("history");
    assert_eq!(texts(&h.messages), ["main 11", "main 12", "main 13", "main 14"]);
    assert!(h.has_older);
    let h = read_history(&path, HistoryOptions { limit: 4, before: Some("b4".into()), ..HistoryOptions::default() })
        .expect("history");
    assert_eq!(texts(&h.messages), ["main 8", "main 9", "side 0", "side 1"]);
}

#[test]
fn a_linear_file_pages_in_file_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("linear.jsonl");
    let mut lines = vec![header()];
    for i in 0..250 {
        lines.push(entry(&format!("m{i}"), None, &format!("old {i}")));
    }
    write(&path, &lines);
    let (got, windows) = all_windows(&path, 100);
    assert!(got == (0..250).map(|i| format!("old {i}")).collect::<Vec<_>>(), "{got:?}");
    assert_eq!(windows, 3);
    // Exactly the limit left: no further window is promised.
    let h = read_history(&path, HistoryOptions { limit: 50, before: Some("m50".into()), ..HistoryOptions::default() })
        .expect("history");
    assert_eq!((h.messages.len(), h.has_older), (50, false));
}
