//! Preparation and requests against Pi's recorded fixtures: every `prepare` item of the shared
//! manifest, the recorded `*.compaction-request.json` calls, and F09's context estimate. The tests
//! that also need the live Pi oracle (Node) are in `fixtures_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_compaction::{
    build_summary_request, estimate_context_tokens, path_context_messages, prepare_compaction, PrepareSettings,
};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

#[path = "fixtures/common.rs"]
mod common;
use common::*;

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
