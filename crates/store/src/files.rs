//! The typed file operations the store offers besides transcripts: the state directory, the
//! session index, the gateway token, moving a transcript aside. Every other crate writes files
//! only through these and [`crate::Store`] (clippy's `disallowed-methods` in the workspace's
//! `clippy.toml` forbids the `std::fs`/`tokio::fs` writers outside this crate), so nothing can write
//! around the store's rules: private modes, temp file + fsync + rename, directory fsync.
//! Also the one incremental reader of a transcript's appended lines ([`read_appended`]).

use crate::fsutil;
use std::io;
use std::path::{Path, PathBuf};

/// Creates the state directory (and its parents) with mode 0700 where missing.
pub fn create_state_dir(dir: &Path) -> io::Result<()> {
    fsutil::create_private_dir(dir)
}

/// The name of the lock file a gateway holds in its state directory while it serves it.
pub const STATE_DIR_LOCK: &str = "gateway.lock";

/// The state directory, held by this process while the value lives (an exclusive `flock` on
/// `<dir>/gateway.lock`, released by the kernel when the process ends, even by SIGKILL).
pub struct StateDirLock {
    _file: std::fs::File,
}

/// Takes the state directory's lock, writing this process's id in the lock file. `Err(Ok(pid))`
/// when another process holds it (`pid`: what its file says, when readable); `Err(Err(e))` when
/// the lock file cannot be opened.
pub fn lock_state_dir(dir: &Path) -> Result<StateDirLock, io::Result<Option<u32>>> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(STATE_DIR_LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(Err)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(Ok(text.trim().parse().ok()));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(Err(e)),
    }
    // Only the holder writes it: the id of the process that serves the directory.
    let written = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id()));
    written.map_err(Err)?;
    Ok(StateDirLock { _file: file })
}

/// Creates the directory (0700) that the transcript or index at `path` goes in, where missing.
pub fn create_dir_for(path: &Path) -> io::Result<()> {
    fsutil::create_parent_dir(path)
}

/// Replaces an agent's session index (`sessions.json`) with `bytes`: 0600, atomically.
pub fn write_session_index(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fsutil::write_private_atomically(path, bytes)
}

/// Replaces the allow-always list of approvals (`approvals.json`) with `bytes`: 0600, atomically.
pub fn write_approvals(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fsutil::write_private_atomically(path, bytes)
}

/// Replaces a messaging channel's small state file (its read position) with `bytes`: 0600,
/// atomically (temp, fsync, rename, directory fsync), the directory made 0700 where missing.
pub fn write_channel_state(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fsutil::create_parent_dir(path)?;
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

/// The name [`archive_transcript`] gives a transcript archived now: `<path>.<reason>.<timestamp>`
/// (for every store backend).
pub fn archive_path(path: &Path, reason: &str) -> PathBuf {
    fsutil::with_suffix(path, &format!(".{reason}.{}", crate::rewrite::file_timestamp()))
}

/// Writes an imported transcript to `path`, which must not exist yet: a temp file (0600) written
/// and fsynced, then linked into place without replacing anything (an existing file is an
/// `AlreadyExists` error and is left alone), and the directory fsynced.
pub fn import_transcript(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fsutil::write_private_new(path, bytes)
}

/// Creates an empty private file (0600) at `path` if there is none (the search index database,
/// whose journal files SQLite then creates with the same mode).
pub fn create_private_file(path: &Path) -> io::Result<()> {
    fsutil::create_parent_dir(path)?;
    fsutil::touch_private(path)
}

/// What [`read_appended`] found: the whole lines from the offset asked for, and the file's
/// identity so a caller can tell a replaced file (repair, archive) from a grown one.
pub struct AppendedLines {
    /// Complete lines (each ending in `\n`) starting at the offset; a last line still being
    /// written is left for the next read.
    pub bytes: Vec<u8>,
    /// Offset just past `bytes`.
    pub end: u64,
    /// `(dev, ino)` of the file.
    pub ident: (u64, u64),
    /// Its length now.
    pub len: u64,
}

/// Reads the complete lines of a transcript from `offset` on (`None` when there is no file). An
/// offset past the end reads nothing (the caller sees `len < offset` and starts over).
pub fn read_appended(path: &Path, offset: u64) -> io::Result<Option<AppendedLines>> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    let (ident, len) = ((meta.dev(), meta.ino()), meta.len());
    if offset >= len {
        return Ok(Some(AppendedLines { bytes: Vec::new(), end: offset.min(len), ident, len }));
    }
    f.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::with_capacity((len - offset) as usize);
    f.take(len - offset).read_to_end(&mut bytes)?;
    let whole = memchr::memrchr(b'\n', &bytes).map_or(0, |p| p + 1);
    bytes.truncate(whole);
    Ok(Some(AppendedLines { end: offset + whole as u64, bytes, ident, len }))
}

/// Writes an export (`pincer transcript export --output`) to `path`, which must not exist
/// (0600, fsynced; an existing file is an `AlreadyExists` error and is left as it is).
pub fn write_export(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fsutil::write_private_new(path, bytes)
}

/// Removes the temp files that writes killed midway (an import, a repair, a compaction's rewrite,
/// `sessions.json`, the token) left in a state directory: in the directory itself and in each
/// agent's `sessions/`. Only files named exactly as the store names its temp files, unlocked, of a
/// writer process that is gone ([`fsutil::remove_stale_temps`]); returns them.
pub fn remove_stale_temps(state_dir: &Path) -> Vec<PathBuf> {
    let mut removed = fsutil::remove_stale_temps(state_dir, None);
    for agent in std::fs::read_dir(state_dir.join("agents")).into_iter().flatten().flatten() {
        removed.extend(fsutil::remove_stale_temps(&agent.path().join("sessions"), None));
    }
    removed
}

/// [`remove_stale_temps`] for the temp files of one file (`<path>.tmp.*`), beside it: what an
/// earlier, killed rewrite of it left (`pincer transcript repair` calls it before it rewrites).
pub fn remove_stale_temps_of(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    fsutil::remove_stale_temps(if dir.as_os_str().is_empty() { Path::new(".") } else { dir }, Some(name))
}
