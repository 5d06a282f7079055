//! The CLI's mapped read of a transcript: the same session as the owned read on every Pi fixture and
//! on a large file, and a file that shrinks under its map ends the process with a message and exit
//! code 1 (checked in a child process: the test binary run again with an environment variable).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests fail loudly; the child reports on stdout

use pincer_store::mapped::FileBytes;
use pincer_store::{context_report, LeafArg, Session};
use pincer_testkit::fixtures_dir;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Set in the child: what it does, and the file it does it to.
const CHILD_MODE: &str = "PINCER_TEST_MAPPED_CHILD";
const CHILD_FILE: &str = "PINCER_TEST_MAPPED_FILE";

/// Everything the CLI prints or checks of a session: the context report at each leaf, the problems,
/// the rendered file.
fn observed(s: &Session, leaves: &[LeafArg]) -> Vec<u8> {
    let mut out = Vec::new();
    for leaf in leaves {
        match context_report(s, leaf) {
            Ok(r) => r.write_json(&mut out).expect("write"),
            Err(e) => out.extend_from_slice(e.to_string().as_bytes()),
        }
        out.push(b'\n');
    }
    out.extend_from_slice(format!("{:?}\n", s.problems).as_bytes());
    out.extend_from_slice(&s.render(false));
    out.extend_from_slice(&s.render(true));
    out
}

#[test]
fn the_mapped_and_owned_reads_give_the_same_session_on_every_fixture() {
    let dir = fixtures_dir();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest")).expect("json");
    let mut mapped_files = 0;
    for fx in manifest["fixtures"].as_array().expect("fixtures") {
        let file = dir.join(fx["file"].as_str().expect("file"));
        let mut leaves = vec![LeafArg::Default, LeafArg::Null];
        for exp in fx["expected"].as_array().expect("expected") {
            let leaf = exp["leaf"].as_str().expect("leaf");
            if !leaf.starts_with('(') {
                leaves.push(LeafArg::parse(leaf));
            }
        }
        let owned = Session::parse(std::fs::read(&file).expect("read"));
        let bytes = pincer_store::mapped::map(&file).expect("map");
        mapped_files += usize::from(bytes.is_mapped());
        let mapped = Session::parse(bytes);
        assert!(mapped.bytes() == owned.bytes(), "{}", file.display());
        assert_eq!(mapped.problems, owned.problems, "{}", file.display());
        if owned.migrated {
            // v1 migration gives entries random ids: nothing more to compare.
            continue;
        }
        let (got, want) = (observed(&mapped, &leaves), observed(&owned, &leaves));
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want), "{}", file.display());
    }
    // Empty fixtures are read, not mapped; all others are mapped.
    assert!(mapped_files > 10, "only {mapped_files} fixtures were mapped");
}

/// A chain of `n` messages with a few lines Pi skips, about 300 bytes a line.
fn write_chain(path: &Path, n: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    writeln!(f, r#"{{"type":"session","version":3,"id":"m","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/"}}"#)
        .unwrap();
    let filler = "x".repeat(200);
    let mut parent = "null".to_owned();
    for i in 0..n {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        writeln!(
            f,
            r#"{{"type":"message","id":"e{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:00.000Z","message":{{"role":"{role}","content":"{filler}","timestamp":{i}}}}}"#
        )
        .unwrap();
        if i % 1000 == 999 {
            writeln!(f, "null\n{{\"broken\"\n").unwrap();
        }
        parent = format!("\"e{i}\"");
    }
    f.flush().unwrap();
}

#[test]
fn a_large_file_is_mapped_and_reads_as_the_owned_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl");
    write_chain(&path, 20_000);
    assert!(std::fs::metadata(&path).unwrap().len() > 4 << 20);
    let owned = Session::read(&path).unwrap().unwrap();
    let mapped = Session::read_mapped(&path).unwrap().unwrap();
    let leaves = [LeafArg::Default, LeafArg::Null, LeafArg::Id("e7777".into())];
    assert!(observed(&mapped, &leaves) == observed(&owned, &leaves));
    assert!(pincer_store::mapped::map(&path).unwrap().is_mapped());
    assert!(Session::read_mapped(&dir.path().join("missing")).unwrap().is_none());
}

/// Runs this test binary again for one test, in `mode`, on `file`.
fn child(test: &str, mode: &str, file: &Path) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_MODE, mode)
        .env(CHILD_FILE, file)
        .output()
        .expect("run the child")
}

/// In the child: the file mapped (by `map`, or by hand for `foreign`), cut to nothing, then read.
fn shrink_and_touch(mode: &str, file: &Path) {
    let bytes: FileBytes = pincer_store::mapped::map(file).expect("map");
    assert!(bytes.is_mapped());
    assert_eq!(&bytes[..8], b"{\"type\":");
    std::fs::OpenOptions::new().write(true).open(file).unwrap().set_len(0).unwrap();
    let sum: u64 = match mode {
        "ours" => bytes.iter().map(|&b| u64::from(b)).sum(),
        _ => foreign_touch(file),
    };
    println!("survived the read ({sum})");
    std::process::exit(0);
}

/// A map the store did not make, of the (now empty) file with its old length: a SIGBUS from it is
/// not ours to report.
fn foreign_touch(file: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(file).unwrap();
    let len = 1 << 20;
    // SAFETY: a fresh read-only map of an open file; reading past the file's end raises SIGBUS,
    // which is what this child is for.
    #[allow(unsafe_code)]
    let sum = unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        u64::from(std::ptr::read_volatile(p.cast::<u8>()))
    };
    sum
}

#[test]
fn a_mapped_file_that_shrinks_ends_the_process_with_a_message_and_exit_code_1() {
    if let (Some(mode), Some(file)) = (std::env::var_os(CHILD_MODE), std::env::var_os(CHILD_FILE)) {
        if mode == "ours" {
            shrink_and_touch("ours", Path::new(&file));
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shrinks.jsonl");
    write_chain(&path, 10_000);
    let out = child("a_mapped_file_that_shrinks_ends_the_process_with_a_message_and_exit_code_1", "ours", &path);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stdout: {stdout}\nstderr: {stderr}");
    let want = format!("pincer: {} shrank while it was being read (another program rewrote it)", path.display());
    assert!(stderr.contains(&want), "stderr: {stderr}");
    assert!(!stdout.contains("survived"), "stdout: {stdout}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "the child cut the file");
}

#[test]
fn a_sigbus_outside_the_stores_maps_keeps_its_default_action() {
    if let (Some(mode), Some(file)) = (std::env::var_os(CHILD_MODE), std::env::var_os(CHILD_FILE)) {
        if mode == "foreign" {
            shrink_and_touch("foreign", Path::new(&file));
        }
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.jsonl");
    write_chain(&path, 10_000);
    let out = child("a_sigbus_outside_the_stores_maps_keeps_its_default_action", "foreign", &path);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "status {:?}\nstdout: {stdout}\nstderr: {stderr}", out.status);
    assert!(!stderr.contains("shrank"), "stderr: {stderr}");
    assert!(!stdout.contains("survived"), "stdout: {stdout}");
}
