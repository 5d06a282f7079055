//! What `export.rs` and `export_external.rs` share: the fixtures, running `pincer`, and the JSONL
//! embedded in an HTML export.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub fn fixture() -> PathBuf {
    pincer_testkit::repo_root().join("crates/export/tests/fixtures/three-branches.jsonl")
}

pub fn pincer(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("TZ", "UTC").env_remove("PINCER_STATE_DIR").output().unwrap()
}

pub fn ok(args: &[&str]) -> Vec<u8> {
    let out = pincer(args);
    assert!(out.status.success(), "pincer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The JSONL embedded in an HTML export, decoded.
pub fn embedded(html: &[u8]) -> Vec<u8> {
    pincer_export::import::extract(html).unwrap()
}
