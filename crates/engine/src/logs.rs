//! Pincer's own recent log lines for `logs.tail` (`openclaw logs`, the Control UI's logs view): a
//! tracing layer writes each formatted line into a ring bounded in lines and bytes; lines are
//! redacted by the gateway's redactor as they enter (once the gateway set it) and again as they
//! are read, so a secret logged before the gateway started never leaves the process either. The
//! ring is a virtual log file: a line's cursor is the byte offset after it, so OpenClaw's
//! `{cursor, size, reset}` follow-up reads work unchanged.

use crate::protocol::LogsTail;
use pincer_store::redact::Redactor;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

/// Lines and bytes kept.
pub const MAX_LINES: usize = 2000;
pub const MAX_BYTES: usize = 1024 * 1024;
/// Longest line kept (longer ones are cut, with `…`).
pub const MAX_LINE_BYTES: usize = 4096;
/// The name `logs.tail` gives the ring (OpenClaw's clients show a file name).
pub const RING_NAME: &str = "pincer://gateway-log";

#[derive(Default)]
struct Ring {
    /// (end offset, line) oldest first.
    lines: VecDeque<(u64, String)>,
    bytes: usize,
    /// Bytes ever written: the virtual file's size.
    written: u64,
}

static RING: Mutex<Ring> = Mutex::new(Ring { lines: VecDeque::new(), bytes: 0, written: 0 });
static REDACTOR: OnceLock<Arc<dyn Redactor>> = OnceLock::new();

/// The gateway's redactor, for the lines from now on (the first call wins).
pub fn set_redactor(r: Arc<dyn Redactor>) {
    let _ = REDACTOR.set(r);
}

fn cut(line: &str) -> String {
    if line.len() <= MAX_LINE_BYTES {
        return line.to_owned();
    }
    let mut end = MAX_LINE_BYTES - 3;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// Adds one line (no trailing newline).
pub fn push(line: &str) {
    let line = match REDACTOR.get() {
        Some(r) => cut(&r.redact_str(line)),
        None => cut(line),
    };
    let mut ring = pincer_pi::lock(&RING);
    ring.written += line.len() as u64 + 1;
    ring.bytes += line.len() + 1;
    let end = ring.written;
    ring.lines.push_back((end, line));
    while ring.lines.len() > MAX_LINES || ring.bytes > MAX_BYTES {
        let Some((_, old)) = ring.lines.pop_front() else { break };
        ring.bytes -= old.len() + 1;
    }
}

/// A `tracing` writer into the ring: what one event formats to is split into lines.
#[derive(Default)]
pub struct RingWriter(Vec<u8>);

impl std::io::Write for RingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RingWriter {
    fn drop(&mut self) {
        for line in String::from_utf8_lossy(&self.0).lines().filter(|l| !l.trim().is_empty()) {
            push(line);
        }
    }
}

/// The layer feeding the ring (plain text, no colours), for the binary's subscriber.
pub fn layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer().with_ansi(false).with_writer(RingWriter::default)
}

/// `logs.tail` → `{file, cursor, size, lines, truncated, reset}`: the lines after `cursor` (the
/// newest `limit`, within `max_bytes`), or the newest ones without a cursor; `reset` when the
/// cursor is older than the ring or past its end.
pub fn tail(redactor: &dyn Redactor, cursor: Option<u64>, limit: usize, max_bytes: usize) -> LogsTail {
    let ring = pincer_pi::lock(&RING);
    let first = ring.lines.front().map(|(end, l)| end - l.len() as u64 - 1).unwrap_or(ring.written);
    let (after, reset) = match cursor {
        None => (0, false),
        Some(c) if c > ring.written || c < first => (0, true),
        Some(c) => (c, false),
    };
    let newer: Vec<&(u64, String)> = ring.lines.iter().filter(|(end, _)| *end > after).collect();
    let mut picked: Vec<String> = Vec::new();
    let mut bytes = 0;
    for (_, line) in newer.iter().rev().take(limit) {
        if bytes + line.len() + 1 > max_bytes && !picked.is_empty() {
            break;
        }
        bytes += line.len() + 1;
        picked.push(redactor.redact_str(line));
    }
    let truncated = picked.len() < newer.len();
    picked.reverse();
    LogsTail { file: RING_NAME, cursor: ring.written, size: ring.written, lines: picked, truncated, reset }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pincer_store::redact::NoRedaction;

    #[test]
    fn the_ring_is_bounded_redacted_and_read_after_a_cursor() {
        set_redactor(Arc::new(pincer_store::redact::SecretRedactor::new(&[]).expect("redactor")));
        push("first line");
        push("my key is sk-abcdefghijklmnopqrstuvwxyz0123456789");
        let all = tail(&NoRedaction, None, 200, 250_000);
        let lines = &all.lines;
        let at = lines.iter().position(|l| l == "first line").expect("first line");
        assert!(!lines[at + 1].contains("sk-abcdefghijklmnopqrstuvwxyz0123456789"), "{}", lines[at + 1]);
        assert!(!all.reset);
        push("third");
        let next = tail(&NoRedaction, Some(all.cursor), 200, 250_000);
        assert_eq!(next.lines, ["third"]);
        let past = serde_json::to_value(tail(&NoRedaction, Some(all.cursor + 10_000), 200, 250_000)).expect("json");
        assert_eq!(past["reset"], true, "{past}");
        assert!(serde_json::to_value(&next).expect("json").get("reset").is_none(), "reset only when it is");
        for i in 0..(MAX_LINES + 10) {
            push(&format!("line {i} {}", "x".repeat(MAX_LINE_BYTES * 2)));
        }
        let ring = pincer_pi::lock(&RING);
        assert!(ring.lines.len() <= MAX_LINES && ring.bytes <= MAX_BYTES);
        assert!(ring.lines.iter().all(|(_, l)| l.len() <= MAX_LINE_BYTES));
        drop(ring);
    }
}
