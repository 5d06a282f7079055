//! Preparation against the live `prepare.mjs` oracle (the part of `fixtures.rs` that needs the Pi
//! oracle on Node, so it builds only with the `external` feature) on further files and settings:
//! second compaction, tool flows, custom entries, trailing markers.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[path = "fixtures/common.rs"]
mod common;
use common::*;

fn oracle_prepare(file: &Path, leaf: Option<&str>, keep: u64, reserve: u64) -> Value {
    pincer_testkit::oracle_prepare(file, leaf, keep, reserve)
}

/// A value as JavaScript holds it (`1.0` is the number 1, array-index keys first), so stored
/// messages compare equal to what node printed.
fn js_normal(v: &Value) -> Value {
    serde_json::from_str(&pincer_pi::js::stringify(v)).unwrap()
}

/// A session with trailing `custom` markers after the last message, tool calls with non-ASCII and
/// number-valued arguments, a bash execution, a branch summary and a custom message.
fn generated_session(dir: &Path) -> PathBuf {
    let mut lines = vec![json!({"type":"session","version":3,"id":"0190a5b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b",
        "timestamp":"2025-09-01T09:00:00.000Z","cwd":"/w"})];
    let mut parent = Value::Null;
    let mut n = 0;
    let mut push = |lines: &mut Vec<Value>, mut e: Value| {
        n += 1;
        let id = format!("e{n:07}");
        e["id"] = json!(id);
        e["parentId"] = parent.clone();
        e["timestamp"] = json!(format!("2025-09-01T09:{:02}:{:02}.000Z", n / 60, n % 60));
        parent = json!(id);
        lines.push(e);
    };
    for t in 0..6 {
        push(
            &mut lines,
            json!({"type":"message","message":{"role":"user","content":format!("Turn {t}: update src/t{t}.rs — naïve café 😀"),"timestamp":1}}),
        );
        push(
            &mut lines,
            json!({"type":"message","message":{"role":"assistant","content":[
            {"type":"thinking","thinking":"plan ".repeat(20)},
            {"type":"toolCall","id":format!("c{t}"),"name":"edit","arguments":{"path":format!("src/t{t}.rs"),"n":1.0,"big":1e21,"2":"two","1":[0.5]}}],
            "stopReason":"toolUse","usage":{"input":100,"output":10,"cacheRead":0,"cacheWrite":0,"totalTokens":0},"timestamp":2}}),
        );
        push(
            &mut lines,
            json!({"type":"message","message":{"role":"toolResult","toolCallId":format!("c{t}"),"toolName":"edit",
            "content":[{"type":"text","text":"ok ".repeat(300 * (t + 1))}],"isError":false,"timestamp":3}}),
        );
        if t == 2 {
            push(
                &mut lines,
                json!({"type":"message","message":{"role":"bashExecution","command":"cargo test","output":"fail","exitCode":101,"cancelled":false,"truncated":false,"timestamp":4}}),
            );
            push(
                &mut lines,
                json!({"type":"custom_message","customType":"note","content":"remember src/x.rs","display":true}),
            );
            push(&mut lines, json!({"type":"branch_summary","fromId":"e0000001","summary":"explored src/y.rs"}));
        }
        push(
            &mut lines,
            json!({"type":"message","message":{"role":"assistant","content":[{"type":"text","text":format!("Done with turn {t}.")}],
            "stopReason":"stop","usage":{"input":200,"output":20,"cacheRead":5,"cacheWrite":0,"totalTokens":225 + t},"timestamp":5}}),
        );
    }
    push(&mut lines, json!({"type":"custom","customType":"openclaw.cache-ttl","data":{"t":1}}));
    push(&mut lines, json!({"type":"custom","customType":"openclaw.cache-ttl","data":{"t":2}}));
    let file = dir.join("generated.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, text).unwrap();
    file
}

/// The live oracle on settings and files the fixtures do not cover, including a second compaction
/// (§15 case 46: boundary at the first compaction's firstKept, previous summary carried over).
#[test]
fn live_oracle_prepare_matches() {
    let dir = tempfile::tempdir().unwrap();
    let generated = generated_session(dir.path());
    let f05 = fixtures().join("05-compaction.jsonl");
    let cases: Vec<(PathBuf, Option<&str>, u64)> = vec![
        (f05.clone(), None, 100),
        (f05.clone(), None, 218),
        (f05.clone(), None, 1),
        (f05.clone(), None, 20000),
        (f05.clone(), Some("dbbdfecc"), 100),
        (fixtures().join("07-compaction-split-turn.jsonl"), None, 50),
        (fixtures().join("09-tools-images.jsonl"), None, 1),
        (fixtures().join("09-tools-images.jsonl"), None, 300),
        (fixtures().join("08-custom-entries.jsonl"), None, 1),
        (fixtures().join("02-branch-summary.jsonl"), None, 10),
        (generated.clone(), None, 1),
        (generated.clone(), None, 200),
        (generated.clone(), None, 700),
        (generated.clone(), None, 1500),
        (generated.clone(), Some("e0000015"), 100),
    ];
    for (file, leaf, keep) in cases {
        let expected = oracle_prepare(&file, leaf, keep, 16384);
        let loaded = path_at(&file, leaf);
        let got = pincer_prepare(&loaded.entries, expected["leafId"].clone(), keep, 16384);
        assert_eq!(js_normal(&got), js_normal(&expected), "{} leaf {leaf:?} keep {keep}", file.display());
    }
}
