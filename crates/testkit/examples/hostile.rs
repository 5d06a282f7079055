//! Before/after figures for the hostile shapes of issue 34, items 7 and 8, against a real
//! `pincer gateway` process (any build: pass the binary): `sessions.branches.list` and
//! `sessions.tree` over a chain with a tip under every entry, and `sessions.search` over 20,000
//! words `m0…m19999` plus 32 groups of 500 words: `m*` × 8, `m1`, 32 prefixes of 500 words each,
//! `m*` × 150, and a plain `m1` sent while `m*` × 150 runs on another connection. Prints the median
//! of the runs and every run.
//!
//! cargo build -p pincer && cargo build -p pincer-testkit --example hostile
//! target/debug/examples/hostile --bin target/debug/pincer tree 1000,4000,8000 [runs]
//! target/debug/examples/hostile --bin target/debug/pincer search [runs]

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a measuring tool
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // it writes its fixture files directly

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::shapes::{heavy_query, message, search_corpus, write_session};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One request: how long it took and what came back (`ok <bytes>` or the error's message).
async fn call(c: &mut Client, method: &str, params: Value) -> (Duration, String) {
    let t = Instant::now();
    let r = c.try_request(method, params, Duration::from_secs(900)).await.unwrap();
    let what = match r {
        Ok(v) => format!("ok, {} bytes", v.to_string().len()),
        Err(e) => format!("error {}", e["message"]),
    };
    (t.elapsed(), what.chars().take(100).collect())
}

fn scratch() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pincer-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

async fn tree(bin: &str, chains: &str, runs: usize) {
    for chain in chains.split(',').map(|c| c.parse::<usize>().expect("chain lengths: 1000,4000")) {
        let dir = scratch();
        let state = dir.join("state");
        let mut entries = vec![message("m0", None, "user", "root")];
        for i in 1..chain {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            entries.push(message(&format!("s{}", i - 1), Some(&format!("m{}", i - 1)), "user", "side"));
            entries.push(message(&format!("m{i}"), Some(&format!("m{}", i - 1)), role, "chain"));
        }
        write_session(&state, "tree", "0000000a-0000-4000-8000-00000000000a", &entries);
        let fake = FakeOpenAi::start_in_thread();
        let gw = GatewayProcess::start(bin, &state, &fake.gateway_toml());
        let mut c = Client::connect(&gw.addr).await;
        for m in ["sessions.branches.list", "sessions.tree"] {
            let mut ts = Vec::new();
            for _ in 0..runs {
                ts.push(call(&mut c, m, json!({"sessionKey": "agent:main:tree"})).await.0);
            }
            println!("{m}, {} entries: median {:?} of {ts:?}", 2 * chain - 1, median(ts.clone()));
        }
        drop(gw);
        let _ = std::fs::remove_dir_all(dir);
    }
}

async fn search(bin: &str, runs: usize) {
    let dir = scratch();
    let state = dir.join("state");
    search_corpus(&state);
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start(bin, &state, &fake.gateway_toml());
    let mut c = Client::connect(&gw.addr).await;
    while c.request("sessions.search", json!({"query": "m19999"})).await.unwrap().get("indexing").is_some() {}
    let (m8, m150, heavy) = (["m*"; 8].join(" "), ["m*"; 150].join(" "), heavy_query());
    for (name, q, n) in
        [("m* x 8", &m8, runs), ("m1", &"m1".to_owned(), runs), ("32 prefixes", &heavy, runs), ("m* x 150", &m150, 1)]
    {
        let mut ts = Vec::new();
        let mut what = String::new();
        for _ in 0..n {
            let (t, w) = call(&mut c, "sessions.search", json!({"query": q})).await;
            ts.push(t);
            what = w;
        }
        println!("sessions.search {name}: median {:?} of {ts:?}: {what}", median(ts.clone()));
    }
    let mut other = Client::connect(&gw.addr).await;
    let running = tokio::spawn(async move { call(&mut other, "sessions.search", json!({"query": m150})).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (t, w) = call(&mut c, "sessions.search", json!({"query": "m1"})).await;
    let (tr, wr) = running.await.unwrap();
    println!("sessions.search m1 sent while m* x 150 runs: {t:?}: {w} (m* x 150: {tr:?}: {wr})");
    drop(gw);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: hostile --bin PINCER tree 1000,4000,8000 [runs] | hostile --bin PINCER search [runs]";
    let (Some("--bin"), Some(bin), Some(what)) = (args.first().map(String::as_str), args.get(1), args.get(2)) else {
        panic!("{usage}")
    };
    match what.as_str() {
        "tree" => {
            let runs = args.get(4).and_then(|r| r.parse().ok()).unwrap_or(3);
            tree(bin, args.get(3).expect(usage), runs).await;
        }
        "search" => search(bin, args.get(3).and_then(|r| r.parse().ok()).unwrap_or(3)).await,
        _ => panic!("{usage}"),
    }
}
