//! The only ways a transcript is ever changed other than by appending: an atomic replacement (temp
//! file + fsync + rename + directory fsync, keeping a backup) and cutting a torn last line (saved
//! beside the file first).

use crate::fsutil::{create_temp, sync_parent_dir, with_suffix};
use crate::ids::now_iso;
use crate::StoreError;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io { path: path.display().to_string(), source }
}

/// `<ISO time with ':' and '.' made file-safe>`, as OpenClaw names archives.
pub fn file_timestamp() -> String {
    now_iso().replace(':', "-")
}

/// Replaces `path` with `content` atomically and durably; the old file is kept as
/// `<path>.bak.<timestamp>` (returned). Temp files an earlier, killed rewrite of `path` left beside
/// it are removed first ([`crate::files::remove_stale_temps_of`]).
pub fn replace_atomically(path: &Path, content: &[u8]) -> Result<PathBuf, StoreError> {
    // What an earlier rewrite of this file left when it was killed goes first.
    crate::files::remove_stale_temps_of(path);
    let (tmp, mut f) = create_temp(path).map_err(|e| io_err(path, e))?;
    let result = (|| {
        f.write_all(content).map_err(|e| io_err(&tmp, e))?;
        f.sync_all().map_err(|e| io_err(&tmp, e))?;
        let mut backup = with_suffix(path, &format!(".bak.{}", file_timestamp()));
        while backup.exists() {
            backup = with_suffix(path, &format!(".bak.{}.{}", file_timestamp(), crate::ids::short_id()));
        }
        if std::fs::hard_link(path, &backup).is_err() {
            std::fs::copy(path, &backup).map_err(|e| io_err(&backup, e))?;
            File::open(&backup).and_then(|f| f.sync_all()).map_err(|e| io_err(&backup, e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
        sync_parent(path)?;
        Ok(backup)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    drop(f);
    result
}

fn sync_parent(path: &Path) -> Result<(), StoreError> {
    sync_parent_dir(path).map_err(|e| io_err(path, e))
}

/// Removes an interrupted last line (bytes `at..len`) before appending, after saving those bytes
/// to `<path>.torn.<timestamp>`: no acknowledged write is ever in them, but nothing is thrown away.
/// `file` must be open for writing. One side file per torn tail: nothing is saved for an empty
/// tail, an existing `<path>.torn.*` with the same bytes is reused, and a side file that could not
/// be written completely (a full disk) is removed again before the error is returned, so retries do
/// not leave a trail of empty or partial copies. The tail is cut only once its copy is durable.
pub fn cut_torn_tail(path: &Path, file: &File, at: u64, len: u64) -> Result<(), StoreError> {
    if len > at {
        let mut frag = vec![0u8; (len - at) as usize];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut frag, at).map_err(|e| io_err(path, e))?;
        if !saved_already(path, &frag) {
            save_torn(path, &frag)?;
        }
    }
    file.set_len(at).map_err(|e| io_err(path, e))?;
    file.sync_all().map_err(|e| io_err(path, e))?;
    sync_parent(path)
}

/// Writes `frag` to a new `<path>.torn.<timestamp>`; on failure nothing of it is left.
fn save_torn(path: &Path, frag: &[u8]) -> Result<(), StoreError> {
    let mut side = with_suffix(path, &format!(".torn.{}", file_timestamp()));
    while side.exists() {
        side = with_suffix(path, &format!(".torn.{}.{}", file_timestamp(), crate::ids::short_id()));
    }
    let mut f =
        OpenOptions::new().write(true).create_new(true).mode(0o600).open(&side).map_err(|e| io_err(&side, e))?;
    let written = f.write_all(frag).and_then(|_| f.sync_all()).and_then(|_| sync_parent_dir(&side));
    if let Err(e) = written {
        drop(f);
        let _ = std::fs::remove_file(&side);
        return Err(io_err(&side, e));
    }
    Ok(())
}

/// Whether a `<path>.torn.*` beside `path` already holds exactly `frag` (an earlier attempt saved
/// it and then failed to cut the tail).
fn saved_already(path: &Path, frag: &[u8]) -> bool {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return false };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let mut prefix = name.to_os_string();
    prefix.push(".torn.");
    let prefix = prefix.as_encoded_bytes().to_vec();
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        e.file_name().as_encoded_bytes().starts_with(&prefix)
            && e.metadata().is_ok_and(|m| m.is_file() && m.len() == frag.len() as u64)
            && std::fs::read(e.path()).is_ok_and(|b| b == frag)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn torn_copies(dir: &Path) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("s.jsonl.torn."))
            .map(|e| std::fs::read(e.path()).expect("read"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn one_copy_per_torn_tail_and_none_for_an_empty_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let head = b"{\"type\":\"session\",\"version\":3,\"id\":\"s\"}\n";
        let torn = b"{\"type\":\"mess";
        let open = || OpenOptions::new().read(true).write(true).open(&path).expect("open");
        // An earlier attempt saved the same bytes (and then failed to cut): no second copy.
        std::fs::write(&path, [&head[..], torn].concat()).expect("write");
        std::fs::write(with_suffix(&path, ".torn.earlier"), torn).expect("write");
        cut_torn_tail(&path, &open(), head.len() as u64, (head.len() + torn.len()) as u64).expect("cut");
        assert_eq!(std::fs::read(&path).expect("read"), head);
        assert_eq!(torn_copies(dir.path()), vec![torn.to_vec()]);
        // Different bytes get their own copy.
        std::fs::write(&path, [&head[..], b"{\"other"].concat()).expect("write");
        cut_torn_tail(&path, &open(), head.len() as u64, head.len() as u64 + 7).expect("cut");
        assert_eq!(torn_copies(dir.path()), vec![b"{\"other".to_vec(), torn.to_vec()]);
        // Nothing to save: no empty copy.
        cut_torn_tail(&path, &open(), head.len() as u64, head.len() as u64).expect("cut");
        assert_eq!(torn_copies(dir.path()).len(), 2);
        assert_eq!(std::fs::read(&path).expect("read"), head);
    }
}
