//! The figures of issue 15, measured in one run (`cargo run --release -p pincer-search --example
//! bench [SESSIONS ENTRIES]`, default 1000 × 1000 = 1M entries):
//! - indexing the generated state dir from scratch, and the planted hits found exactly;
//! - search latency p50/p99 over the index (rare words, phrases, prefixes, common words);
//! - export of one 100k-entry session (HTML and Markdown: time and size);
//! - append latency with and without the indexer fed by the store, and the indexer's own cost.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::disallowed_methods)] // a benchmark

use pincer_search::{Index, Indexer};
use pincer_store::{NewEntry, Store, StoreOptions};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (sessions, entries) = (args.first().copied().unwrap_or(1000), args.get(1).copied().unwrap_or(1000));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();

    // ---- corpus and index ----
    let t = Instant::now();
    let corpus = pincer_testkit::corpus::generate(state, sessions, entries);
    println!(
        "corpus: {sessions} sessions, {} entries, {} MB, written in {:.1} s",
        corpus.entries,
        corpus.bytes >> 20,
        t.elapsed().as_secs_f64()
    );
    let mut index = Index::open(state).unwrap();
    let t = Instant::now();
    let done = index.rebuild().unwrap();
    let db = std::fs::metadata(pincer_search::db_path(state)).map(|m| m.len()).unwrap_or(0);
    println!(
        "reindex: {} files, {} messages in {:.1} s, index {} MB",
        done.files,
        done.messages,
        t.elapsed().as_secs_f64(),
        db >> 20
    );

    let mut expected: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for p in &corpus.planted {
        let file = format!("agents/main/sessions/{}.jsonl", p.session_id);
        expected.entry(p.query.clone()).or_default().insert((file, p.entry_id.clone()));
    }
    for (q, want) in &expected {
        let got: BTreeSet<(String, String)> =
            index.search(q, None, 100).unwrap().into_iter().map(|h| (h.file, h.entry_id)).collect();
        assert_eq!(&got, want, "query {q}");
    }
    println!("known hits: {} queries, every planted hit found and nothing else", expected.len());

    // ---- search latency ----
    let mut queries: Vec<String> = expected.keys().cloned().collect();
    queries.extend(
        ["kalo", "mine ruti", "\"kalo mine\"", "ka*", "zeben*", "sapa dofe guha", "nothingmatches"].map(String::from),
    );
    let mut all = Vec::new();
    let mut by_query = Vec::new();
    for q in &queries {
        let mut times = Vec::new();
        let mut n = 0;
        for _ in 0..25 {
            let t = Instant::now();
            n = index.search(q, None, 20).unwrap().len();
            times.push(t.elapsed());
        }
        all.extend(times.iter().copied());
        by_query.push((q.clone(), n, pct(&mut times, 0.5)));
    }
    // With the per-query filter of the RPC (the 999 visible sessions of 1,000).
    let visible: Vec<String> = (0..sessions - 1)
        .map(|s| format!("agents/main/sessions/{}.jsonl", pincer_testkit::corpus::session_id(s)))
        .collect();
    let mut filtered = Vec::new();
    for q in &queries {
        for _ in 0..10 {
            let t = Instant::now();
            index.search(q, Some(&visible), 21).unwrap();
            filtered.push(t.elapsed());
        }
    }
    println!(
        "search over {} entries ({} queries × 25): p50 {}, p99 {}, max {}",
        corpus.entries,
        queries.len(),
        ms(pct(&mut all, 0.5)),
        ms(pct(&mut all, 0.99)),
        ms(pct(&mut all, 1.0))
    );
    println!(
        "  with the visible-sessions filter: p50 {}, p99 {}",
        ms(pct(&mut filtered, 0.5)),
        ms(pct(&mut filtered, 0.99))
    );
    for (q, n, p50) in by_query.iter().filter(|(q, ..)| !q.starts_with("needle") || q == "needle3") {
        println!("  {q:<24} {n:>3} hits  p50 {}", ms(*p50));
    }
    drop(index);

    // ---- export of a 100k-entry session ----
    let big = state.join("big.jsonl");
    let mut text =
        json!({"type": "session", "version": 3, "id": "big", "timestamp": "2026-12-01T10:00:00.000Z", "cwd": "/tmp"})
            .to_string();
    text.push('\n');
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    for i in 0..100_000usize {
        let parent = if i == 0 {
            None
        } else if i % 1000 == 0 {
            Some(format!("b{}", i - 500))
        } else {
            Some(format!("b{}", i - 1))
        };
        let content = if i % 2 == 0 {
            if i % 100 == 0 {
                json!([{"type": "text", "text": format!("message {i} with **markdown** and an image")}, {"type": "image", "data": png, "mimeType": "image/png"}])
            } else {
                json!(format!("user message {i}: some words about the tree and its branches"))
            }
        } else {
            json!([{"type": "text", "text": format!("reply {i}: a longer answer with `code` and a list\n\n- one\n- two")}])
        };
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        text.push_str(&json!({"type": "message", "id": format!("b{i}"), "parentId": parent, "timestamp": "2026-12-01T10:00:00.000Z",
            "message": {"role": role, "content": content, "timestamp": 1_796_119_200_000i64 + i as i64}}).to_string());
        text.push('\n');
    }
    std::fs::write(&big, &text).unwrap();
    let t = Instant::now();
    let session = pincer_store::Session::read(&big).unwrap().unwrap();
    let read = t.elapsed();
    let t = Instant::now();
    let html = pincer_export::html(&session, None);
    let html_t = t.elapsed();
    let t = Instant::now();
    let md = pincer_export::markdown(&session, &pincer_store::LeafArg::Default).unwrap();
    let md_t = t.elapsed();
    println!("export of a 100,000-entry session ({} MB JSONL, 100 branches): read {}, HTML {} ({} MB), Markdown of the active branch {} ({} MB)",
        text.len() >> 20, ms(read), ms(html_t), html.len() >> 20, ms(md_t), md.len() >> 20);

    // ---- append latency with and without the indexer ----
    let n = 2000;
    let run = |with_indexer: bool| {
        let d = tempfile::tempdir().unwrap();
        let indexer = with_indexer.then(|| Indexer::start(d.path()).unwrap());
        let store =
            Store::new(StoreOptions { on_append: indexer.as_ref().map(Indexer::observer), ..StoreOptions::default() });
        let file = d.path().join("agents/main/sessions/append-bench.jsonl");
        let mut times = Vec::with_capacity(n);
        for i in 0..n {
            let m = json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("appended message number {i} about lisbon"), "timestamp": i});
            let t = Instant::now();
            store.append(&file, NewEntry::message(m)).unwrap();
            times.push(t.elapsed());
        }
        let t = Instant::now();
        if let Some(i) = &indexer {
            i.flush();
        }
        let flush = t.elapsed();
        let hits = indexer.as_ref().map(|_| Index::open(d.path()).unwrap().search("lisbon", None, 100).unwrap().len());
        store.close();
        (
            pct(&mut times.clone(), 0.5),
            pct(&mut times.clone(), 0.99),
            times.iter().sum::<Duration>() / n as u32,
            flush,
            hits,
        )
    };
    let (a50, a99, amean, _, _) = run(false);
    let (b50, b99, bmean, flush, hits) = run(true);
    println!("append ({n} appends, fdatasync each): without indexer p50 {} p99 {} mean {}; with indexer p50 {} p99 {} mean {}; indexer behind by {} at the end, {:?} hits",
        ms(a50), ms(a99), ms(amean), ms(b50), ms(b99), ms(bmean), ms(flush), hits);

    // The indexer's own cost per append: one sync of a file that grew by one message.
    let d = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let file = d.path().join("agents/main/sessions/sync-bench.jsonl");
    let mut idx = Index::open(d.path()).unwrap();
    let mut times = Vec::new();
    for i in 0..n {
        store
            .append(
                &file,
                NewEntry::message(
                    json!({"role": "user", "content": format!("message {i} about porto"), "timestamp": i}),
                ),
            )
            .unwrap();
        let t = Instant::now();
        idx.sync_file(&file).unwrap();
        times.push(t.elapsed());
    }
    store.close();
    println!(
        "indexing one appended message (off the append path): p50 {}, p99 {}",
        ms(pct(&mut times, 0.5)),
        ms(pct(&mut times, 0.99))
    );
}
