//! What `compaction_e2e.rs` and `compaction_e2e_external.rs` share: the binary, the compaction
//! settings and reading the transcript.

use std::path::{Path, PathBuf};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub const COMPACTION: &str =
    "[agents.defaults.compaction]\nreserve_tokens = 1000\nreserve_tokens_floor = 0\nkeep_recent_tokens = 400\n";

pub fn message(n: usize) -> String {
    format!("turn-{n}: please look at src/module_{n}.rs {}", "lorem ipsum dolor sit amet ".repeat(36))
}

/// The main session's transcript in a state dir.
pub fn transcript(state: &Path) -> PathBuf {
    pincer_testkit::probe::transcript_path(state, "agent:main:main").expect("the main session has a transcript")
}
