//! Load command for the gateway: starts the real `pincer gateway` process against an instantly
//! answering fake provider and reports cold start, idle RSS, RSS with many idle connections, and
//! for N concurrent sessions of L entries each (every combination of `--sessions` and
//! `--lengths`): send→final latency (p50/p99), turns/s, and the gateway's own CPU time per turn
//! (user + system of its threads, in nanoseconds from `/proc/<pid>/task/*/schedstat`, or in ticks
//! from `/proc/<pid>/stat` when threads ended meanwhile; the load generator and the fake do not count).
//! The request-body pass (writing the model call's JSON body, O(context) by nature) is read from
//! the gateway's `/metrics` (`pincer_request_body_*`, the writing thread's CPU clock) and reported
//! on its own: its share of the CPU per turn, its throughput in MB/s, and the CPU per turn without it.
//! From the same place: fdatasyncs per turn, their mean time, and how many were in flight on
//! average (their summed time over the wall time: above 1 they overlapped).
//! Sessions of L entries are written as fixture files (user/assistant pairs chained as Pi does)
//! before the gateway starts.
//!
//! cargo build --release -p pincer
//! cargo run --release -p pincer-testkit --example load -- [--bin target/release/pincer] [--sessions 1,100] [--lengths 0,1000,10000] [--turns 50] [--idle 1000] [--perf DIR]
//!
//! `--postgres` runs the gateways on the PostgreSQL store instead (a throwaway cluster started here, the
//! prefilled sessions moved in with `pincer store import`), `--replicas N` starts N of them on it with
//! the sessions' clients spread over them (CPU is then the sum over the replicas):
//! cargo run --release -p pincer-testkit --example load -- --postgres --replicas 3 --sessions 30 --turns 20 --idle 0
//!
//! `--rate R` paces the sessions' turns to R turns/s in all (each session starts a turn every
//! sessions/R seconds, or at once when it is behind): per-turn costs that depend on how busy the
//! gateway is (threads that sleep and wake between turns) then compare at equal load, for example a
//! long session's turn against a fresh one's: `--sessions 10 --lengths 0,10000 --rate 150`.
//! `--equal-load` does that by itself: after each combination of long sessions it measures as
//! many fresh ones paced at the rate the long ones reached, and prints the ratio of their CPU per
//! turn without the request-body pass (and without the body's send too).
//!
//! `--context-cache-mb N` sets the gateway's `context_cache_mb` (many long sessions at once do not
//! fit the default 128 MiB: `--sessions 100 --lengths 10000 --context-cache-mb 1024`).
//!
//! `--perf DIR` records a `perf record -g` profile of the gateway process during each measured
//! combination into `DIR/perf-<sessions>x<entries>-<sessions' prefix>.data` (read with
//! `perf report -i …`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a measuring tool

use pincer_testkit::fake_openai::FakeOpenAi;
use pincer_testkit::gateway::{Client, GatewayProcess, TOKEN};
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

/// User + system CPU time of a process, in seconds, in clock ticks of 1/100 s (`/proc/<pid>/stat`,
/// which counts the time of threads that have ended too).
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // Fields 14 and 15 of stat(5) are the 12th and 13th after the command name; clock ticks of 1/100 s.
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

/// A process's CPU time at one instant: the tick count of `/proc/<pid>/stat` and each live
/// thread's nanoseconds on a CPU (`/proc/<pid>/task/<tid>/schedstat`).
struct CpuReading {
    ticks_s: f64,
    threads_ns: std::collections::HashMap<String, u64>,
}

impl CpuReading {
    fn of(pid: u32) -> CpuReading {
        let threads_ns = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| {
                        Some((t.file_name().to_string_lossy().into_owned(), schedstat_ns(&t.path().join("schedstat"))?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        CpuReading { ticks_s: cpu_s(pid), threads_ns }
    }

    /// Seconds of CPU since `earlier`: the threads' nanoseconds summed (a thread started since counts
    /// whole), unless that falls short of the tick count by more than the ticks' rounding, which
    /// means threads ended in between and took their time with them: then the tick count.
    fn since(&self, earlier: &CpuReading) -> f64 {
        let precise = self
            .threads_ns
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(earlier.threads_ns.get(tid).copied().unwrap_or(0)))
            .sum::<u64>() as f64
            / 1e9;
        let ticks = self.ticks_s - earlier.ticks_s;
        if precise < ticks - 0.02 {
            ticks
        } else {
            precise
        }
    }
}

/// A thread's nanoseconds on a CPU: the first field of its `schedstat`.
fn schedstat_ns(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.split_whitespace().next()?.parse().ok()
}

/// CPU time of the calling thread, in seconds (`/proc/thread-self/schedstat`).
fn thread_cpu_s() -> f64 {
    schedstat_ns(std::path::Path::new("/proc/thread-self/schedstat")).expect("schedstat run time") as f64 / 1e9
}

/// CPU milliseconds a process spends per MB sending a request body over loopback TCP to a
/// peer that reads it (the kernel's copy and both ends of the protocol run on the sender's CPU):
/// the other O(context) part of a model call besides writing the body, which the gateway cannot
/// time itself (the socket writes happen inside the HTTP client). The median of five 64 MB sends.
fn loopback_send_ms_per_mb() -> f64 {
    use std::io::{Read, Write};
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = listener.local_addr().expect("addr");
            let reader = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().expect("accept");
                let mut buf = vec![0u8; 1 << 20];
                while s.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
            });
            let mut w = std::net::TcpStream::connect(addr).expect("connect");
            let chunk = vec![b'x'; 1 << 20];
            let started = thread_cpu_s();
            for _ in 0..64 {
                w.write_all(&chunk).expect("send");
            }
            let spent = thread_cpu_s() - started;
            drop(w);
            reader.join().expect("reader");
            spent * 1e3 / (64.0 * (1 << 20) as f64 / 1e6)
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// Context switches of all the process's threads (voluntary and not), from `/proc/<pid>/task/*/status`.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Writes a session of `entries` entries (user/assistant pairs of about 500 bytes each) as Pi
/// would, and returns its `sessions.json` row.
fn prefill(dir: &std::path::Path, session_id: &str, entries: usize) -> serde_json::Value {
    use std::fmt::Write as _;
    let sessions = dir.join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).expect("sessions dir");
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"{{"type":"session","version":3,"id":"{session_id}","timestamp":"2026-12-01T00:00:00.000Z","cwd":"/"}}"#
    );
    let filler = "lorem ipsum dolor sit amet ".repeat(16);
    let mut parent = "null".to_owned();
    for i in 0..entries {
        let id = format!("{:08x}", i + 1);
        let msg = if i % 2 == 0 {
            json!({"role": "user", "content": format!("question {i}: {filler}"), "timestamp": 1_764_547_200_000u64 + i as u64})
        } else {
            json!({"role": "assistant", "content": [{"type": "text", "text": format!("answer {i}: {filler}")}],
                "api": "openai-completions", "provider": "fake", "model": "fake-model", "stopReason": "stop",
                "usage": {"input": 10, "output": 10, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 20,
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                "timestamp": 1_764_547_200_000u64 + i as u64})
        };
        let _ = writeln!(
            out,
            r#"{{"type":"message","id":"{id}","parentId":{parent},"timestamp":"2026-12-01T00:00:00.000Z","message":{msg}}}"#
        );
        parent = format!("\"{id}\"");
    }
    std::fs::write(sessions.join(format!("{session_id}.jsonl")), out).expect("write session");
    json!({"sessionId": session_id, "updatedAt": 1, "sessionStartedAt": 1})
}

/// Totals the gateway exports on `/metrics`: the request-body pass (bytes, CPU seconds) and the
/// transcript fdatasyncs (count, seconds spent in them).
#[derive(Clone, Copy, Default)]
struct Totals {
    body_bytes: f64,
    body_cpu: f64,
    syncs: f64,
    sync_seconds: f64,
}

impl std::ops::Add for Totals {
    type Output = Totals;
    fn add(self, o: Totals) -> Totals {
        Totals {
            body_bytes: self.body_bytes + o.body_bytes,
            body_cpu: self.body_cpu + o.body_cpu,
            syncs: self.syncs + o.syncs,
            sync_seconds: self.sync_seconds + o.sync_seconds,
        }
    }
}

/// [`totals`] summed over several gateways.
async fn totals_of(addrs: &[String]) -> Totals {
    let mut t = Totals::default();
    for a in addrs {
        t = t + totals(a).await;
    }
    t
}

impl std::ops::Sub for Totals {
    type Output = Totals;
    fn sub(self, o: Totals) -> Totals {
        Totals {
            body_bytes: self.body_bytes - o.body_bytes,
            body_cpu: self.body_cpu - o.body_cpu,
            syncs: self.syncs - o.syncs,
            sync_seconds: self.sync_seconds - o.sync_seconds,
        }
    }
}

async fn totals(addr: &str) -> Totals {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect /metrics");
    let req =
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n");
    sock.write_all(req.as_bytes()).await.expect("write /metrics");
    let mut text = String::new();
    sock.read_to_string(&mut text).await.expect("read /metrics");
    let value = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|r| r.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0)
    };
    Totals {
        body_bytes: value("pincer_request_body_bytes_total"),
        body_cpu: value("pincer_request_body_cpu_microseconds_total") / 1e6,
        syncs: value("pincer_store_fdatasync_seconds_count"),
        sync_seconds: value("pincer_store_fdatasync_seconds_sum"),
    }
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
    let lengths: Vec<usize> = arg("--lengths", "0").split(',').map(|s| s.parse().expect("--lengths")).collect();
    let perf_dir = std::env::args().any(|a| a == "--perf").then(|| std::path::PathBuf::from(arg("--perf", ".")));
    let rate: f64 = arg("--rate", "0").parse().expect("--rate");
    let equal_load = std::env::args().any(|a| a == "--equal-load");
    let send_ms_per_mb = std::thread::spawn(loopback_send_ms_per_mb).join().expect("loopback calibration");
    println!("sending over loopback TCP: {send_ms_per_mb:.3} ms of CPU per MB (the sender's side)");
    let fake = FakeOpenAi::start_unrecorded().await;
    let dir = tempfile_dir();
    let mut index = serde_json::Map::new();
    for &len in &lengths {
        for &n in &levels {
            for s in 0..n {
                let sid = format!("load-{len}-{n}-{s}");
                index.insert(format!("agent:main:{sid}"), prefill(&dir, &sid, len));
                if equal_load && len > 0 {
                    let sid = format!("fresh{len}-0-{n}-{s}");
                    index.insert(format!("agent:main:{sid}"), prefill(&dir, &sid, 0));
                }
            }
        }
    }
    std::fs::write(dir.join("agents/main/sessions/sessions.json"), serde_json::to_vec(&index).expect("index"))
        .expect("write sessions.json");
    // A window no prefilled session reaches: compaction would otherwise run after every turn.
    let mut config = fake.gateway_toml_window(100_000_000);
    if let Some(mb) = std::env::args().any(|a| a == "--context-cache-mb").then(|| arg("--context-cache-mb", "128")) {
        config = format!("[gateway]\ncontext_cache_mb = {mb}\n{config}");
    }
    let replicas: usize = arg("--replicas", "1").parse().expect("--replicas");
    let postgres = std::env::args().any(|a| a == "--postgres").then(pincer_testkit::postgres::Postgres::start);
    assert!(replicas == 1 || postgres.is_some(), "--replicas needs --postgres");
    if let Some(pg) = &postgres {
        let url = pg.database("load");
        pincer_testkit::postgres::import(std::path::Path::new(&bin), &dir, &url);
        config.push_str(&format!("\n[store]\nbackend = \"postgres\"\nurl = \"{url}\"\n"));
        println!("store: PostgreSQL, {replicas} replica(s)");
    }

    let t0 = Instant::now();
    let mut gws = Vec::new();
    for r in 0..replicas {
        let state = if r == 0 { dir.clone() } else { dir.join(format!("replica-{r}")) };
        gws.push(
            tokio::task::spawn_blocking({
                let (bin, config) = (bin.clone(), config.clone());
                move || GatewayProcess::start(&bin, &state, &config)
            })
            .await
            .expect("start"),
        );
    }
    let gw = &gws[0];
    let addrs: Vec<String> = gws.iter().map(|g| g.addr.clone()).collect();
    let pids: Vec<u32> = gws.iter().map(|g| g.child.id()).collect();
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

    let env = Env { addrs, pids, pid, turns, send_ms_per_mb, perf_dir };
    for &len in &lengths {
        for &n in &levels {
            let long = combination(&env, "load", len, n, rate).await;
            if equal_load && len > 0 {
                // The same number of fresh sessions, paced at the rate the long ones reached.
                let fresh = combination(&env, &format!("fresh{len}"), 0, n, long.rate).await;
                long.compare(&fresh, len);
            }
        }
    }
    drop(gws);
    drop(postgres);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits, before a measurement, until the work that warming up started is over: the search
/// index has taken in every prefilled transcript (`sessions.search` no longer answers `indexing`;
/// indexing a 10,000-entry session once costs about a second of CPU, which would otherwise land in
/// the first measured turns) and the gateway's CPU clock stands still for 200 ms.
async fn settle(addr: &str, pid: u32) {
    let mut c = Client::connect(addr).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        // A gateway without search (an older build measured side by side) has nothing to wait for.
        let Ok(r) = c.request("sessions.search", json!({"query": "turn", "limit": 1})).await else { break };
        if r.get("indexing").and_then(serde_json::Value::as_bool) != Some(true) {
            break;
        }
    }
    let mut last = cpu_s(pid);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = cpu_s(pid);
        if now - last < 0.005 {
            break;
        }
        last = now;
    }
}

/// Starts `perf record -g` on the gateway process (Debian's linux-perf).
fn start_perf(file: &std::path::Path, pid: u32) -> std::process::Child {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).expect("perf dir");
    }
    let child = std::process::Command::new("perf")
        .args(["record", "-q", "-F", "499", "--call-graph", "dwarf,16384", "-p", &pid.to_string(), "-o"])
        .arg(file)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("perf record (apt install linux-perf)");
    std::thread::sleep(Duration::from_millis(300)); // perf attaches
    child
}

/// Stops a `perf record` with SIGINT (it writes its file then) and waits for it.
fn stop_perf(mut child: std::process::Child) {
    let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let _ = child.wait();
}

/// Counts a profile's samples (`perf script`) as the request-body pass (a frame in
/// `body_pass::measured`), its send (the HTTP client flushing its buffer to the provider's socket:
/// hyper's `Buffered::poll_flush`, where the kernel copies the body) or the rest.
fn profile_split(data: &std::path::Path) -> [u64; 3] {
    let out = std::process::Command::new("perf")
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(data)
        .stderr(std::process::Stdio::null())
        .output()
        .expect("perf script");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut counts = [0u64; 3];
    for sample in text.split("\n\n").filter(|s| !s.trim().is_empty()) {
        let i = if sample.contains("body_pass::measured") {
            0
        } else if sample.contains("hyper::proto::h1::io::Buffered<T,B>::poll_flush") {
            1
        } else {
            2
        };
        counts[i] += 1;
    }
    counts
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pincer-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// What every measured combination shares: the gateways, the first one's process, and how a
/// combination is measured.
struct Env {
    addrs: Vec<String>,
    pids: Vec<u32>,
    /// The first gateway's process (the one profiled and whose RSS is reported).
    pid: u32,
    turns: usize,
    send_ms_per_mb: f64,
    perf_dir: Option<std::path::PathBuf>,
}

/// One combination's figures, per measured turn.
struct Outcome {
    /// Turns per second over the measured turns.
    rate: f64,
    /// The gateways' CPU per turn, in ms.
    cpu: f64,
    /// The request-body pass per turn (the gateway's own clock), in ms.
    pass: f64,
    /// The body's send per turn at the loopback calibration's rate, in ms.
    send: f64,
    /// With `--perf`: the CPU per turn outside the pass and the send, by the profile's samples.
    profiled_rest: Option<f64>,
}

impl Outcome {
    /// Prints how a long session's turn compares with a fresh one's measured at the same rate.
    fn compare(&self, fresh: &Outcome, len: usize) {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let (long_rest, fresh_rest) = (self.cpu - self.pass, fresh.cpu - fresh.pass);
        let (long_net, fresh_net) = (long_rest - self.send, fresh_rest - fresh.send);
        let profiled = match (self.profiled_rest, fresh.profiled_rest) {
            (Some(a), Some(b)) => format!("; by the profiles {a:.3} against {b:.3}: {:.2}x", ratio(a, b)),
            _ => String::new(),
        };
        println!(
            "      equal load ({:.0} turns/s against {:.0}): a {len}-entry turn costs {long_rest:.3} ms of CPU without \
             the request-body pass, a fresh one {fresh_rest:.3}: {:.2}x; without the pass and the body's send at the \
             loopback rate {long_net:.3} against {fresh_net:.3}: {:.2}x{profiled}",
            self.rate,
            fresh.rate,
            ratio(long_rest, fresh_rest),
            ratio(long_net, fresh_net),
        );
    }
}

/// Measures `n` sessions of `len` prefilled entries (`<prefix>-<len>-<n>-<s>`) taking `env.turns`
/// turns each (paced to `rate` turns/s in all when it is above 0), and prints the figures.
async fn combination(env: &Env, prefix: &str, len: usize, n: usize, rate: f64) -> Outcome {
    let (turns, pid, send_ms_per_mb) = (env.turns, env.pid, env.send_ms_per_mb);
    let cpu_all = || env.pids.iter().map(|p| CpuReading::of(*p)).collect::<Vec<_>>();
    let warm = std::sync::Arc::new(tokio::sync::Barrier::new(n + 1));
    // Measured turns start together once the gateway has settled after the warm-up.
    let go = std::sync::Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::new();
    for s in 0..n {
        let addr = env.addrs[s % env.addrs.len()].clone();
        let (warm, go) = (warm.clone(), go.clone());
        let name = format!("{prefix}-{len}-{n}-{s}");
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(&addr).await;
            let key = format!("agent:main:{name}");
            let mut lat = Vec::with_capacity(turns);
            // The first turn reads the session from its file and writes its whole request body.
            let mut first = Duration::ZERO;
            // With a rate: this session's turns start every n/rate seconds, the sessions spread
            // evenly over that gap.
            let gap = (rate > 0.0).then(|| Duration::from_secs_f64(n as f64 / rate));
            let mut start = tokio::time::Instant::now();
            // Turn 0 warms up (the gateway reads the prefilled file once); it is not counted.
            for t in 0..=turns {
                if let (Some(gap), true) = (gap, t > 0) {
                    tokio::time::sleep_until(start + gap.mul_f64((t - 1) as f64 + s as f64 / n as f64)).await;
                }
                let run = format!("{name}-{t}");
                let sent = Instant::now();
                c.request(
                    "chat.send",
                    json!({"sessionKey": key, "message": format!("turn {t}"), "idempotencyKey": run}),
                )
                .await
                .expect("send");
                let end = c.chat_end(&run).await;
                assert_eq!(end["payload"]["state"], "final", "{end}");
                if t > 0 {
                    lat.push(sent.elapsed());
                } else {
                    first = sent.elapsed();
                }
                if t == turns && s == 0 && std::env::var_os("LOAD_SHOW_EVENTS").is_some() {
                    for e in &c.events {
                        println!("event: {}", e.to_string().chars().take(300).collect::<String>());
                    }
                    println!("final: {}", end.to_string().chars().take(600).collect::<String>());
                }
                c.events.clear();
                if t == 0 {
                    warm.wait().await;
                    go.wait().await;
                    start = tokio::time::Instant::now();
                }
            }
            (lat, first)
        }));
    }
    warm.wait().await;
    settle(&env.addrs[0], pid).await;
    let profile = env.perf_dir.as_ref().map(|d| d.join(format!("perf-{n}x{len}-{prefix}.data")));
    let perf = profile.as_ref().map(|p| start_perf(p, pid));
    let before = totals_of(&env.addrs).await;
    let cpu_before = cpu_all();
    let switches_before: u64 = env.pids.iter().map(|p| switches(*p)).sum();
    let own_before = CpuReading::of(std::process::id());
    let started = Instant::now();
    go.wait().await;
    let (mut all, mut firsts) = (Vec::new(), Vec::new());
    for t in tasks {
        let (lat, first) = t.await.expect("session task");
        all.extend(lat);
        firsts.push(first);
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu: f64 = cpu_all().iter().zip(&cpu_before).map(|(now, then)| now.since(then)).sum();
    let own = CpuReading::of(std::process::id()).since(&own_before);
    let switched = env.pids.iter().map(|p| switches(*p)).sum::<u64>().saturating_sub(switches_before);
    let d = totals_of(&env.addrs).await - before;
    let (body_bytes, body_cpu) = (d.body_bytes, d.body_cpu);
    let count = all.len();
    let per_turn = |s: f64| s * 1e3 / count as f64;
    let split = perf.zip(profile.as_ref()).map(|(p, file)| {
        stop_perf(p);
        profile_split(file)
    });
    let paced = if rate > 0.0 { format!(" (paced at {rate:.0} turns/s)") } else { String::new() };
    let send = body_bytes / count as f64 / 1e6 * send_ms_per_mb;
    let outcome = Outcome {
        rate: count as f64 / wall,
        cpu: per_turn(cpu),
        pass: per_turn(body_cpu),
        send,
        profiled_rest: split.map(|[pass, send, rest]| per_turn(cpu) * rest as f64 / (pass + send + rest).max(1) as f64),
    };
    println!(
        "{n:>4} sessions x {turns} turns at {len:>6} entries{paced}: send→final p50 {:.2} ms, p99 {:.2} ms, {:.0} turns/s, \
         gateway CPU {:.3} ms/turn ({:.3} without the request-body pass; the pass {:.3} ms/turn, \
         {:.2} MB/turn at {:.0} MB/s; {:.3} without the pass and the body's send at the loopback rate), \
         gateway RSS {:.1} MiB",
        pct(&mut all, 0.5),
        pct(&mut all, 0.99),
        outcome.rate,
        outcome.cpu,
        outcome.cpu - outcome.pass,
        outcome.pass,
        body_bytes / count as f64 / 1e6,
        if body_cpu > 0.0 { body_bytes / body_cpu / 1e6 } else { 0.0 },
        outcome.cpu - outcome.pass - send,
        rss_kib(pid) as f64 / 1024.0
    );
    println!(
        "      first turns (all {n} at once, before the measured ones: each session read from its file and its whole \
         request body written): send→final p50 {:.2} ms, max {:.2} ms",
        pct(&mut firsts, 0.5),
        pct(&mut firsts, 1.0)
    );
    // Time inside fdatasync summed over the calls, over the wall time: above 1, calls of
    // different files overlapped (they run on several blocking threads).
    println!(
        "      fdatasyncs: {:.2} per turn, {:.3} ms each on average, {:.2} in flight on average; \
         {:.1} context switches of the gateway's threads per turn; this command's own CPU (the clients and \
         the fake provider) {:.3} ms/turn",
        d.syncs / count as f64,
        if d.syncs > 0.0 { d.sync_seconds / d.syncs * 1e3 } else { 0.0 },
        d.sync_seconds / wall,
        switched as f64 / count as f64,
        own * 1e3 / count as f64
    );
    if let Some([pass, send, rest]) = split {
        let all = (pass + send + rest).max(1) as f64;
        // The send's own rate: the body's bytes per turn over its share of the CPU per turn.
        let send_ms = per_turn(cpu) * send as f64 / all;
        println!(
            "      profile: {:.1} % the request-body pass, {:.1} % its send (the HTTP client's flush: {send_ms:.3} \
             ms/turn, {:.0} MB/s), {:.1} % the rest: {:.3} ms/turn without the pass and the send (under perf, {} samples)",
            100.0 * pass as f64 / all,
            100.0 * send as f64 / all,
            if send_ms > 0.0 { body_bytes / count as f64 / 1e3 / send_ms } else { 0.0 },
            100.0 * rest as f64 / all,
            per_turn(cpu) * rest as f64 / all,
            pass + send + rest
        );
    }
    outcome
}
