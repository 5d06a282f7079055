//! Load command for the gateway: starts the real `pincer gateway` process against an instantly
//! answering fake provider and reports cold start, idle RSS, RSS with many idle connections, and
//! send→final latency (p50/p99) and turns/s for N concurrent sessions.
//!
//! cargo build --release -p pincer
//! cargo run --release -p pincer-testkit --example load -- [--bin target/release/pincer] [--sessions 1,100] [--turns 50] [--idle 1000]

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a measuring tool

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess};
use serde_json::json;
use std::time::{Duration, Instant};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.to_owned())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = arg("--bin", "target/release/pincer");
    let turns: usize = arg("--turns", "50").parse().expect("--turns");
    let idle: usize = arg("--idle", "1000").parse().expect("--idle");
    let levels: Vec<usize> = arg("--sessions", "1,100").split(',').map(|s| s.parse().expect("--sessions")).collect();
    let fake = FakeOpenAi::start().await;
    let dir = tempfile_dir();
    let config = format!("{}\n[agents.defaults]\nmodel = \"fake/fake-model\"\n", fake.provider_toml());

    let t0 = Instant::now();
    let gw = tokio::task::spawn_blocking({
        let (bin, dir, config) = (bin.clone(), dir.clone(), config.clone());
        move || GatewayProcess::start(&bin, &dir, &config)
    })
    .await
    .expect("start");
    let first = Client::connect(&gw.addr).await;
    let cold = t0.elapsed();
    drop(first);
    let pid = gw.child.id();
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("cold start to first accepted connection (hello-ok): {:.1} ms", cold.as_secs_f64() * 1e3);
    println!("idle RSS: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);

    let mut conns = Vec::with_capacity(idle);
    for _ in 0..idle {
        conns.push(Client::connect(&gw.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("RSS with {idle} idle connections: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);
    drop(conns);

    for &n in &levels {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for s in 0..n {
            let addr = gw.addr.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = Client::connect(&addr).await;
                let key = format!("agent:main:load-{n}-{s}");
                let mut lat = Vec::with_capacity(turns);
                for t in 0..turns {
                    let run = format!("load-{n}-{s}-{t}");
                    let sent = Instant::now();
                    c.request(
                        "chat.send",
                        json!({"sessionKey": key, "message": format!("turn {t}"), "idempotencyKey": run}),
                    )
                    .await
                    .expect("send");
                    let end = c.chat_end(&run).await;
                    assert_eq!(end["payload"]["state"], "final", "{end}");
                    lat.push(sent.elapsed());
                    c.events.clear();
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("session task"));
        }
        let wall = started.elapsed().as_secs_f64();
        let count = all.len();
        println!(
            "{n:>4} concurrent sessions x {turns} turns: send→final p50 {:.2} ms, p99 {:.2} ms, {:.0} turns/s, gateway RSS {:.1} MiB",
            pct(&mut all, 0.5),
            pct(&mut all, 0.99),
            count as f64 / wall,
            rss_kib(pid) as f64 / 1024.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pincer-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}
