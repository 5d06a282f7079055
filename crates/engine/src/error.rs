//! The engine's errors, typed so callers can tell them apart: [`GatewayError`] (starting,
//! configuration) and [`EngineError`] (a request refused or failed), with the one mapping of the
//! latter to the wire.

use crate::protocol::{ErrorCode, ErrorKind, RpcError};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the gateway could not start or a turn could not read its session.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// `pincer.toml`, the environment or the command line asked for something invalid.
    #[error("{0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("{}: cannot create the state directory: {source}", path.display())]
    StateDir { path: PathBuf, source: std::io::Error },
    /// Another gateway serves the JSONL state directory.
    #[error(
        "{}: another pincer gateway{} is serving this state directory; run one gateway per JSONL state directory (several replicas share a PostgreSQL store: [store] backend = \"postgres\")",
        path.display(),
        pid.map_or(String::new(), |p| format!(" (pid {p})"))
    )]
    StateDirInUse { path: PathBuf, pid: Option<u32> },
    /// The transcript could not be read or its leaf not found.
    #[error(transparent)]
    Store(#[from] pincer_store::StoreError),
    /// A blocking worker task panicked or was cancelled.
    #[error("{what} task failed: {source}")]
    Task { what: &'static str, source: tokio::task::JoinError },
}

/// Why an engine call was refused or failed, one variant per cause a caller tells apart (the
/// OpenAI adapter answers a busy session with 429, a turn's `chat` error names its kind). The one
/// mapping to the wire: [`EngineError::code`] (an RPC error's `code`), [`EngineError::kind`] (a
/// failed turn's `errorKind`) and `From<EngineError> for RpcError` (with `details` where the cause
/// has them). Every variant's text is the message the client reads.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The request is wrong (a malformed parameter, a name that is not allowed, an operation the
    /// session's state forbids): sending it again will not help.
    #[error("{0}")]
    Invalid(String),
    /// What the request names does not exist: a session, an entry, an agent.
    #[error("{0}")]
    NotFound(String),
    /// The session moved under the request (its leaf is elsewhere, it was reset or deleted
    /// meanwhile): nothing was written; reload and send again.
    #[error("{0}")]
    Conflict(String),
    /// The session is busy (a turn runs, its queue is full): send again when it has finished.
    #[error("{0}")]
    Busy(String),
    /// The store could not read or write: nothing of the request was acknowledged.
    #[error("{0}")]
    Persistence(String),
    /// The gateway cannot serve it now (shutting down, the other replicas unreachable, the answer
    /// budget spent).
    #[error("{0}")]
    Unavailable(String),
    /// A bug: a task of the engine panicked.
    #[error("{0}")]
    Internal(String),
    /// The approval was decided before (by `by`, as `decision`).
    #[error("approval already resolved: {id} was already decided ({decision} by {by})")]
    ApprovalResolved { id: String, decision: String, by: String },
    /// No pending approval has this id (never had, decided and forgotten, or expired).
    #[error("unknown or expired approval id: {id}")]
    ApprovalNotFound { id: String },
    /// The turn ran and failed (a provider error, a write that failed mid-turn): its `chat` error
    /// event said so with `kind`.
    #[error("{summary}")]
    RunFailed { run_id: String, summary: String },
}

impl EngineError {
    /// [`EngineError::Invalid`].
    pub fn invalid(message: impl Into<String>) -> EngineError {
        EngineError::Invalid(message.into())
    }

    /// A store failure that cost a turn what it was writing: the text its `chat` error carries
    /// names the cause a person can act on (a full disk, a read-only file system) before the
    /// store's own error.
    pub fn unsaved(e: &pincer_store::StoreError) -> EngineError {
        EngineError::Persistence(format!("the turn could not be saved ({}): {e}", store_cause(e)))
    }

    /// A blocking task of the engine that panicked or was cancelled.
    pub fn task(e: tokio::task::JoinError) -> EngineError {
        EngineError::Internal(format!("task failed: {e}"))
    }

    /// The RPC error's `code`: the request itself is wrong, or the gateway cannot do it now.
    pub fn code(&self) -> ErrorCode {
        match self {
            EngineError::Invalid(_)
            | EngineError::NotFound(_)
            | EngineError::Conflict(_)
            | EngineError::ApprovalResolved { .. }
            | EngineError::ApprovalNotFound { .. } => ErrorCode::InvalidRequest,
            EngineError::Busy(_)
            | EngineError::Persistence(_)
            | EngineError::Unavailable(_)
            | EngineError::Internal(_)
            | EngineError::RunFailed { .. } => ErrorCode::Unavailable,
        }
    }

    /// The `errorKind` of a turn that ends with this error: the store failed (`persistence`), a
    /// task panicked (`internal`), or the request no longer fits the session (`conflict`).
    pub fn kind(&self) -> ErrorKind<'static> {
        match self {
            EngineError::Persistence(_) | EngineError::Unavailable(_) | EngineError::Busy(_) => ErrorKind::Persistence,
            EngineError::Internal(_) => ErrorKind::Internal,
            _ => ErrorKind::Conflict,
        }
    }
}

impl From<EngineError> for RpcError {
    fn from(e: EngineError) -> RpcError {
        use crate::protocol::ErrorDetails;
        let details = match &e {
            EngineError::ApprovalResolved { decision, .. } => {
                Some(ErrorDetails::Approval { reason: "APPROVAL_ALREADY_RESOLVED", decision: Some(decision) })
            }
            EngineError::ApprovalNotFound { .. } => {
                Some(ErrorDetails::Approval { reason: "APPROVAL_NOT_FOUND", decision: None })
            }
            EngineError::RunFailed { run_id, summary } => {
                Some(ErrorDetails::RunFailed { run_id, status: "error", summary })
            }
            _ => None,
        };
        let details = details.map(|d| Box::new(serde_json::to_value(d).unwrap_or_default()));
        RpcError { code: e.code(), message: e.to_string(), details }
    }
}

/// What a person can do something about in a store failure.
fn store_cause(e: &pincer_store::StoreError) -> &'static str {
    use std::io::ErrorKind as K;
    match e {
        pincer_store::StoreError::Io { source, .. } => match source.kind() {
            K::StorageFull => "the disk is full",
            K::ReadOnlyFilesystem => "the file system is read-only",
            K::PermissionDenied => "permission denied",
            _ => "an I/O error",
        },
        _ => "a store error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wire(e: EngineError) -> serde_json::Value {
        RpcError::from(e).to_json()
    }

    #[test]
    fn each_cause_has_the_code_clients_have_always_read() {
        let m = || "why".to_owned();
        for (e, code) in [
            (EngineError::Invalid(m()), "INVALID_REQUEST"),
            (EngineError::NotFound(m()), "INVALID_REQUEST"),
            (EngineError::Conflict(m()), "INVALID_REQUEST"),
            (EngineError::Busy(m()), "UNAVAILABLE"),
            (EngineError::Persistence(m()), "UNAVAILABLE"),
            (EngineError::Unavailable(m()), "UNAVAILABLE"),
            (EngineError::Internal(m()), "UNAVAILABLE"),
        ] {
            assert_eq!(wire(e.clone()), json!({"code": code, "message": "why"}), "{e:?}");
        }
    }

    #[test]
    fn approvals_and_failed_runs_carry_their_details() {
        let resolved = EngineError::ApprovalResolved { id: "a1".into(), decision: "deny".into(), by: "cli".into() };
        assert_eq!(
            wire(resolved),
            json!({"code": "INVALID_REQUEST", "message": "approval already resolved: a1 was already decided (deny by cli)",
                "details": {"reason": "APPROVAL_ALREADY_RESOLVED", "decision": "deny"}})
        );
        assert_eq!(
            wire(EngineError::ApprovalNotFound { id: "zz".into() }),
            json!({"code": "INVALID_REQUEST", "message": "unknown or expired approval id: zz",
                "details": {"reason": "APPROVAL_NOT_FOUND"}})
        );
        assert_eq!(
            wire(EngineError::RunFailed { run_id: "r1".into(), summary: "the provider said no".into() }),
            json!({"code": "UNAVAILABLE", "message": "the provider said no",
                "details": {"runId": "r1", "status": "error", "summary": "the provider said no"}})
        );
    }

    #[test]
    fn a_turn_ended_by_an_error_names_its_kind() {
        let full = pincer_store::StoreError::Io {
            path: "/s/t.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        let unsaved = EngineError::unsaved(&full);
        assert_eq!(unsaved.kind(), ErrorKind::Persistence);
        assert!(unsaved.to_string().starts_with("the turn could not be saved (the disk is full): "), "{unsaved}");
        assert_eq!(EngineError::Conflict("moved".into()).kind(), ErrorKind::Conflict);
        assert_eq!(EngineError::Internal("panicked".into()).kind(), ErrorKind::Internal);
    }
}
