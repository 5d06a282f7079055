//! The typed file operations the store offers besides transcripts: the state directory, the
//! session index, the gateway token, moving a transcript aside. Every other crate writes files
//! only through these and [`crate::Store`] (clippy's `disallowed-methods` in the workspace's
//! `clippy.toml` forbids the `std::fs`/`tokio::fs` writers outside this crate), so nothing can write
//! around the store's rules: private modes, temp file + fsync + rename, directory fsync.

use crate::fsutil;
use std::io;
use std::path::{Path, PathBuf};

/// Creates the state directory (and its parents) with mode 0700 where missing.
pub fn create_state_dir(dir: &Path) -> io::Result<()> {
    fsutil::create_private_dir(dir)
}

/// Creates the directory (0700) that the transcript or index at `path` goes in, where missing.
pub fn create_dir_for(path: &Path) -> io::Result<()> {
    fsutil::create_parent_dir(path)
}

/// Replaces an agent's session index (`sessions.json`) with `bytes`: 0600, atomically.
pub fn write_session_index(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fsutil::write_private_atomically(path, bytes)
}

/// Writes the gateway token file (0600, atomically), the token on one line.
pub fn write_token_file(path: &Path, token: &str) -> io::Result<()> {
    fsutil::write_private_atomically(path, format!("{token}\n").as_bytes())
}

/// Moves a transcript aside as `<path>.<reason>.<timestamp>` (OpenClaw's archive names; nothing is
/// ever deleted). Returns the new path, or `None` when there was no file.
pub fn archive_transcript(path: &Path, reason: &str) -> io::Result<Option<PathBuf>> {
    fsutil::archive(path, reason)
}
