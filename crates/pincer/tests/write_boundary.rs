//! The transcript store is the only code that writes files: no source file outside `crates/store/src`
//! may open a file for writing, create, rename, truncate or remove one. Other crates write through
//! the store (`Store::append`, `pincer_store::fsutil`), so a transcript can never be written around it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use std::path::{Path, PathBuf};

/// Calls that write, move or delete files.
const FORBIDDEN: &[&str] = &[
    "OpenOptions",
    "File::create",
    "fs::write",
    "fs::rename",
    "fs::remove_file",
    "fs::copy",
    "fs::hard_link",
    "set_len(",
    "tokio::fs::write",
    "create_new(",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn only_the_store_writes_files() {
    let crates = pincer_testkit::repo_root().join("crates");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).expect("crates").flatten() {
        let name = krate.file_name().to_string_lossy().to_string();
        if name == "store" || name == "testkit" {
            continue;
        }
        let src = krate.path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(files.len() >= 2, "no sources found under {}", crates.display());
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read source");
        for (n, line) in text.lines().enumerate() {
            if line.trim() == "#[cfg(test)]" {
                break; // unit tests (at the end of a file) may make fixtures
            }
            let code = line.split("//").next().unwrap_or("");
            for pat in FORBIDDEN {
                if code.contains(pat) {
                    offenders.push(format!("{}:{}: {pat}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "file writes outside the store:\n{}", offenders.join("\n"));
}

#[test]
fn the_check_catches_a_write() {
    // The scanner itself must be able to fail: a line with a forbidden call is flagged.
    let line = "let f = std::fs::OpenOptions::new().append(true).open(p);";
    assert!(FORBIDDEN.iter().any(|p| line.contains(p)));
}
