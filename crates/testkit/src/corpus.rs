//! A generated state directory for search tests and benchmarks: `sessions` transcripts of
//! `entries` message entries each (pseudo-words from a fixed vocabulary, a side branch in every
//! session), with known words planted in known entries: unique needles (some on a side branch,
//! one in an archived session), a phrase with look-alike distractors, and three words sharing a
//! prefix that nothing else has. Written directly (fixtures), fast: one buffer per file.

use crate::probe::Rng;
use serde_json::json;
use std::path::Path;

/// One planted hit: the query that must find it and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planted {
    pub query: String,
    pub session_key: String,
    pub session_id: String,
    pub entry_id: String,
    /// True when the entry is on a side branch (not the active one).
    pub off_branch: bool,
    /// True when its session is archived.
    pub archived: bool,
}

/// The corpus written.
pub struct Corpus {
    pub planted: Vec<Planted>,
    pub entries: usize,
    pub bytes: u64,
}

const SYLLABLES: [&str; 16] =
    ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "fe", "gu", "ha", "ji", "be"];

fn vocabulary() -> Vec<String> {
    let mut v = Vec::new();
    for a in SYLLABLES {
        for b in SYLLABLES {
            v.push(format!("{a}{b}"));
            for c in ["n", "r", "s", "l"] {
                v.push(format!("{a}{b}{c}"));
            }
        }
    }
    v
}

/// `gen-<n>`'s session id.
pub fn session_id(n: usize) -> String {
    format!("{n:08x}-0000-4000-8000-{n:012x}")
}

/// Entry id `i` of session `n`.
pub fn entry_id(n: usize, i: usize) -> String {
    format!("e{n}x{i}")
}

/// Writes the corpus under `state_dir` (agent `main`; session `gen-<sessions-1>` is archived).
pub fn generate(state_dir: &Path, sessions: usize, entries: usize) -> Corpus {
    assert!(sessions >= 100 && entries >= 60, "the planted hits need at least 100 sessions of 60 entries");
    let dir = state_dir.join("agents/main/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let vocab = vocabulary();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Where the known words go: (session, entry, text, off-branch).
    let mut plants: Vec<(usize, usize, String, bool, String)> = Vec::new();
    for k in 0..20 {
        let s = (k * 37) % (sessions - 1);
        let e = 1 + (k * 13) % (entries - 10);
        plants.push((s, e, format!("needle{k}"), false, format!("needle{k}")));
    }
    // On the side branch of session 7 (its entries are after the main chain, see below).
    plants.push((7, entries + 2, "needlebranch".into(), true, "needlebranch".into()));
    plants.push((sessions - 1, 5, "needlearchived".into(), false, "needlearchived".into()));
    for (j, s) in [3, 30, 60].into_iter().enumerate() {
        plants.push((s, 10 + j, "amber falcon sings".into(), false, "\"amber falcon sings\"".into()));
        plants.push((s + 1, 11 + j, "amber falcon".into(), false, String::new()));
        plants.push((s + 2, 12 + j, "sings amber falcon".into(), false, String::new()));
    }
    for (j, w) in ["quasarite", "quasarish", "quasarly"].into_iter().enumerate() {
        plants.push((40 + j, 20 + j, w.into(), false, "quasar*".into()));
    }
    let mut planted = Vec::new();
    let mut index = serde_json::Map::new();
    let mut total_bytes = 0u64;
    let t0: i64 = 1_796_119_200_000;
    for s in 0..sessions {
        let sid = session_id(s);
        let mut out = String::with_capacity(entries * 220);
        out.push_str(
            &json!({"type": "session", "version": 3, "id": sid, "timestamp": "2026-12-01T10:00:00.000Z", "cwd": "/tmp"})
                .to_string(),
        );
        out.push('\n');
        // The main chain 0..entries, then a side branch of 5 entries under entry 30.
        let total = entries + 5;
        for i in 0..total {
            let parent = match i {
                0 => None,
                i if i == entries => Some(entry_id(s, 30)),
                i => Some(entry_id(s, i - 1)),
            };
            let mut words: Vec<&str> =
                (0..8 + rng.range(0, 20)).map(|_| vocab[rng.range(0, vocab.len() as u64) as usize].as_str()).collect();
            let extra: Vec<&(usize, usize, String, bool, String)> =
                plants.iter().filter(|p| p.0 == s && p.1 == i).collect();
            for p in &extra {
                words.insert(words.len() / 2, p.2.as_str());
            }
            let text = words.join(" ");
            let ts = t0 + (s as i64) * 10_000_000 + i as i64 * 1000;
            let user = i % 2 == 0;
            let message = if user {
                json!({"role": "user", "content": text, "timestamp": ts})
            } else {
                json!({"role": "assistant", "content": [{"type": "text", "text": text}], "api": "openai-completions",
                    "provider": "gen", "model": "gen", "stopReason": "stop", "timestamp": ts})
            };
            let line = json!({"type": "message", "id": entry_id(s, i), "parentId": parent,
                "timestamp": "2026-12-01T10:00:00.000Z", "message": message});
            out.push_str(&line.to_string());
            out.push('\n');
            for p in extra {
                if !p.4.is_empty() {
                    planted.push(Planted {
                        query: p.4.clone(),
                        session_key: format!("agent:main:gen-{s}"),
                        session_id: sid.clone(),
                        entry_id: entry_id(s, i),
                        off_branch: p.3,
                        archived: s == sessions - 1,
                    });
                }
            }
        }
        // The active leaf: back on the main chain.
        out.push_str(
            &json!({"type": "leaf", "id": format!("leaf{s}"), "parentId": entry_id(s, entries - 1),
            "targetId": entry_id(s, entries - 1), "timestamp": "2026-12-01T10:00:00.000Z"})
            .to_string(),
        );
        out.push('\n');
        total_bytes += out.len() as u64;
        std::fs::write(dir.join(format!("{sid}.jsonl")), out).unwrap();
        let mut row = json!({"sessionId": sid, "updatedAt": t0 + s as i64, "sessionStartedAt": t0});
        if s == sessions - 1 {
            row["archivedAt"] = json!(t0);
        }
        index.insert(format!("agent:main:gen-{s}"), row);
    }
    std::fs::write(dir.join("sessions.json"), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    Corpus { planted, entries: sessions * (entries + 5), bytes: total_bytes }
}
