//! Transcript shapes the hostile-input tests (issue 34) and their measuring example
//! (`examples/hostile.rs`) share, written as fixture files: a session in a state directory, a
//! message entry, the search corpus of the attack and the costliest query it allows.

use serde_json::{json, Value};

/// Writes session `agent:main:<name>` (id `sid`) with the given entry lines into `state`.
pub fn write_session(state: &std::path::Path, name: &str, sid: &str, entries: &[Value]) {
    let dir = state.join("agents/main/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let mut out = json!({"type": "session", "version": 3, "id": sid, "timestamp": "2026-12-01T10:00:00.000Z",
        "cwd": "/"})
    .to_string();
    out.push('\n');
    for e in entries {
        out.push_str(&e.to_string());
        out.push('\n');
    }
    std::fs::write(dir.join(format!("{sid}.jsonl")), out).unwrap();
    let index_path = dir.join("sessions.json");
    let mut index: Value =
        std::fs::read(&index_path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_else(|| json!({}));
    index[format!("agent:main:{name}")] =
        json!({"sessionId": sid, "updatedAt": 1_780_000_000_000_i64, "sessionStartedAt": 1_780_000_000_000_i64});
    std::fs::write(index_path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
}

/// A `message` entry of `role` (`user`, else an assistant reply) with `text`.
pub fn message(id: &str, parent: Option<&str>, role: &str, text: &str) -> Value {
    let message = match role {
        "user" => json!({"role": "user", "content": text, "timestamp": 1}),
        _ => json!({"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop",
            "timestamp": 1}),
    };
    json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2026-12-01T10:00:00.000Z",
        "message": message})
}

/// The search corpus of the attack: 20,000 words `m0…m19999` (100 per message), and 32 groups of
/// 500 words `q00x000…q31x499` (each message holds two of every group, each word in 16 messages),
/// so the 32 prefixes `q00x*…q31x*` are each just within the expansion limit.
pub fn search_corpus(state: &std::path::Path) {
    let mut entries = Vec::new();
    let mut push = |text: String| {
        let id = format!("c{}", entries.len());
        entries.push(message(&id, None, "user", &text));
    };
    for i in 0..200 {
        push((i * 100..(i + 1) * 100).map(|n| format!("m{n}")).collect::<Vec<_>>().join(" "));
    }
    for j in 0..4000 {
        let words: Vec<String> =
            (0..64).map(|w| format!("q{:02}x{:03}", w % 32, (j * 2 + w / 32) % 500)).collect::<Vec<_>>();
        push(words.join(" "));
    }
    write_session(state, "corpus", "0000000c-0000-4000-8000-00000000000c", &entries);
}

/// 32 prefixes, each standing for 500 indexed words: as costly as a query may be.
pub fn heavy_query() -> String {
    (0..32).map(|k| format!("q{k:02}x*")).collect::<Vec<_>>().join(" ")
}
