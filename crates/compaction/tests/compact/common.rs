//! What `compact.rs` and `compact_external.rs` share: a store, settings, a generated transcript and
//! the prompts of a summary request.

use crate::support::{prompt_text, FakeProvider};
use pincer_compaction::{CompactionSettings, Mode, TURN_PREFIX_SUMMARIZATION_PROMPT};
use pincer_store::{Store, StoreOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub fn store() -> Store {
    Store::new(StoreOptions::default())
}

pub fn settings(mode: Mode, keep: u64) -> CompactionSettings {
    CompactionSettings { mode, reserve_tokens_floor: 0, keep_recent_tokens: keep, ..CompactionSettings::default() }
}

/// A transcript: header, `turns` tool-using turns, then two `openclaw.cache-ttl` markers.
pub fn write_session(dir: &Path, turns: usize, result_chars: usize) -> PathBuf {
    let mut lines = vec![json!({"type":"session","version":3,"id":"0190a5b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b",
        "timestamp":"2025-09-01T09:00:00.000Z","cwd":"/w"})];
    let mut n = 0;
    let mut parent = Value::Null;
    let mut push = |e: Value| {
        n += 1;
        let mut e = e;
        let id = format!("e{n:07}");
        e["id"] = json!(id);
        e["parentId"] = parent.clone();
        e["timestamp"] = json!(format!("2025-09-01T{:02}:{:02}:{:02}.000Z", 9 + n / 3600, n / 60 % 60, n % 60));
        parent = json!(id);
        lines.push(e);
    };
    for t in 0..turns {
        push(
            json!({"type":"message","message":{"role":"user","content":format!("Turn {t}: refactor src/mod{t}.rs and keep the tests green"),"timestamp":1}}),
        );
        push(json!({"type":"message","message":{"role":"assistant","content":[
            {"type":"text","text":format!("Editing src/mod{t}.rs.")},
            {"type":"toolCall","id":format!("c{t}"),"name":"edit","arguments":{"path":format!("src/mod{t}.rs"),"oldText":"a","newText":"b"}}],
            "stopReason":"toolUse","usage":{"input":100,"output":10,"cacheRead":0,"cacheWrite":0,"totalTokens":110},"timestamp":2}}));
        push(json!({"type":"message","message":{"role":"toolResult","toolCallId":format!("c{t}"),"toolName":"edit",
            "content":[{"type":"text","text":"x".repeat(result_chars)}],"isError":false,"timestamp":3}}));
        push(
            json!({"type":"message","message":{"role":"assistant","content":[{"type":"text","text":format!("Turn {t} done.")}],
            "stopReason":"stop","usage":{"input":200,"output":20,"cacheRead":0,"cacheWrite":0,"totalTokens":220 + t},"timestamp":4}}),
        );
    }
    push(json!({"type":"custom","customType":"openclaw.cache-ttl","data":{"t":1}}));
    push(json!({"type":"custom","customType":"openclaw.cache-ttl","data":{"t":2}}));
    let file = dir.join("session.jsonl");
    std::fs::write(&file, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    file
}

/// The prompts of the history requests (not the split-turn prefix ones), in arrival order.
pub fn history_prompts(fake: &FakeProvider) -> Vec<String> {
    fake.bodies().iter().map(prompt_text).filter(|p| !p.contains(TURN_PREFIX_SUMMARIZATION_PROMPT)).collect()
}
