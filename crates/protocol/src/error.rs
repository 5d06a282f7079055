//! The error of a request in OpenClaw's shape (`{code, message, details?}`), its code as an enum,
//! and the `errorKind` a failed run's `chat` error carries: the one place that names them.

use serde::Serialize;
use serde_json::{json, Value};

/// An error response's `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request is wrong (its params, the session's state): sending it again will not help.
    InvalidRequest,
    /// The gateway cannot do it now (a busy session, a store failure, a provider error).
    Unavailable,
}

impl ErrorCode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::Unavailable => "UNAVAILABLE",
        }
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// An error in OpenClaw's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Box<Value>>,
}

impl RpcError {
    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError { code: ErrorCode::InvalidRequest, message: message.into(), details: None }
    }
    pub fn unavailable(message: impl Into<String>) -> RpcError {
        RpcError { code: ErrorCode::Unavailable, message: message.into(), details: None }
    }
    pub fn with_details(mut self, details: Value) -> RpcError {
        self.details = Some(Box::new(details));
        self
    }
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.details {
            e["details"] = (**d).clone();
        }
        e
    }
}

/// The `details` of the errors that carry some.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ErrorDetails<'a> {
    /// An approval that was decided before (`APPROVAL_ALREADY_RESOLVED`, with that decision) or is
    /// not known (`APPROVAL_NOT_FOUND`).
    Approval {
        reason: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        decision: Option<&'a str>,
    },
    /// A run that ended in an error (`agent.wait`).
    RunFailed {
        #[serde(rename = "runId")]
        run_id: &'a str,
        /// Always `error`.
        status: &'static str,
        summary: &'a str,
    },
}

/// Why a run failed, as its `chat` error's `errorKind` (and the `kind` label of
/// `pincer_turn_errors_total`): a provider's classification, or one of the gateway's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind<'a> {
    /// The provider's error class (`rate_limit`, `context_length`, `timeout`, …).
    Provider(&'a str),
    /// The turn could not be written (a full disk, a read-only file system).
    Persistence,
    /// The transcript moved under the turn (a leaf guard, a concurrent writer).
    Conflict,
    /// The turn's replica or process died before its reply was written.
    Interrupted,
    /// The `before_agent_run` hook could not decide (nothing was written).
    Hook,
    /// A bug: the run's task panicked.
    Internal,
}

impl ErrorKind<'_> {
    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorKind::Provider(kind) => kind,
            ErrorKind::Persistence => "persistence",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Hook => "hook",
            ErrorKind::Internal => "internal",
        }
    }
}

impl serde::Serialize for ErrorKind<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
