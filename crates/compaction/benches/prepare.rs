//! Benchmark: compaction preparation on a generated 100k-entry session (a previous compaction in
//! the middle, tool calls and results, trailing cache markers). Prints the median of several runs
//! for reading + indexing the file and decoding the active path (all of it, and from the previous
//! compaction's boundary on, as a compaction does), for `prepare_compaction`, and for serializing
//! the history the summary request would carry.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use pincer_compaction::{load_compaction_path, load_path, prepare_compaction, PrepareSettings};
use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

const ENTRIES: usize = 100_000;
const RUNS: usize = 7;

fn generate(path: &std::path::Path) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let header = json!({"type":"session","version":3,"id":"0190a5b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b",
        "timestamp":"2025-09-01T09:00:00.000Z","cwd":"/w"});
    writeln!(out, "{header}").unwrap();
    let mut parent = Value::Null;
    for n in 0..ENTRIES {
        let id = format!("{n:08x}");
        let t = n / 4;
        let mut e = match n % 4 {
            _ if n == ENTRIES / 2 => {
                json!({"type":"compaction","summary":"## Goal\nEarlier work.","firstKeptEntryId":format!("{:08x}", n - 400),
                "tokensBefore":150000,"details":{"readFiles":["src/a.rs"],"modifiedFiles":["src/b.rs"]},"fromHook":false})
            }
            _ if n >= ENTRIES - 2 => json!({"type":"custom","customType":"openclaw.cache-ttl","data":{"t":n}}),
            0 => {
                json!({"type":"message","message":{"role":"user","content":format!("Turn {t}: refactor src/mod{}.rs please", t % 500),"timestamp":1}})
            }
            1 => json!({"type":"message","message":{"role":"assistant","content":[
                {"type":"thinking","thinking":"Let me look at the module first. ".repeat(4)},
                {"type":"toolCall","id":format!("c{t}"),"name":"edit","arguments":{"path":format!("src/mod{}.rs", t % 500),"oldText":"fn a()","newText":"fn b()"}}],
                "stopReason":"toolUse","usage":{"input":1000,"output":50,"cacheRead":0,"cacheWrite":0,"totalTokens":1050},"timestamp":2}}),
            2 => json!({"type":"message","message":{"role":"toolResult","toolCallId":format!("c{t}"),"toolName":"edit",
                "content":[{"type":"text","text":"line of output\n".repeat(40)}],"isError":false,"timestamp":3}}),
            _ => {
                json!({"type":"message","message":{"role":"assistant","content":[{"type":"text","text":format!("Turn {t} done: renamed a to b.")}],
                "stopReason":"stop","usage":{"input":2000,"output":20,"cacheRead":0,"cacheWrite":0,"totalTokens":2020},"timestamp":4}})
            }
        };
        e["id"] = json!(id);
        e["parentId"] = parent.clone();
        e["timestamp"] = json!("2025-09-01T09:00:00.000Z");
        parent = json!(id);
        writeln!(out, "{e}").unwrap();
    }
    out.flush().unwrap();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.jsonl");
    generate(&file);
    let size = std::fs::metadata(&file).unwrap().len();
    let settings = PrepareSettings::default();
    let (mut load, mut load_all, mut prep, mut ser) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..RUNS {
        let t = Instant::now();
        let all = load_path(&file).unwrap();
        load_all.push(t.elapsed());
        drop(all);
        let t0 = Instant::now();
        let loaded = load_compaction_path(&file).unwrap();
        let t1 = Instant::now();
        let p = prepare_compaction(&loaded.entries, settings).unwrap();
        let t2 = Instant::now();
        let text = p.serialized_history();
        let t3 = Instant::now();
        load.push(t1 - t0);
        prep.push(t2 - t1);
        ser.push(t3 - t2);
        last = Some((loaded.entries.len(), p.messages_to_summarize.len(), p.tokens_before, text.len()));
    }
    let (path_len, summarized, tokens_before, text_len) = last.unwrap();
    println!(
        "compaction preparation, {ENTRIES} entries ({:.1} MB), active path {path_len} entries, median of {RUNS}:",
        size as f64 / 1e6
    );
    println!("  read + index + decode path : {:>8.1} ms  (all of it)", median(load_all).as_secs_f64() * 1e3);
    println!("  … from the boundary on     : {:>8.1} ms  (what a compaction reads)", median(load).as_secs_f64() * 1e3);
    println!(
        "  prepare_compaction         : {:>8.1} ms  ({summarized} messages to summarize, tokensBefore {tokens_before})",
        median(prep).as_secs_f64() * 1e3
    );
    println!("  serialize history          : {:>8.1} ms  ({text_len} bytes)", median(ser).as_secs_f64() * 1e3);
}
