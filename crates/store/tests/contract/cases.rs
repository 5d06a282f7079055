//! The store contract: what every backend of [`Transcripts`] must do, written once and run by
//! each backend's test binary (`crates/store/tests/contract.rs` over JSONL files,
//! `crates/pg/tests/contract.rs` over PostgreSQL) through [`contract_tests!`]: appends chain to
//! the leaf, a keyed entry is written once, leaf moves and chosen parents branch, a batch commits
//! together, positions grow and read back (catch-up), history windows page the active branch,
//! transcripts are archived and imported, and the session index round-trips with a stamp that
//! moves. Each case gets a fresh store over a fresh state directory.

use pincer_store::history::HistoryOptions;
use pincer_store::{AfterCommit, NewEntry, ParentChoice, Pos, Transcripts, TranscriptsExt};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One `#[test]` per case, each over the store `$make(case_name, state_dir)` returns.
#[macro_export]
macro_rules! contract_tests {
    ($make:expr) => {
        $crate::contract_tests!(@cases $make;
            appends_chain_to_the_leaf_and_a_key_is_written_once,
            leaf_moves_and_chosen_parents_branch,
            a_batch_chains_in_order_and_commits_together,
            positions_grow_and_read_back_from_any_entry,
            history_windows_page_the_active_branch,
            transcripts_are_archived_and_imported_whole,
            the_session_index_round_trips_with_a_stamp_that_moves,
        );
        #[test]
        fn async_appends_chain_run_their_hook_first_and_write_a_key_once() {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = $make("async_appends", dir.path());
            cases::async_appends_chain_run_their_hook_first_and_write_a_key_once(store, dir.path());
        }
    };
    (@cases $make:expr; $($case:ident,)*) => {
        $(
            #[test]
            fn $case() {
                let dir = tempfile::tempdir().expect("tempdir");
                let store = $make(stringify!($case), dir.path());
                cases::$case(&*store, dir.path());
            }
        )*
    };
}

fn transcript(state: &Path, id: &str) -> PathBuf {
    state.join(format!("agents/main/sessions/{id}.jsonl"))
}

fn user(text: &str, key: Option<&str>) -> NewEntry {
    let mut m = json!({"role": "user", "content": text, "timestamp": 1});
    if let Some(k) = key {
        m["idempotencyKey"] = json!(k);
    }
    NewEntry::message(m)
}

fn assistant(text: &str) -> NewEntry {
    NewEntry::message(json!({"role": "assistant", "content": [{"type": "text", "text": text}],
        "api": "openai-completions", "provider": "local", "model": "m", "stopReason": "stop", "timestamp": 2,
        "usage": {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}}))
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

/// The `(id, parentId)` of every entry but the header, in order.
fn links(s: &dyn Transcripts, f: &Path) -> Vec<(String, Option<String>)> {
    let (entries, whole) = s.entries_at(f, Pos::START, 1 << 24).expect("entries_at");
    assert!(whole);
    (entries.iter().map(|(_, e)| e).filter(|e| e["type"] != "session"))
        .map(|e| (e["id"].as_str().expect("id").to_owned(), e["parentId"].as_str().map(str::to_owned)))
        .collect()
}

/// The async append ([`Transcripts::lock_for_append`], [`Transcripts::append_held`]), as the
/// gateway writes every turn: entries chain to the leaf, the hook runs with the entries as written
/// before the caller hears of them, a resent key comes back as the entry already there (not
/// written again), and the lock is let go (the next append takes it).
pub fn async_appends_chain_run_their_hook_first_and_write_a_key_once(s: Arc<dyn Transcripts>, state: &Path) {
    let f = transcript(state, "held");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let written: Vec<(String, bool)> = rt.block_on(async {
        let mut out = Vec::new();
        for entry in [user("hello", Some("h1:user")), assistant("hi"), user("hello", Some("h1:user"))] {
            let held = s.clone().lock_for_append(f.clone()).await.expect("lock");
            let log = seen.clone();
            let after: AfterCommit = Box::new(move |all| {
                let mut log = log.lock().expect("log");
                log.extend(all.iter().map(|a| (a.id().expect("id").to_owned(), a.appended)));
            });
            let all =
                s.clone().append_held(held, f.clone(), vec![entry], Some("held".into()), after).await.expect("append");
            let a = (all[0].id().expect("id").to_owned(), all[0].appended);
            assert_eq!(seen.lock().expect("log").last(), Some(&a), "the hook ran before the append returned");
            out.push(a);
        }
        out
    });
    let (first, reply) = (written[0].0.clone(), written[1].0.clone());
    assert_eq!(written[2], (first.clone(), false), "a resent key is the entry already there");
    assert_eq!(links(&*s, &f), [(first.clone(), None), (reply, Some(first))]);
    assert_eq!(seen.lock().expect("log").len(), 3);
}

pub fn appends_chain_to_the_leaf_and_a_key_is_written_once(s: &dyn Transcripts, state: &Path) {
    let f = transcript(state, "chain");
    assert!(!s.exists(&f).expect("exists") && s.end(&f).expect("end").is_none() && s.leaf(&f).expect("leaf").is_none());
    let u = s.append_with(&f, user("hi", Some("r1:user")), Some("chain")).expect("user");
    let a = s.append(&f, assistant("hello")).expect("assistant");
    assert!(u.appended && a.appended && s.exists(&f).expect("exists"));
    assert_eq!(u.entry["parentId"], Value::Null, "the first entry is a root");
    assert_eq!(a.entry["parentId"].as_str(), u.id(), "the next one chains to the leaf");
    assert_eq!(s.leaf(&f).expect("leaf").as_deref(), a.id());
    // The entry as written is what reads back: id, parent, timestamp and the message.
    let (hit, pos) = s.find_keyed(&f, "r1:user").expect("find").expect("found");
    assert_eq!((&hit, pos), (&u.entry, u.pos));
    // A resend of the key returns the first entry, writes nothing and moves nothing.
    let end = s.end(&f).expect("end");
    let again = s.append(&f, user("hi, again", Some("r1:user"))).expect("resend");
    assert_eq!((again.appended, &again.entry, again.pos), (false, &u.entry, u.pos));
    assert_eq!(s.end(&f).expect("end"), end, "nothing written");
    assert_eq!(s.leaf(&f).expect("leaf").as_deref(), a.id(), "the leaf did not move");
    assert_eq!(s.find_keyed(&f, "r9:user").expect("find"), None);
    // The header names the session; unknown fields of an entry are kept.
    let session = s.read_session(&f).expect("read").expect("exists");
    let header = session.header.as_ref().and_then(|h| h.get("id")).and_then(Value::as_str);
    assert_eq!(header, Some("chain"));
    let mut odd = obj(json!({"customType": "x.note", "data": {"n": 1}, "futureField": [1, 2]}));
    odd.insert("alsoKept".into(), json!(true));
    let c = s.append(&f, NewEntry::of("custom", odd)).expect("custom");
    let (back, _) = s.entries_at(&f, c.pos, 1 << 20).expect("entries_at");
    assert_eq!(back[0].1["futureField"], json!([1, 2]));
    assert_eq!(back[0].1["alsoKept"], true);
    assert_eq!(links(s, &f).len(), 3);
}

pub fn leaf_moves_and_chosen_parents_branch(s: &dyn Transcripts, state: &Path) {
    let f = transcript(state, "branch");
    let u1 = s.append_with(&f, user("first", None), Some("branch")).expect("u1");
    let a1 = s.append(&f, assistant("one")).expect("a1");
    let u2 = s.append(&f, user("second", None)).expect("u2");
    // Back to a1: the next message is a sibling of u2.
    s.append(&f, NewEntry::move_leaf(a1.id())).expect("leaf move");
    assert_eq!(s.leaf(&f).expect("leaf").as_deref(), a1.id());
    let u2b = s.append(&f, user("second, edited", None)).expect("u2'");
    assert_eq!(u2b.entry["parentId"].as_str(), a1.id());
    assert_ne!(u2b.id(), u2.id());
    // A chosen parent branches without moving the leaf first; a root starts a new tree.
    let mut beside = user("beside", None);
    beside.parent = ParentChoice::Entry(u1.id().expect("id").to_owned());
    let b = s.append(&f, beside).expect("branch");
    assert_eq!(b.entry["parentId"].as_str(), u1.id());
    let mut root = user("a new root", None);
    root.parent = ParentChoice::Root;
    assert_eq!(s.append(&f, root).expect("root").entry["parentId"], Value::Null);
    // A move to an entry that does not exist is refused, naming it, and writes nothing.
    let end = s.end(&f).expect("end");
    let e = s.append(&f, NewEntry::move_leaf(Some("no-such-entry"))).expect_err("unknown target");
    assert!(e.to_string().contains("no-such-entry"), "{e}");
    assert_eq!(s.end(&f).expect("end"), end);
    // The active branch is the leaf's: the history shows the root alone.
    let h = s.history(&f, HistoryOptions { limit: 200, max_chars: 100_000, before: None }).expect("history");
    let texts: Vec<&Value> = h.messages.iter().map(|m| &m["content"]).collect();
    assert_eq!(texts, [&json!("a new root")]);
}

pub fn a_batch_chains_in_order_and_commits_together(s: &dyn Transcripts, state: &Path) {
    let f = transcript(state, "batch");
    let first = s.append_with(&f, user("q", Some("b1:user")), Some("batch")).expect("user");
    let batch = vec![assistant("calling"), user("result", None), assistant("done")];
    let written = s.append_all(&f, batch, None).expect("batch");
    assert_eq!(written.len(), 3);
    let mut parent = first.id().map(str::to_owned);
    for w in &written {
        assert!(w.appended);
        assert_eq!(w.entry["parentId"].as_str(), parent.as_deref(), "each chains to the one before");
        parent = w.id().map(str::to_owned);
    }
    assert!(written.windows(2).all(|w| w[1].pos > w[0].pos));
    assert_eq!(s.leaf(&f).expect("leaf"), parent);
    // A batch with a bad entry is refused, naming it. (Whether the entries before it were written
    // differs: PostgreSQL rolls the batch back, the JSONL group commit keeps them unacknowledged,
    // as `Transcripts::append_all` allows.)
    let bad = vec![assistant("kept?"), NewEntry::move_leaf(Some("no-such-entry"))];
    let e = s.append_all(&f, bad, None).expect_err("an unknown target");
    assert!(e.to_string().contains("no-such-entry"), "{e}");
}

pub fn positions_grow_and_read_back_from_any_entry(s: &dyn Transcripts, state: &Path) {
    let f = transcript(state, "positions");
    let mut appended = vec![s.append_with(&f, user("first", Some("p1:user")), Some("positions")).expect("append")];
    appended.push(s.append(&f, assistant("one")).expect("append"));
    let label = obj(json!({"targetId": appended[0].id(), "label": "l"}));
    appended.push(s.append(&f, NewEntry::of("label", label)).expect("label"));
    appended.push(s.append(&f, user("second", None)).expect("append"));
    appended.push(s.append(&f, assistant(&"long ".repeat(200))).expect("append"));
    let pos: Vec<Pos> = appended.iter().map(|a| a.pos).collect();
    assert!(pos.windows(2).all(|w| w[1] > w[0]), "positions grow: {pos:?}");
    assert!(s.end(&f).expect("end").is_some_and(|end| end > pos[4]), "the end is after the last entry");
    let ids = |v: &[(Pos, Value)]| {
        v.iter().map(|(p, e)| (*p, e["id"].as_str().unwrap_or("").to_owned())).collect::<Vec<(Pos, String)>>()
    };
    let want: Vec<(Pos, String)> = appended.iter().map(|a| (a.pos, a.id().expect("id").to_owned())).collect();
    for k in 0..pos.len() {
        let (from, whole) = s.entries_at(&f, pos[k], 1 << 20).expect("entries_at");
        assert!(whole);
        assert_eq!(ids(&from), want[k..].to_vec(), "from entry {k}");
        let plain = s.entries_from(&f, pos[k], 1 << 20).expect("entries_from");
        assert_eq!(plain, from.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(), "entries_from {k}");
        let before = s.entries_before(&f, pos[k], 1 << 20).expect("entries_before");
        let before: Vec<(Pos, Value)> = before.into_iter().filter(|(_, e)| e["type"] != "session").collect();
        assert_eq!(ids(&before), want[..k].to_vec(), "before entry {k}");
    }
    // Catch-up from the end: nothing yet; then exactly what was appended since.
    let end = s.end(&f).expect("end").expect("it exists");
    assert!(s.entries_at(&f, end, 1 << 20).expect("entries_at").0.is_empty());
    let next = s.append(&f, user("third", None)).expect("append");
    assert_eq!(
        ids(&s.entries_at(&f, end, 1 << 20).expect("entries_at").0),
        [(next.pos, next.id().expect("id").to_owned())]
    );
    // A read cut by its limit says so; the tail holds the last entries.
    let (cut, whole) = s.entries_at(&f, pos[0], 400).expect("entries_at");
    assert!(!whole && cut.len() < pos.len(), "a read cut by its limit says so: {} entries", cut.len());
    let tail = s.tail_entries(&f, 1 << 20).expect("tail");
    assert_eq!(tail.last().and_then(|e| e["id"].as_str()), next.id());
    // The key's resend finds the first position.
    let again = s.append(&f, user("first", Some("p1:user"))).expect("resend");
    assert_eq!((again.appended, again.pos), (false, pos[0]));
}

pub fn history_windows_page_the_active_branch(s: &dyn Transcripts, state: &Path) {
    let f = transcript(state, "history");
    s.ensure_created(&f, Some("history")).expect("create");
    assert!(s.exists(&f).expect("exists") && s.leaf(&f).expect("leaf").is_none());
    for i in 0..12 {
        s.append(&f, user(&format!("q{i}"), None)).expect("user");
        s.append(&f, assistant(&format!("a{i}"))).expect("assistant");
    }
    let text = |m: &Value| match &m["content"] {
        Value::String(t) => t.clone(),
        c => c[0]["text"].as_str().unwrap_or_default().to_owned(),
    };
    let all = s.history(&f, HistoryOptions { limit: 200, max_chars: 1_000_000, before: None }).expect("history");
    assert!(!all.has_older);
    let all: Vec<String> = all.messages.iter().map(text).collect();
    assert_eq!(all.len(), 24);
    assert_eq!((all[0].as_str(), all[23].as_str()), ("q0", "a11"));
    // Windows of 5, newest first, each asked `before` the oldest of the last: the whole branch once.
    let (mut paged, mut before) = (Vec::new(), None);
    loop {
        let w =
            s.history(&f, HistoryOptions { limit: 5, max_chars: 1_000_000, before: before.clone() }).expect("window");
        assert!(w.messages.len() <= 5);
        let mut texts: Vec<String> = w.messages.iter().map(text).collect();
        texts.append(&mut paged);
        paged = texts;
        if !w.has_older {
            break;
        }
        before = w.messages[0]["__openclaw"]["id"].as_str().map(str::to_owned);
        assert!(before.is_some(), "a window names its messages' ids: {:?}", w.messages[0]);
    }
    assert_eq!(paged, all);
}

pub fn transcripts_are_archived_and_imported_whole(s: &dyn Transcripts, state: &Path) {
    let f = transcript(state, "archive");
    s.append_with(&f, user("keep me", Some("k:user")), Some("archive")).expect("user");
    s.append(&f, assistant("kept")).expect("assistant");
    let bytes = s.read_bytes(&f, 1 << 20).expect("read").expect("bytes");
    assert_eq!(s.bytes(&f).expect("size"), Some(bytes.len() as u64));
    assert!(s.read_bytes(&f, bytes.len() as u64 - 1).expect("read").is_none(), "too large for the limit: nothing");
    let moved = s.archive_transcript(&f, "reset").expect("archive").expect("moved");
    assert!(moved.to_string_lossy().contains(".jsonl.reset."), "{}", moved.display());
    assert!(!s.exists(&f).expect("exists") && s.read_bytes(&f, 1 << 20).expect("read").is_none());
    s.forget(&f);
    let aside = s.set_aside(f.parent().expect("dir"));
    assert_eq!(aside.iter().map(|(p, _)| p).collect::<Vec<_>>(), [&moved]);
    assert!(s.archive_transcript(&f, "reset").expect("archive").is_none(), "nothing left to move");
    // Imported whole, it reads back byte for byte, with its keys known.
    let g = transcript(state, "imported");
    s.import_transcript(&g, &bytes).expect("import");
    assert_eq!(s.read_bytes(&g, 1 << 20).expect("read").as_deref(), Some(&bytes[..]));
    // An existing transcript is not replaced: the store's one error type says what and where.
    match s.import_transcript(&g, &bytes) {
        Err(pincer_store::StoreError::Io { path, source }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists, "{source}");
            assert!(path.ends_with("imported.jsonl"), "the error names the transcript: {path}");
        }
        other => panic!("an existing transcript is not replaced: {other:?}"),
    }
    assert!(s.find_keyed(&g, "k:user").expect("find").is_some());
    let leaf = s.leaf(&g).expect("leaf");
    assert_eq!(leaf.as_deref(), links(s, &g).last().map(|(id, _)| id.as_str()));
    let next = s.append(&g, user("more", None)).expect("append");
    assert_eq!(next.entry["parentId"].as_str(), leaf.as_deref(), "chains to the imported leaf");
}

pub fn the_session_index_round_trips_with_a_stamp_that_moves(s: &dyn Transcripts, state: &Path) {
    let idx = state.join("agents/main/sessions/sessions.json");
    assert_eq!(s.index_stamp(&idx), None);
    assert_eq!(s.read_index(&idx).expect("read"), None);
    let map = json!({"agent:main:main": {"sessionId": "s1", "updatedAt": 5, "label": "hi"}});
    s.write_index(&idx, &serde_json::to_vec(&map).expect("json")).expect("write");
    let first = s.index_stamp(&idx).expect("stamp");
    let back: Value = serde_json::from_slice(&s.read_index(&idx).expect("read").expect("some")).expect("json");
    assert_eq!(back, map);
    s.write_index(&idx, b"{}").expect("write");
    assert_ne!(s.index_stamp(&idx), Some(first));
    assert_eq!(s.read_index(&idx).expect("read").as_deref(), Some(&b"{}"[..]));
    assert_eq!(s.agents(state), vec!["main".to_string()]);
}
