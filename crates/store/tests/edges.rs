//! The store at the edges of its resources, through real files and real processes: open file
//! handles and cached writers stay bounded (also under a low `nofile` limit), a read-only transcript
//! can be read but not appended to (checked as an unprivileged user even when the tests run as
//! root), and a full disk leaves no litter and heals once space returns (on a small tmpfs mounted
//! in a private mount namespace).
//!
//! The process-level checks re-run this test binary as a child (`child_process` below, selected by
//! `PINCER_EDGE_CHILD`) under `prlimit`, `setpriv` or `unshare`; the child reports success by
//! writing a marker file, so a child that did nothing cannot pass.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_store::verify::verify;
use pincer_store::{NewEntry, Store, StoreError, StoreOptions};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text, "timestamp": 1})
}

fn lines(path: &Path) -> Vec<Value> {
    pincer_testkit::probe::read_rows(path)
}

/// Checks a file holds a header and then `texts` in order, each entry chained to the one before.
fn assert_chained(path: &Path, texts: &[String]) {
    let l = lines(path);
    assert_eq!(l[0]["type"], "session", "{}", path.display());
    let got: Vec<&str> = l[1..].iter().map(|e| e["message"]["content"].as_str().unwrap_or("?")).collect();
    assert_eq!(got, texts.iter().map(String::as_str).collect::<Vec<_>>(), "{}", path.display());
    assert_eq!(l[1]["parentId"], Value::Null);
    for w in l[1..].windows(2) {
        assert_eq!(w[1]["parentId"], w[0]["id"], "{}", path.display());
    }
    let report = verify(path).expect("verify");
    assert!(report.healthy(), "{}", report.to_text());
}

/// Open file descriptors of this process that point into `dir`.
fn fds_into(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

#[test]
fn open_handles_stay_within_max_open_files_and_closed_files_are_revalidated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    let mut opts = StoreOptions { max_open_files: 8, ..StoreOptions::default() };
    opts.lock.max_lingering = 2;
    let store = Store::new(opts);
    let files: Vec<PathBuf> = (0..200).map(|i| root.join(format!("s{i}.jsonl"))).collect();
    let mut most = 0;
    for round in 0..3 {
        for f in &files {
            store.append(f, NewEntry::message(user(&format!("r{round}")))).expect("append");
            let open = fds_into(&root);
            most = most.max(open);
            assert!(open <= 8 + 2, "{open} descriptors into the store directory after appending to {}", f.display());
            assert!(store.open_files() <= 8, "{} transcripts open", store.open_files());
        }
    }
    assert!(most >= 8, "the bound was reached ({most}), so closing was exercised");
    // Another process appends to a file whose handle was closed: the reopened writer notices.
    let first = &files[0];
    let leaf = store.leaf(first).expect("leaf").expect("has a leaf");
    let foreign = json!({"type": "message", "id": "foreign1", "parentId": leaf, "timestamp": "2025-01-01T00:00:00.000Z",
        "message": user("foreign")});
    for f in &files[1..20] {
        store.append(f, NewEntry::message(user("r3"))).expect("append");
    }
    let mut raw = std::fs::OpenOptions::new().append(true).open(first).expect("open");
    raw.write_all(format!("{foreign}\n").as_bytes()).expect("write");
    drop(raw);
    let after = store.append(first, NewEntry::message(user("after"))).expect("append");
    assert_eq!(after.entry["parentId"], "foreign1");
    store.close();
    assert_eq!(fds_into(&root), store.open_files(), "only transcript handles remain after close");
    let texts: Vec<String> = ["r0", "r1", "r2"].map(String::from).to_vec();
    for f in &files[20..] {
        assert_chained(f, &texts);
    }
    assert_chained(first, &[texts.clone(), vec!["foreign".into(), "after".into()]].concat());
}

#[test]
fn idle_writers_are_dropped_beyond_max_writers_and_rebuilt_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::new(StoreOptions { max_writers: 16, max_open_files: 4, ..StoreOptions::default() });
    let files: Vec<PathBuf> = (0..100).map(|i| dir.path().join(format!("w{i}.jsonl"))).collect();
    for round in 0..2 {
        for f in &files {
            store.append(f, NewEntry::message(user(&format!("r{round}")))).expect("append");
            assert!(store.cached_writers() <= 16, "{} writers cached", store.cached_writers());
        }
    }
    for f in &files {
        assert_chained(f, &["r0".into(), "r1".into()]);
    }
}

/// Runs this test binary's `child_process` test as a child, `wrap` being the command line that
/// precedes it (`prlimit …`, `setpriv …`); fails unless the child wrote `<dir>/child-ok`.
fn run_child(wrap: &[&str], mode: &str, dir: &Path) {
    let exe = std::env::current_exe().expect("current_exe");
    let (prog, pre) = match wrap.split_first() {
        Some((p, rest)) => (p.to_string(), rest.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
        None => (exe.display().to_string(), Vec::new()),
    };
    let mut cmd = Command::new(prog);
    cmd.args(pre);
    if !wrap.is_empty() {
        cmd.arg(&exe);
    }
    let out = cmd
        .args(["child_process", "--exact", "--nocapture", "--test-threads=1"])
        .env("PINCER_EDGE_CHILD", mode)
        .env("PINCER_EDGE_DIR", dir)
        .output()
        .expect("spawn the child");
    let marker = dir.join("child-ok");
    assert!(
        out.status.success() && marker.exists(),
        "child {mode} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The child side of the process-level tests (does nothing unless `PINCER_EDGE_CHILD` is set).
#[test]
fn child_process() {
    let (Ok(mode), Ok(dir)) = (std::env::var("PINCER_EDGE_CHILD"), std::env::var("PINCER_EDGE_DIR")) else {
        return;
    };
    let dir = PathBuf::from(dir);
    match mode.as_str() {
        "many-files" => child_many_files(&dir),
        "read-only" => child_read_only(&dir),
        "disk-full" => child_disk_full(&dir),
        other => panic!("unknown child mode {other}"),
    }
    std::fs::write(dir.join("child-ok"), b"ok").expect("marker");
}

#[test]
fn five_hundred_files_through_one_store_under_nofile_64() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_child(&["prlimit", "--nofile=64", "--"], "many-files", dir.path());
    for i in 0..500 {
        assert_chained(&dir.path().join(format!("m{i}.jsonl")), &["a".into(), "b".into()]);
    }
}

/// Default options: the open-file bound adapts to the limit `prlimit` set.
fn child_many_files(dir: &Path) {
    let store = Store::new(StoreOptions::default());
    for text in ["a", "b"] {
        for i in 0..500 {
            store.append(&dir.join(format!("m{i}.jsonl")), NewEntry::message(user(text))).expect("append");
        }
    }
    store.close();
}

#[test]
fn a_read_only_transcript_can_be_read_but_not_appended_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("ro.jsonl");
    let store = Store::new(StoreOptions::default());
    store.append(&f, NewEntry::message(user("one"))).expect("append");
    store.append(&f, NewEntry::message(user("two"))).expect("append");
    store.close();
    let before = std::fs::read(&f).expect("read");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    if pincer_testkit::probe::is_root() {
        // Root ignores permissions: check as nobody, owning the directory and the 0400 file.
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).expect("chown dir");
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).expect("chown file");
        run_child(&["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"], "read-only", dir.path());
    } else {
        run_child(&[], "read-only", dir.path());
    }
    assert_eq!(std::fs::read(&f).expect("read"), before, "the file is untouched");
}

fn child_read_only(dir: &Path) {
    let f = dir.join("ro.jsonl");
    assert!(std::fs::OpenOptions::new().append(true).open(&f).is_err(), "really not writable for this user");
    let l = lines(&f);
    let store = Store::new(StoreOptions::default());
    assert_eq!(store.leaf(&f).expect("leaf of a read-only file"), l[2]["id"].as_str().map(str::to_owned));
    let err = store.append(&f, NewEntry::message(user("three"))).expect_err("append must fail");
    match &err {
        StoreError::Io { path, source } => {
            assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
            assert_eq!(path, &f.display().to_string(), "names the transcript");
        }
        other => panic!("expected an Io error, got {other:?}"),
    }
    assert!(err.to_string().contains("Permission denied"), "{err}");
    // Reading still works after the failed attempt, and no lock file is left.
    assert_eq!(store.leaf(&f).expect("leaf again"), l[2]["id"].as_str().map(str::to_owned));
    store.close();
    assert!(!dir.join("ro.jsonl.lock").exists());
}

#[test]
fn a_full_disk_leaves_no_litter_and_the_next_append_after_space_returns_is_chained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    // A private mount namespace (and, unprivileged, a user namespace): the tmpfs disappears with
    // the child and is never visible outside it.
    let mut wrap = vec!["unshare", "--mount"];
    if !pincer_testkit::probe::is_root() {
        wrap.push("--map-root-user");
    }
    let script = "mount -t tmpfs -o size=256k tmpfs \"$0\" && exec \"$@\"";
    let mnt_s = mnt.display().to_string();
    wrap.extend(["sh", "-c", script, &mnt_s]);
    run_child(&wrap, "disk-full", dir.path());
}

fn io_kind(e: &StoreError) -> Option<std::io::ErrorKind> {
    match e {
        StoreError::Io { source, .. } => Some(source.kind()),
        _ => None,
    }
}

/// Fills the filesystem of `path` until a write fails with ENOSPC.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![b'x'; 4096];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
}

fn siblings(path: &Path, infix: &str) -> Vec<PathBuf> {
    let name = path.file_name().expect("name").to_string_lossy().into_owned();
    let mut v: Vec<PathBuf> = std::fs::read_dir(path.parent().expect("dir"))
        .expect("ls")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{name}{infix}")))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn child_disk_full(dir: &Path) {
    let mnt = dir.join("mnt");
    let t = mnt.join("s.jsonl");
    let filler = mnt.join("filler");
    let store = Store::new(StoreOptions::default());
    let big = "y".repeat(40 * 1024);
    let mut texts: Vec<String> = Vec::new();
    for i in 0..3 {
        texts.push(format!("before {i}"));
        store.append(&t, NewEntry::message(user(&texts[i]))).expect("append");
    }
    let leaf = store.leaf(&t).expect("leaf");
    let expect_full = |store: &Store, text: &str| {
        let e = store.append(&t, NewEntry::message(user(text))).expect_err("the disk is full");
        assert_eq!(io_kind(&e), Some(std::io::ErrorKind::StorageFull), "{e}");
        assert!(e.to_string().contains("No space left on device"), "{e}");
    };

    // 1. Full before the lock file can be written: no (empty) lock file stays.
    store.close();
    fill(&filler);
    for _ in 0..3 {
        expect_full(&store, "lost");
        assert_eq!(siblings(&t, ".lock"), Vec::<PathBuf>::new(), "no lock file left behind");
    }

    // 2. Full while writing the entry (the lock is held already): the partial write is taken back.
    std::fs::remove_file(&filler).expect("free");
    let guard = store.lock(&t).expect("lock");
    let len = std::fs::metadata(&t).expect("meta").len();
    fill(&filler);
    for _ in 0..3 {
        expect_full(&store, &big);
        assert_eq!(std::fs::metadata(&t).expect("meta").len(), len, "nothing of the failed write stays");
    }
    assert!(verify(&t).expect("verify").healthy());
    drop(guard);
    store.close();
    assert_eq!(siblings(&t, ".lock"), Vec::<PathBuf>::new());

    // 3. Space returns: the next append is chained to the last acknowledged entry.
    std::fs::remove_file(&filler).expect("free");
    let ok = store.append(&t, NewEntry::message(user(&big))).expect("append after space returned");
    assert_eq!(ok.entry["parentId"].as_str(), leaf.as_deref());
    texts.push(big.clone());
    assert_chained(&t, &texts);

    // 4. A torn tail (another writer crashed) that cannot be saved aside while the disk is full:
    //    no empty or partial `.torn` copies per attempt; exactly one once space returns.
    let fragment = br#"{"type":"message","id":"torn","parentId":"x","mess"#;
    std::fs::OpenOptions::new().append(true).open(&t).expect("open").write_all(fragment).expect("tear");
    let guard = store.lock(&t).expect("lock");
    fill(&filler);
    for _ in 0..3 {
        expect_full(&store, "lost");
        assert_eq!(siblings(&t, ".torn."), Vec::<PathBuf>::new(), "no copy per failed attempt");
        assert!(std::fs::read(&t).expect("read").ends_with(fragment), "the torn bytes are kept");
    }
    drop(guard);
    store.close();
    std::fs::remove_file(&filler).expect("free");
    let after = store.append(&t, NewEntry::message(user("after"))).expect("append");
    assert_eq!(after.entry["parentId"], ok.entry["id"]);
    let torn = siblings(&t, ".torn.");
    assert_eq!(torn.len(), 1, "{torn:?}");
    assert_eq!(std::fs::read(&torn[0]).expect("read"), fragment);
    texts.push("after".into());
    assert_chained(&t, &texts);
    store.close();
    assert_eq!(siblings(&t, ".lock"), Vec::<PathBuf>::new());
}

/// Issue 34, item 12: `chat.history` finds an entry's keys wherever valid JSON puts them, also in a
/// line too large to decode (over 256 KiB): written by another JSON writer with spaces after the
/// colons, or with `id` and `parentId` after a large `message`. `verify` calls such a file healthy
/// and the model sees every message, so history must show them all (as placeholders when too large).
#[test]
fn history_finds_the_ids_of_oversized_lines_wherever_valid_json_puts_them() {
    use pincer_store::history::{read_history, HistoryOptions, MAX_LINE_BYTES};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("spaced.jsonl");
    let big = "x".repeat(MAX_LINE_BYTES + 1024);
    let ts = "2026-01-01T00:00:00.000Z";
    let lines = [
        format!(r#"{{"type": "session", "version": 3, "id": "s1", "timestamp": "{ts}", "cwd": "/"}}"#),
        format!(
            r#"{{"type": "message", "id": "a1", "parentId": null, "timestamp": "{ts}", "message": {{"role": "user", "content": "hello", "timestamp": 1}}}}"#
        ),
        // `id` and `parentId` after 300 KiB of message.
        format!(
            r#"{{"message": {{"role": "assistant", "content": [{{"type": "text", "text": "{big}"}}], "timestamp": 2}}, "type": "message", "timestamp": "{ts}", "id": "b2", "parentId": "a1"}}"#
        ),
        // Spaces after the colons, keys first.
        format!(
            r#"{{"type" : "message", "id" :	"c3", "parentId":  "b2", "timestamp": "{ts}", "message": {{"role": "user", "content": "{big}", "timestamp": 3}}}}"#
        ),
        format!(
            r#"{{"type":"message","id":"d4","parentId":"c3","timestamp":"{ts}","message":{{"role":"assistant","content":[{{"type":"text","text":"bye"}}],"timestamp":4}}}}"#
        ),
    ];
    std::fs::write(&path, lines.join("\n") + "\n").expect("write");
    let report = verify(&path).expect("verify");
    assert!(report.healthy(), "{}", report.to_text());

    let h = read_history(&path, HistoryOptions::default()).expect("history");
    let ids: Vec<&str> = h.messages.iter().map(|m| m["__openclaw"]["id"].as_str().unwrap_or("?")).collect();
    assert_eq!(ids, ["a1", "b2", "c3", "d4"], "{:#}", json!(h.messages));
    for m in &h.messages[1..3] {
        assert_eq!(m["__openclaw"]["reason"], "oversized", "{m}");
    }
    assert_eq!(h.session_id.as_deref(), Some("s1"));
}
