//! The PostgreSQL store against a real cluster (one per test binary, a database per test): the same
//! transcript as the file store byte for byte (import, export, context, history), Pi reads what it
//! appended identically, idempotency keys are unique per transcript across store instances, and
//! concurrent appends from three instances (three replicas) make one chain.
#![allow(clippy::disallowed_methods)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_pg::{PgOptions, PgStore};
use pincer_store::history::HistoryOptions;
use pincer_store::{
    context_report, LeafArg, NewEntry, ParentChoice, Session, Store, StoreOptions, Transcripts, TranscriptsExt,
};
use pincer_testkit::postgres::Postgres;
use pincer_testkit::{comparable, oracle_context};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn store(url: &str, state: &Path) -> PgStore {
    PgStore::connect(PgOptions {
        url: url.to_owned(),
        pool_size: 4,
        state_dir: state.to_path_buf(),
        redactor: Arc::new(pincer_store::redact::SecretRedactor::default()),
        cwd: "/work".into(),
    })
    .expect("connect")
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn user(text: &str, key: Option<&str>) -> NewEntry {
    let mut m = json!({"role": "user", "content": text, "timestamp": 1});
    if let Some(k) = key {
        m["idempotencyKey"] = json!(k);
    }
    NewEntry::message(m)
}

fn assistant(text: &str) -> NewEntry {
    NewEntry::message(json!({"role":"assistant","content":[{"type":"text","text":text}],"api":"openai-completions",
        "provider":"local","model":"m","usage":{"input":1,"output":1,"cacheRead":0,"cacheWrite":0,"totalTokens":2,
        "cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"stopReason":"stop","timestamp":2}))
}

/// A small tree: a branch, a leaf move, a label, a keyed message, a compaction.
fn write_tree(s: &dyn Transcripts, f: &Path) {
    s.append_with(f, NewEntry::of("model_change", obj(json!({"provider": "local", "modelId": "m"}))), Some("tree-1"))
        .expect("append");
    let u1 = s.append(f, user("first", Some("k1:user"))).expect("u1");
    let a1 = s.append(f, assistant("one")).expect("a1");
    s.append(f, user("second", None)).expect("u2");
    let a2 = s.append(f, assistant("two")).expect("a2");
    s.append(f, NewEntry::move_leaf(a1.id())).expect("leaf");
    s.append(f, user("second, edited", None)).expect("u2'");
    s.append(f, assistant("two'")).expect("a2'");
    s.append(f, NewEntry::of("label", obj(json!({"targetId": a2.id(), "label": "old"})))).expect("label");
    let mut c = Map::new();
    c.insert("summary".into(), json!("they said first"));
    c.insert("firstKeptEntryId".into(), json!(u1.id()));
    c.insert("tokensBefore".into(), json!(100));
    s.append(f, NewEntry::of("compaction", c)).expect("compaction");
    s.append(f, user("third", None)).expect("u3");
    let mut branch = user("beside", None);
    branch.parent = ParentChoice::Entry(u1.id().expect("id").to_owned());
    s.append(f, branch).expect("branch");
}

fn transcript(state: &Path, id: &str) -> PathBuf {
    state.join(format!("agents/main/sessions/{id}.jsonl"))
}

#[test]
fn an_imported_file_reads_back_byte_for_byte_with_the_same_context_and_history() {
    let url = Postgres::shared().database("import");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = transcript(dir.path(), "tree-1");
    write_tree(&Store::new(StoreOptions::default()), &file);
    let bytes = std::fs::read(&file).expect("read");
    let pg = store(&url, dir.path());
    assert!(pg.import_bytes(&file, &bytes).expect("import"));
    assert!(!pg.import_bytes(&file, &bytes).expect("import again"), "an existing transcript is not replaced");
    assert_eq!(pg.export(&file).expect("export").expect("exists"), bytes, "the same bytes");
    // Bounded reads as the file store gives them: whole when it fits, nothing when it does not.
    let n = bytes.len() as u64;
    let files = Store::new(StoreOptions::default());
    for max in [n, n - 1] {
        assert_eq!(
            pg.read_bytes(&file, max).expect("pg"),
            files.read_bytes(&file, max).expect("files"),
            "read_bytes({max}) of {n} bytes"
        );
    }
    assert_eq!(pg.read_bytes(&file, n).expect("read").as_deref(), Some(&bytes[..]));
    let from_db = pg.read_session(&file).expect("read").expect("exists");
    let from_file = Session::read(&file).expect("read").expect("exists");
    let ctx = |s: &Session| context_report(s, &LeafArg::Default).expect("context").to_value();
    assert_eq!(ctx(&from_db), ctx(&from_file));
    // Every entry as a window's `before` too (the WebChat's older windows), at each limit.
    let ids: Vec<Option<String>> = std::iter::once(None)
        .chain(
            bytes
                .split(|b| *b == b'\n')
                .filter_map(|l| serde_json::from_slice::<Value>(l).ok()?["id"].as_str().map(|s| Some(s.to_owned()))),
        )
        .collect();
    for limit in [1, 3, 200] {
        for before in &ids {
            let o = HistoryOptions { limit, max_chars: 8000, before: before.clone() };
            assert_eq!(
                pg.history(&file, o.clone()).expect("history"),
                Store::new(StoreOptions::default()).history(&file, o).expect("history"),
                "limit {limit}, before {before:?}"
            );
        }
    }
    assert_eq!(pg.leaf(&file).expect("leaf"), Store::new(StoreOptions::default()).leaf(&file).expect("leaf"));
    let (hit, _) = pg.find_keyed(&file, "k1:user").expect("find").expect("found");
    assert_eq!(hit["message"]["content"], "first");
}

#[test]
fn what_the_database_store_appends_reads_the_same_in_pi() {
    let url = Postgres::shared().database("pi");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = transcript(dir.path(), "tree-1");
    let pg = store(&url, dir.path());
    write_tree(&pg, &file);
    let bytes = pg.export(&file).expect("export").expect("exists");
    let out = dir.path().join("exported.jsonl");
    std::fs::write(&out, &bytes).expect("write");
    let ours = Session::parse(bytes);
    for leaf in [None, ours.entries.get(3).and_then(|e| e.id.as_deref())] {
        let arg = leaf.map(LeafArg::parse).unwrap_or(LeafArg::Default);
        let mine = comparable(&context_report(&ours, &arg).expect("context").to_value());
        assert_eq!(mine, comparable(&oracle_context(&out, leaf)), "leaf {leaf:?}");
    }
    // A keyed entry is written once, also through another instance.
    let other = store(&url, dir.path());
    let again = other.append(&file, user("first", Some("k1:user"))).expect("resend");
    assert!(!again.appended);
    assert_eq!(again.entry["message"]["content"], "first");
    let unknown = other.append(&file, NewEntry::move_leaf(Some("no-such-entry"))).expect_err("unknown target");
    assert!(unknown.to_string().contains("no-such-entry"), "{unknown}");
}

#[test]
fn three_instances_appending_at_once_make_one_chain_with_every_key_once() {
    let url = Postgres::shared().database("race");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = transcript(dir.path(), "race");
    let stores: Vec<PgStore> = (0..3).map(|_| store(&url, dir.path())).collect();
    std::thread::scope(|s| {
        for (n, st) in stores.iter().enumerate() {
            let file = &file;
            s.spawn(move || {
                for i in 0..20 {
                    let key = format!("r{n}-{i}:user");
                    st.append(file, user(&key, Some(&key))).expect("append");
                    // Each replica also sends one of the others' keys (written by whichever comes
                    // first): never a second row.
                    let other = format!("r{}-{}:user", (n + 1) % 3, i / 2);
                    let _ = st.append(file, user(&other, Some(&other))).expect("resend");
                }
            });
        }
    });
    let s = stores[0].read_session(&file).expect("read").expect("exists");
    assert_eq!(s.entries.len(), 60, "every key exactly once");
    let ids: Vec<&str> = s.entries.iter().map(|e| e.id.as_deref().expect("id")).collect();
    for i in 0..s.entries.len() {
        let parent = s.value(i).expect("entry")["parentId"].clone();
        let want = if i == 0 { Value::Null } else { json!(ids[i - 1]) };
        assert_eq!(parent, want, "entry {i} chains to the one before it: one chain, no fork");
    }
    let keys: std::collections::HashSet<String> = (0..60)
        .map(|i| s.value(i).expect("entry")["message"]["idempotencyKey"].as_str().expect("key").to_owned())
        .collect();
    assert_eq!(keys.len(), 60);
    assert_eq!(stores[2].leaf(&file).expect("leaf").as_deref(), ids.last().copied());
}

#[test]
fn search_finds_appends_at_once_and_a_database_made_before_search_is_indexed_on_start() {
    let pg = Postgres::shared();
    let url = pg.database("search");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = store(&url, dir.path());
    let f = transcript(dir.path(), "search-1");
    write_tree(&s, &f);
    let name = s.name(&f);
    let found = |s: &PgStore, q: &str| -> Vec<String> {
        s.search(q, Some(std::slice::from_ref(&name)), 10).expect("search").into_iter().map(|h| h.snippet).collect()
    };
    let mut edited = found(&s, "second");
    edited.sort();
    assert_eq!(edited, ["second", "second, edited"], "every branch is searchable");
    assert_eq!(found(&s, "\"second edited\""), ["second, edited"]);
    assert_eq!(s.search_title(&name).expect("title").as_deref(), Some("first"));
    // Only live transcripts of the list are searched.
    assert_eq!(s.search("second", Some(&["agents/main/sessions/other.jsonl".to_owned()]), 10).expect("search"), vec![]);
    // As many words as the SQLite index allows, not one more (issue 34, item 7).
    let words = |n: usize| vec!["second"; n].join(" ");
    assert_eq!(found(&s, &words(pincer_search::text::MAX_QUERY_WORDS)).len(), 2);
    let e = s.search(&words(pincer_search::text::MAX_QUERY_WORDS + 1), None, 10).expect_err("too many").to_string();
    assert!(e.contains("words; at most"), "{e}");
    drop(s);

    // A database written before migration 2: its messages are indexed when a store starts on it.
    pg.psql(&url, "DELETE FROM search_messages; UPDATE transcripts SET indexed_seq = 0");
    let s = store(&url, dir.path());
    let hits =
        pincer_testkit::probe::poll(std::time::Duration::from_secs(10), std::time::Duration::from_millis(20), || {
            Some(found(&s, "first")).filter(|h| !h.is_empty())
        });
    assert_eq!(hits, Some(vec!["first".to_owned()]));
    assert_eq!(pg.psql(&url, "SELECT count(*) FROM search_messages"), "8");
    assert_eq!(pg.psql(&url, "SELECT count(*) FROM transcripts WHERE indexed_seq < last_seq"), "0");
}

/// Appends five entries (a keyed user message, a reply, a label, a message, a long reply) and
/// returns their positions (how they read back is the store contract's, `tests/contract.rs`).
fn positions_of_five(s: &dyn Transcripts, f: &Path) -> Vec<u64> {
    let pos = |a: pincer_store::Appended| a.pos.0;
    let first = s.append_with(f, user("first", Some("p1:user")), Some("pos-1")).expect("append");
    let label = obj(json!({"targetId": first.id(), "label": "l"}));
    let rest = [assistant("one"), NewEntry::of("label", label), user("second", None), assistant(&"long ".repeat(200))];
    std::iter::once(pos(first)).chain(rest.into_iter().map(|e| pos(s.append(f, e).expect("append")))).collect()
}

#[test]
fn positions_are_byte_offsets_in_files_and_seqs_in_the_database() {
    let url = Postgres::shared().database("positions");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = transcript(dir.path(), "pos-1");
    let files = Store::new(StoreOptions::default());
    let offsets = positions_of_five(&files, &file);
    let bytes = std::fs::read(&file).expect("file");
    let starts: Vec<u64> = std::iter::once(0)
        .chain(bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i as u64 + 1))
        .filter(|p| *p < bytes.len() as u64)
        .skip(1) // the header
        .collect();
    assert_eq!(offsets, starts, "a file's positions are its lines' byte offsets");
    let other = tempfile::tempdir().expect("tempdir");
    let seqs = positions_of_five(&store(&url, other.path()), &transcript(other.path(), "pos-1"));
    assert_eq!(seqs, vec![1, 2, 3, 4, 5], "the database's are the seqs");
}
