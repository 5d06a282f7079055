//! The gateway's own errors (starting, configuration, reading a transcript for a turn), typed so
//! callers can tell them apart; RPC methods answer with [`crate::protocol::RpcError`] instead.

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

/// `errorKind` and a user-facing cause for a failed transcript write.
pub fn persist_failure(e: &pincer_store::StoreError) -> (crate::protocol::ErrorKind<'static>, String) {
    use std::io::ErrorKind as K;
    let why = match e {
        pincer_store::StoreError::Io { source, .. } => match source.kind() {
            K::StorageFull => "the disk is full",
            K::ReadOnlyFilesystem => "the file system is read-only",
            K::PermissionDenied => "permission denied",
            _ => "an I/O error",
        },
        _ => "a store error",
    };
    (crate::protocol::ErrorKind::Persistence, format!("the turn could not be saved ({why}): {e}"))
}
