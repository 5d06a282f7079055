//! Adversarial end-to-end tests of the gateway's edges, with real processes: the `pincer gateway`
//! binary as a child process (sometimes under `prlimit` or on a tiny tmpfs), real sockets, the fake
//! OpenAI-compatible provider, and the gateway's memory and descriptors read from `/proc/<pid>`.
//! Each test attacks one bound — durable idempotency across SIGKILL, a second gateway on one state
//! dir refused, a leaf guard raced by two sends, a transcript locked by another process, pre-auth
//! floods, slow consumers, Origin checks, slowloris, many sessions under a low file limit, SSE logs
//! of deleted sessions, a full disk, a reset or delete during a turn, graceful shutdown, the
//! per-session queue, frame sizes, and a crash storm — asserts the bound with the measured numbers
//! in the failure message, and checks that an ordinary client (connect, `chat.send`, `chat` final)
//! keeps chatting during or after the attack. The tests that also need the Pi oracle (Node) are in
//! `edges_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use futures::{SinkExt, StreamExt};
use pincer_testkit::fake_openai::{FakeOpenAi, Pacing};
use pincer_testkit::gateway::{Client, GatewayProcess, StartOptions, TOKEN};
use pincer_testkit::probe::message_text as text;
use pincer_testkit::probe::{self, Rng, Sampler};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

#[path = "edges/common.rs"]
mod common;
use common::*;

const MIB: u64 = 1024; // KiB in a MiB

fn prlimit_1024() -> StartOptions {
    StartOptions { wrapper: vec!["prlimit".into(), "--nofile=1024:1024".into(), "--".into()], ..Default::default() }
}

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The ordinary client: a fresh connection, one turn on its own session, the final reply.
async fn ordinary_turn(addr: &str, tag: &str) {
    // Under a flood of unauthenticated sockets a client can be evicted (oldest unauthenticated
    // first) before its handshake is done, as designed; like a real client it connects again.
    let mut errors = Vec::new();
    let mut c = loop {
        match Client::try_connect(addr, Duration::from_secs(20)).await {
            Ok(c) => break c,
            Err(e) if errors.len() < 4 => errors.push(e),
            Err(e) => panic!("the ordinary client ({tag}) never got in: {e}; before: {errors:?}"),
        }
    };
    if !errors.is_empty() {
        eprintln!("ordinary client ({tag}) connected after {} attempts: {errors:?}", errors.len() + 1);
    }
    let run = unique(&format!("ordinary-{tag}"));
    let said = format!("hello from the ordinary client {run}");
    let ack = send(&mut c, &format!("agent:main:ordinary-{tag}"), &said, &run).await;
    assert_eq!(ack.as_ref().map(|a| a["status"].clone()), Ok(json!("started")), "ordinary chat.send ({tag}): {ack:?}");
    let end = c.chat_end(&run).await;
    assert_eq!(end["payload"]["state"], "final", "ordinary turn ({tag}): {end}");
    assert!(text(&end["payload"]["message"]).contains(&said), "ordinary reply ({tag}): {end}");
}

fn customs<'a>(rows: &'a [Value], custom_type: &str, run: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r["type"] == "custom" && r["customType"] == custom_type && r["data"]["runId"] == run)
        .collect()
}

/// RSS once the process is idle: over 250 ms it used at most 20 ms of CPU and its RSS moved less
/// than 1 MiB (polled for at most 30 s; leftover work of a closed connection finishes first).
async fn settled_rss(pid: u32) -> u64 {
    let mut last = (probe::rss_kib(pid), probe::cpu_ticks(pid).unwrap_or(0));
    probe::poll_async(Duration::from_secs(30), Duration::from_millis(250), || {
        let now = (probe::rss_kib(pid), probe::cpu_ticks(pid).unwrap_or(0));
        let idle = now.0.abs_diff(last.0) < MIB && now.1.saturating_sub(last.1) <= 2;
        last = now;
        async move { idle.then_some(now.0) }
    })
    .await
    .unwrap_or(last.0)
}

// 1 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01_idempotency_is_durable_across_sigkill_and_an_interrupted_turn_resumes_by_itself() {
    let mut e = start("", StartOptions::default());
    let key = "agent:main:durable";
    let mut c = Client::connect(&e.gw.addr).await;
    let ack = send(&mut c, key, "remember this", "K-done").await.expect("send");
    assert_eq!(ack["status"], "started");
    assert_eq!(c.chat_end("K-done").await["payload"]["state"], "final");
    let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    let before = probe::read_rows(&file);
    drop(c);

    restart(&mut e.gw); // SIGKILL, then a new process on the same state dir
    let mut c = Client::connect(&e.gw.addr).await;
    let again = send(&mut c, key, "remember this", "K-done").await.expect("resend");
    assert_eq!(again, json!({"runId": "K-done", "status": "ok"}), "a finished turn resent after SIGKILL");
    let rows = probe::read_rows(&file);
    assert_eq!(rows.len(), before.len(), "nothing written for the resend: {rows:#?}");
    assert_eq!(user_rows(&rows, "K-done"), 1);
    assert_eq!(replies(&rows, "K-done").len(), 1);
    let requests = e.fake.requests().len();

    // A turn killed mid-stream.
    let ack = send(&mut c, key, "[slow] a long story that gets interrupted", "K-cut").await.expect("send");
    assert_eq!(ack["status"], "started");
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == "K-cut" && f["payload"]["state"] == "delta").await;
    drop(c);
    restart(&mut e.gw);
    // No resend: the gateway takes the turn up by itself, for the same user row.
    let answered = probe::poll_async(Duration::from_secs(20), Duration::from_millis(50), || {
        let rows = probe::read_rows(&file);
        async move { (!replies(&rows, "K-cut").is_empty()).then_some(rows) }
    })
    .await
    .expect("the interrupted turn K-cut answered within 20 s of the restart, without a resend");
    let rows = answered;
    assert_eq!(user_rows(&rows, "K-cut"), 1, "no second user row: {rows:#?}");
    assert!(customs(&rows, "pincer.turn-interrupted", "K-cut").is_empty(), "resumed, not given up");
    let user = rows.iter().find(|r| r["message"]["idempotencyKey"] == "K-cut:user").expect("K-cut user row");
    let resumes = customs(&rows, "pincer.turn-resumed", "K-cut");
    assert_eq!(resumes.len(), 1, "one pincer.turn-resumed entry");
    assert_eq!(resumes[0]["parentId"], user["id"], "the attempt is chained to the unanswered user row");
    let reply = replies(&rows, "K-cut");
    assert_eq!(reply.len(), 1, "one assistant reply for the resumed turn: {rows:#?}");
    assert_eq!(reply[0]["parentId"], resumes[0]["id"]);
    assert_eq!(e.fake.requests().len(), requests + 2, "the run was sent to the provider twice: cut, resumed");

    let mut c = Client::connect(&e.gw.addr).await;
    // The reply is on disk a moment before the resumed run lets go of its key: a resend meanwhile
    // is told `in_flight` (and starts nothing); once the run is over, `ok`.
    let mut third = json!(null);
    for _ in 0..200 {
        third = send(&mut c, key, "[slow] a long story that gets interrupted", "K-cut").await.expect("resend");
        if third["status"] != "in_flight" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(third, json!({"runId": "K-cut", "status": "ok"}));
    let after = probe::read_rows(&file);
    assert_eq!(after.len(), rows.len(), "nothing more written");
    assert_eq!(user_rows(&after, "K-done"), 1);
    assert_eq!(replies(&after, "K-done").len(), 1);
    assert_chain(&after, "durable");
    assert_verifies(&file);
    ordinary_turn(&e.gw.addr, "durable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01f_a_queued_message_aborted_while_it_waits_is_not_run_after_a_restart() {
    let mut e = start("", StartOptions::default());
    let key = "agent:main:queued-abort";
    let mut c = Client::connect(&e.gw.addr).await;
    send(&mut c, key, "[slow] the running turn", "D-a").await.expect("send a");
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == "D-a" && f["payload"]["state"] == "delta").await;
    send(&mut c, key, "never mind this one", "D-b").await.expect("send b");
    let r = c.request("chat.abort", json!({"sessionKey": key, "runId": "D-b"})).await.expect("abort");
    assert_eq!(r["aborted"], true, "{r}");
    c.chat_end("D-b").await;
    let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    probe::poll_async(Duration::from_secs(10), Duration::from_millis(50), || {
        let rows = probe::read_rows(&file);
        async move { (!customs(&rows, "pincer.turn-dropped", "D-b").is_empty()).then_some(()) }
    })
    .await
    .expect("the dropped record of D-b");
    drop(c);
    restart(&mut e.gw);
    probe::poll_async(Duration::from_secs(30), Duration::from_millis(100), || {
        let rows = probe::read_rows(&file);
        async move { (!replies(&rows, "D-a").is_empty()).then_some(()) }
    })
    .await
    .expect("D-a resumed and answered");
    // Give a wrongly revived D-b the time of a whole turn to show up.
    ordinary_turn(&e.gw.addr, "queued-abort").await;
    let rows = probe::read_rows(&file);
    assert_eq!(user_rows(&rows, "D-b"), 0, "the aborted message never ran\n{}", outline(&rows, "D-a"));
    assert_chain(&rows, "queued-abort");
}

/// Holds `<transcript>.lock` as a live Pincer holder does (the file, flocked), so that every
/// gateway's appends to that transcript wait; dropping it releases them.
struct HeldLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl HeldLock {
    /// Waits for the lock to be free (a holder's linger ends; one left by a killed holder is
    /// removed, as a gateway would), then takes it.
    fn take(transcript: &Path) -> HeldLock {
        let path = PathBuf::from(format!("{}.lock", transcript.display()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let file = loop {
            assert!(Instant::now() < deadline, "{} stayed held", path.display());
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if std::fs::File::open(&path).is_ok_and(|f| f.try_lock().is_ok()) {
                        let _ = std::fs::remove_file(&path); // no live holder
                    } else {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                Err(e) => panic!("create {}: {e}", path.display()),
            }
        };
        std::fs::write(&path, json!({"pid": std::process::id(), "createdAt": "2026-01-01T00:00:00.000Z"}).to_string())
            .expect("lock body");
        file.lock().expect("flock");
        HeldLock { path, _file: file }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01b_a_second_gateway_on_one_jsonl_state_dir_refuses_to_start() {
    // A second `pincer gateway` on the same state dir (started by mistake, or by a supervisor before
    // the old one is gone) would interleave turns of one session: it refuses to start, naming the
    // process that serves the directory, and the first one goes on serving. Once the first is gone
    // (even by SIGKILL), a new one starts.
    let mut e = start("", StartOptions::default());
    let mut second = std::process::Command::new(BIN)
        .args(["gateway", "--bind", "127.0.0.1:0", "--state-dir"])
        .arg(&e.gw.state_dir)
        .env("PINCER_GATEWAY_TOKEN", TOKEN)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run a second gateway");
    // Bounded: a second gateway that does start (the defect) is killed, and the test fails.
    let status = probe::poll(Duration::from_secs(20), Duration::from_millis(50), || second.try_wait().ok().flatten());
    if status.is_none() {
        let _ = second.kill();
    }
    let out = second.wait_with_output().expect("second gateway's output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.is_some_and(|s| !s.success()), "a second gateway started on the same state dir: {stderr}");
    let pid = e.gw.pid().to_string();
    assert!(
        stderr.contains("another pincer gateway") && stderr.contains(&pid) && stderr.contains("postgres"),
        "the refusal names the holder and the way to run several: {stderr}"
    );
    ordinary_turn(&e.gw.addr, "first-still-serves").await;
    let config = config(&e.fake, "");
    tokio::task::block_in_place(|| e.gw.kill9());
    let next = tokio::task::block_in_place(|| GatewayProcess::start(BIN, &e.gw.state_dir, &config));
    ordinary_turn(&next.addr, "after-the-first").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01c_two_sends_guarded_by_one_leaf_write_one_turn() {
    // Two tabs send at once, each "only if the leaf is still X" (`expectedLeafEntryId`). Both
    // pass the check when they arrive (nothing can be written meanwhile: the transcript's lock is
    // held); the one that runs second finds the leaf moved, writes nothing, and says so.
    let e = start("", StartOptions::default());
    let key = "agent:main:guarded";
    let mut c = Client::connect(&e.gw.addr).await;
    assert_eq!(send(&mut c, key, "hello", "G-first").await.expect("send")["status"], "started");
    assert_eq!(c.chat_end("G-first").await["payload"]["state"], "final");
    let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    let leaf = probe::read_rows(&file).last().expect("rows")["id"].clone();
    let held = HeldLock::take(&file);
    let mut c2 = Client::connect(&e.gw.addr).await;
    let guarded = |run: &str| json!({"sessionKey": key, "message": format!("edit {run}"), "idempotencyKey": run, "expectedLeafEntryId": leaf});
    let (ra, rb) = tokio::join!(c.request("chat.send", guarded("G-a")), c2.request("chat.send", guarded("G-b")));
    assert_eq!(ra.expect("send a")["status"], "started");
    assert_eq!(rb.expect("send b")["status"], "started");
    drop(held);
    let (ea, eb) = tokio::join!(c.chat_end("G-a"), c2.chat_end("G-b"));
    let mut ends = [("G-a", ea), ("G-b", eb)];
    ends.sort_by_key(|(_, e)| e["payload"]["state"] != "final");
    let [(won, _), (lost, refused)] = ends;
    assert_eq!(refused["payload"]["state"], "error", "{refused}");
    assert_eq!(refused["payload"]["errorKind"], "conflict", "{refused}");
    let why = refused["payload"]["errorMessage"].as_str().unwrap_or("");
    assert!(why.contains("active branch of agent:main:guarded moved"), "{why}");
    let rows = probe::read_rows(&file);
    assert_eq!(user_rows(&rows, won), 1);
    assert_eq!(user_rows(&rows, lost), 0, "nothing written for the stale send: {}", outline(&rows, won));
    let user = rows.iter().find(|r| r["message"]["idempotencyKey"] == format!("{won}:user")).expect("user row");
    assert_eq!(user["parentId"], leaf, "the winner is chained where both expected");
    assert_chain(&rows, key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01d_a_transcript_another_process_holds_stalls_only_its_own_session() {
    // OpenClaw (or Pi, or a second gateway) holds one session's transcript lock for a long run.
    // That session's next turn waits for it; other sessions keep answering, also those whose
    // transcripts share its writer lane (each lane writes a quarter of the sessions here), and the
    // waiting session's history still reads.
    let e = start("", StartOptions::default());
    let mut c = Client::connect(&e.gw.addr).await;
    let key = "agent:main:held-elsewhere";
    assert_eq!(send(&mut c, key, "hello", "H-first").await.expect("send")["status"], "started");
    assert_eq!(c.chat_end("H-first").await["payload"]["state"], "final");
    let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    let lanes = pincer_store::lanes::lane_count();
    let lane = pincer_store::lanes::lane_index(&file, lanes);
    // Sessions until two share the held one's lane (and some that do not).
    let mut same_lane = Vec::new();
    let mut others = Vec::new();
    for i in 0..64 {
        if same_lane.len() >= 2 && others.len() >= 2 {
            break;
        }
        let k = format!("agent:main:neighbour-{i}");
        let run = format!("N-{i}-first");
        assert_eq!(send(&mut c, &k, "hello", &run).await.expect("send")["status"], "started");
        assert_eq!(c.chat_end(&run).await["payload"]["state"], "final");
        let f = probe::transcript_path(&e.gw.state_dir, &k).expect("transcript");
        match pincer_store::lanes::lane_index(&f, lanes) == lane {
            true => same_lane.push(k),
            false => others.push(k),
        }
    }
    assert!(same_lane.len() >= 2, "no session shares lane {lane} of {lanes}");
    let held = HeldLock::take(&file);
    assert_eq!(send(&mut c, key, "wait for the lock", "H-waits").await.expect("send")["status"], "started");
    tokio::time::sleep(Duration::from_millis(300)).await; // its user row's append is waiting now
    for (i, k) in same_lane.iter().chain(&others).enumerate() {
        let run = format!("N-{i}-while-held");
        let mut cn = Client::connect(&e.gw.addr).await;
        assert_eq!(
            send(&mut cn, k, "hello while another session is held", &run).await.expect("send")["status"],
            "started"
        );
        let end = cn.try_chat_end(&run, Duration::from_secs(20)).await;
        let same = same_lane.contains(k);
        let end = end.unwrap_or_else(|e| panic!("{k} (lane shared with the held session: {same}) stalled: {e}"));
        assert_eq!(end["payload"]["state"], "final", "{k}: {end}");
    }
    let mut ch = Client::connect(&e.gw.addr).await;
    let history = tokio::time::timeout(Duration::from_secs(10), ch.request("chat.history", json!({"sessionKey": key})))
        .await
        .expect("the held session's history reads while its turn waits")
        .expect("chat.history");
    assert!(history["messages"].as_array().is_some_and(|m| !m.is_empty()), "{history}");
    let rows = probe::read_rows(&file);
    assert_eq!(user_rows(&rows, "H-waits"), 0, "nothing written while the lock is held elsewhere");
    drop(held);
    let end = c.try_chat_end("H-waits", Duration::from_secs(30)).await.expect("the waiting turn ends");
    assert_eq!(end["payload"]["state"], "final", "{end}");
    let rows = probe::read_rows(&file);
    assert_eq!(user_rows(&rows, "H-waits"), 1);
    assert_eq!(replies(&rows, "H-waits").len(), 1, "{}", outline(&rows, "H-waits"));
    assert_chain(&rows, key);
}

// 2 ────────────────────────────────────────────────────────────────────────────────────────────

/// What one pre-auth flooder saw.
#[derive(Debug)]
struct Flood {
    status: u16,
    written: u64,
    close_code: Option<u16>,
    ended: bool,
}

const FLOOD_ANNOUNCED: u64 = 24_000_000;

const FLOOD_GIVE_UP: u64 = 12 * 1024 * 1024;

async fn flood(addr: String) -> Flood {
    let up = probe::raw_upgrade(&addr, None, &[]).await.expect("upgrade");
    if up.status != 101 {
        return Flood { status: up.status, written: 0, close_code: None, ended: true };
    }
    let (mut rd, mut wr) = up.stream.into_split();
    let mut buf = up.rest;
    let reader = tokio::spawn(async move {
        let mut tmp = vec![0u8; 16384];
        let mut code = None;
        loop {
            for f in probe::take_server_frames(&mut buf) {
                code = code.or(f.close_code());
            }
            match tokio::time::timeout(Duration::from_secs(30), rd.read(&mut tmp)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return (code, true),
                Ok(Ok(n)) => buf.extend_from_slice(&tmp[..n]),
                Err(_) => return (code, false),
            }
        }
    });
    let mut written = 0u64;
    let header = probe::client_frame_header(1, FLOOD_ANNOUNCED, [1, 2, 3, 4]);
    if wr.write_all(&header).await.is_ok() {
        let chunk = vec![b'a'; 64 * 1024];
        while written < FLOOD_GIVE_UP && !reader.is_finished() {
            match tokio::time::timeout(Duration::from_secs(10), wr.write_all(&chunk)).await {
                Ok(Ok(())) => written += chunk.len() as u64,
                _ => break, // reset by the server, or blocked: the reader tells which
            }
        }
    }
    let (close_code, ended) = reader.await.unwrap_or((None, false));
    Flood { status: 101, written, close_code, ended }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t02_pre_auth_floods_are_cut_and_memory_stays_flat() {
    let e = start("", StartOptions::default());
    let pid = e.gw.pid();
    ordinary_turn(&e.gw.addr, "preauth-warm").await;
    let base = settled_rss(pid).await;
    let floods: Vec<_> = (0..30).map(|_| tokio::spawn(flood(e.gw.addr.clone()))).collect();
    ordinary_turn(&e.gw.addr, "preauth-during").await;
    let mut results = Vec::new();
    for f in floods {
        results.push(f.await.expect("flood task"));
    }
    let peak = probe::hwm_kib(pid);
    ordinary_turn(&e.gw.addr, "preauth-after").await;
    let after = settled_rss(pid).await;
    let written: u64 = results.iter().map(|r| r.written).sum();
    let with_1009 = results.iter().filter(|r| r.close_code == Some(1009)).count();
    eprintln!(
        "pre-auth flood: RSS base {base} KiB, peak (VmHWM) {peak} KiB, after {after} KiB; {} MiB written by 30 \
         sockets; {with_1009} closed with 1009, the rest reset",
        written / (1024 * 1024)
    );
    for r in &results {
        assert_eq!(r.status, 101, "{r:?}");
        assert!(r.ended, "the server never closed a flooding socket: {r:?}");
        assert!(r.close_code.is_none() || r.close_code == Some(1009), "{r:?}");
        assert!(r.written < FLOOD_GIVE_UP, "the server kept reading the unauthenticated frame: {r:?}");
    }
    assert!(peak.saturating_sub(base) < 16 * MIB, "RSS grew by {} KiB (base {base}, peak {peak})", peak - base);
}

// 3 ────────────────────────────────────────────────────────────────────────────────────────────

/// What one slow-consumer attack saw.
#[derive(Debug)]
struct SlowConsumer {
    sent: usize,
    /// From the last request sent until the kernel saw the server end the connection.
    closed_after: Option<Duration>,
    frames_read: usize,
    close_code: Option<u16>,
    ended: bool,
}

/// One slow-consumer attack: pipelines history requests and does not read a byte until the
/// kernel says the server has ended the connection (FIN or RST: the TCP state leaves ESTABLISHED);
/// then reads what is left to find the close frame.
async fn slow_consumer(addr: &str, key: &str, ordinary: &str) -> SlowConsumer {
    use std::os::fd::AsRawFd;
    let ws = Client::connect(addr).await.into_ws();
    let fd = match ws.get_ref() {
        tokio_tungstenite::MaybeTlsStream::Plain(s) => s.as_raw_fd(),
        _ => panic!("not a plain TCP stream"),
    };
    let (mut sink, mut stream) = ws.split();
    let mut sent = 0;
    for i in 0..1500 {
        let req = json!({"type": "req", "id": format!("h{i}"), "method": "chat.history",
            "params": {"sessionKey": key, "maxChars": 500_000}});
        match tokio::time::timeout(Duration::from_secs(10), sink.send(Message::Text(req.to_string().into()))).await {
            Ok(Ok(())) => sent += 1,
            _ => break,
        }
    }
    let t0 = Instant::now();
    ordinary_turn(addr, ordinary).await; // while the consumer is not reading
    let closed_after = probe::poll_async(Duration::from_secs(90), Duration::from_millis(50), || {
        let st = probe::tcp_state(fd);
        async move { (st != Some(probe::TCP_ESTABLISHED)).then(|| t0.elapsed()) }
    })
    .await;
    let mut frames_read = 0;
    let mut close_code = None;
    let mut ended = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(Message::Close(f)))) => close_code = f.map(|f| u16::from(f.code)),
            Ok(Some(Ok(_))) => frames_read += 1,
            Ok(Some(Err(_))) | Ok(None) => {
                ended = true;
                break;
            }
            Err(_) => break,
        }
    }
    drop(sink);
    SlowConsumer { sent, closed_after, frames_read, close_code, ended }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t03_a_slow_consumer_is_closed_and_its_buffer_is_bounded_and_freed() {
    let e = start("", StartOptions::default());
    let pid = e.gw.pid();
    let key = "agent:main:big";
    let mut c = Client::connect(&e.gw.addr).await;
    let budget_kib = c.hello["policy"]["maxBufferedBytes"].as_u64().expect("policy.maxBufferedBytes") / 1024;
    c.request("sessions.create", json!({"key": key})).await.expect("create");
    for i in 0..10 {
        // Under the 128 KiB per-message cap of chat.history, so every answer carries ~2.4 MB.
        let body = format!("{i:02}{}", "lorem ipsum ".repeat(10_000));
        c.request("chat.inject", json!({"sessionKey": key, "message": body})).await.expect("inject");
    }
    let one = c.request("chat.history", json!({"sessionKey": key, "maxChars": 500_000})).await.expect("history");
    let answer_bytes = one.to_string().len();
    assert!(answer_bytes > 1_000_000, "a history answer is {answer_bytes} bytes: the attack would not fill the budget");
    drop(c);
    let base = settled_rss(pid).await;
    let started = Instant::now();
    let attack = slow_consumer(&e.gw.addr, key, "slow-during").await;
    let peak = probe::hwm_kib(pid);
    let closed = Instant::now();
    let after = settled_rss(pid).await;
    eprintln!(
        "slow consumer: answer {answer_bytes} B, budget {budget_kib} KiB; {attack:?}; RSS base {base} KiB, \
         peak {peak} (+{}), after {after} (+{}); idle {:?} after the close ({:?} in all)",
        peak - base,
        after.saturating_sub(base),
        closed.elapsed(),
        started.elapsed()
    );
    assert!(attack.closed_after.is_some(), "the server did not end the slow consumer's connection: {attack:?}");
    assert!(attack.ended, "the socket did not end: {attack:?}");
    assert!(attack.close_code.is_none() || attack.close_code == Some(1008), "close code: {attack:?}");
    assert!(attack.frames_read < attack.sent, "every request was answered: nothing was bounded: {attack:?}");
    assert!(peak - base < budget_kib + 16 * MIB, "RSS grew {} KiB, budget {budget_kib} KiB", peak - base);
    // Once the connection is gone its queue is freed: what stays (allocator caches) is well below a
    // whole budget's worth.
    assert!(
        after.saturating_sub(base) < budget_kib * 3 / 4,
        "RSS stayed up after the slow consumer was closed: base {base}, peak {peak}, after {after} KiB"
    );
    ordinary_turn(&e.gw.addr, "slow-after").await;
}

// 4 ────────────────────────────────────────────────────────────────────────────────────────────

async fn upgrade_status(addr: &str, host: Option<&str>, origin: Option<&str>) -> String {
    let extra: Vec<(&str, &str)> = origin.map(|o| ("Origin", o)).into_iter().collect();
    probe::raw_upgrade(addr, host, &extra).await.expect("upgrade").status_line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t04_origin_and_host_checks_on_the_upgrade() {
    let e = start("[gateway]\nallowed_origins = [\"https://chat.example.com\"]\n", StartOptions::default());
    let addr = e.gw.addr.clone();
    let own = format!("http://{addr}");
    let cases: [(Option<&str>, &str); 4] = [
        (Some("http://evil.example"), "403"),
        (Some(own.as_str()), "101"),
        (None, "101"),
        (Some("https://chat.example.com"), "101"),
    ];
    for (origin, want) in cases {
        let line = upgrade_status(&addr, Some(&addr), origin).await;
        assert!(line.starts_with(&format!("HTTP/1.1 {want}")), "Origin {origin:?}: {line}");
    }
    ordinary_turn(&addr, "origin").await;

    let open = start("[gateway.auth]\nmode = \"none\"\n", StartOptions::default());
    let port = open.gw.addr.rsplit(':').next().expect("port").to_owned();
    let evil_host = format!("evil.example:{port}");
    let rebound = upgrade_status(&open.gw.addr, Some(&evil_host), Some(&format!("http://{evil_host}"))).await;
    assert!(rebound.starts_with("HTTP/1.1 403"), "DNS rebinding without auth: {rebound}");
    let own = upgrade_status(&open.gw.addr, None, Some(&format!("http://{}", open.gw.addr))).await;
    assert!(own.starts_with("HTTP/1.1 101"), "own origin without auth: {own}");
    ordinary_turn(&open.gw.addr, "origin-noauth").await;
}

// 5 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t05_slowloris_sockets_are_closed_and_a_real_client_still_gets_in() {
    const ATTACKERS: usize = 3000;
    const HEADER_TIMEOUT: Duration = Duration::from_millis(2000);
    let soft = probe::raise_nofile();
    assert!(soft as usize > ATTACKERS + 256, "this process may open only {soft} files; the attack needs more");
    let e = start("[gateway]\nheader_timeout_ms = 2000\n", prlimit_1024());
    let pid = e.gw.pid();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    assert!(limits.lines().any(|l| l.starts_with("Max open files") && l.contains(" 1024 ")), "{limits}");
    let sampler = Sampler::start(pid, Duration::from_millis(20));
    let opened = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for _ in 0..ATTACKERS {
        let (addr, opened) = (e.gw.addr.clone(), opened.clone());
        attackers.push(tokio::spawn(async move {
            let mut s = tokio::time::timeout(Duration::from_secs(20), tokio::net::TcpStream::connect(&addr))
                .await
                .map_err(|_| "connect timed out".to_string())?
                .map_err(|e| format!("connect: {e}"))?;
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.map_err(|e| format!("write: {e}"))?;
            let t0 = Instant::now();
            opened.fetch_add(1, Ordering::Relaxed);
            let mut b = [0u8; 1024];
            loop {
                match tokio::time::timeout(Duration::from_secs(30), s.read(&mut b)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return Ok(t0.elapsed()),
                    Ok(Ok(_)) => continue, // e.g. a 408 before the close
                    Err(_) => return Err("still open after 30 s".to_string()),
                }
            }
        }));
    }
    let half = probe::poll_async(Duration::from_secs(30), Duration::from_millis(10), || {
        let n = opened.load(Ordering::Relaxed);
        async move { (n >= ATTACKERS / 3).then_some(n) }
    })
    .await;
    assert!(half.is_some(), "the attack never got going");
    let during = Instant::now();
    ordinary_turn(&e.gw.addr, "slowloris-during").await;
    let ordinary_took = during.elapsed();
    let opened_by_then = opened.load(Ordering::Relaxed);
    let mut closed_after = Vec::new();
    let mut failures = Vec::new();
    for a in attackers {
        match a.await.expect("attacker task") {
            Ok(d) => closed_after.push(d),
            Err(e) => failures.push(e),
        }
    }
    ordinary_turn(&e.gw.addr, "slowloris-after").await;
    let samples = sampler.stop();
    let slowest = closed_after.iter().max().copied().unwrap_or_default();
    eprintln!(
        "slowloris: {} sockets closed by the server, slowest after {slowest:?}; {opened_by_then} open when the \
         ordinary turn ran ({ordinary_took:?}); gateway fds max {} ({} samples)",
        closed_after.len(),
        samples.max_fds,
        samples.samples
    );
    assert!(failures.is_empty(), "{} attackers failed, e.g. {:?}", failures.len(), failures.first());
    assert!(slowest <= HEADER_TIMEOUT + Duration::from_secs(4), "a slowloris socket lived {slowest:?}");
    assert!(samples.max_fds < 1024, "the gateway had {} descriptors open", samples.max_fds);
    assert!(!e.gw.log_text().contains("accept failed"), "accept failed (out of descriptors?)");
}

// 6 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t06_eleven_hundred_sessions_under_a_1024_file_limit() {
    const SESSIONS: usize = 1100;
    const WORKERS: usize = 8;
    let e = start("", prlimit_1024());
    let pid = e.gw.pid();
    let sampler = Sampler::start(pid, Duration::from_millis(50));
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (addr, next, failures) = (e.gw.addr.clone(), next.clone(), failures.clone());
        workers.push(tokio::spawn(async move {
            let mut c = Client::connect(&addr).await;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= SESSIONS {
                    return;
                }
                let run = format!("many-{n}");
                let params = json!({"sessionKey": format!("agent:main:s{n}"), "message": format!("hello s{n}"),
                    "idempotencyKey": run});
                let outcome = match c.try_request("chat.send", params, Duration::from_secs(30)).await {
                    Ok(Ok(_)) => match c.try_chat_end(&run, Duration::from_secs(30)).await {
                        Ok(end) if end["payload"]["state"] == "final" => None,
                        Ok(end) => Some(format!("s{n}: {}", end["payload"])),
                        Err(e) => Some(format!("s{n}: {e}")),
                    },
                    Ok(Err(err)) => Some(format!("s{n}: chat.send refused: {err}")),
                    Err(e) => Some(format!("s{n}: {e}")),
                };
                if let Some(f) = outcome {
                    failures.lock().expect("failures").push(f);
                    if let Ok(again) = Client::try_connect(&addr, Duration::from_secs(10)).await {
                        c = again;
                    }
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let took = started.elapsed();
    let samples = sampler.stop();
    let failures = failures.lock().expect("failures").clone();
    let index = probe::session_index(&e.gw.state_dir, "main");
    let mut complete = 0;
    let mut broken = Vec::new();
    for n in 0..SESSIONS {
        let key = format!("agent:main:s{n}");
        let rows = index[&key]["sessionId"]
            .as_str()
            .map(|id| probe::read_rows(&probe::sessions_dir(&e.gw.state_dir, "main").join(format!("{id}.jsonl"))))
            .unwrap_or_default();
        let ok = rows.len() == 3
            && rows[0]["type"] == "session"
            && rows[1]["message"]["role"] == "user"
            && rows[2]["message"]["role"] == "assistant"
            && rows[2]["parentId"] == rows[1]["id"];
        if ok {
            complete += 1;
        } else if broken.len() < 3 {
            broken.push(format!("{key}: {} rows", rows.len()));
        }
    }
    eprintln!(
        "many sessions: {complete}/{SESSIONS} complete in {took:?}; gateway fds max {}; RSS max {} KiB; {} failures, \
         e.g. {:?}",
        samples.max_fds,
        samples.max_rss_kib,
        failures.len(),
        failures.first()
    );
    assert!(
        failures.is_empty(),
        "{} of {SESSIONS} turns failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(complete, SESSIONS, "incomplete transcripts, e.g. {broken:?}");
    assert!(samples.max_fds < 1024, "the gateway had {} descriptors open", samples.max_fds);
    ordinary_turn(&e.gw.addr, "many-after").await;
}

// 7 ────────────────────────────────────────────────────────────────────────────────────────────

async fn sse_after(addr: &str, key: &str, last: &str) -> Vec<probe::SseEvent> {
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Accept", "text/event-stream"), ("Authorization", auth.as_str()), ("Last-Event-ID", last)];
    let body =
        probe::http_get(addr, &format!("/api/sessions/{key}/events"), &headers, Duration::from_millis(700)).await;
    assert!(body.starts_with("HTTP/1.1 200"), "SSE for {key}: {}", &body[..body.len().min(300)]);
    probe::sse_events(&body)
}

fn mark(i: usize) -> String {
    format!("SSE-SECRET-{i:03}-")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t07_sse_never_replays_deleted_or_reset_sessions_and_keeps_no_log() {
    const SESSIONS: usize = 200;
    let e = start("", StartOptions::default());
    let pid = e.gw.pid();
    let mut c = Client::connect(&e.gw.addr).await;
    ordinary_turn(&e.gw.addr, "sse-warm").await;
    let base = settled_rss(pid).await;
    let t0 = Instant::now();
    for i in 0..SESSIONS {
        let key = format!("agent:main:sse{i}");
        c.request("sessions.create", json!({"key": key})).await.expect("create");
        let body = mark(i).repeat(150_000 / mark(i).len());
        c.request("chat.inject", json!({"sessionKey": key, "message": body})).await.expect("inject");
    }
    let injecting = t0.elapsed();
    let full = settled_rss(pid).await;
    // Ids of each transcript's start (`<sessionId>:0`), as a client that saw nothing would send.
    let index = probe::session_index(&e.gw.state_dir, "main");
    let start_of = |i: usize| format!("{}:0", index[format!("agent:main:sse{i}")]["sessionId"].as_str().expect("sid"));
    // The control: before the delete the catch-up does replay the content.
    let replay = sse_after(&e.gw.addr, &format!("agent:main:sse{}", SESSIONS - 1), &start_of(SESSIONS - 1)).await;
    assert!(replay.iter().any(|ev| ev.data.contains(&mark(SESSIONS - 1))), "no replay before the delete: {replay:?}");
    for i in 0..SESSIONS {
        c.request("sessions.delete", json!({"key": format!("agent:main:sse{i}")})).await.expect("delete");
    }
    let after = settled_rss(pid).await;
    for i in [0, SESSIONS / 2, SESSIONS - 1] {
        let evs = sse_after(&e.gw.addr, &format!("agent:main:sse{i}"), &start_of(i)).await;
        assert!(!evs.iter().any(|ev| ev.data.contains("SSE-SECRET")), "deleted session {i} replayed: {evs:?}");
        if let Some(first) = evs.first() {
            assert_eq!(first.event.as_deref(), Some("reset"), "session {i}: {evs:?}");
        }
    }
    // The same after sessions.reset.
    let key = "agent:main:sse-reset";
    c.request("sessions.create", json!({"key": key})).await.expect("create");
    c.request("chat.inject", json!({"sessionKey": key, "message": mark(999).repeat(100)})).await.expect("inject");
    let old = format!("{}:0", probe::session_index(&e.gw.state_dir, "main")[key]["sessionId"].as_str().expect("sid"));
    let before_reset = sse_after(&e.gw.addr, key, &old).await;
    assert!(before_reset.iter().any(|ev| ev.data.contains(&mark(999))), "{before_reset:?}");
    c.request("sessions.reset", json!({"key": key})).await.expect("reset");
    let evs = sse_after(&e.gw.addr, key, &old).await;
    assert!(!evs.iter().any(|ev| ev.data.contains("SSE-SECRET")), "a reset session replayed: {evs:?}");
    if let Some(first) = evs.first() {
        assert_eq!(first.event.as_deref(), Some("reset"), "{evs:?}");
    }
    let injected_kib = (SESSIONS * 150_000 / 1024) as u64;
    eprintln!(
        "SSE: {injected_kib} KiB injected in {injecting:?}; RSS base {base} KiB, after injecting {full} KiB, after \
         delete {after} KiB ({:?} in all)",
        t0.elapsed()
    );
    // Catch-up reads the store: RSS that stayed 1.5× the injected bytes above the baseline would
    // mean events were kept in memory.
    assert!(
        after.saturating_sub(base) < injected_kib * 3 / 2,
        "after deleting, RSS is {} KiB above the baseline ({injected_kib} KiB were injected)",
        after.saturating_sub(base)
    );
    ordinary_turn(&e.gw.addr, "sse-after").await;
}

// 8 ────────────────────────────────────────────────────────────────────────────────────────────

/// A 2 MiB tmpfs for the state dir: mounted directly as root, else inside the gateway's own mount
/// namespace (`unshare -rm`), where the test reaches it through `/proc/<pid>/root`.
struct SmallDisk {
    state: PathBuf,
    as_root: bool,
}

impl SmallDisk {
    fn view(&self, pid: u32, p: &Path) -> PathBuf {
        if self.as_root {
            p.to_path_buf()
        } else {
            PathBuf::from(format!("/proc/{pid}/root")).join(p.strip_prefix("/").unwrap_or(p))
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if self.as_root {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.state).status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t08_a_full_disk_fails_the_turn_and_nothing_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state");
    let as_root = probe::is_root();
    let disk = SmallDisk { state: state.clone(), as_root };
    let mut options = StartOptions { config_path: Some(dir.path().join("pincer.toml")), ..Default::default() };
    if as_root {
        let st =
            std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"]).arg(&state).status();
        assert!(st.is_ok_and(|s| s.success()), "mount tmpfs on {}", state.display());
    } else {
        options.wrapper =
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=2m tmpfs \"$PINCER_TMPFS\" && exec \"$0\" \"$@\""]
                .map(String::from)
                .to_vec();
        options.env = vec![("PINCER_TMPFS".into(), state.display().to_string())];
    }
    let fake = FakeOpenAi::start_in_thread();
    let gw = GatewayProcess::start_with(BIN, &state, &config(&fake, ""), &options);
    let pid = gw.pid();
    let key = "agent:main:disk";
    let mut c = Client::connect(&gw.addr).await;
    c.request("sessions.messages.subscribe", json!({"key": key})).await.expect("subscribe");
    send(&mut c, key, "before the disk fills", "disk-1").await.expect("send");
    assert_eq!(c.chat_end("disk-1").await["payload"]["state"], "final");

    // Fill the file system to the last page.
    let filler = disk.view(pid, &state.join("filler.bin"));
    let mut f = std::fs::File::create(&filler).expect("filler");
    let chunk = vec![0u8; 64 * 1024];
    let mut filled = 0u64;
    let full = loop {
        match std::io::Write::write(&mut f, &chunk) {
            Ok(0) => break None,
            Ok(n) => filled += n as u64,
            Err(e) => break e.raw_os_error(),
        }
        assert!(filled < 64 * 1024 * 1024, "the state dir is not a small tmpfs");
    };
    drop(f);
    assert_eq!(full, Some(libc::ENOSPC), "the filler ended without ENOSPC after {filled} bytes");
    let requests = fake.requests().len();
    c.events.clear();
    let big = "this turn cannot be saved ".repeat(1000); // needs new pages
    let outcome = match send(&mut c, key, &big, "disk-2").await {
        Err(err) => err["message"].as_str().unwrap_or_default().to_owned(),
        Ok(ack) => {
            assert_eq!(ack["status"], "started", "{ack}");
            let end = c.chat_end("disk-2").await;
            assert_eq!(end["payload"]["state"], "error", "{end}");
            end["payload"]["errorMessage"].as_str().unwrap_or_default().to_owned()
        }
    };
    c.request("health", json!({})).await.expect("health");
    eprintln!("disk full: filled {filled} bytes; the turn failed with: {outcome}");
    assert!(outcome.contains("disk is full"), "the error does not say the disk is full: {outcome}");
    assert!(!c.events.iter().any(|f| f["event"] == "session.message"), "announced an unsaved turn: {:?}", c.events);
    assert_eq!(fake.requests().len(), requests, "the provider was called for an unsaved turn");

    std::fs::remove_file(&filler).expect("remove filler");
    send(&mut c, key, "after the disk was freed", "disk-3").await.expect("send");
    let end = c.chat_end("disk-3").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    let file = probe::transcript_path(&disk.view(pid, &state), key).expect("transcript");
    let rows = probe::read_rows(&file);
    assert_eq!(user_rows(&rows, "disk-2"), 0, "the failed turn reached the file");
    assert_eq!(replies(&rows, "disk-3").len(), 1);
    assert_chain(&rows, "disk");
    assert_verifies(&file);
    let sessions = disk.view(pid, &probe::sessions_dir(&state, "main"));
    let names = || -> Vec<String> {
        std::fs::read_dir(&sessions)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect())
            .unwrap_or_default()
    };
    let no_lock = probe::poll(Duration::from_secs(3), Duration::from_millis(20), || {
        let n = names();
        (!n.iter().any(|n| n.ends_with(".lock"))).then_some(n)
    });
    let listing = no_lock.unwrap_or_else(|| panic!("a .lock file is left: {:?}", names()));
    let torn = listing.iter().filter(|n| n.contains(".torn.")).count();
    assert!(torn <= 1, "{torn} torn files: {listing:?}");
    ordinary_turn(&gw.addr, "disk-after").await;
    drop(c);
    drop(gw);
    drop(disk);
}

// 9 ────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t09b_a_reset_or_delete_during_a_turn_keeps_the_turn_whole_in_the_archive() {
    // `sessions.reset` (and `sessions.delete`) while a reply streams: the run is aborted, and its
    // user row and aborted partial end up in the archived transcript, chained; nothing is written
    // under the old name afterwards, and the session's new transcript starts clean.
    let e = start("", StartOptions::default());
    let mut c = Client::connect(&e.gw.addr).await;
    for (method, key) in [("sessions.reset", "agent:main:reset-mid"), ("sessions.delete", "agent:main:delete-mid")] {
        let run = format!("{method}-run");
        assert_eq!(send(&mut c, key, "[slow] a story cut by a reset", &run).await.expect("send")["status"], "started");
        c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == run.as_str() && f["payload"]["state"] == "delta")
            .await;
        let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
        c.request(method, json!({"key": key})).await.expect(method);
        let end = c.chat_end(&run).await;
        assert_eq!(end["payload"]["state"], "aborted", "{end}");
        // Whatever the aborted run still wrote has landed by now; give a stray write time to show.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!file.exists(), "{method}: {} was written again after it was archived", file.display());
        let dir = probe::sessions_dir(&e.gw.state_dir, "main");
        let name = file.file_name().and_then(|n| n.to_str()).expect("name").to_owned();
        let archived: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|d| d.ok().map(|d| d.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{name}."))))
            .filter(|p| !p.to_string_lossy().ends_with(".lock"))
            .collect();
        assert_eq!(archived.len(), 1, "{method}: one archive of {name}: {archived:?}");
        let rows = probe::read_rows(&archived[0]);
        assert_eq!(user_rows(&rows, &run), 1, "{method}: {}", outline(&rows, &run));
        let partial = rows.iter().find(|r| r["message"]["idempotencyKey"] == format!("{run}:assistant"));
        assert!(partial.is_some(), "{method}: the aborted partial is in the archive: {}", outline(&rows, &run));
        assert_chain(&rows, method);
        assert_verifies(&archived[0]);
    }
    ordinary_turn(&e.gw.addr, "reset-mid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t09c_a_turn_sent_while_a_reset_waits_goes_to_the_new_transcript() {
    // A reply streams; `sessions.reset` aborts it and waits for it to write its partial (held
    // back here by the transcript's lock); a turn sent meanwhile, queued behind the reset, runs in
    // the session's new transcript, not in the one moved aside.
    let e = start("", StartOptions::default());
    let key = "agent:main:reset-queue";
    let mut c = Client::connect(&e.gw.addr).await;
    assert_eq!(send(&mut c, key, "[slow] cut by a reset", "Q-a").await.expect("send")["status"], "started");
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == "Q-a" && f["payload"]["state"] == "delta").await;
    let old = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    let held = HeldLock::take(&old);
    let mut c2 = Client::connect(&e.gw.addr).await;
    let mut c3 = Client::connect(&e.gw.addr).await;
    // Q-b is sent once the reset waits for Q-a; the lock goes a moment later (Q-b's check of the
    // transcript waits for Q-a's pending write too).
    let (reset, sent, ()) = tokio::join!(
        c2.request("sessions.reset", json!({"key": key})),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            send(&mut c3, key, "after the reset", "Q-b").await
        },
        async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            drop(held);
        }
    );
    reset.expect("reset");
    assert_eq!(sent.expect("send Q-b")["status"], "started");
    assert_eq!(c.chat_end("Q-a").await["payload"]["state"], "aborted");
    let end = c3.chat_end("Q-b").await;
    assert_eq!(end["payload"]["state"], "final", "{end}");
    let new = probe::transcript_path(&e.gw.state_dir, key).expect("the new transcript");
    assert_ne!(new, old);
    assert!(!old.exists(), "{} was written again after the reset", old.display());
    let rows = probe::read_rows(&new);
    assert_eq!(user_rows(&rows, "Q-b"), 1, "Q-b is in the new transcript: {rows:#?}");
    assert_eq!(replies(&rows, "Q-b").len(), 1);
    assert_eq!(user_rows(&rows, "Q-a"), 0);
    assert_chain(&rows, key);
    assert_verifies(&new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t09d_a_waiting_messages_record_never_recreates_the_transcript_a_reset_moved_aside() {
    // R-a waits for the model's first token (so its abort writes nothing); R-b, sent behind it,
    // writes its queued-turn record before its ack, without the session's queue slot, and that
    // write is held back by the transcript's lock (taken here, as another process would). The
    // reset aborts both and moves the transcript aside meanwhile; once the lock goes, the record
    // goes to the new transcript, never creates a file under the old name again.
    let e = start("", StartOptions::default());
    let key = "agent:main:reset-record";
    let mut c = Client::connect(&e.gw.addr).await;
    let asked = e.fake.requests().len();
    e.fake.set_pacing(Pacing { first: Duration::from_secs(3600), ..Pacing::default() });
    assert_eq!(send(&mut c, key, "waits for its first token", "R-a").await.expect("send")["status"], "started");
    let model_asked = probe::poll_async(Duration::from_secs(30), Duration::from_millis(20), || {
        let n = e.fake.requests().len();
        async move { (n > asked).then_some(()) }
    });
    model_asked.await.expect("the model was asked for R-a");
    e.fake.set_pacing(Pacing::default());
    let old = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    let held = HeldLock::take(&old);
    let (mut c2, mut c3) = (Client::connect(&e.gw.addr).await, Client::connect(&e.gw.addr).await);
    let (sent, reset) = tokio::join!(send(&mut c3, key, "queued behind R-a", "R-b"), async {
        // R-b is registered (its record waits for the lock) before the reset is asked for.
        let registered = probe::poll_async(Duration::from_secs(30), Duration::from_millis(20), || {
            let addr = e.gw.addr.clone();
            async move {
                let health = Client::connect(&addr).await.request("health", json!({})).await.expect("health");
                (health["activeRuns"] == 2).then_some(())
            }
        });
        registered.await.expect("R-b registered behind R-a");
        let reset = c2.request("sessions.reset", json!({"key": key})).await;
        drop(held);
        reset
    });
    reset.expect("reset");
    assert_eq!(sent.expect("send R-b")["status"], "started");
    assert_eq!(c.chat_end("R-a").await["payload"]["state"], "aborted");
    assert_eq!(c3.chat_end("R-b").await["payload"]["state"], "aborted", "the reset aborted R-b too");
    assert!(!old.exists(), "{} was written again after the reset", old.display());
    // The session goes on in its new transcript, which holds what R-b's sender typed.
    assert_eq!(send(&mut c, key, "after the reset", "R-c").await.expect("send")["status"], "started");
    assert_eq!(c.chat_end("R-c").await["payload"]["state"], "final");
    assert!(!old.exists(), "{} was written again after the reset", old.display());
    let new = probe::transcript_path(&e.gw.state_dir, key).expect("the new transcript");
    assert_ne!(new, old);
    let rows = probe::read_rows(&new);
    assert_eq!(
        customs(&rows, "pincer.turn-queued", "R-b").len(),
        1,
        "R-b's record is in the new transcript: {rows:#?}"
    );
    assert_eq!(customs(&rows, "pincer.turn-dropped", "R-b").len(), 1, "{rows:#?}");
    assert_eq!((user_rows(&rows, "R-b"), user_rows(&rows, "R-c"), replies(&rows, "R-c").len()), (0, 1, 1), "{rows:#?}");
    assert_chain(&rows, key);
    assert_verifies(&new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t09_sigterm_ends_a_streaming_turn_then_says_shutdown_then_closes_1012() {
    let mut e = start("", StartOptions::default());
    let key = "agent:main:graceful";
    ordinary_turn(&e.gw.addr, "graceful-before").await;
    let mut c = Client::connect(&e.gw.addr).await;
    send(&mut c, key, "[slow] keep talking", "K-term").await.expect("send");
    c.event(|f| f["event"] == "chat" && f["payload"]["runId"] == "K-term" && f["payload"]["state"] == "delta").await;
    assert!(probe::signal(e.gw.pid(), libc::SIGTERM), "SIGTERM");
    let (frames, code) = c.frames_until_close(Duration::from_secs(30)).await;
    let status = tokio::task::block_in_place(|| e.gw.wait_exit(Duration::from_secs(30)));
    let aborted = frames
        .iter()
        .position(|f| f["event"] == "chat" && f["payload"]["runId"] == "K-term" && f["payload"]["state"] == "aborted");
    let shutdown = frames.iter().position(|f| f["event"] == "shutdown");
    let names: Vec<String> = frames
        .iter()
        .map(|f| format!("{}:{}", f["event"].as_str().unwrap_or("res"), f["payload"]["state"].as_str().unwrap_or("")))
        .collect();
    let (Some(a), Some(s)) = (aborted, shutdown) else { panic!("aborted and shutdown expected, got {names:?}") };
    assert!(a < s, "the aborted event came after shutdown: {names:?}");
    assert_eq!(code, Some(1012), "close code; frames {names:?}");
    let id = frames[a]["payload"]["message"]["__openclaw"]["id"].as_str().expect("message.__openclaw.id").to_owned();
    assert!(status.is_some_and(|s| s.success()), "exit status {status:?}");
    let file = probe::transcript_path(&e.gw.state_dir, key).expect("transcript");
    let rows = probe::read_rows(&file);
    let partial = rows.iter().find(|r| r["id"] == id.as_str()).unwrap_or_else(|| panic!("{id} is not in the file"));
    assert_eq!(partial["message"]["openclawAbort"]["origin"], "shutdown", "{partial}");
    assert_verifies(&file);
    restart(&mut e.gw);
    ordinary_turn(&e.gw.addr, "graceful-after").await;
}

// 10 ───────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_a_session_queue_is_bounded() {
    let e = start("", StartOptions::default());
    let key = "agent:main:busy";
    let mut c = Client::connect(&e.gw.addr).await;
    for i in 0..40 {
        let frame = json!({"type": "req", "id": format!("q{i}"), "method": "chat.send",
            "params": {"sessionKey": key, "message": format!("[slow] queued {i}"), "idempotencyKey": format!("Q{i}")}});
        c.send_raw(&frame.to_string()).await;
    }
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..40 {
        let r = c.response().await;
        let i: usize = r["id"].as_str().and_then(|id| id.strip_prefix('q')).and_then(|n| n.parse().ok()).expect("id");
        if r["ok"] == true {
            assert_eq!(r["payload"]["status"], "started", "{r}");
            accepted.push(i);
        } else {
            refused.push((i, r["error"].clone()));
        }
    }
    ordinary_turn(&e.gw.addr, "busy-during").await;
    eprintln!("queue bound: {} accepted, {} refused", accepted.len(), refused.len());
    assert!(!refused.is_empty(), "40 sends on one session were all accepted");
    assert!(accepted.len() <= 32, "{} turns accepted into one session's queue", accepted.len());
    for (i, err) in &refused {
        assert_eq!(err["code"], "UNAVAILABLE", "Q{i}: {err}");
        assert!(err["message"].as_str().unwrap_or("").contains("session busy"), "Q{i}: {err}");
    }
    let r = c.request("chat.abort", json!({"sessionKey": key})).await.expect("abort");
    assert_eq!(r["aborted"], true, "{r}");
    for i in &accepted {
        let end = c.chat_end(&format!("Q{i}")).await;
        assert!(matches!(end["payload"]["state"].as_str(), Some("final" | "aborted")), "Q{i}: {end}");
    }
    ordinary_turn(&e.gw.addr, "busy-after").await;
}

// 10b ──────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10b_a_100_mb_provider_stream_is_cut_at_the_reply_cap_and_memory_stays_bounded() {
    let e = start("max_reply_bytes = 4194304\n", StartOptions::default());
    let pid = e.gw.pid();
    let base = probe::rss_kib(pid);
    let sampler = Sampler::start(pid, Duration::from_millis(20));
    let key = "agent:main:huge";
    let mut c = Client::connect(&e.gw.addr).await;
    c.request("sessions.messages.subscribe", json!({"key": key})).await.expect("subscribe");
    let t0 = Instant::now();
    send(&mut c, key, "[huge] say a lot", "HUGE").await.expect("send");
    let end = c.chat_end("HUGE").await;
    let took = t0.elapsed();
    let peak = sampler.stop().max_rss_kib.max(probe::hwm_kib(pid));
    eprintln!("100 MB stream: ended {} after {took:?}, RSS {base} -> peak {peak} KiB", end["payload"]["state"]);
    assert_eq!(end["payload"]["state"], "error", "{end}");
    assert_eq!(end["payload"]["errorKind"], "reply_too_large", "{end}");
    assert!(end["payload"]["errorMessage"].as_str().unwrap_or("").contains("4194304"), "the cap is named: {end}");
    assert!(peak < base + 128 * MIB, "RSS grew from {base} to {peak} KiB for a capped reply");
    // The partial is persisted once, chained to the user row, about the size of the cap.
    let rows = probe::transcript_rows(&e.gw.state_dir, key);
    let replies: Vec<&Value> = rows.iter().filter(|r| r["message"]["role"] == "assistant").collect();
    assert_eq!(replies.len(), 1, "one persisted partial");
    let partial = text(&replies[0]["message"]);
    assert!(partial.len() >= 4_194_304 && partial.len() <= 4_194_304 + 64 * 1024, "partial of {} bytes", partial.len());
    assert_eq!(replies[0]["message"]["stopReason"], "error");
    let user = rows.iter().find(|r| r["message"]["role"] == "user").expect("user row");
    assert_eq!(replies[0]["parentId"], user["id"]);
    ordinary_turn(&e.gw.addr, "after-huge").await;
}

// 11 ───────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t11_frames_over_max_payload_are_refused_and_big_attachments_under_it_pass() {
    use base64::Engine as _;
    let e = start("", StartOptions::default());
    let c = Client::connect(&e.gw.addr).await;
    let max_payload = c.hello["policy"]["maxPayload"].as_u64().expect("policy.maxPayload") as usize;
    let (mut sink, mut stream) = c.into_ws().split();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(max_payload + 4096));
    let writer = tokio::spawn(async move {
        let _ = sink.send(Message::Text(big.into())).await;
        sink
    });
    let mut error = None;
    let mut close = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Ok(Some(Ok(m))) = tokio::time::timeout_at(deadline, stream.next()).await {
        match m {
            Message::Text(t) => {
                let f: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                if f["type"] == "res" && f["ok"] == false {
                    error = Some(f);
                }
            }
            Message::Close(f) => {
                close = f.map(|f| u16::from(f.code));
                break;
            }
            _ => {}
        }
    }
    writer.abort();
    let error = error.expect("an error response before the close");
    assert!(error["error"]["message"].as_str().unwrap_or("").contains("maxPayload"), "{error}");
    assert_eq!(close, Some(1009), "close code after {error}");

    // 19.6 MB of images, base64 in one frame under maxPayload: accepted.
    let image = vec![0x89u8; 4_900_000];
    let b64 = base64::engine::general_purpose::STANDARD.encode(&image);
    let attachments: Vec<Value> = (0..4).map(|_| json!({"mimeType": "image/png", "content": b64})).collect();
    let params = json!({"sessionKey": "agent:main:images", "message": "four pictures", "idempotencyKey": "K-img",
        "attachments": attachments});
    let frame_len = json!({"type": "req", "id": "r2", "method": "chat.send", "params": params}).to_string().len();
    assert!(frame_len < max_payload, "the frame ({frame_len} bytes) must be under maxPayload {max_payload}");
    let mut c = Client::connect(&e.gw.addr).await;
    let ack = c.try_request("chat.send", params, Duration::from_secs(60)).await;
    assert_eq!(
        ack.as_ref().map(|r| r.as_ref().map(|p| p["status"].clone())),
        Ok(Ok(json!("started"))),
        "a {frame_len}-byte chat.send with 19.6 MB of images"
    );
    let end = c.try_chat_end("K-img", Duration::from_secs(60)).await.expect("end of the image turn");
    assert_eq!(end["payload"]["state"], "final", "{end}");
    ordinary_turn(&e.gw.addr, "frames-after").await;
}

// 12 ───────────────────────────────────────────────────────────────────────────────────────────

/// What one crash-storm client did.
#[derive(Debug, Default)]
struct Storm {
    acked: Vec<String>,
    statuses: HashMap<String, usize>,
    reconnects: usize,
    errors: Vec<String>,
}

/// Sends turns until `stop`; with `resend`, a turn cut by a restart is sent again with its key until
/// it is answered or known to be over; without, every message is sent once and the client moves on
/// when its connection is lost (the gateway must answer it by itself).
async fn storm_client(i: usize, addr: Arc<Mutex<String>>, stop: Arc<AtomicUsize>, resend: bool) -> Storm {
    let key = format!("agent:main:storm{i}");
    let mut out = Storm::default();
    let mut c: Option<Client> = None;
    let mut extra_after_stop = 1; // one whole turn after the last restart
    let give_up = Instant::now() + Duration::from_secs(90);
    for n in 0.. {
        if stop.load(Ordering::Acquire) == 1 {
            if extra_after_stop == 0 {
                break;
            }
            extra_after_stop -= 1;
        }
        let run = format!("storm{i}-t{n}");
        let message = format!("[slowish] storm {i} turn {n}");
        // Send (and resend) until the turn is answered or known to be over.
        loop {
            assert!(Instant::now() < give_up, "client {i} stuck on {run}: {out:?}");
            let Some(cl) = c.as_mut() else {
                let a = addr.lock().expect("addr").clone();
                match Client::try_connect(&a, Duration::from_secs(5)).await {
                    Ok(cl) => {
                        c = Some(cl);
                        out.reconnects += 1;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await, // the gateway is restarting
                }
                continue;
            };
            let params = json!({"sessionKey": key, "message": message, "idempotencyKey": run});
            match cl.try_request("chat.send", params, Duration::from_secs(10)).await {
                Err(_) => {
                    c = None;
                    if !resend {
                        break; // maybe received: never sent again
                    }
                }
                Ok(Err(err)) => {
                    out.errors.push(format!("{run}: {err}"));
                    c = None;
                }
                Ok(Ok(ack)) => {
                    let status = ack["status"].as_str().unwrap_or("").to_owned();
                    *out.statuses.entry(status.clone()).or_default() += 1;
                    match status.as_str() {
                        "started" | "in_flight" => {
                            if status == "started" && !out.acked.contains(&run) {
                                out.acked.push(run.clone());
                            }
                            match cl.try_chat_end(&run, Duration::from_secs(20)).await {
                                Ok(end) => {
                                    let state = end["payload"]["state"].as_str().unwrap_or("").to_owned();
                                    *out.statuses.entry(format!("end:{state}")).or_default() += 1;
                                    break;
                                }
                                Err(_) => {
                                    c = None;
                                    if !resend {
                                        break;
                                    }
                                }
                            }
                        }
                        _ => break, // ok, interrupted, aborted, error: the turn is over
                    }
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t12_a_crash_storm_never_duplicates_or_breaks_a_turn() {
    crash_storm(7, true).await;
}

/// The same storm (10 SIGKILLs) with clients that never send a message twice: the gateway itself
/// answers every turn a kill cut, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t12b_a_crash_storm_without_resends_still_answers_every_message_once() {
    crash_storm(10, false).await;
}

/// The lines of each gateway process's log (`logs`, oldest first) that name one of `runs`.
fn said_of(logs: &[String], runs: &[String]) -> String {
    let said: Vec<String> = (logs.iter().enumerate())
        .flat_map(|(n, l)| {
            l.lines().filter(|l| runs.iter().any(|r| l.contains(r.as_str()))).map(move |l| format!("process {n}: {l}"))
        })
        .collect();
    said.join("\n")
}

async fn crash_storm(kills: usize, resend: bool) {
    const CLIENTS: usize = 4;
    // Kills every 0.3–1.5 s can cut one turn's resumed runs again and again (more so on a loaded
    // machine): the bound on attempts is tested on its own (bash.rs); here every cut turn must
    // come back.
    let e = start("resume_attempts = 50\n", StartOptions::default());
    let Env { gw, fake: _fake, _dir } = e;
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
            | 1;
    eprintln!("crash storm seed {seed}");
    let addr = Arc::new(Mutex::new(gw.addr.clone()));
    let stop = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> =
        (0..CLIENTS).map(|i| tokio::spawn(storm_client(i, addr.clone(), stop.clone(), resend))).collect();
    // Each process's log, kept for the failure message.
    let logs = Arc::new(Mutex::new(Vec::new()));
    let killer = {
        let (addr, stop, logs) = (addr.clone(), stop.clone(), logs.clone());
        tokio::task::spawn_blocking(move || {
            let mut gw = gw;
            let mut rng = Rng(seed);
            for _ in 0..kills {
                std::thread::sleep(Duration::from_millis(rng.range(300, 1500)));
                logs.lock().expect("logs").push(gw.log_text());
                gw.restart();
                *addr.lock().expect("addr") = gw.addr.clone();
            }
            stop.store(1, Ordering::Release);
            gw
        })
    };
    let mut gw = killer.await.expect("killer");
    let mut storms = Vec::new();
    for c in clients {
        storms.push(c.await.expect("storm client"));
    }
    ordinary_turn(&gw.addr, "storm-after").await;
    // Every turn whose user row reached the disk: its run ids.
    let written = |rows: &[Value]| -> Vec<String> {
        rows.iter()
            .filter_map(|r| r["message"]["idempotencyKey"].as_str()?.strip_suffix(":user").map(str::to_owned))
            .collect()
    };
    if !resend {
        // No client asks again: the gateway answers what the last kill cut by itself.
        let state = gw.state_dir.clone();
        let all_answered = probe::poll_async(Duration::from_secs(120), Duration::from_millis(100), || {
            let done = (0..CLIENTS).all(|i| {
                let Some(file) = probe::transcript_path(&state, &format!("agent:main:storm{i}")) else { return false };
                let rows = probe::read_rows(&file);
                written(&rows).iter().all(|run| !replies(&rows, run).is_empty())
            });
            async move { done.then_some(()) }
        })
        .await;
        if all_answered.is_none() {
            let (mut open, mut runs) = (Vec::new(), Vec::new());
            for file in (0..CLIENTS).filter_map(|i| probe::transcript_path(&state, &format!("agent:main:storm{i}"))) {
                let rows = probe::read_rows(&file);
                for run in written(&rows).into_iter().filter(|r| replies(&rows, r).is_empty()) {
                    open.push(outline(&rows, &run));
                    runs.push(run);
                }
            }
            logs.lock().expect("logs").push(gw.log_text());
            panic!(
                "messages never answered without a resend:\n{}\nthe gateways said of them:\n{}\nthe last gateway said:\n{}",
                open.join("\n"),
                said_of(&logs.lock().expect("logs"), &runs),
                gw.log_text()
            );
        }
    }
    let status = tokio::task::block_in_place(|| gw.terminate());
    assert!(status.success(), "exit {status}");
    let mut report = Vec::new();
    for (i, s) in storms.iter().enumerate() {
        let key = format!("agent:main:storm{i}");
        let file = probe::transcript_path(&gw.state_dir, &key).expect("transcript");
        let rows = probe::read_rows(&file);
        let runs = if resend { s.acked.clone() } else { written(&rows) };
        // Acknowledged ("started") but killed before its user row was written: only a resend
        // brings such a turn back (the ack precedes the row, which is written in the session's queue).
        let lost: Vec<&String> = s.acked.iter().filter(|run| !runs.contains(run)).collect();
        for run in &runs {
            assert_eq!(user_rows(&rows, run), 1, "{key}: user rows of {run}");
            let r = replies(&rows, run);
            assert!(resend || r.len() == 1, "{key}: {run} has {} replies without a resend", r.len());
            if r.len() > 1 {
                logs.lock().expect("logs").push(gw.log_text());
                panic!(
                    "{key}: {} replies for {run}:\n{}\nthe gateways said:\n{}",
                    r.len(),
                    outline(&rows, run),
                    said_of(&logs.lock().expect("logs"), std::slice::from_ref(run))
                );
            }
        }
        let mut keyed = HashMap::new();
        for r in &rows {
            if let Some(k) = r["message"]["idempotencyKey"].as_str() {
                *keyed.entry(k.to_owned()).or_insert(0) += 1;
            }
        }
        assert!(keyed.values().all(|n| *n == 1), "{key}: a key written twice: {keyed:?}");
        assert_chain(&rows, &key);
        assert_verifies(&file);
        assert!(s.errors.is_empty(), "{key}: error responses: {:?}", s.errors);
        let interrupted = rows.iter().filter(|r| r["customType"] == "pincer.turn-interrupted").count();
        let resumed = rows.iter().filter(|r| r["customType"] == "pincer.turn-resumed").count();
        report.push(format!(
            "storm{i}: {} turns acked ({} cut before their user row), {} rows, {interrupted} interrupted, {resumed} resumed, {} reconnects, {:?}",
            s.acked.len(),
            lost.len(),
            rows.len(),
            s.reconnects,
            s.statuses
        ));
    }
    eprintln!("crash storm ({kills} kills, resends {resend}):\n{}", report.join("\n"));
    let acked: usize = storms.iter().map(|s| s.acked.len()).sum();
    assert!(acked >= CLIENTS * 2, "only {acked} turns were acknowledged: the storm tested little");
}
