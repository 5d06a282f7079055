//! What one search may cost is bounded (issue 34, item 7), over a real index of real transcript
//! files: a `prefix*` FTS5 expands word by word stands for at most `MAX_PREFIX_WORDS` indexed words
//! (prefixes of 2 and 3 letters have a prefix index and are not counted), a query has at most
//! `MAX_QUERY_WORDS` words, a query past its time limit stops with an error saying so, and a
//! closed pool stops its searches; searches through the pool each get a connection of their own.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_search::text::MAX_QUERY_WORDS;
use pincer_search::{Index, Readers, MAX_PREFIX_WORDS};
use serde_json::json;
use std::path::Path;

/// A state directory with one transcript of `texts` (user messages).
fn state_with(dir: &Path, texts: &[String]) {
    let sessions = dir.join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let mut out = String::from(
        "{\"type\":\"session\",\"version\":3,\"id\":\"s1\",\"timestamp\":\"2026-12-01T10:00:00.000Z\",\"cwd\":\"/\"}\n",
    );
    for (i, t) in texts.iter().enumerate() {
        out.push_str(
            &json!({"type": "message", "id": format!("e{i}"), "parentId": null, "timestamp": "2026-12-01T10:00:00.000Z",
                "message": {"role": "user", "content": t, "timestamp": 1}})
            .to_string(),
        );
        out.push('\n');
    }
    std::fs::write(sessions.join("s1.jsonl"), out).unwrap();
}

/// 600 words `m0…m599`, 600 words `mmmm0…mmmm599`, 600 `interrupted0…599`, and `common` in every
/// message.
fn corpus(dir: &Path) -> Index {
    let texts: Vec<String> = (0..600).map(|i| format!("common m{i} mmmm{i} interrupted{i} w{}", i % 7)).collect();
    state_with(dir, &texts);
    let mut index = Index::open(dir).unwrap();
    index.sync_all().unwrap();
    index
}

fn error(index: &Index, q: &str) -> String {
    match index.search(q, None, 10) {
        Ok(hits) => panic!("{q:?} was answered with {} hits", hits.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_prefix_expands_to_a_bounded_number_of_words() {
    let dir = tempfile::tempdir().unwrap();
    let index = corpus(dir.path());
    const { assert!(MAX_PREFIX_WORDS < 600) };
    // Whatever the prefix, the error is the limit's (not mistaken for a stopped query).
    let e = error(&index, "interrupted*");
    assert!(e.starts_with("interrupted* stands for more than"), "{e}");
    // One letter, four letters: expanded word by word, and more than the limit.
    for q in ["m*", "mmmm*", "common mmmm*", "\"common m\"*"] {
        let e = error(&index, q);
        assert!(e.contains(&format!("more than {MAX_PREFIX_WORDS} indexed words")), "{q}: {e}");
    }
    // Longer prefixes stand for fewer words; two and three letters have a prefix index.
    assert_eq!(index.search("mmmm1*", None, 100).unwrap().len(), 100, "mmmm1, mmmm10…19, mmmm100…199");
    assert_eq!(index.search("m5*", None, 100).unwrap().len(), 100);
    assert_eq!(index.search("mm*", None, 100).unwrap().len(), 100);
    assert_eq!(index.search("mmm*", None, 100).unwrap().len(), 100);
    assert_eq!(index.search("mmmm599", None, 10).unwrap().len(), 1);
}

#[test]
fn a_query_has_a_bounded_number_of_words() {
    let dir = tempfile::tempdir().unwrap();
    let index = corpus(dir.path());
    let words = |n: usize| (0..n).map(|_| "common").collect::<Vec<_>>().join(" ");
    assert_eq!(index.search(&words(MAX_QUERY_WORDS), None, 5).unwrap().len(), 5);
    let e = error(&index, &words(MAX_QUERY_WORDS + 1));
    assert!(e.contains(&format!("query has {} words; at most {MAX_QUERY_WORDS}", MAX_QUERY_WORDS + 1)), "{e}");
    // Each word of a phrase counts.
    let e = error(&index, &format!("\"{}\"", words(MAX_QUERY_WORDS + 1)));
    assert!(e.contains("at most"), "{e}");
}

#[test]
fn a_query_past_its_time_limit_stops_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = corpus(dir.path());
    assert_eq!(index.search("common", None, 100).unwrap().len(), 100);
    // Already past: the query stops at SQLite's first look at the clock.
    index.set_time_limit(std::time::Duration::ZERO);
    let e = error(&index, "common");
    assert!(e.contains("search stopped at its time limit of 0 ms"), "{e}");
    index.set_time_limit(pincer_search::QUERY_TIME_LIMIT);
    assert_eq!(index.search("common", None, 100).unwrap().len(), 100, "the connection works on");
}

#[test]
fn each_search_has_a_connection_of_its_own_and_a_closed_pool_refuses() {
    let dir = tempfile::tempdir().unwrap();
    drop(corpus(dir.path()));
    let readers = Readers::new(dir.path()).unwrap();
    // One search holds its connection; another runs meanwhile on one of its own.
    let first = readers.take().unwrap();
    let second = readers.take().unwrap();
    assert_eq!(second.search("w6", None, 200).unwrap().len(), 85);
    assert_eq!(first.search("w4", None, 200).unwrap().len(), 86);
    drop((first, second));
    // At most MAX_OPEN at once: one more waits until one comes back.
    let held: Vec<_> = (0..pincer_search::MAX_OPEN).map(|_| readers.take().unwrap()).collect();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| readers.take().map(|r| r.search("w6", None, 200).unwrap().len()));
        drop(held);
        assert_eq!(waiting.join().unwrap().unwrap(), 85);
    });
    readers.close();
    let e = readers.take().err().expect("closed").to_string();
    assert!(e.contains("shutting down"), "{e}");
}
