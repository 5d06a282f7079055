//! File writes that are not transcript appends, kept here so the store stays the only code in
//! Pincer that writes files: small private files replaced atomically (`sessions.json`, the gateway
//! token) and transcripts moved aside when a session is reset or deleted (never deleted).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` (and its parents) with mode 0700 where missing.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Creates the directory a file goes in (0700) where missing.
pub fn create_parent_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => create_private_dir(d),
        _ => Ok(()),
    }
}

/// Makes a rename or a new file in `path`'s directory durable.
pub fn sync_parent_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => File::open(d)?.sync_all(),
        _ => Ok(()),
    }
}

/// `path` with `suffix` appended to its file name (`a.jsonl` → `a.jsonl.lock`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Writes `bytes` to a new temp file beside `path` (0600) and fsyncs it; returns its path.
fn write_temp(path: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    create_parent_dir(path)?;
    let tmp = with_suffix(path, &format!(".tmp.{}.{}", std::process::id(), crate::ids::short_id()));
    let res = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    match res {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Replaces `path` with `bytes` (mode 0600): temp file, fsync, rename, directory fsync.
pub fn write_private_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = write_temp(path, bytes)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_parent_dir(path)
}

/// Writes a new file at `path` (0600) that must not exist: temp file, fsync, hard link into
/// place (fails with `AlreadyExists` rather than replacing anything), temp removed, directory fsync.
pub fn write_private_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = write_temp(path, bytes)?;
    let res = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    res?;
    sync_parent_dir(path)
}

/// Creates `path` empty with mode 0600 unless it exists (whatever its content).
pub fn touch_private(path: &Path) -> std::io::Result<()> {
    match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(f) => {
            f.sync_all()?;
            sync_parent_dir(path)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Moves a transcript aside as `<path>.<reason>.<timestamp>` (OpenClaw's archive names). Returns the
/// new path, or `None` when there was nothing to move.
pub fn archive(path: &Path, reason: &str) -> std::io::Result<Option<PathBuf>> {
    if !path.exists() {
        return Ok(None);
    }
    let target = crate::files::archive_path(path, reason);
    if target.exists() {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{} exists", target.display())));
    }
    std::fs::rename(path, &target)?;
    sync_parent_dir(path)?;
    Ok(Some(target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_private_write_and_archive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a/b/sessions.json");
        write_private_atomically(&p, b"{}").expect("write");
        write_private_atomically(&p, b"{\"x\":1}").expect("rewrite");
        assert_eq!(std::fs::read(&p).expect("read"), b"{\"x\":1}");
        assert_eq!(std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(p.parent().expect("dir")).expect("ls").count(), 1, "no temp files left");
        let moved = archive(&p, "reset").expect("archive").expect("moved");
        assert!(!p.exists());
        assert!(moved.to_string_lossy().contains("sessions.json.reset."));
        assert_eq!(archive(&p, "reset").expect("nothing"), None);
    }
}
