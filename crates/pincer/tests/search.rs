//! `pincer sessions search` and `reindex` over a generated state directory (1,000 sessions; 100
//! entries each here, `PINCER_SEARCH_CORPUS=1000x1000` for the 1M-entry run, which
//! `examples/search_bench.rs` also does in release): every planted word, phrase and prefix is
//! found exactly where it was put (off the active branch too), archived sessions only on request,
//! appended messages without a reindex, and bad queries refused.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

fn pincer(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("PINCER_STATE_DIR").output().unwrap()
}

fn json(args: &[&str]) -> Value {
    let out = pincer(args);
    assert!(out.status.success(), "pincer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hits(state: &Path, query: &str, archived: bool) -> BTreeSet<(String, String)> {
    let mut args =
        vec!["sessions", "search", query, "--json", "--limit", "100", "--state-dir", state.to_str().unwrap()];
    if archived {
        args.push("--archived");
    }
    json(&args)
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            assert!(h["snippet"].as_str().is_some_and(|s| !s.is_empty()), "{h}");
            (h["sessionKey"].as_str().unwrap().to_owned(), h["entryId"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[test]
fn the_planted_hits_are_found_and_nothing_else() {
    let (sessions, entries) = match std::env::var("PINCER_SEARCH_CORPUS") {
        Ok(v) => {
            let (a, b) = v.split_once('x').expect("PINCER_SEARCH_CORPUS=<sessions>x<entries>");
            (a.parse().unwrap(), b.parse().unwrap())
        }
        Err(_) => (1000, 100),
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let corpus = pincer_testkit::corpus::generate(state, sessions, entries);
    let s = state.to_str().unwrap();
    let done = json(&["sessions", "reindex", "--state-dir", s]);
    assert_eq!(done["files"], sessions);
    assert_eq!(done["messages"].as_u64().unwrap() as usize, corpus.entries);

    let mut expected: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for p in &corpus.planted {
        let set = expected.entry(p.query.clone()).or_default();
        if !p.archived {
            set.insert((p.session_key.clone(), p.entry_id.clone()));
        }
    }
    assert!(expected.len() >= 23, "needles, the branch needle, the phrase and the prefix are planted");
    for (query, want) in &expected {
        assert_eq!(&hits(state, query, false), want, "query {query}");
    }
    assert_eq!(expected["\"amber falcon sings\""].len(), 3, "the phrase, not its look-alikes");
    assert_eq!(expected["quasar*"].len(), 3);
    assert!(corpus.planted.iter().any(|p| p.off_branch && p.query == "needlebranch"));
    // Archived sessions: only when asked for.
    assert!(hits(state, "needlearchived", false).is_empty());
    let archived = hits(state, "needlearchived", true);
    assert_eq!(archived.len(), 1);
    assert!(archived.iter().all(|(k, _)| *k == format!("agent:main:gen-{}", sessions - 1)));

    // An append is found by the next search without a reindex.
    let file = state.join("agents/main/sessions").join(format!("{}.jsonl", pincer_testkit::corpus::session_id(5)));
    let appended = json(&[
        "transcript",
        "append",
        file.to_str().unwrap(),
        "--message",
        r#"{"role":"user","content":"a freshly appended zebracorn","timestamp":1}"#,
    ]);
    let id = appended["id"].as_str().unwrap().to_owned();
    assert_eq!(hits(state, "zebracorn", false), BTreeSet::from([("agent:main:gen-5".to_owned(), id)]));

    // The index is private.
    use std::os::unix::fs::PermissionsExt;
    for f in std::fs::read_dir(state.join("search")).unwrap().flatten() {
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600, "{:?}", f.path());
    }
    assert_eq!(std::fs::metadata(state.join("search")).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
fn bad_queries_and_state_dirs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().to_str().unwrap();
    pincer_testkit::corpus::generate(dir.path(), 100, 60);
    for q in ["\"\"", "  ", "* -- ()"] {
        let out = pincer(&["sessions", "search", q, "--state-dir", s]);
        assert_eq!(out.status.code(), Some(2), "{q:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no words to search for") || err.contains("must not be empty"), "{q:?}: {err}");
    }
    let missing = dir.path().join("nope");
    let out = pincer(&["sessions", "search", "x", "--state-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such state directory"));
    assert!(!missing.exists(), "nothing created");
    // FTS5's own syntax typed by a user is searched for as words, not run.
    assert!(json(&["sessions", "search", "NEAR(a b) OR text:x", "--json", "--state-dir", s])
        .as_array()
        .unwrap()
        .is_empty());
}
