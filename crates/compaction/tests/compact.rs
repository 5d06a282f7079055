//! `compact()` against a fake OpenAI chat-completions provider: the faults (HTTP 500, timeout,
//! abort, quality guard exhausted) that must leave the transcript byte-identical, and the
//! compaction path decoded from the previous boundary only. The tests that also need the Pi oracle
//! (Node) are in `compact_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use pincer_agent::CancellationToken;
use pincer_compaction::{
    compact, load_compaction_path, load_path, prepare_compaction, CompactionError, CompactionReason,
    CompactionSettings, Mode, PrepareSettings,
};
use pincer_store::NewEntry;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;
use support::{FakeProvider, Reply};

#[path = "compact/common.rs"]
mod common;
use common::*;

async fn expect_untouched(
    file: &Path,
    fut: impl std::future::Future<Output = Result<pincer_compaction::CompactionOutcome, CompactionError>>,
) -> CompactionError {
    let before = std::fs::read(file).unwrap();
    let err = fut.await.expect_err("compaction must fail");
    assert_eq!(std::fs::read(file).unwrap(), before, "the transcript must stay byte-identical");
    err
}

#[tokio::test]
async fn provider_error_leaves_transcript_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 4, 600);
    let fake = FakeProvider::start(Box::new(|_, _| Reply::Status(500, "upstream exploded".into()))).await;
    let model = fake.model(Some(200_000));
    let st = settings(Mode::Safeguard, 300);
    let err = expect_untouched(
        &file,
        compact(&file, &store(), &model, &st, CompactionReason::Manual, CancellationToken::new()),
    )
    .await;
    assert!(matches!(err, CompactionError::Summary { what: "history", .. }), "{err}");
    assert!(err.to_string().contains("HTTP 500") && err.to_string().contains("upstream exploded"), "{err}");
}

#[tokio::test]
async fn timeout_leaves_transcript_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 4, 600);
    let fake = FakeProvider::start(Box::new(|_, _| Reply::NoResponse)).await;
    let model = fake.model(Some(200_000));
    let st = CompactionSettings { timeout_seconds: 1, ..settings(Mode::Safeguard, 300) };
    let err = expect_untouched(
        &file,
        compact(&file, &store(), &model, &st, CompactionReason::Manual, CancellationToken::new()),
    )
    .await;
    assert!(matches!(err, CompactionError::Timeout(1)), "{err}");
}

#[tokio::test]
async fn abort_leaves_transcript_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 4, 600);
    let fake = FakeProvider::start(Box::new(|_, _| Reply::NoResponse)).await;
    let model = fake.model(Some(200_000));
    let st = settings(Mode::Safeguard, 300);
    let cancel = CancellationToken::new();
    let before = std::fs::read(&file).unwrap();
    let task = {
        let (file, cancel) = (file.clone(), cancel.clone());
        tokio::spawn(async move { compact(&file, &store(), &model, &st, CompactionReason::Manual, cancel).await })
    };
    fake.wait_requests(1).await;
    cancel.cancel();
    let err = task.await.unwrap().expect_err("aborted");
    assert!(matches!(err, CompactionError::Aborted), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before);
}

#[tokio::test]
async fn quality_guard_exhaustion_leaves_transcript_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 4, 600);
    let fake = FakeProvider::start(Box::new(|_, _| Reply::Text("Sure! The user worked on some files.".into()))).await;
    let model = fake.model(Some(200_000));
    let st = settings(Mode::Safeguard, 300);
    let err = expect_untouched(
        &file,
        compact(&file, &store(), &model, &st, CompactionReason::Manual, CancellationToken::new()),
    )
    .await;
    assert!(matches!(err, CompactionError::QualityGuard { attempts: 2, .. }), "{err}");
    let prompts = history_prompts(&fake);
    assert_eq!(prompts.len(), 2, "one generation and max_retries = 1 regeneration");
    assert!(!prompts[0].contains("was rejected"));
    assert!(prompts[1].contains("A previous summary was rejected (missing sections: ## Goal"), "{}", prompts[1]);
}

/// Preparing from the previous compaction's boundary: the entries before its first kept entry are
/// not decoded (`null`), everything from there on is, and the preparation is the one the fully
/// decoded path gives.
#[test]
fn compaction_path_decodes_from_the_previous_boundary_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 40, 300);
    let store = store();
    let compaction = |first_kept: Value| {
        let p = json!({"summary": "## Goal\nEarlier turns.", "firstKeptEntryId": first_kept, "tokensBefore": 9000});
        NewEntry::of("compaction", p.as_object().unwrap().clone())
    };
    store.append(&file, compaction(json!("e0000081"))).unwrap();
    for t in 0..12 {
        let m = json!({"role": "user", "content": format!("after the compaction {t}: {}", "words ".repeat(60)), "timestamp": 5});
        store.append(&file, NewEntry::message(m)).unwrap();
    }
    let settings = PrepareSettings { keep_recent_tokens: 300, ..PrepareSettings::default() };
    let full = load_path(&file).unwrap().entries;
    let lazy = load_compaction_path(&file).unwrap().entries;
    let boundary = full.iter().position(|e| e["id"] == "e0000081").unwrap();
    assert_eq!(full.len(), lazy.len());
    assert!(lazy[..boundary].iter().all(Value::is_null), "nothing before the boundary is decoded");
    assert_eq!(lazy[boundary..], full[boundary..], "everything from it on is");
    let (a, b) = (prepare_compaction(&full, settings), prepare_compaction(&lazy, settings));
    assert!(a.is_some());
    assert_eq!(a, b);

    // A boundary that is not a string id: nothing is skipped.
    store.append(&file, compaction(json!(81))).unwrap();
    store.append(&file, NewEntry::message(json!({"role": "user", "content": "more", "timestamp": 6}))).unwrap();
    let full = load_path(&file).unwrap().entries;
    assert_eq!(load_compaction_path(&file).unwrap().entries, full);
}
