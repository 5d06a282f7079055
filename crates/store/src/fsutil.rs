//! File writes that are not transcript appends, kept here so the store stays the only code in
//! Pincer that writes files: small private files replaced atomically (`sessions.json`, the gateway
//! token) and transcripts moved aside when a session is reset or deleted (never deleted).
//!
//! Every temp + rename (or link) write goes through [`create_temp`]: the temp file is
//! `<name>.tmp.<pid>.<8 hex digits>` beside its target, and its writer holds an exclusive `flock`
//! on it until it is in place. [`remove_stale_temps`] removes what a killed writer left: files of
//! exactly that name whose lock nobody holds and whose writer process is gone.

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

/// The infix of a temp file's name: `<name>.tmp.<pid>.<id>`.
const TEMP_INFIX: &str = ".tmp.";
/// A temp file unlocked for this long is a leftover even when a process of its pid is alive (the
/// pid was reused): a writer writes, fsyncs and renames without pausing that long.
const TEMP_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Creates the temp file (0600, new) a write of `path` goes through, `<path>.tmp.<pid>.<id>`,
/// locked (`flock`, exclusive) for as long as the returned file is open, so a cleanup never takes
/// a live write's temp file for a leftover.
pub(crate) fn create_temp(path: &Path) -> std::io::Result<(PathBuf, File)> {
    let tmp = with_suffix(path, &format!("{TEMP_INFIX}{}.{}", std::process::id(), crate::ids::short_id()));
    let f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    if let Err(e) = f.lock() {
        drop(f);
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok((tmp, f))
}

/// The file name a temp file of [`create_temp`] was made for and its writer's pid, when `name` is
/// exactly such a name (`<base>.tmp.<decimal pid>.<8 lowercase hex digits>`, base not empty).
pub(crate) fn temp_name_parts(name: &str) -> Option<(&str, u32)> {
    let (rest, id) = name.rsplit_once('.')?;
    if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let (base, pid) = rest.rsplit_once(TEMP_INFIX)?;
    if base.is_empty() || pid.is_empty() || pid.len() > 10 || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, pid.parse().ok()?))
}

/// Removes from `dir` the temp files killed writes left (of the file named `base` only, when
/// given): regular files named exactly as [`create_temp`] names them, whose lock no writer holds,
/// and whose writer process is gone (or that nobody touched for [`TEMP_STALE_AFTER`]). Nothing
/// else is touched (not symlinks, directories, other names, nor a temp a live writer holds).
/// Returns the files removed.
pub fn remove_stale_temps(dir: &Path, base: Option<&str>) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some((of, pid)) = name.to_str().and_then(temp_name_parts) else { continue };
        if base.is_some_and(|b| b != of) {
            continue;
        }
        let path = entry.path();
        if is_stale_temp(&path, pid) {
            removed.push(path);
        }
    }
    removed
}

/// Removes the temp file `path` (of writer `pid`) when it is a leftover; true when it was.
fn is_stale_temp(path: &Path, pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if !meta.file_type().is_file() {
        return false;
    }
    let Ok(file) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) else {
        return false;
    };
    // A live writer holds the lock until its temp is in place.
    if file.try_lock().is_err() {
        return false;
    }
    let idle = meta.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|d| d >= TEMP_STALE_AFTER);
    if crate::lock::process_alive(pid) && !idle {
        return false;
    }
    // Only the file inspected (not one that took its name meanwhile).
    let same = file.metadata().is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
    same && std::fs::remove_file(path).is_ok()
}

/// Writes `bytes` to a new temp file beside `path` (0600) and fsyncs it; returns its path and the
/// open file, whose lock marks the write as live until it is dropped.
fn write_temp(path: &Path, bytes: &[u8]) -> std::io::Result<(PathBuf, File)> {
    create_parent_dir(path)?;
    let (tmp, mut f) = create_temp(path)?;
    match f.write_all(bytes).and_then(|()| f.sync_all()) {
        Ok(()) => Ok((tmp, f)),
        Err(e) => {
            drop(f);
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Replaces `path` with `bytes` (mode 0600): temp file, fsync, rename, directory fsync.
pub fn write_private_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (tmp, _live) = write_temp(path, bytes)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_parent_dir(path)
}

/// Writes a new file at `path` (0600) that must not exist: temp file, fsync, hard link into
/// place (fails with `AlreadyExists` rather than replacing anything), temp removed, directory fsync.
pub fn write_private_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (tmp, live) = write_temp(path, bytes)?;
    let res = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    drop(live);
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
    fn temp_names_are_recognized_exactly_and_live_ones_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (tmp, live) = create_temp(&dir.path().join("s.jsonl")).expect("temp");
        let name = tmp.file_name().and_then(|n| n.to_str()).expect("name");
        assert_eq!(temp_name_parts(name), Some(("s.jsonl", std::process::id())));
        for other in ["s.jsonl.tmp.1.ABCDEF01", "s.jsonl.tmp.1.abcdef0", "s.jsonl.tmp..abcdef01", ".tmp.1.abcdef01"] {
            assert_eq!(temp_name_parts(other), None, "{other}");
        }
        assert_eq!(temp_name_parts("a.tmp.b.tmp.42.0123abcd"), Some(("a.tmp.b", 42)));
        // Ours and locked: kept even when it is old; unlocked and old: a leftover.
        let old = std::time::SystemTime::now() - TEMP_STALE_AFTER - std::time::Duration::from_secs(1);
        std::fs::File::options().write(true).open(&tmp).and_then(|f| f.set_modified(old)).expect("age");
        assert!(remove_stale_temps(dir.path(), None).is_empty());
        drop(live);
        assert_eq!(remove_stale_temps(dir.path(), Some("other.jsonl")), Vec::<PathBuf>::new());
        assert_eq!(remove_stale_temps(dir.path(), Some("s.jsonl")), vec![tmp]);
    }

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
