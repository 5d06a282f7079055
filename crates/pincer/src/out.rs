//! Everything the CLI prints to stdout goes through here, so that a reader that stops reading
//! (`pincer sessions list | head -1`) ends the command quietly with exit 0, as `rg` does: Rust
//! ignores SIGPIPE, and `println!` would panic on the broken pipe.

use crate::Failure;
use std::io::Write;

/// The failure a write to stdout becomes: a closed pipe is a quiet success, anything else an error.
pub fn write_failure(e: &std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe => Failure::closed_pipe(),
        _ => Failure::failed(format!("writing output: {e}")),
    }
}

/// Writes `bytes` to stdout and flushes.
pub fn write(bytes: &[u8]) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush()).map_err(|e| write_failure(&e))
}

/// Writes `text` and a newline to stdout.
pub fn line(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| write_failure(&e))
}

/// `value` as indented JSON and a newline.
pub fn json_pretty(value: &serde_json::Value) -> Result<(), Failure> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut out, value).map_err(std::io::Error::from);
    written.and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()).map_err(|e| write_failure(&e))
}
