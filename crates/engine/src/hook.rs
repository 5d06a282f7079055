//! The `before_agent_run` hook: an external command that sees the user's message before anything is
//! written or shown, and allows it or blocks it (optionally with a replacement). It gets
//! `{"sessionKey","message"}` on stdin and answers `{"outcome":"allow"}` or
//! `{"outcome":"block","reason":"…","message":"replacement"?}` on stdout.
//!
//! A hook's *decision* to block is a decision ([`Decision::Block`]: the turn writes the redacted row).
//! A hook that *cannot decide* — it fails to start, exits non-zero, times out, or answers anything
//! else — is a failure of the gateway, not of the user ([`Decision::Failed`]): the turn fails closed
//! with an error naming the cause, and nothing is written, so the message is not lost and its key
//! can be sent again. The hook runs in its own process group, which is killed once it has answered
//! (or timed out): a background child holding its stdout cannot stall the turn, nor outlive it.
//! Its stdin is written concurrently with reading its answer; a hook that exits without reading
//! the message (`/bin/echo …`) is allowed to, and that is logged.

use crate::config::HookConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the hook decided, or why it could not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Block {
        reason: String,
        replacement: Option<String>,
    },
    /// The hook did not decide (the reason names why): the turn fails, nothing is written.
    Failed(String),
}

/// The longest answer read from a hook.
const MAX_ANSWER_BYTES: u64 = 1024 * 1024;
/// How long a hook's stdout may stay open after the hook itself exited (a background child).
const AFTER_EXIT: Duration = Duration::from_millis(200);

fn failed(reason: String) -> Decision {
    tracing::warn!("before_agent_run hook failed: {reason}");
    Decision::Failed(reason)
}

/// The program a hook command names, found as a shell would (`PATH` for a bare name), if it is
/// an executable file. The one check of it (startup and `decide`).
pub fn find_program(program: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if executable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(format!("{program} is not an executable file"))
        } else {
            Err(format!("{program} does not exist"))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| format!("{program} is not found on PATH"))
}

/// Kills what is left of the hook's process group (its background children).
fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()).and_then(rustix::process::Pid::from_raw) else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

/// What a hook reads on its stdin: one JSON object.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HookInput<'a> {
    session_key: &'a str,
    message: &'a str,
}

pub async fn decide(h: &HookConfig, session_key: &str, message: &str) -> Decision {
    let Some((program, args)) = h.command.split_first() else {
        return failed("the hook command is empty".into());
    };
    let timeout = Duration::from_millis(h.timeout_ms.unwrap_or(10_000));
    let mut child = match tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return failed(format!("the hook {program} could not start: {e}")),
    };
    let pid = child.id();
    let input = serde_json::to_string(&HookInput { session_key, message }).unwrap_or_default();
    let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
    let write = async move {
        let Some(mut stdin) = stdin else { return };
        match stdin.write_all(input.as_bytes()).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                tracing::info!("the before_agent_run hook exited without reading the message");
            }
            Err(e) => tracing::warn!("writing the message to the before_agent_run hook: {e}"),
        }
        // Dropped: the hook sees end of input.
    };
    let run = async {
        // Read while writing and waiting: a hook may answer before (or without) reading its input.
        let mut reader = tokio::spawn(async move {
            let mut out = Vec::new();
            if let Some(stdout) = stdout {
                stdout
                    .take(MAX_ANSWER_BYTES)
                    .read_to_end(&mut out)
                    .await
                    .map_err(|e| format!("reading the hook's answer: {e}"))?;
            }
            Ok::<_, String>(out)
        });
        let ((), status) = tokio::join!(write, child.wait());
        let status = status.map_err(|e| format!("waiting for the hook: {e}"))?;
        // The hook has exited: its answer is what it wrote; a child it left behind holding stdout
        // gets a moment, then the group is killed and what was read counts.
        let read = match tokio::time::timeout(AFTER_EXIT, &mut reader).await {
            Ok(r) => r,
            Err(_) => {
                kill_group(pid);
                reader.await
            }
        };
        let out = read.map_err(|e| format!("reading the hook's answer: {e}"))??;
        if !status.success() {
            return Err(format!("the hook exited with {status}"));
        }
        Ok(out)
    };
    let outcome = tokio::time::timeout(timeout, run).await;
    kill_group(pid);
    let out = match outcome {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return failed(e),
        Err(_) => return failed(format!("the hook did not answer within {} ms", timeout.as_millis())),
    };
    let Ok(v) = serde_json::from_slice::<Value>(&out) else {
        let shown: String = String::from_utf8_lossy(&out).chars().take(80).collect();
        return failed(format!("the hook's answer is not JSON: {shown:?}"));
    };
    match v.get("outcome").and_then(Value::as_str) {
        Some("allow") => Decision::Allow,
        Some("block") => Decision::Block {
            reason: v.get("reason").and_then(Value::as_str).unwrap_or("blocked by policy").to_owned(),
            replacement: v.get("message").and_then(Value::as_str).map(str::to_owned),
        },
        _ => failed("the hook's answer has no outcome \"allow\" or \"block\"".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> HookConfig {
        HookConfig { command: vec!["sh".into(), "-c".into(), script.into()], timeout_ms: Some(2000) }
    }

    #[tokio::test]
    async fn decisions_and_failures() {
        assert_eq!(decide(&sh("cat >/dev/null; echo '{\"outcome\":\"allow\"}'"), "k", "m").await, Decision::Allow);
        assert_eq!(
            decide(
                &sh("cat >/dev/null; echo '{\"outcome\":\"block\",\"reason\":\"pii\",\"message\":\"[redacted]\"}'"),
                "k",
                "m"
            )
            .await,
            Decision::Block { reason: "pii".into(), replacement: Some("[redacted]".into()) }
        );
        // The hook sees the message.
        let echo = decide(
            &sh("grep -q secret && echo '{\"outcome\":\"block\"}' || echo '{\"outcome\":\"allow\"}'"),
            "k",
            "a secret",
        )
        .await;
        assert!(matches!(echo, Decision::Block { .. }));
        for bad in ["echo garbage", "exit 3", "sleep 5", "echo '{\"outcome\":\"maybe\"}'"] {
            assert!(matches!(decide(&sh(bad), "k", "m").await, Decision::Failed(_)), "{bad}");
        }
        let missing = HookConfig { command: vec!["/nonexistent/hook".into()], timeout_ms: None };
        assert!(matches!(decide(&missing, "k", "m").await, Decision::Failed(_)));
    }

    #[tokio::test]
    async fn a_hook_that_does_not_read_its_input_still_decides() {
        let echo = HookConfig { command: vec!["/bin/echo".into(), "{\"outcome\":\"allow\"}".into()], timeout_ms: None };
        let big = "x".repeat(256 * 1024);
        for _ in 0..10 {
            assert_eq!(decide(&echo, "k", &big).await, Decision::Allow);
            assert_eq!(decide(&echo, "k", "short").await, Decision::Allow);
        }
    }

    #[tokio::test]
    async fn a_background_child_holding_stdout_neither_stalls_nor_outlives_the_hook() {
        let dir = tempfile::tempdir().expect("dir");
        let pidfile = dir.path().join("child.pid");
        let script = format!(
            "cat >/dev/null; (sleep 30 & echo $! > {}; wait) & echo '{{\"outcome\":\"allow\"}}'",
            pidfile.display()
        );
        let h = HookConfig { command: vec!["sh".into(), "-c".into(), script], timeout_ms: Some(5000) };
        let started = std::time::Instant::now();
        assert_eq!(decide(&h, "k", "m").await, Decision::Allow);
        println!("decided in {:?}", started.elapsed());
        let pid: i32 = std::fs::read_to_string(&pidfile).expect("pid").trim().parse().expect("pid number");
        let mut gone = false;
        for _ in 0..50 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for a parent that is gone too.
            if stat.is_empty() || stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "the hook's background child {pid} is still running");
    }

    #[test]
    fn programs_are_found_as_a_shell_would() {
        assert!(find_program("sh").is_ok());
        assert!(find_program("/bin/sh").is_ok());
        let e = find_program("/usr/local/bin/my-policy-that-is-not-here").expect_err("missing");
        assert!(e.contains("does not exist"), "{e}");
        assert!(find_program("no-such-program-anywhere").is_err());
        let dir = tempfile::tempdir().expect("dir");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").expect("write");
        let e = find_program(&plain.display().to_string()).expect_err("not executable");
        assert!(e.contains("not an executable"), "{e}");
    }
}
