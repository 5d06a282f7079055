//! The `before_agent_run` hook: an external command that sees the user's message before anything is
//! written or shown, and allows it or blocks it (optionally with a replacement). It gets
//! `{"sessionKey","message"}` on stdin and answers `{"outcome":"allow"}` or
//! `{"outcome":"block","reason":"…","message":"replacement"?}` on stdout. A hook that fails to start,
//! crashes, times out or answers anything else blocks the message (fails closed).

use crate::config::HookConfig;
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Block { reason: String, replacement: Option<String> },
}

fn closed(reason: String) -> Decision {
    tracing::warn!("before_agent_run hook failed closed: {reason}");
    Decision::Block { reason, replacement: None }
}

pub async fn decide(h: &HookConfig, session_key: &str, message: &str) -> Decision {
    let Some((program, args)) = h.command.split_first() else {
        return closed("the hook command is empty".into());
    };
    let timeout = Duration::from_millis(h.timeout_ms.unwrap_or(10_000));
    let mut child = match tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return closed(format!("the hook could not start: {e}")),
    };
    let input = json!({"sessionKey": session_key, "message": message}).to_string();
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes()).await.map_err(|e| format!("writing to the hook: {e}"))?;
        }
        let mut out = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            stdout.take(1024 * 1024).read_to_end(&mut out).await.map_err(|e| format!("reading the hook: {e}"))?;
        }
        let status = child.wait().await.map_err(|e| format!("waiting for the hook: {e}"))?;
        if !status.success() {
            return Err(format!("the hook exited with {status}"));
        }
        Ok(out)
    };
    let out = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return closed(e),
        Err(_) => return closed(format!("the hook did not answer within {} ms", timeout.as_millis())),
    };
    let Ok(v) = serde_json::from_slice::<Value>(&out) else {
        return closed("the hook's answer is not JSON".into());
    };
    match v.get("outcome").and_then(Value::as_str) {
        Some("allow") => Decision::Allow,
        Some("block") => Decision::Block {
            reason: v.get("reason").and_then(Value::as_str).unwrap_or("blocked by policy").to_owned(),
            replacement: v.get("message").and_then(Value::as_str).map(str::to_owned),
        },
        _ => closed("the hook's answer has no outcome \"allow\" or \"block\"".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> HookConfig {
        HookConfig { command: vec!["sh".into(), "-c".into(), script.into()], timeout_ms: Some(2000) }
    }

    #[tokio::test]
    async fn decisions_and_failing_closed() {
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
            assert!(matches!(decide(&sh(bad), "k", "m").await, Decision::Block { .. }), "{bad}");
        }
        let missing = HookConfig { command: vec!["/nonexistent/hook".into()], timeout_ms: None };
        assert!(matches!(decide(&missing, "k", "m").await, Decision::Block { .. }));
    }
}
