//! The Pi oracle as one long-lived Node process per test binary: `oracle/batch.mjs` imports the
//! installed oracle's `context.mjs` and `prepare.mjs` once and answers requests as JSON lines, with
//! the exact text those scripts print. Started on first use behind a mutex (requests are answered
//! one at a time, each in milliseconds); restarted if it dies. The process ends when the test
//! binary exits (its stdin closes).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// What one of the oracle's scripts would have printed, and its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Printed {
    /// The script's stdout (pretty JSON and a newline).
    pub stdout: String,
    /// Its exit code.
    pub code: i32,
}

struct Batch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

static BATCH: Mutex<Option<Batch>> = Mutex::new(None);

fn start() -> Batch {
    let script = crate::repo_root().join("crates/testkit/oracle/batch.mjs");
    let mut child = Command::new("node")
        .arg(&script)
        .arg(crate::oracle_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run node {}: {e}", script.display()));
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    Batch { child, stdin, stdout }
}

/// Sends one request and reads its answer.
fn ask(req: &Value) -> Printed {
    let mut guard = BATCH.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // A process that died (or a previous caller that panicked mid-request) is replaced.
    if guard.as_mut().is_none_or(|b| !matches!(b.child.try_wait(), Ok(None))) {
        *guard = Some(start());
    }
    let b = guard.as_mut().expect("started");
    let sent = writeln!(b.stdin, "{req}").and_then(|()| b.stdin.flush());
    let mut line = String::new();
    let read = sent.and_then(|()| b.stdout.read_line(&mut line));
    if !matches!(read, Ok(n) if n > 0) {
        let status = b.child.try_wait();
        *guard = None;
        panic!("the Pi oracle (batch.mjs) did not answer {req}: {read:?}, process {status:?}");
    }
    let reply: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("batch.mjs answered {line:?}: {e}"));
    if let Some(why) = reply["stderr"].as_str() {
        eprintln!("Pi oracle, request {req}:\n{why}");
    }
    Printed {
        stdout: reply["stdout"].as_str().unwrap_or_default().to_owned(),
        code: reply["code"].as_i64().unwrap_or(-1) as i32,
    }
}

fn parsed(what: &str, p: &Printed) -> Value {
    serde_json::from_str(&p.stdout)
        .unwrap_or_else(|e| panic!("oracle {what} output is not JSON ({e}); exit {}\nstdout: {}", p.code, p.stdout))
}

/// What `node context.mjs FILE [LEAF]` prints.
pub fn context_printed(file: &Path, leaf: Option<&str>) -> Printed {
    ask(&json!({"op": "context", "file": file, "leaf": leaf}))
}

/// What `node prepare.mjs FILE [LEAF] --keep KEEP --reserve RESERVE` prints.
pub fn prepare_printed(file: &Path, leaf: Option<&str>, keep: u64, reserve: u64) -> Printed {
    ask(&json!({"op": "prepare", "file": file, "leaf": leaf, "keep": keep, "reserve": reserve}))
}

/// `context.mjs`'s JSON output (`{"error": …}` when Pi fails).
pub fn context(file: &Path, leaf: Option<&str>) -> Value {
    parsed("context", &context_printed(file, leaf))
}

/// `prepare.mjs`'s JSON output (`{"error": …}` when Pi fails).
pub fn prepare(file: &Path, leaf: Option<&str>, keep: u64, reserve: u64) -> Value {
    parsed("prepare", &prepare_printed(file, leaf, keep, reserve))
}
