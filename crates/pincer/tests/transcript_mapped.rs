//! `pincer transcript context` and `export` of a transcript large enough to be mapped print exactly
//! what the library prints from the owned read (`Session::read`), at the file's leaf and at others.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the test writes its fixture file directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_store::{context_report, LeafArg, Session};
use std::io::Write;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// ~3 MB: a chain of messages with a model change, a compaction, a custom message, a branch summary,
/// a side branch and a few lines Pi skips.
fn write_big(path: &Path) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let ts = "2025-01-01T00:00:00.000Z";
    writeln!(f, r#"{{"type":"session","version":3,"id":"big","timestamp":"{ts}","cwd":"/"}}"#).unwrap();
    let text = "lorem ipsum é ".repeat(20);
    let mut parent = "null".to_owned();
    for i in 0..8000 {
        let line = match i {
            100 => format!(
                r#"{{"type":"model_change","id":"e{i}","parentId":{parent},"timestamp":"{ts}","provider":"p","modelId":"m"}}"#
            ),
            4000 => format!(
                r#"{{"type":"compaction","id":"e{i}","parentId":{parent},"timestamp":"{ts}","summary":"s","firstKeptEntryId":"e3000","tokensBefore":5}}"#
            ),
            5000 => format!(
                r#"{{"type":"custom_message","id":"e{i}","parentId":{parent},"timestamp":"{ts}","customType":"c","content":"x","display":true}}"#
            ),
            6000 => format!(
                r#"{{"type":"branch_summary","id":"e{i}","parentId":{parent},"timestamp":"{ts}","summary":"b","fromId":"e10"}}"#
            ),
            7000 => format!(
                r#"{{"type":"message","id":"side","parentId":"e20","timestamp":"{ts}","message":{{"role":"user","content":"side","timestamp":1}}}}"#
            ),
            _ => {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                format!(
                    r#"{{"type":"message","id":"e{i}","parentId":{parent},"timestamp":"{ts}","message":{{"role":"{role}","content":"{text}{i}","timestamp":{i}}}}}"#
                )
            }
        };
        writeln!(f, "{line}").unwrap();
        if i % 997 == 0 {
            writeln!(f, "{{\"broken\"").unwrap();
        }
        if i != 7000 {
            parent = format!("\"e{i}\"");
        }
    }
    f.flush().unwrap();
}

fn run(args: &[&str]) -> Vec<u8> {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[test]
fn context_and_export_of_a_mapped_file_print_what_the_owned_read_gives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl");
    write_big(&path);
    assert!(std::fs::metadata(&path).unwrap().len() > 2 << 20, "large enough to be mapped");
    let file = path.to_str().unwrap();
    let owned = Session::read(&path).unwrap().unwrap();
    for leaf in [None, Some("e2500"), Some("side"), Some("null")] {
        let mut want = Vec::new();
        let arg = leaf.map(LeafArg::parse).unwrap_or(LeafArg::Default);
        context_report(&owned, &arg).unwrap().write_json(&mut want).unwrap();
        let got = match leaf {
            None => run(&["transcript", "context", file]),
            Some(l) => run(&["transcript", "context", file, "--leaf", l]),
        };
        assert!(got == want, "context at {leaf:?} differs");
    }
    assert!(run(&["transcript", "export", file, "--format", "jsonl"]) == std::fs::read(&path).unwrap());
    let md = pincer_export::markdown(&owned, &LeafArg::Default).unwrap();
    assert!(run(&["transcript", "export", file, "--format", "md"]) == md.into_bytes());
}
