//! Stopping a session's runs wherever they run: the one way every entry point takes (`chat.abort`,
//! a `/stop` message from any client or channel, `sessions.abort`, and `sessions.reset` /
//! `sessions.delete` before they move the transcript aside). This process's runs are cancelled at
//! once; on the PostgreSQL store, the runs other replicas hold are flagged in the `runs` table and
//! their replicas woken (`pg_notify`), which cancel them as their own. Each cancelled run writes
//! its aborted partial once and announces its end, as a local abort does.

use crate::error::EngineError;
use crate::state::Engine;

/// Aborts the runs of session `session_key` (only `run_id` when given), with `origin` recorded on
/// the local ones' partials; returns the ids of the runs found running, here or on another replica.
/// Fails only when the other replicas' runs could not be reached.
pub async fn abort(
    gw: &Engine,
    session_key: &str,
    run_id: Option<&str>,
    origin: &'static str,
) -> Result<Vec<String>, EngineError> {
    let mut ids = Vec::new();
    for r in gw.runs_of(session_key) {
        if run_id.is_none_or(|id| id == r.run_id) && !r.cancel.is_cancelled() {
            r.abort(origin);
            ids.push(r.run_id.clone());
        }
    }
    // A run found here is not looked for elsewhere; a whole session's runs may be anywhere.
    if let Some(pg) = gw.pg.as_ref().filter(|_| run_id.is_none() || ids.is_empty()) {
        let remote = pg
            .request_abort(session_key.to_owned(), run_id.map(str::to_owned), origin.to_owned())
            .await
            .map_err(|e| EngineError::Unavailable(format!("cannot reach the other replicas' runs: {e}")))?;
        for id in remote {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// [`abort`] of every run of session `session_key` before its transcript is moved aside
/// (`sessions.reset`, `sessions.delete`): their partials are written, as any abort's, but a run
/// stopped before any reply marks nothing there ([`crate::state::RunHandle::moving_aside`]).
pub async fn abort_to_move(gw: &Engine, session_key: &str) -> Result<Vec<String>, EngineError> {
    for r in gw.runs_of(session_key) {
        r.moving_aside.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    abort(gw, session_key, None, "rpc").await
}

/// Why runs are stopped: the `origin` of an aborted partial and the `stopReason` of its event.
pub const ORIGINS: [&str; 3] = ["rpc", "stop-command", "shutdown"];

/// `name` as one of [`ORIGINS`]; `rpc` for anything else (a request from an older replica).
pub fn origin_named(name: &str) -> &'static str {
    ORIGINS.into_iter().find(|o| *o == name).unwrap_or("rpc")
}
