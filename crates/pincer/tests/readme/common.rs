//! What `readme.rs` and `readme_external.rs` share: the README and its fenced blocks, the
//! repository, and running commands.

use std::path::{Path, PathBuf};
use std::process::Output;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).unwrap()
}

/// The fenced blocks of a Markdown text: (language, body).
pub fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(lang)) => current = Some((lang.trim().to_owned(), String::new())),
            (Some(_), Some("")) => out.extend(current.take()),
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(current.is_none(), "an unclosed code block in the README");
    out
}

pub fn of_lang(lang: &str) -> Vec<String> {
    blocks(&readme()).into_iter().filter(|(l, _)| l == lang).map(|(_, b)| b).collect()
}

pub fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
