//! The index follows the transcripts: appended lines are indexed from the byte where the last
//! sync stopped (a line still being written waits), a replaced or shortened file is indexed again
//! from its start, a removed one is forgotten, and only user and assistant text is indexed.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_search::Index;
use serde_json::json;
use std::io::Write;
use std::path::Path;

fn line(id: &str, role: &str, text: &str) -> String {
    let content = if role == "assistant" { json!([{"type": "text", "text": text}]) } else { json!(text) };
    format!(
        "{}\n",
        json!({"type": "message", "id": id, "parentId": null, "timestamp": "2026-12-01T10:00:00.000Z",
        "message": {"role": role, "content": content, "timestamp": 1}})
    )
}

fn ids(index: &Index, q: &str) -> Vec<String> {
    let mut v: Vec<String> = index.search(q, None, 50).unwrap().into_iter().map(|h| h.entry_id).collect();
    v.sort();
    v
}

fn append(path: &Path, text: &str) {
    std::fs::OpenOptions::new().append(true).create(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
}

#[test]
fn appends_replacements_and_removals_are_followed() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let f = sessions.join("s1.jsonl");
    append(
        &f,
        "{\"type\":\"session\",\"version\":3,\"id\":\"s1\",\"timestamp\":\"2026-12-01T10:00:00.000Z\",\"cwd\":\"/\"}\n",
    );
    append(&f, &line("a", "user", "the walrus sings"));
    append(&f, &line("b", "assistant", "a walrus reply"));
    append(&f, &line("t", "toolResult", "walrus tool output"));
    let mut index = Index::open(dir.path()).unwrap();
    assert_eq!(index.sync_all().unwrap().messages, 2, "user and assistant only");
    assert_eq!(ids(&index, "walrus"), ["a", "b"]);
    assert_eq!(index.title("agents/main/sessions/s1.jsonl").unwrap().as_deref(), Some("the walrus sings"));

    // A line still being written is left for later, then taken in once whole.
    let whole = line("c", "user", "walrus number three");
    let (head, tail) = whole.split_at(20);
    append(&f, head);
    assert_eq!(index.sync_file(&f).unwrap(), 0);
    append(&f, tail);
    assert_eq!(index.sync_file(&f).unwrap(), 1);
    assert_eq!(ids(&index, "walrus"), ["a", "b", "c"]);
    assert_eq!(index.sync_file(&f).unwrap(), 0, "nothing new, nothing read twice");

    // Replaced (a repair writes a new file): indexed again, old rows gone.
    let tmp = sessions.join("s1.tmp");
    std::fs::write(
        &tmp,
        format!(
            "{{\"type\":\"session\",\"version\":3,\"id\":\"s1\",\"timestamp\":\"x\",\"cwd\":\"/\"}}\n{}",
            line("z", "user", "only the otter now")
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, &f).unwrap();
    index.sync_all().unwrap();
    assert_eq!(ids(&index, "walrus"), Vec::<String>::new());
    assert_eq!(ids(&index, "otter"), ["z"]);

    // Removed: forgotten. A file outside the state dir's sessions is ignored.
    std::fs::remove_file(&f).unwrap();
    index.sync_all().unwrap();
    assert_eq!(ids(&index, "otter"), Vec::<String>::new());
    let outside = dir.path().join("elsewhere.jsonl");
    append(&outside, &line("o", "user", "otter outside"));
    assert_eq!(index.sync_file(&outside).unwrap(), 0);

    // Rebuild gives the same as syncing.
    append(&sessions.join("s2.jsonl"), &line("q", "user", "quiet quokka"));
    index.sync_all().unwrap();
    let a = ids(&index, "quokka*");
    index.rebuild().unwrap();
    assert_eq!(ids(&index, "quokka*"), a);
    assert_eq!(a, ["q"]);
}

#[test]
fn files_synced_together_are_committed_together_and_one_failure_spares_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let (a, b) = (sessions.join("a.jsonl"), sessions.join("b.jsonl"));
    append(&a, &line("a1", "user", "amber albatross"));
    append(&b, &line("b1", "user", "amber bison"));
    // Named like a transcript but unreadable as one (a directory): its error is returned, the
    // others are indexed all the same.
    let bad = sessions.join("bad.jsonl");
    std::fs::create_dir(&bad).unwrap();
    let mut index = Index::open(dir.path()).unwrap();
    let (added, errors) = index.sync_files(&[a.clone(), bad.clone(), b.clone()]).unwrap();
    assert_eq!(added, 2);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("bad.jsonl"), "{}", errors[0]);
    assert_eq!(ids(&index, "amber"), ["a1", "b1"]);
    // The next sync reads only what came after.
    append(&b, &line("b2", "assistant", "amber again"));
    let (added, errors) = index.sync_files(&[a, b]).unwrap();
    assert_eq!((added, errors.len()), (1, 0));
    assert_eq!(ids(&index, "amber"), ["a1", "b1", "b2"]);
}
