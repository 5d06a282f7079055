//! The agent's workspace: the one directory its file tools may touch. [`Workspace::resolve`] turns a
//! model-given path into a real path inside it (absolute paths, `..` and symlinks leading outside are
//! refused with an error naming the path), and [`Workspace::write`] is the only place the tools write.
//!
//! Why this module writes files itself rather than through `pincer-store` (clippy's
//! `disallowed-methods` keep std's file writers in the store): the store's rules are for Pincer's own
//! transcripts (append-only JSONL, locks, redaction); the workspace holds the *user's* files, which the
//! agent creates and overwrites as a user would with an editor. Keeping the writes here, in one small
//! function with a local allow, keeps the rule checkable: nothing else in the agent writes. Each write
//! goes to a temporary file beside the target and is renamed over it, so an interrupted write never
//! leaves a half-written file; writes to one file are serialised ([`Workspace::lock`]).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::ToolError;

/// A workspace directory shared by the tools of one agent.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    /// One lock per real path being written (Pi's `withFileMutationQueue`).
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Workspace {
    /// The workspace at `root` (created when a tool first needs it).
    pub fn new(root: impl Into<PathBuf>) -> Arc<Workspace> {
        Arc::new(Workspace { root: root.into(), locks: Mutex::new(HashMap::new()) })
    }

    /// The configured directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of the workspace, created if missing.
    pub(crate) async fn real_root(&self) -> Result<PathBuf, ToolError> {
        tokio::fs::create_dir_all(&self.root)
            .await
            .and(tokio::fs::canonicalize(&self.root).await)
            .map_err(|e| ToolError::failed(format!("workspace {} is not available: {e}", self.root.display())))
    }

    /// The real path of `path` (relative to the workspace), which may not exist yet: its deepest
    /// existing ancestor is resolved (every symlink followed) and must lie inside the workspace, and
    /// the rest may not contain `..`. An empty path or `.` is the workspace itself.
    pub async fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let rel = Path::new(path);
        if rel.is_absolute() {
            return Err(ToolError::failed(format!(
                "{path}: absolute paths are refused; give a path relative to the workspace"
            )));
        }
        let root = self.real_root().await?;
        let outside = || ToolError::failed(format!("{path}: refused, it resolves outside the workspace"));
        let mut existing = root.join(rel);
        let mut rest = Vec::new();
        let real = loop {
            match tokio::fs::canonicalize(&existing).await {
                Ok(real) => break real,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // A dangling symlink is refused rather than written through.
                    if tokio::fs::symlink_metadata(&existing).await.is_ok() {
                        return Err(outside());
                    }
                    let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                        return Err(outside());
                    };
                    rest.push(name.to_owned());
                    existing = parent.to_path_buf();
                }
                Err(e) => return Err(ToolError::failed(format!("{path}: {e}"))),
            }
        };
        if !real.starts_with(&root) {
            return Err(outside());
        }
        let mut out = real;
        for name in rest.iter().rev() {
            if Path::new(name).components().any(|c| !matches!(c, Component::Normal(_))) {
                return Err(outside());
            }
            out.push(name);
        }
        Ok(out)
    }

    /// Like [`Workspace::resolve`], for a path that must exist.
    pub async fn resolve_existing(&self, path: &str) -> Result<PathBuf, ToolError> {
        let real = self.resolve(path).await?;
        match tokio::fs::metadata(&real).await {
            Ok(_) => Ok(real),
            Err(e) => Err(ToolError::failed(format!("{path}: {e}"))),
        }
    }

    /// The write lock of one real path: held across a read-modify-write so that concurrent `edit`s
    /// and `write`s of one file do not lose each other's changes.
    pub fn lock(&self, real: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(real.to_path_buf()).or_default().clone()
    }

    /// Writes `bytes` to `real` (a path from [`Workspace::resolve`]), creating parent directories:
    /// through a temporary file in the same directory, synced and renamed over the target, keeping
    /// an existing file's permissions.
    #[allow(clippy::disallowed_methods, clippy::disallowed_types)] // the workspace is the user's files; see the module doc
    pub async fn write(&self, real: &Path, bytes: Vec<u8>) -> std::io::Result<()> {
        let real = real.to_path_buf();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let dir = real.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
            std::fs::create_dir_all(dir)?;
            let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let tmp = dir.join(format!(".{name}.pincer-{}.tmp", uuid::Uuid::new_v4().simple()));
            let result = (|| {
                let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
                f.write_all(&bytes)?;
                if let Ok(meta) = std::fs::metadata(&real) {
                    f.set_permissions(meta.permissions())?;
                }
                f.sync_all()?;
                std::fs::rename(&tmp, &real)
            })();
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result
        })
        .await
        .map_err(std::io::Error::other)?
    }
}
