//! Crash safety with real processes: several `pincer transcript append` processes write one file
//! while some of them are killed with SIGKILL at random moments (holding the lock, mid-write, mid-
//! fsync). Afterwards every acknowledged append is there exactly once, every parentId resolves, a
//! retried key is never written twice, `verify` is clean after `repair` of at most a torn tail, and
//! the real Pi library opens the file and builds the same context as Pincer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use pincer_store::{context_report, LeafArg, Session};
use pincer_testkit::probe::Rng;
use pincer_testkit::{comparable, oracle_context};
use pretty_assertions::assert_eq;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const PER_WORKER: usize = 30;

fn append(file: &Path, key: &str, kill_after: Option<Duration>) -> Option<Value> {
    let msg = format!(r#"{{"role":"user","content":"{key}","timestamp":1}}"#);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pincer"))
        .args(["transcript", "append"])
        .arg(file)
        .args(["--message", &msg, "--idempotency-key", key])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pincer");
    if let Some(d) = kill_after {
        std::thread::sleep(d);
        let _ = child.kill(); // SIGKILL; a no-op if it already finished
    }
    let out = child.wait_with_output().expect("wait");
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

#[test]
fn killed_writers_never_lose_or_duplicate_acknowledged_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("crash.jsonl");
    let acked: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
    let kills = Mutex::new(0usize);
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (file, acked, kills) = (&file, &acked, &kills);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((w as u64 + 1) * 0x1234_5678));
                for i in 0..PER_WORKER {
                    let key = format!("w{w}-{i}");
                    // Every other attempt is killed after 0–4 ms; then the same key is retried
                    // until it is acknowledged, as a client would.
                    let mut attempt = 0;
                    loop {
                        let kill = (attempt < 3 && rng.next_u64().is_multiple_of(2))
                            .then(|| Duration::from_micros(rng.next_u64() % 4000));
                        if kill.is_some() {
                            *kills.lock().expect("lock") += 1;
                        }
                        if let Some(out) = append(file, &key, kill) {
                            assert!(out["id"].is_string(), "{out}");
                            acked.lock().expect("lock").insert(key.clone());
                            break;
                        }
                        attempt += 1;
                        assert!(attempt < 20, "{key} never succeeded");
                    }
                }
            });
        }
    });
    let acked = acked.into_inner().expect("lock");
    assert_eq!(acked.len(), WORKERS * PER_WORKER);
    assert!(*kills.lock().expect("lock") > 20, "too few kills to mean anything");
    assert!(started.elapsed() < Duration::from_secs(240), "a dead lock holder blocked the others");

    // Verify, repair at most a torn tail, verify clean.
    let pincer = env!("CARGO_BIN_EXE_pincer");
    let verify = Command::new(pincer).args(["transcript", "verify", "--json"]).arg(&file).output().expect("verify");
    let report: Value = serde_json::from_slice(&verify.stdout).expect("verify json");
    let kinds: Vec<&str> =
        report["problems"].as_array().expect("problems").iter().filter_map(|p| p["kind"].as_str()).collect();
    assert!(kinds.iter().all(|k| *k == "torn-tail"), "unexpected problems: {report}");
    if !kinds.is_empty() {
        assert!(Command::new(pincer).args(["transcript", "repair"]).arg(&file).status().expect("repair").success());
    }
    let clean = Command::new(pincer).args(["transcript", "verify"]).arg(&file).status().expect("verify");
    assert!(clean.success(), "verify is not clean after repair");

    // Every acknowledged key exactly once; nothing twice; every parent resolves; one chain.
    let text = std::fs::read_to_string(&file).expect("read");
    let entries: Vec<Value> = text.lines().skip(1).map(|l| serde_json::from_str(l).expect("json line")).collect();
    let mut count: HashMap<String, usize> = HashMap::new();
    for e in &entries {
        let k = e["message"]["idempotencyKey"].as_str().expect("key").to_owned();
        *count.entry(k).or_default() += 1;
    }
    assert!(count.values().all(|&n| n == 1), "a key was written twice: {count:?}");
    for k in &acked {
        assert_eq!(count.get(k), Some(&1), "acknowledged {k} is missing");
    }
    let ids: HashSet<&str> = entries.iter().filter_map(|e| e["id"].as_str()).collect();
    for (n, e) in entries.iter().enumerate() {
        match e["parentId"].as_str() {
            Some(p) => assert!(ids.contains(p), "entry {n} has a dangling parent"),
            None => assert_eq!(n, 0, "only the first entry is a root"),
        }
        if n > 0 {
            assert_eq!(e["parentId"], entries[n - 1]["id"], "entry {n} is not chained to the one before it");
        }
    }

    // Pi opens it and sees what Pincer sees.
    let session = Session::parse(text.into_bytes());
    let ours = comparable(&context_report(&session, &LeafArg::Default).expect("context").to_value());
    let pi = oracle_context(&file, None);
    assert_eq!(pi["extra"]["rewrittenOnOpen"], false);
    assert_eq!(ours, comparable(&pi));
    assert_eq!(ours["context"]["messages"].as_array().map(Vec::len), Some(entries.len()));
}
