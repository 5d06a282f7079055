//! Store benchmarks (`cargo bench -p pincer-store`), printed as medians and percentiles:
//! - durable append latency at 1k and 1M existing entries, beside a plain `write` + `fdatasync` of
//!   the same bytes on the same disk (the ratio to that floor is the store's own cost);
//! - open + leaf + `history` of the last 200 messages of a 100k-entry file;
//! - context building of a 100k-entry file, and its throughput in MB/s on a ~100 MB file (the file
//!   read as `Session::read` reads it), and of the 100k-entry file mapped as the CLI reads it
//!   (`Session::read_mapped`).
//!
//! The reads also report the process's CPU time per read (user + system of all its threads), which
//! a machine busy with other work inflates far less than the wall time.
//!
//! Set `PINCER_BENCH_QUICK=1` for a short run. Data files are generated under `target/bench-data`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // benches fail loudly and print their figures

use pincer_store::history::{read_history, HistoryOptions};
use pincer_store::{build_context, NewEntry, Session, Store, StoreOptions};
use serde_json::json;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn data_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data");
    std::fs::create_dir_all(&d).expect("bench dir");
    d
}

/// A chain of `n` user/assistant messages of about `size` bytes each.
fn make_file(path: &Path, n: usize, size: usize) {
    if path.exists() {
        return;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).expect("create"));
    writeln!(f, r#"{{"type":"session","version":3,"id":"bench","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/"}}"#)
        .expect("write");
    let filler = "lorem ipsum dolor sit amet ".repeat(size / 27 + 1);
    let mut parent = "null".to_string();
    for i in 0..n {
        let id = format!("{i:08x}");
        let msg = if i % 2 == 0 {
            json!({"role":"user","content":&filler[..size],"timestamp":i})
        } else {
            json!({"role":"assistant","content":[{"type":"text","text":&filler[..size]}],"api":"openai-completions","provider":"local","model":"m",
                "usage":{"input":1,"output":1,"cacheRead":0,"cacheWrite":0,"totalTokens":2,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"stopReason":"stop","timestamp":i})
        };
        writeln!(
            f,
            r#"{{"type":"message","id":"{id}","parentId":{parent},"timestamp":"2025-01-01T00:00:00.000Z","message":{msg}}}"#
        )
        .expect("write");
        parent = format!("\"{id}\"");
    }
    f.flush().expect("flush");
    drop(f);
    std::fs::rename(&tmp, path).expect("rename");
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let (p50, p99) = (pct(&samples, 0.5), pct(&samples, 0.99));
    println!("{name:<58} p50 {:>9.3} ms   p99 {:>9.3} ms   (n={})", ms(p50), ms(p99), samples.len());
    p50
}

/// CPU time of this process so far (all threads).
fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn message(i: usize) -> serde_json::Value {
    json!({"role":"user","content":"x".repeat(900),"timestamp":i})
}

fn bench_appends(file: &Path, label: &str, rounds: usize) -> Duration {
    let store = Store::new(StoreOptions::default());
    store.append(file, NewEntry::message(message(0))).expect("warm up"); // first open: tail scan
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let t = Instant::now();
        store.append(file, NewEntry::message(message(i))).expect("append");
        samples.push(t.elapsed());
    }
    report(&format!("durable append, 1 KiB, {label}"), samples)
}

fn bench_floor(dir: &Path, rounds: usize) -> Duration {
    let path = dir.join("floor.bin");
    let _ = std::fs::remove_file(&path);
    let mut f = OpenOptions::new().create(true).append(true).open(&path).expect("open");
    let line = format!(
        "{}\n",
        json!({"type":"message","id":"00000000-0000-0000-0000-000000000000","parentId":"00000000-0000-0000-0000-000000000000","timestamp":"2025-01-01T00:00:00.000Z","message":message(0)})
    );
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        f.write_all(line.as_bytes()).expect("write");
        f.sync_data().expect("sync");
        samples.push(t.elapsed());
    }
    report("floor: write + fdatasync of the same bytes", samples)
}

fn main() {
    let quick = std::env::var_os("PINCER_BENCH_QUICK").is_some();
    let dir = data_dir();
    let rounds = if quick { 200 } else { 2000 };
    let big = if quick { 100_000 } else { 1_000_000 };

    let small = dir.join("append-1k.jsonl");
    let large = dir.join(format!("append-{big}.jsonl"));
    let _ = std::fs::remove_file(&small);
    make_file(&small, 1000, 200);
    make_file(&large, big, 200);
    println!(
        "== appends ({} entries vs {big} entries; {:.0} MB)",
        1000,
        std::fs::metadata(&large).map(|m| m.len()).unwrap_or(0) as f64 / 1e6
    );
    let floor = bench_floor(&dir, rounds);
    let a1 = bench_appends(&small, "1k existing entries", rounds);
    let a2 = bench_appends(&large, &format!("{big} existing entries"), rounds);
    println!(
        "ratio append(1k)/floor {:.2}   append({big})/floor {:.2}   append({big})/append(1k) {:.2}",
        ms(a1) / ms(floor),
        ms(a2) / ms(floor),
        ms(a2) / ms(a1)
    );

    let h100k = dir.join("history-100k.jsonl");
    make_file(&h100k, 100_000, 200);
    let (mut samples, mut cpus) = (Vec::new(), Vec::new());
    for _ in 0..if quick { 20 } else { 100 } {
        let (t, c) = (Instant::now(), cpu());
        let leaf = Store::new(StoreOptions::default()).leaf(&h100k).expect("leaf");
        let h = read_history(&h100k, HistoryOptions::default()).expect("history");
        samples.push(t.elapsed());
        cpus.push(cpu() - c);
        assert!(leaf.is_some() && h.messages.len() == 200);
    }
    println!("== reads");
    report("open + leaf + history(200) of a 100k-entry file", samples);
    report("  … its CPU time", cpus);

    let (mut samples, mut cpus) = (Vec::new(), Vec::new());
    for _ in 0..if quick { 3 } else { 10 } {
        let (t, c0) = (Instant::now(), cpu());
        let data = pincer_store::session::read_whole(&h100k).expect("read");
        let t_read = t.elapsed();
        let s = Session::parse(data);
        let t_parse = t.elapsed();
        let c = build_context(&s, &s.leaf);
        if quick {
            println!(
                "   read {:.1} ms, index {:.1} ms, context {:.1} ms",
                ms(t_read),
                ms(t_parse - t_read),
                ms(t.elapsed() - t_parse)
            );
        }
        samples.push(t.elapsed());
        assert_eq!(c.messages.len(), 100_000);
        cpus.push(cpu() - c0);
    }
    let size = std::fs::metadata(&h100k).map(|m| m.len()).unwrap_or(0) as f64;
    let p50 = report(&format!("context of a 100k-entry file ({:.0} MB)", size / 1e6), samples);
    report("  … its CPU time (all threads)", cpus);
    println!("context throughput {:.0} MB/s", size / 1e6 / p50.as_secs_f64());

    // As `pincer transcript context` reads it: the file mapped, not copied (the gateway reads it
    // into memory, above).
    let (mut samples, mut cpus) = (Vec::new(), Vec::new());
    for _ in 0..if quick { 3 } else { 10 } {
        let (t, c0) = (Instant::now(), cpu());
        let s = Session::read_mapped(&h100k).expect("read").expect("exists");
        let c = build_context(&s, &s.leaf);
        samples.push(t.elapsed());
        assert_eq!(c.messages.len(), 100_000);
        cpus.push(cpu() - c0);
    }
    report("context of the same file, mapped (as the CLI reads it)", samples);
    report("  … its CPU time (all threads)", cpus);

    let mb100 = dir.join("context-100mb.jsonl");
    make_file(&mb100, 100_000, 900);
    let size = std::fs::metadata(&mb100).map(|m| m.len()).unwrap_or(0) as f64;
    let mut samples = Vec::new();
    for _ in 0..if quick { 3 } else { 5 } {
        let t = Instant::now();
        let s = Session::parse(pincer_store::session::read_whole(&mb100).expect("read"));
        let c = build_context(&s, &s.leaf);
        samples.push(t.elapsed());
        assert!(!c.messages.is_empty());
    }
    let p50 = report(&format!("context of a {:.0} MB file", size / 1e6), samples);
    println!("context throughput {:.0} MB/s", size / 1e6 / p50.as_secs_f64());
}
