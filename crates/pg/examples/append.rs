//! Durable append latency, PostgreSQL store against the JSONL store, side by side in one run: N
//! message appends (about 500 bytes each, chained to the leaf, half of them with an idempotency
//! key) to one transcript on each, acknowledged only once durable (commit with `fsync` on the
//! server; `fdatasync` of the file). Prints p50/p99/mean for both. The PostgreSQL cluster is a
//! throwaway one started here (Debian's `postgresql`, as in the tests), on the same disk.
//!
//! cargo run --release -p pincer-pg --example append -- [--appends 2000]

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a measuring tool

use pincer_pg::{PgOptions, PgStore};
use pincer_store::{NewEntry, Store, StoreOptions, Transcripts, TranscriptsExt};
use pincer_testkit::postgres::Postgres;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.to_owned())
}

fn measure(store: &dyn Transcripts, path: &std::path::Path, n: usize) -> Vec<Duration> {
    let filler = "lorem ipsum dolor sit amet ".repeat(16);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let mut m = json!({"role": "user", "content": format!("{i} {filler}"), "timestamp": 1});
        if i % 2 == 0 {
            m["idempotencyKey"] = json!(format!("k{i}:user"));
        }
        let t = Instant::now();
        store.append(path, NewEntry::message(m)).expect("append");
        lat.push(t.elapsed());
    }
    lat
}

fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    let mean = v.iter().map(Duration::as_secs_f64).sum::<f64>() / v.len() as f64 * 1e3;
    println!("{name:<10} {} appends: p50 {:.3} ms, p99 {:.3} ms, mean {:.3} ms", v.len(), at(0.5), at(0.99), mean);
}

fn main() {
    let n: usize = arg("--appends", "2000").parse().expect("--appends");
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().to_path_buf();
    let db = PgStore::connect(PgOptions {
        url: pg.database("bench"),
        pool_size: 4,
        state_dir: state.clone(),
        redactor: Arc::new(pincer_store::redact::SecretRedactor::default()),
        cwd: "/".into(),
    })
    .expect("connect");
    let files = Store::new(StoreOptions::default());
    let path = state.join("agents/main/sessions/bench.jsonl");
    // Warm up both (connections, file creation), then alternate rounds so noise hits both alike.
    measure(&db, &path.with_file_name("warm.jsonl"), 50);
    measure(&files, &path.with_file_name("warm.jsonl"), 50);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        a.extend(measure(&db, &path, n / 4));
        b.extend(measure(&files, &path, n / 4));
    }
    report("postgres", a);
    report("jsonl", b);
}
