//! `compact()` end to end, checked against the real Pi library (`context.mjs`; the part of
//! `compact.rs` that needs the Pi oracle on Node, so it builds only with the `external` feature):
//! Pi's own F05 compaction reproduced byte for byte, safeguard compactions with trailing cache
//! markers, a second compaction with the UPDATE prompt, staged summaries for a small window, and a
//! quality guard that regenerates and then succeeds.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use pincer_agent::CancellationToken;
use pincer_compaction::guard::identifiers_in;
use pincer_compaction::{
    compact, load_path, prepare_compaction, CompactionReason, CompactionSettings, Mode, SUMMARIZATION_SYSTEM_PROMPT,
    TURN_PREFIX_SUMMARIZATION_PROMPT, UPDATE_SUMMARIZATION_PROMPT,
};
use pincer_store::NewEntry;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::Path;
use support::{js_normal, pi_context, pincer_context, prompt_text, system_text, FakeProvider, Reply};

#[path = "compact/common.rs"]
mod common;
use common::*;

/// The part of a prompt inside `<conversation>`.
fn conversation(prompt: &str) -> &str {
    let start = prompt.find("<conversation>\n").map(|i| i + 15).unwrap_or(0);
    let end = prompt.find("\n</conversation>").unwrap_or(prompt.len());
    &prompt[start..end]
}

/// A summary a careful model would write: every section, the last request, every identifier.
fn good_summary(prompt: &str) -> String {
    let conv = conversation(prompt);
    let last_user = conv.rsplit("[User]: ").next().unwrap_or("").lines().next().unwrap_or("").to_owned();
    let mut ids = identifiers_in(conv);
    ids.dedup();
    let ids = ids.join(", ");
    if prompt.contains(TURN_PREFIX_SUMMARIZATION_PROMPT) {
        format!("## Original Request\n{last_user}\n\n## Early Progress\n- touched {ids}\n\n## Context for Suffix\n- continue")
    } else {
        format!(
            "## Goal\n{last_user}\n\n## Constraints & Preferences\n- (none)\n\n## Progress\n### Done\n- [x] touched {ids}\n\n\
             ### In Progress\n- [ ] continue\n\n### Blocked\n- (none)\n\n## Key Decisions\n- **Edit in place**: simplest\n\n\
             ## Next Steps\n1. Continue\n\n## Critical Context\n- (none)"
        )
    }
}

fn good_script() -> support::Script {
    Box::new(|body, _| Reply::Text(good_summary(&prompt_text(body))))
}

fn assert_same_context_as_pi(file: &Path) -> Vec<Value> {
    let ours: Vec<Value> = pincer_context(file).iter().map(js_normal).collect();
    let pi: Vec<Value> = pi_context(file).iter().map(js_normal).collect();
    assert_eq!(ours, pi);
    ours
}

/// Pi's real F05 compaction (split-turn quirk, two calls), reproduced: same requests, same entry,
/// and Pi builds the same context from the file as Pincer.
#[tokio::test]
async fn reproduces_pi_f05_compaction() {
    let fx = pincer_testkit::fixtures_dir();
    let rec: Value =
        serde_json::from_slice(&std::fs::read(fx.join("05-compaction.compaction-request.json")).unwrap()).unwrap();
    let full = std::fs::read_to_string(fx.join("05-compaction.jsonl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f05.jsonl");
    // The file as it was before Pi compacted it: up to the leaf cabcc87c (line 22).
    let before: String = full.lines().take(22).map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, &before).unwrap();
    let summary = rec["result"]["summary"].as_str().unwrap().to_owned();
    let (history, rest) = summary.split_once("\n\n---\n\n**Turn Context (split turn):**\n\n").unwrap();
    let prefix = rest.split("\n\n<read-files>").next().unwrap().to_owned();
    let history = history.to_owned();
    let fake = FakeProvider::start(Box::new(move |body, _| {
        let p = prompt_text(body);
        Reply::Text(if p.contains(TURN_PREFIX_SUMMARIZATION_PROMPT) { prefix.clone() } else { history.clone() })
    }))
    .await;
    let model = fake.model(Some(200_000));
    let st = settings(Mode::Default, 218);
    let out = compact(&file, &store(), &model, &st, CompactionReason::Manual, CancellationToken::new()).await.unwrap();

    let entry = &out.entry;
    assert_eq!(
        json!([
            entry["type"],
            entry["parentId"],
            entry["summary"],
            entry["firstKeptEntryId"],
            entry["tokensBefore"],
            entry["details"],
            entry["fromHook"]
        ]),
        json!([
            "compaction",
            "cabcc87c",
            rec["result"]["summary"],
            rec["result"]["firstKeptEntryId"],
            rec["result"]["tokensBefore"],
            rec["result"]["details"],
            false
        ])
    );
    assert_eq!((out.tokens_before, out.model_calls, out.attempts), (8090, 2, 1));
    // The file: the old bytes untouched, one line added, exactly the entry returned.
    let after = std::fs::read_to_string(&file).unwrap();
    assert_eq!(after, format!("{before}{}\n", serde_json::to_string(entry).unwrap()));
    // The requests: the exact texts Pi sent, system prompt, maxTokens.
    let mut sent: Vec<Value> = fake
        .bodies()
        .iter()
        .map(|b| json!({"system": system_text(b), "text": prompt_text(b), "max_tokens": b["max_tokens"]}))
        .collect();
    sent.sort_by_key(|v| v["max_tokens"].as_u64());
    let mut want: Vec<Value> = rec["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"system": c["systemPrompt"], "text": c["messages"][0]["content"][0]["text"], "max_tokens": c["options"]["maxTokens"]}))
        .collect();
    want.sort_by_key(|v| v["max_tokens"].as_u64());
    assert_eq!(sent, want);
    assert_eq!(system_text(&fake.bodies()[0]), SUMMARIZATION_SYSTEM_PROMPT);
    let ctx = assert_same_context_as_pi(&file);
    assert_eq!(ctx[0]["role"], "compactionSummary");
}

/// Safeguard mode on a transcript ending in cache markers: the entry chains to the last marker, Pi
/// and Pincer build [summary, kept…]; then a second compaction uses the UPDATE prompt with the first
/// summary in `<previous-summary>`; a compaction followed only by a marker is "Already compacted".
#[tokio::test]
async fn safeguard_compactions_with_trailing_markers_and_update_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 6, 600);
    let fake = FakeProvider::start(good_script()).await;
    let model = fake.model(Some(200_000));
    let st = settings(Mode::Safeguard, 400);
    let store = store();
    let before = std::fs::read(&file).unwrap();
    let out = compact(&file, &store, &model, &st, CompactionReason::Threshold, CancellationToken::new()).await.unwrap();
    assert_eq!(out.entry["parentId"], "e0000026", "chained to the last cache marker (the leaf)");
    let after = std::fs::read(&file).unwrap();
    assert_eq!(&after[..before.len()], &before[..]);
    let ctx = assert_same_context_as_pi(&file);
    // [summary, kept messages from firstKept to the end]: the kept tail is not orphaned.
    let path = load_path(&file).unwrap().entries;
    let first = path.iter().position(|e| e["id"] == out.entry["firstKeptEntryId"]).unwrap();
    let kept: Vec<Value> =
        path[first..].iter().filter(|e| e["type"] == "message").map(|e| js_normal(&e["message"])).collect();
    assert!(!kept.is_empty() && first > 0);
    assert_eq!(ctx[1..].to_vec(), kept);
    assert_eq!(ctx[0]["summary"], out.entry["summary"]);
    let first_summary = out.entry["summary"].as_str().unwrap().to_owned();
    let first_request = history_prompts(&fake)[0].clone();
    assert!(first_request.ends_with(pincer_compaction::SUMMARIZATION_PROMPT), "{first_request}");

    // A marker after the compaction: nothing new to compact.
    store
        .append(
            &file,
            NewEntry::of("custom", json!({"customType":"openclaw.cache-ttl","data":{}}).as_object().unwrap().clone()),
        )
        .unwrap();
    let marker_only = std::fs::read(&file).unwrap();
    let err =
        compact(&file, &store, &model, &st, CompactionReason::Threshold, CancellationToken::new()).await.unwrap_err();
    assert_eq!(err.to_string(), "Already compacted");
    assert_eq!(std::fs::read(&file).unwrap(), marker_only);

    // More turns, then a second compaction: the UPDATE prompt with the first summary.
    for t in 0..3 {
        store
            .append(
                &file,
                NewEntry::message(
                    json!({"role":"user","content":format!("Next {t}: document docs/api{t}.md"),"timestamp":5}),
                ),
            )
            .unwrap();
        store.append(&file, NewEntry::message(json!({"role":"assistant","content":[{"type":"text","text":"y".repeat(900)}],
            "stopReason":"stop","usage":{"input":10,"output":10,"cacheRead":0,"cacheWrite":0,"totalTokens":5000},"timestamp":6}))).unwrap();
    }
    let n_before = history_prompts(&fake).len();
    let out2 = compact(&file, &store, &model, &st, CompactionReason::Manual, CancellationToken::new()).await.unwrap();
    let second = history_prompts(&fake)[n_before].clone();
    assert!(
        second.contains(&format!(
            "<previous-summary>\n{first_summary}\n</previous-summary>\n\n{UPDATE_SUMMARIZATION_PROMPT}"
        )),
        "{second}"
    );
    assert_eq!(
        out2.entry["details"]["modifiedFiles"],
        json!(["src/mod0.rs", "src/mod1.rs", "src/mod2.rs", "src/mod3.rs", "src/mod4.rs", "src/mod5.rs"])
    );
    let ctx2 = assert_same_context_as_pi(&file);
    assert_eq!(ctx2[0]["summary"], out2.entry["summary"]);
}

/// A history too large for the model's window is summarized in stages; no stage starts with a tool
/// result, the stages cover the serialized history exactly, and each later stage updates the
/// previous stage's summary.
#[tokio::test]
async fn safeguard_summarizes_large_history_in_stages() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 24, 1500);
    let fake = FakeProvider::start(good_script()).await;
    let model = fake.model(Some(6000));
    let st = CompactionSettings { reserve_tokens: 2000, ..settings(Mode::Safeguard, 500) };
    let prep = prepare_compaction(&load_path(&file).unwrap().entries, st.prepare_settings(Some(6000))).unwrap();
    let out =
        compact(&file, &store(), &model, &st, CompactionReason::Overflow, CancellationToken::new()).await.unwrap();
    let bodies: Vec<Value> =
        fake.bodies().into_iter().filter(|b| !prompt_text(b).contains(TURN_PREFIX_SUMMARIZATION_PROMPT)).collect();
    assert!(out.stages >= 2, "stages {}", out.stages);
    assert_eq!((bodies.len(), out.model_calls), (out.stages, fake.bodies().len()));
    let chunks: Vec<String> = bodies.iter().map(|b| conversation(&prompt_text(b)).to_owned()).collect();
    assert_eq!(chunks.join("\n\n"), prep.serialized_history());
    assert!(chunks.iter().all(|c| c.starts_with("[User]: ") || c.starts_with("[Assistant")), "{chunks:?}");
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(b["max_tokens"], 1600);
        if i > 0 {
            let prev = good_summary(&prompt_text(&bodies[i - 1]));
            assert!(prompt_text(b).contains(&format!("<previous-summary>\n{prev}\n</previous-summary>")));
        }
    }
    assert_same_context_as_pi(&file);
}

/// The guard retries: a bad first summary, a good second one → written, attempts = 2.
#[tokio::test]
async fn quality_guard_regenerates_then_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_session(dir.path(), 4, 600);
    let history_calls = std::sync::atomic::AtomicUsize::new(0);
    let fake = FakeProvider::start(Box::new(move |body, _| {
        let p = prompt_text(body);
        let is_history = !p.contains(TURN_PREFIX_SUMMARIZATION_PROMPT);
        if is_history && history_calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Reply::Text("## Goal\nstuff".into())
        } else {
            Reply::Text(good_summary(&p))
        }
    }))
    .await;
    let model = fake.model(Some(200_000));
    let st = settings(Mode::Safeguard, 300);
    let out = compact(&file, &store(), &model, &st, CompactionReason::Manual, CancellationToken::new()).await.unwrap();
    assert_eq!((out.attempts, out.model_calls, history_prompts(&fake).len()), (2, fake.bodies().len(), 2));
    assert_same_context_as_pi(&file);
}
