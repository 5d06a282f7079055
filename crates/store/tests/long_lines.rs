//! Reads that take a file in pieces give the answers of one plain read: a small first look at
//! either end (the header when a file is opened, the backwards scan for the leaf, `chat.history`'s
//! session id) also when those lines are far longer than the first look, or when lines before the
//! header are long and broken; and a large file read by several threads at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)] // tests fail loudly; they write their fixture files directly

use pincer_store::history::{read_history, HistoryOptions};
use pincer_store::{NewEntry, Store, StoreOptions};
use pretty_assertions::assert_eq;
use serde_json::json;
use std::path::Path;

fn write(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).expect("write fixture");
}

fn entry(id: &str, parent: Option<&str>, text: &str) -> String {
    json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2025-01-01T00:00:00.000Z",
        "message": {"role": "user", "content": text, "timestamp": 1}})
    .to_string()
}

#[test]
fn long_header_and_last_lines_read_as_short_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (header_pad, last_pad) in [(0, 0), (20_000, 0), (0, 300_000), (40_000, 1_000_000)] {
        let path = dir.path().join(format!("s-{header_pad}-{last_pad}.jsonl"));
        let header = json!({"type": "session", "version": 3, "id": "long", "timestamp": "2025-01-01T00:00:00.000Z",
            "cwd": "x".repeat(header_pad)})
        .to_string();
        write(&path, &[header, entry("a", None, "first"), entry("b", Some("a"), &"y".repeat(last_pad))]);

        let store = Store::new(StoreOptions::default());
        assert_eq!(store.leaf(&path).expect("leaf").as_deref(), Some("b"), "{}", path.display());
        let h = read_history(&path, HistoryOptions::default()).expect("history");
        assert_eq!(h.session_id.as_deref(), Some("long"), "{}", path.display());
        // The header was read as valid: an append continues the chain, no rewrite.
        let before = std::fs::read(&path).expect("read");
        let appended =
            store.append(&path, NewEntry::message(json!({"role": "user", "content": "next", "timestamp": 2})));
        assert_eq!(appended.expect("append").entry["parentId"], "b");
        assert!(std::fs::read(&path).expect("read").starts_with(&before), "the file was rewritten");
    }
}

#[test]
fn a_long_broken_line_before_the_header_hides_the_session_id_as_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let header =
        json!({"type": "session", "version": 3, "id": "late", "timestamp": "2025-01-01T00:00:00.000Z", "cwd": "/"})
            .to_string();
    // Not JSON and longer than the first look: the header on the next line still gives the id.
    let path = dir.path().join("broken-first.jsonl");
    write(&path, &[format!("{{\"broken\": \"{}", "z".repeat(10_000)), header.clone(), entry("a", None, "hi")]);
    assert_eq!(read_history(&path, HistoryOptions::default()).expect("history").session_id.as_deref(), Some("late"));
    // A first JSON line that is not a header: no session id, however long it is.
    let path = dir.path().join("json-first.jsonl");
    write(&path, &[json!({"note": "q".repeat(10_000)}).to_string(), header, entry("a", None, "hi")]);
    assert_eq!(read_history(&path, HistoryOptions::default()).expect("history").session_id, None);
}

#[test]
fn a_large_file_read_in_parallel_is_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    for len in [100, 9 * 1024 * 1024 + 3, 20 * 1024 * 1024 + 1] {
        let path = dir.path().join(format!("big-{len}.jsonl"));
        let bytes: Vec<u8> = (0..len).map(|i: usize| (i % 251) as u8 ^ (i / 4096) as u8).collect();
        std::fs::write(&path, &bytes).expect("write fixture");
        assert!(pincer_store::session::read_whole(&path).expect("read") == bytes, "{len} bytes read differently");
    }
    assert_eq!(
        pincer_store::session::read_whole(&dir.path().join("missing")).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::NotFound)
    );
}
