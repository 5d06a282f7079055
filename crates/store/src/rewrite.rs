//! The only ways a transcript is ever changed other than by appending: an atomic replacement (temp
//! file + fsync + rename + directory fsync, keeping a backup) and cutting a torn last line (saved
//! beside the file first).

use crate::fsutil::{sync_parent_dir, with_suffix};
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
/// `<path>.bak.<timestamp>` (returned).
pub fn replace_atomically(path: &Path, content: &[u8]) -> Result<PathBuf, StoreError> {
    let tmp = with_suffix(path, &format!(".tmp.{}.{}", std::process::id(), crate::ids::short_id()));
    let result = (|| {
        let mut f =
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(|e| io_err(&tmp, e))?;
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
    result
}

fn sync_parent(path: &Path) -> Result<(), StoreError> {
    sync_parent_dir(path).map_err(|e| io_err(path, e))
}

/// Removes an interrupted last line (bytes `at..len`) before appending, after saving those bytes
/// to `<path>.torn.<timestamp>`: no acknowledged write is ever in them, but nothing is thrown away.
pub fn cut_torn_tail(path: &Path, file: Option<&File>, at: u64, len: u64) -> Result<(), StoreError> {
    let owned;
    let file = match file {
        Some(f) => f,
        None => {
            owned = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io_err(path, e))?;
            &owned
        }
    };
    let mut frag = vec![0u8; (len - at) as usize];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut frag, at).map_err(|e| io_err(path, e))?;
    let side = with_suffix(path, &format!(".torn.{}", file_timestamp()));
    let mut f = OpenOptions::new().create(true).append(true).mode(0o600).open(&side).map_err(|e| io_err(&side, e))?;
    f.write_all(&frag).and_then(|_| f.sync_all()).map_err(|e| io_err(&side, e))?;
    file.set_len(at).map_err(|e| io_err(path, e))?;
    file.sync_all().map_err(|e| io_err(path, e))?;
    sync_parent(path)
}
