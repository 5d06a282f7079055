//! Files written by Pincer, opened by the real Pi library: a long chat with branches, labels, model
//! and thinking changes, custom entries, tool calls, images, a compaction and a branch summary must
//! give the same `{sessionId, leafId, entries, context}` in Pi as in Pincer, at several leaves.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use pincer_store::{context_report, LeafArg, NewEntry, ParentChoice, Session, Store, StoreOptions};
use pincer_testkit::{comparable, oracle_context};
use pretty_assertions::assert_eq;
use serde_json::{json, Map, Value};
use std::path::Path;

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn assistant(text: &str, model: &str) -> Value {
    json!({"role":"assistant","content":[{"type":"thinking","thinking":"hmm","thinkingSignature":"sig"},{"type":"text","text":text}],
        "api":"openai-completions","provider":"local","model":model,
        "usage":{"input":10,"output":5,"cacheRead":0,"cacheWrite":0,"totalTokens":15,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},
        "stopReason":"stop","timestamp":1738486806000_i64})
}

fn assert_same_in_pi(file: &Path, leaf: Option<&str>) {
    let ours = Session::parse(std::fs::read(file).expect("read"));
    let arg = leaf.map(LeafArg::parse).unwrap_or(LeafArg::Default);
    let mine = comparable(&context_report(&ours, &arg).expect("context").to_value());
    let pi = comparable(&oracle_context(file, leaf));
    assert_eq!(mine, pi, "leaf {leaf:?}");
}

#[test]
fn a_long_chat_written_by_pincer_reads_the_same_in_pi() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("roundtrip.jsonl");
    let store = Store::new(StoreOptions::default());
    let ap = |e: NewEntry| store.append(&f, e).expect("append");
    ap(NewEntry::of("model_change", obj(json!({"provider":"local","modelId":"llama3.2"}))));
    ap(NewEntry::of("thinking_level_change", obj(json!({"thinkingLevel":"low"}))));
    let u1 = ap(NewEntry::message(json!({"role":"user","content":[{"type":"text","text":"What is in this picture?"},
        {"type":"image","data":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==","mimeType":"image/png"}],"timestamp":1})));
    let a1 = ap(NewEntry::message(assistant("A single pixel.", "llama3.2")));
    ap(NewEntry::of(
        "custom",
        obj(json!({"customType":"openclaw.cache-ttl","data":{"timestamp":1,"provider":"local"}})),
    ));
    ap(NewEntry::message(json!({"role":"user","content":"Read a.md please","timestamp":2})));
    ap(NewEntry::message(
        json!({"role":"assistant","content":[{"type":"toolCall","id":"call_1","name":"read","arguments":{"path":"a.md"}},
        {"type":"toolCall","id":"call_2","name":"time","arguments":{}}],"api":"anthropic-messages","provider":"anthropic","model":"claude-x",
        "usage":{"input":1,"output":1,"cacheRead":0,"cacheWrite":0,"totalTokens":2,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},
        "stopReason":"toolUse","timestamp":3}),
    ));
    ap(NewEntry::message(
        json!({"role":"toolResult","toolCallId":"call_1","toolName":"read","content":[{"type":"text","text":"# A"}],"isError":false,"timestamp":4}),
    ));
    ap(NewEntry::message(
        json!({"role":"toolResult","toolCallId":"call_2","toolName":"time","content":[{"type":"text","text":"no clock"}],"isError":true,"timestamp":5}),
    ));
    let a2 = ap(NewEntry::message(assistant("a.md has a heading.", "claude-x")));
    ap(NewEntry::of("label", obj(json!({"targetId": a2.entry["id"], "label":"checkpoint"}))));
    ap(NewEntry::of(
        "custom_message",
        obj(json!({"customType":"note","content":"remember this","display":true,"details":{"k":1}})),
    ));
    ap(NewEntry::of("session_info", obj(json!({"name":"Round trip"}))));
    // A branch from the first answer: an edited second question.
    let mut edit = NewEntry::message(json!({"role":"user","content":"Actually, describe the colour.","timestamp":6}));
    edit.parent = ParentChoice::Entry(a1.id().expect("id").to_owned());
    let b1 = ap(edit);
    let b2 = ap(NewEntry::message(assistant("It is transparent black.", "llama3.2")));
    ap(NewEntry::of(
        "compaction",
        obj(json!({"summary":"## Goal\nDescribe a pixel.","firstKeptEntryId": b1.entry["id"],"tokensBefore":1234,
        "details":{"readFiles":[],"modifiedFiles":[]},"fromHook":false})),
    ));
    ap(NewEntry::message(json!({"role":"user","content":"Thanks!","timestamp":7})));
    let last = ap(NewEntry::message(assistant("You're welcome.", "llama3.2")));
    let mut bs =
        NewEntry::of("branch_summary", obj(json!({"fromId": u1.entry["id"], "summary":"Explored the colour."})));
    bs.parent = ParentChoice::Entry(u1.id().expect("id").to_owned());
    ap(bs);
    ap(NewEntry::message(json!({"role":"user","content":"Back on the first branch.","timestamp":8})));

    assert_same_in_pi(&f, None);
    for leaf in [a2.id(), b2.id(), last.id(), a1.id(), Some("null")] {
        assert_same_in_pi(&f, leaf);
    }
}

#[test]
fn files_migrated_by_pincer_read_the_same_in_pi() {
    let dir = tempfile::tempdir().expect("tempdir");
    for fixture in ["10-v1-legacy.jsonl", "11-v2-hookmessage.jsonl", "13-truncated-last-line.jsonl", "19-crlf.jsonl"] {
        let f = dir.path().join(fixture);
        std::fs::copy(pincer_testkit::fixtures_dir().join(fixture), &f).expect("copy");
        Store::new(StoreOptions::default())
            .append(&f, NewEntry::message(json!({"role":"user","content":"appended by pincer","timestamp":9})))
            .expect("append");
        let pi = oracle_context(&f, None);
        assert_eq!(pi["extra"]["rewrittenOnOpen"], false, "{fixture}: Pi had to rewrite the file");
        assert_same_in_pi(&f, None);
        let msgs = pi["context"]["messages"].as_array().expect("messages");
        assert_eq!(msgs.last().expect("last")["content"], "appended by pincer", "{fixture}");
    }
}
