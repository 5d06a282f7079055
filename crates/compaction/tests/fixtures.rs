//! Preparation and requests against the real Pi library: every `prepare` item of the shared
//! manifest, the recorded `*.compaction-request.json` calls, and the live `prepare.mjs` oracle on
//! further files and settings (second compaction, tool flows, custom entries, trailing markers).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_compaction::{
    build_summary_request, entry_tokens, estimate_context_tokens, path_context_messages, prepare_compaction,
    LoadedPath, PrepareSettings,
};
use pincer_store::{Leaf, Session};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    pincer_testkit::fixtures_dir()
}

/// The root→leaf path of `file` at `leaf` (`None`: the file's leaf), decoded.
fn path_at(file: &Path, leaf: Option<&str>) -> LoadedPath {
    let s = Session::parse(std::fs::read(file).unwrap());
    let leaf = match leaf {
        None => s.leaf.clone(),
        Some(id) => Leaf::Entry(*s.by_id.get(id).unwrap_or_else(|| panic!("no entry {id} in {}", file.display()))),
    };
    let Leaf::Entry(i) = leaf else { return LoadedPath { entries: vec![], leaf_id: None } };
    let (path, cycle) = s.path_from(i);
    assert!(!cycle);
    LoadedPath { entries: path.iter().map(|&i| s.value(i).unwrap()).collect(), leaf_id: s.leaf_id().map(Into::into) }
}

/// What `prepare.mjs` prints, computed by Pincer.
fn pincer_prepare(path: &[Value], leaf_id: Value, keep: u64, reserve: u64) -> Value {
    let settings = PrepareSettings { reserve_tokens: reserve, keep_recent_tokens: keep };
    let ctx = path_context_messages(path);
    let result = match prepare_compaction(path, settings) {
        None => Value::Null,
        Some(p) => {
            let idx = path.iter().position(|e| e.get("id") == Some(&json!(p.first_kept_entry_id)));
            json!({
                "firstKeptEntryId": p.first_kept_entry_id,
                "firstKeptEntryIndex": idx.map(|i| json!(i)).unwrap_or(json!(-1)),
                "firstKeptEntryType": idx.map(|i| path[i]["type"].clone()),
                "isSplitTurn": p.is_split_turn,
                "tokensBefore": p.tokens_before,
                "previousSummary": p.previous_summary,
                "messagesToSummarize": p.messages_to_summarize,
                "turnPrefixMessages": p.turn_prefix_messages,
                "fileOps": p.file_ops.to_json(),
                "details": p.details(),
                "fileOpsSuffix": p.file_ops_suffix(),
                "serializedHistory": p.serialized_history(),
                "serializedTurnPrefix": p.serialized_turn_prefix(),
            })
        }
    };
    json!({
        "leafId": leaf_id,
        "settings": {"enabled": true, "reserveTokens": reserve, "keepRecentTokens": keep},
        "pathLength": path.len(),
        "contextEstimate": estimate_context_tokens(&ctx).to_json(),
        "entryTokens": entry_tokens(path),
        "result": result,
    })
}

fn leaf_arg(leaf: &str) -> Option<&str> {
    if leaf.starts_with("(default") {
        None
    } else {
        Some(leaf)
    }
}

#[test]
fn every_manifest_prepare_item_matches_the_fixture() {
    let manifest: Value = serde_json::from_slice(&std::fs::read(fixtures().join("manifest.json")).unwrap()).unwrap();
    let mut checked = Vec::new();
    for fx in manifest["fixtures"].as_array().unwrap() {
        for item in fx["prepare"].as_array().into_iter().flatten() {
            let file = fixtures().join(fx["file"].as_str().unwrap());
            let leaf = leaf_arg(item["leaf"].as_str().unwrap());
            let expected: Value =
                serde_json::from_slice(&std::fs::read(fixtures().join(item["file"].as_str().unwrap())).unwrap())
                    .unwrap();
            let loaded = path_at(&file, leaf);
            let got = pincer_prepare(
                &loaded.entries,
                expected["leafId"].clone(),
                item["keepRecentTokens"].as_u64().unwrap(),
                item["reserveTokens"].as_u64().unwrap(),
            );
            assert_eq!(got, expected, "{}", item["file"]);
            checked.push(item["file"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(checked.len(), 7, "{checked:?}");
}

/// §15 cases 45 and 47: the recorded requests of the real `compact()`.
#[test]
fn compaction_request_fixtures_match_the_built_requests() {
    for (name, keep) in [("05-compaction", 218), ("07-compaction-split-turn", 600)] {
        let rec: Value =
            serde_json::from_slice(&std::fs::read(fixtures().join(format!("{name}.compaction-request.json"))).unwrap())
                .unwrap();
        let loaded = path_at(&fixtures().join(format!("{name}.jsonl")), rec["leafBefore"].as_str());
        let prep =
            prepare_compaction(&loaded.entries, PrepareSettings { reserve_tokens: 16384, keep_recent_tokens: keep })
                .unwrap();
        let calls: Vec<Value> = build_summary_request(&prep, None).iter().map(|r| r.to_pi_call()).collect();
        assert_eq!(Value::Array(calls), rec["calls"], "{name}");
        // The stored result: firstKeptEntryId, tokensBefore, details, and the summary's file lists.
        let details = serde_json::to_value(prep.details()).unwrap();
        assert_eq!(
            json!([prep.first_kept_entry_id, prep.tokens_before, details]),
            json!([rec["result"]["firstKeptEntryId"], rec["result"]["tokensBefore"], rec["result"]["details"]]),
            "{name}"
        );
        assert!(rec["result"]["summary"].as_str().unwrap().ends_with(&prep.file_ops_suffix()));
    }
}

/// §15 case 41: F09's estimate is 3120 usage + 37 trailing.
#[test]
fn f09_context_estimate() {
    let loaded = path_at(&fixtures().join("09-tools-images.jsonl"), None);
    let est = estimate_context_tokens(&path_context_messages(&loaded.entries));
    assert_eq!((est.usage_tokens, est.trailing_tokens, est.tokens), (3120, 37, 3157));
}

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
