//! The append path through real files: chaining, idempotency, other writers, torn tails, migration,
//! header-less files, branching, concurrency, permissions and redaction.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use pincer_store::{build_context, NewEntry, ParentChoice, Session, Store, StoreError, StoreOptions};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text, "timestamp": 1})
}

fn keyed(text: &str, key: &str) -> Value {
    json!({"role": "user", "content": text, "timestamp": 1, "idempotencyKey": key})
}

fn lines(path: &Path) -> Vec<Value> {
    pincer_testkit::probe::read_rows(path)
}

fn context_texts(path: &Path) -> Vec<String> {
    let s = Session::parse(std::fs::read(path).expect("read"));
    build_context(&s, &s.leaf)
        .message_values()
        .iter()
        .map(|m| m["content"].as_str().map(str::to_owned).unwrap_or_else(|| m["content"].to_string()))
        .collect()
}

#[test]
fn appends_are_chained_and_a_fresh_store_continues_the_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("sessions/abc.jsonl");
    let store = Store::new(StoreOptions::default());
    let a = store.append(&f, NewEntry::message(user("one"))).expect("append");
    let b = store.append(&f, NewEntry::message(user("two"))).expect("append");
    let c = Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("three"))).expect("append");
    let l = lines(&f);
    assert_eq!(l.len(), 4);
    assert_eq!(l[0]["type"], "session");
    assert_eq!(l[0]["version"], 3);
    assert_eq!(l[0]["id"], "abc", "the header id defaults to the file stem");
    assert_eq!(l[1], a.entry);
    assert_eq!(l[2], b.entry);
    assert_eq!(l[3], c.entry);
    assert_eq!(a.entry["parentId"], Value::Null);
    assert_eq!(b.entry["parentId"], a.entry["id"]);
    assert_eq!(c.entry["parentId"], b.entry["id"]);
    let keys: Vec<&str> = l[1].as_object().expect("object").keys().map(String::as_str).collect();
    assert_eq!(keys, vec!["type", "id", "parentId", "timestamp", "message"]);
    assert_eq!(context_texts(&f), vec!["one", "two", "three"]);
}

#[test]
fn new_files_are_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("agents/main/sessions/s.jsonl");
    Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("x"))).expect("append");
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&f), 0o600);
    assert_eq!(mode(f.parent().expect("dir")), 0o700);
}

#[test]
fn idempotency_key_returns_the_existing_entry_across_stores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let first = store.append(&f, NewEntry::message(keyed("hi", "k1"))).expect("append");
    store.append(&f, NewEntry::message(user("between"))).expect("append");
    let again = store.append(&f, NewEntry::message(keyed("hi", "k1"))).expect("append");
    assert!(first.appended);
    assert!(!again.appended);
    assert_eq!(again.entry, first.entry);
    // A new process (fresh index built from the file) sees it too.
    let other = Store::new(StoreOptions::default()).append(&f, NewEntry::message(keyed("hi", "k1"))).expect("append");
    assert_eq!(other, again);
    assert_eq!(lines(&f).len(), 3);
}

#[test]
fn lines_written_by_another_process_are_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let a = store.append(&f, NewEntry::message(user("mine"))).expect("append");
    let foreign = json!({"type":"message","id":"f0f0f0f0","parentId":a.entry["id"],"timestamp":"2025-01-01T00:00:00.000Z",
        "message": keyed("theirs", "foreign-key"), "extraField": {"kept": true}});
    let mut text = std::fs::read_to_string(&f).expect("read");
    text.push_str(&format!("{foreign}\n"));
    std::fs::write(&f, text).expect("write");
    let b = store.append(&f, NewEntry::message(user("after"))).expect("append");
    assert_eq!(b.entry["parentId"], "f0f0f0f0");
    let dup = store.append(&f, NewEntry::message(keyed("theirs", "foreign-key"))).expect("append");
    assert!(!dup.appended);
    assert_eq!(dup.entry, foreign, "the existing entry comes back with its unknown fields");
    assert_eq!(context_texts(&f), vec!["mine", "theirs", "after"]);
}

/// The answers async threads get without blocking come from the cached state only while the file
/// is the one cached: a line written by another process (or a file never looked at) sends the
/// caller the blocking way, and a known key is never reported absent.
#[test]
fn peeks_answer_from_memory_only_while_the_file_is_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    assert_eq!(store.peek_leaf(&f), None, "never looked at");
    assert!(!store.known_unkeyed(&f, &["k1"]));
    let a = store.append(&f, NewEntry::message(keyed("hi", "k1"))).expect("append");
    assert_eq!(store.peek_leaf(&f), Some(a.entry["id"].as_str().map(str::to_owned)));
    assert!(!store.known_unkeyed(&f, &["k1"]), "the key is in the file");
    assert!(store.known_unkeyed(&f, &["k2"]));
    // Another process appends a line with k2: the cache no longer answers.
    let foreign = json!({"type":"message","id":"f0f0f0f0","parentId":a.entry["id"],"timestamp":"2025-01-01T00:00:00.000Z",
        "message": keyed("theirs", "k2")});
    let mut text = std::fs::read_to_string(&f).expect("read");
    text.push_str(&format!("{foreign}\n"));
    std::fs::write(&f, text).expect("write");
    assert_eq!(store.peek_leaf(&f), None);
    assert!(!store.known_unkeyed(&f, &["k2"]));
    // The blocking call reads the change; then the cache answers again.
    assert_eq!(store.leaf(&f).expect("leaf").as_deref(), Some("f0f0f0f0"));
    assert_eq!(store.peek_leaf(&f), Some(Some("f0f0f0f0".to_owned())));
    assert!(store.find_keyed(&f, "k2").expect("find").is_some());
    assert!(!store.known_unkeyed(&f, &["k2"]));
    assert!(store.known_unkeyed(&f, &["k3"]));
    assert!(!store.known_unkeyed(&f, &["k3", "k2"]), "one key in the file is enough to send the caller to find_keyed");
}

#[test]
fn a_torn_tail_is_cut_saved_aside_and_never_glued_onto() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let a = store.append(&f, NewEntry::message(user("one"))).expect("append");
    let fragment = br#"{"type":"message","id":"torn","parentId":"x","mess"#;
    let mut bytes = std::fs::read(&f).expect("read");
    bytes.extend_from_slice(fragment);
    std::fs::write(&f, &bytes).expect("write");
    let b = Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("two"))).expect("append");
    assert_eq!(b.entry["parentId"], a.entry["id"]);
    assert_eq!(lines(&f).len(), 3);
    let saved: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".torn."))
        .collect();
    assert_eq!(saved.len(), 1);
    assert_eq!(std::fs::read(saved[0].path()).expect("read"), fragment);
}

#[test]
fn a_complete_last_line_without_newline_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    std::fs::write(
        &f,
        "{\"type\":\"session\",\"version\":3,\"id\":\"s\",\"timestamp\":\"2025-01-01T00:00:00.000Z\",\"cwd\":\"/\"}\n\
         {\"type\":\"message\",\"id\":\"aa\",\"parentId\":null,\"timestamp\":\"2025-01-01T00:00:01.000Z\",\"message\":{\"role\":\"user\",\"content\":\"one\",\"timestamp\":1}}",
    )
    .expect("write");
    let b = Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("two"))).expect("append");
    assert_eq!(b.entry["parentId"], "aa");
    assert_eq!(context_texts(&f), vec!["one", "two"]);
}

#[test]
fn v1_files_are_migrated_atomically_on_first_append_with_a_backup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("legacy.jsonl");
    let original = std::fs::read(pincer_testkit::fixtures_dir().join("10-v1-legacy.jsonl")).expect("fixture");
    std::fs::write(&f, &original).expect("write");
    let before = context_texts(&f);
    let a = Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("new turn"))).expect("append");
    let l = lines(&f);
    assert_eq!(l[0]["version"], 3);
    assert!(l[1..].iter().all(|e| e.get("id").is_some() && e.get("parentId").is_some()));
    assert_eq!(a.entry["parentId"], l[l.len() - 2]["id"]);
    let mut want = before;
    want.push("new turn".into());
    assert_eq!(context_texts(&f), want);
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".bak."))
        .collect();
    assert_eq!(backups.len(), 1);
    assert_eq!(std::fs::read(backups[0].path()).expect("read"), original);
}

#[test]
fn linear_v3_files_are_linked_keeping_their_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    std::fs::write(
        &f,
        "{\"type\":\"session\",\"version\":3,\"id\":\"s\",\"timestamp\":\"2025-01-01T00:00:00.000Z\",\"cwd\":\"/\"}\n\
         {\"type\":\"message\",\"id\":\"a1\",\"timestamp\":\"2025-01-01T00:00:01.000Z\",\"message\":{\"role\":\"user\",\"content\":\"one\",\"timestamp\":1}}\n\
         {\"type\":\"message\",\"timestamp\":\"2025-01-01T00:00:02.000Z\",\"message\":{\"role\":\"user\",\"content\":\"two\",\"timestamp\":2}}\n",
    )
    .expect("write");
    let c = Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("three"))).expect("append");
    let l = lines(&f);
    assert_eq!(l[1]["id"], "a1");
    assert_eq!(l[1]["parentId"], Value::Null);
    assert_eq!(l[2]["parentId"], "a1");
    assert_eq!(l[2]["id"].as_str().map(str::len), Some(8));
    assert_eq!(c.entry["parentId"], l[2]["id"]);
    assert_eq!(context_texts(&f), vec!["one", "two", "three"]);
}

#[test]
fn a_headerless_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let original = std::fs::read(pincer_testkit::fixtures_dir().join("15a-no-header.jsonl")).expect("fixture");
    std::fs::write(&f, &original).expect("write");
    let err = Store::new(StoreOptions::default()).append(&f, NewEntry::message(user("x"))).expect_err("refused");
    assert!(matches!(err, StoreError::NoHeader(_)), "{err}");
    assert!(err.to_string().contains("repair"), "{err}");
    assert_eq!(std::fs::read(&f).expect("read"), original);
}

#[test]
fn branches_and_leaf_moves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let a = store.append(&f, NewEntry::message(user("a"))).expect("append");
    store.append(&f, NewEntry::message(user("b"))).expect("append");
    let a_id = a.id().expect("id").to_owned();
    let mut branch = NewEntry::message(user("b2"));
    branch.parent = ParentChoice::Entry(a_id.clone());
    store.append(&f, branch).expect("branch");
    assert_eq!(context_texts(&f), vec!["a", "b2"]);
    store.append(&f, NewEntry::move_leaf(Some(&a_id))).expect("move");
    assert_eq!(context_texts(&f), vec!["a"]);
    assert_eq!(store.leaf(&f).expect("leaf").as_deref(), Some(a_id.as_str()));
    store.append(&f, NewEntry::message(user("c"))).expect("append");
    assert_eq!(context_texts(&f), vec!["a", "c"]);
    store.append(&f, NewEntry::move_leaf(None)).expect("reset");
    assert_eq!(context_texts(&f), Vec::<String>::new());
    let root = store.append(&f, NewEntry::message(user("root"))).expect("append");
    assert_eq!(root.entry["parentId"], Value::Null);
    // Unknown parents and targets are refused and nothing is written.
    let len = std::fs::metadata(&f).expect("meta").len();
    let mut bad = NewEntry::message(user("x"));
    bad.parent = ParentChoice::Entry("nope".into());
    assert!(matches!(store.append(&f, bad), Err(StoreError::UnknownEntry(_))));
    assert!(matches!(store.append(&f, NewEntry::move_leaf(Some("nope"))), Err(StoreError::UnknownEntry(_))));
    assert_eq!(std::fs::metadata(&f).expect("meta").len(), len);
}

#[test]
fn invalid_entries_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let mut e = NewEntry::message(user("x"));
    e.payload.insert("parentId".into(), json!("forged"));
    assert!(matches!(store.append(&f, e), Err(StoreError::InvalidEntry(_))));
    assert!(matches!(store.append(&f, NewEntry::message(json!("not an object"))), Err(StoreError::InvalidEntry(_))));
    assert!(!f.exists(), "nothing was written");
}

#[test]
fn concurrent_appenders_form_one_chain_with_every_entry_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    std::thread::scope(|s| {
        for t in 0..8 {
            let store = store.clone();
            let f = f.clone();
            s.spawn(move || {
                for i in 0..40 {
                    store
                        .append(&f, NewEntry::message(keyed(&format!("{t}-{i}"), &format!("{t}-{i}"))))
                        .expect("append");
                }
            });
        }
    });
    let l = lines(&f);
    assert_eq!(l.len(), 1 + 8 * 40);
    for w in l[1..].windows(2) {
        assert_eq!(w[1]["parentId"], w[0]["id"], "each entry is chained to the one before it");
    }
    let mut texts = context_texts(&f);
    texts.sort();
    let mut want: Vec<String> = (0..8).flat_map(|t| (0..40).map(move |i| format!("{t}-{i}"))).collect();
    want.sort();
    assert_eq!(texts, want);
}

/// Appends of one key queued together (one commit writes what queued while the one before it was
/// syncing) write it once: every caller gets the one entry, one of them as appended.
#[test]
fn one_key_queued_by_many_threads_at_once_is_written_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let results = std::sync::Mutex::new(Vec::new());
    let together = std::sync::Barrier::new(12);
    std::thread::scope(|s| {
        for t in 0..12 {
            let (store, f, results, together) = (store.clone(), f.clone(), &results, &together);
            s.spawn(move || {
                for i in 0..30 {
                    together.wait();
                    if t == 0 {
                        // Holds the file's commit (its fdatasync) while the others queue key i.
                        store.append(&f, NewEntry::message(user(&format!("between {i}")))).expect("append");
                        continue;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(100));
                    let a =
                        store.append(&f, NewEntry::message(keyed(&format!("m{i}"), &format!("k{i}")))).expect("append");
                    results.lock().expect("results").push((i, a));
                }
            });
        }
    });
    let l = lines(&f);
    let keyed_rows = l.iter().filter(|e| e["message"]["idempotencyKey"].is_string()).count();
    assert_eq!(keyed_rows, 30, "each key once");
    assert_eq!(l.len(), 1 + 30 + 30);
    for i in 0..30 {
        let all: Vec<_> =
            results.lock().expect("results").iter().filter(|(k, _)| *k == i).map(|(_, a)| a.clone()).collect();
        assert_eq!(all.len(), 11);
        assert_eq!(all.iter().filter(|a| a.appended).count(), 1, "key k{i} appended once");
        let written = l.iter().find(|e| e["message"]["idempotencyKey"] == format!("k{i}")).expect("written");
        assert!(all.iter().all(|a| &a.entry == written && a.pos == all[0].pos), "every caller of k{i} gets the entry");
    }
}

/// While an append waits for the transcript's lock held by another process (a flocked lock file
/// naming a live pid, as OpenClaw and Pincer hold it), this process's readers of the file are not
/// held up with it.
#[test]
fn readers_do_not_wait_for_an_append_waiting_for_another_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let first = store.append(&f, NewEntry::message(user("first"))).expect("append");
    store.close(); // releases the lingering lock
    let lock_path = dir.path().join("s.jsonl.lock");
    let holder = std::fs::OpenOptions::new().write(true).create_new(true).open(&lock_path).expect("lock file");
    std::fs::write(&lock_path, json!({"pid": std::process::id(), "createdAt": "2026-01-01T00:00:00.000Z"}).to_string())
        .expect("lock body");
    holder.lock().expect("flock");
    std::thread::scope(|s| {
        let waiting = s.spawn(|| store.append(&f, NewEntry::message(user("second"))));
        std::thread::sleep(std::time::Duration::from_millis(200)); // the append waits for the lock now
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = store.clone();
        let path = f.clone();
        s.spawn(move || tx.send(reader.leaf(&path).map_err(|e| e.to_string())));
        let leaf =
            rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the reader waited for the lock's holder");
        assert_eq!(leaf.expect("leaf").as_deref(), first.id());
        assert!(!waiting.is_finished(), "the append waits while the other process holds the lock");
        drop(holder);
        std::fs::remove_file(&lock_path).expect("release");
        let second = waiting.join().expect("join").expect("append after the release");
        assert_eq!(second.entry["parentId"].as_str(), first.id());
    });
}

#[test]
fn the_holder_of_the_lock_can_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let store = Store::new(StoreOptions::default());
    let guard = store.lock(&f).expect("lock");
    store.append(&f, NewEntry::message(user("inside"))).expect("re-entrant append");
    drop(guard);
    store.close();
    assert!(!dir.path().join("s.jsonl.lock").exists());
}

#[test]
fn secrets_are_redacted_before_they_reach_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("s.jsonl");
    let a = Store::new(StoreOptions::default())
        .append(&f, NewEntry::message(user("key sk-proj-abcdefghijklmnopqrstuvwxyz0123")))
        .expect("append");
    let text = std::fs::read_to_string(&f).expect("read");
    assert!(!text.contains("abcdefghijklmnopqrstuvwxyz0123"));
    assert_eq!(a.entry["message"]["content"], "key sk-pro…[REDACTED]");
}

/// A turn takes its transcript's lock before the append that writes it; when the transcript's
/// directory does not exist yet and the path is spelled through a symlink or `..`, both must still
/// name one lock (they once took two keys, and the append waited out the lock timeout for this
/// process's own lock).
#[test]
fn the_turn_lock_and_the_append_agree_on_a_new_directory_behind_a_symlink_or_dotdot() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("real")).expect("real");
    std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).expect("symlink");
    std::fs::create_dir(dir.path().join("a")).expect("a");
    let spellings = [
        (dir.path().join("link/sessions/s.jsonl"), dir.path().join("real/sessions/s.jsonl")),
        (dir.path().join("a/../dotted/s.jsonl"), dir.path().join("dotted/s.jsonl")),
        (dir.path().join("link/gone/../deep/s.jsonl"), dir.path().join("real/deep/s.jsonl")),
    ];
    for (spelled, real) in spellings {
        let mut opts = StoreOptions::default();
        opts.lock.acquire_timeout = std::time::Duration::from_secs(1);
        let store = Store::new(opts);
        let held = store.try_lock(&spelled, std::time::Instant::now()).expect("try_lock").expect("free");
        let r = store.append(&spelled, NewEntry::message(user("one")));
        drop(held);
        r.unwrap_or_else(|e| panic!("append to {} while holding its lock: {e}", spelled.display()));
        let s = Session::read(&real).expect("read").expect("written where the path leads");
        assert_eq!(s.entries.len(), 1, "{}", spelled.display());
    }
}
