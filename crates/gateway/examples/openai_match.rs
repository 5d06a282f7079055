//! Benchmark of the OpenAI endpoint's session matching: 10,000 sessions (3 turns each, written as
//! Pi v3 transcripts), the conversation index built from them, then the cost of placing a request
//! (its history's chain hashes computed, the deepest match and the retry lookup) for histories that
//! end on a session's leaf, that diverge inside one (an edit), and that match nothing.
//!
//! `cargo run --release -p pincer-gateway --example openai_match [-- SESSIONS [REQUESTS]]`
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the benchmark writes its fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a benchmark fails loudly and prints

use pincer_gateway::openai::index::ConversationIndex;
use pincer_gateway::openai::wire::{chain, conversation, Hash, ROOT};
use pincer_store::redact::NoRedaction;
use serde_json::{json, Value};
use std::time::Instant;

fn transcript(i: usize, turns: usize) -> (String, Vec<Value>) {
    let mut out = format!(
        "{}\n",
        json!({"type": "session", "version": 3, "id": format!("s{i}"), "timestamp": "2026-12-01T00:00:00.000Z", "cwd": "/"})
    );
    let mut parent = Value::Null;
    let mut history = Vec::new();
    for t in 0..turns {
        for (role, text) in
            [("user", format!("session {i} question {t}")), ("assistant", format!("answer {t} for session {i}"))]
        {
            let id = format!("{i:06}{t:02}{}", &role[..1]);
            let message = if role == "user" {
                json!({"role": "user", "content": text, "timestamp": 1})
            } else {
                json!({"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop", "timestamp": 1})
            };
            let e = json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2026-12-01T00:00:00.000Z", "message": message});
            out.push_str(&format!("{e}\n"));
            parent = json!(id);
            history.push(json!({"role": role, "content": text}));
        }
    }
    (out, history)
}

fn place(idx: &ConversationIndex, messages: &Value) -> Option<usize> {
    let c = conversation(messages, &NoRedaction).expect("valid");
    let (history, trailing) = c.hashes();
    let mut at: Hash = ROOT;
    let chains: Vec<Hash> = history
        .iter()
        .flatten()
        .map(|h| {
            at = chain(at, *h);
            at
        })
        .collect();
    let full = trailing.iter().flatten().fold(at, |c, h| chain(c, *h));
    let _ = idx.keyed_turn(full, "oai-none", &mut |_| true);
    idx.deepest(&chains, None, &mut |_| true).map(|m| m.depth)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let (sessions, requests) = (args.first().copied().unwrap_or(10_000), args.get(1).copied().unwrap_or(3_000));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    let mut histories = Vec::new();
    for i in 0..sessions {
        let (text, history) = transcript(i, 3);
        let path = dir.path().join(format!("s{i}.jsonl"));
        std::fs::write(&path, text).expect("write");
        files.push((format!("agent:main:openai:{i}"), path));
        histories.push(history);
    }
    let idx = ConversationIndex::default();
    let t = Instant::now();
    idx.build(files);
    let (n, entries) = idx.size();
    println!("index built: {n} sessions, {entries} entries in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    for (what, make) in [
        ("continue (history = a session's active branch)", 0),
        ("edit (diverges after the first reply)", 1),
        ("new (matches nothing)", 2),
    ] {
        let mut times = Vec::with_capacity(requests);
        for r in 0..requests {
            let i = (r * 7919) % sessions;
            let mut h = histories[i].clone();
            match make {
                0 => h.push(json!({"role": "user", "content": "next question"})),
                1 => {
                    h.truncate(2);
                    h.push(json!({"role": "user", "content": "an edited second question"}));
                }
                _ => {
                    h = vec![
                        json!({"role": "user", "content": format!("fresh {r}")}),
                        json!({"role": "assistant", "content": "x"}),
                        json!({"role": "user", "content": "y"}),
                    ]
                }
            }
            let body = json!(h);
            let t = Instant::now();
            let depth = place(&idx, &body);
            times.push(t.elapsed().as_secs_f64() * 1e6);
            let want = match make {
                0 => Some(6),
                1 => Some(2),
                _ => None,
            };
            assert_eq!(depth, want, "{what}");
        }
        let (p50, p99) = (percentile(&mut times, 0.5), percentile(&mut times, 0.99));
        println!("{what}: p50 {p50:.1} µs, p99 {p99:.1} µs over {requests} requests");
    }
}
