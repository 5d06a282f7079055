//! Server-Sent Events parser over a byte stream (WHATWG "event stream interpretation").
//!
//! Bytes arrive in arbitrary chunks; [`SseParser::push`] buffers incomplete lines and returns every
//! event completed by the chunk. Handles `\n`, `\r\n` and lone `\r` line ends (also a `\r\n` split
//! across two chunks), multi-line `data:`, comments (`:` lines), fields without a colon, a leading
//! BOM, and reports whether the stream ended in the middle of an event ([`SseParser::has_partial`]),
//! which a provider turns into a "stream cut mid-event" error.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, `"message"` when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen, if any.
    pub id: Option<String>,
}

/// Error for a line longer than the parser accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server-sent event line longer than {limit} bytes")]
pub struct LineTooLong {
    /// The limit that was exceeded.
    pub limit: usize,
}

/// Incremental parser. Invariant: `buf` never contains a complete line.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// The previous chunk ended with `\r`: a leading `\n` in the next chunk belongs to that line end.
    skip_lf: bool,
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    /// A field line of the current event has been seen (so the stream is "inside" an event).
    in_event: bool,
    last_id: Option<String>,
}

/// Longest line accepted (a single `data:` line of a huge tool call still fits).
pub const MAX_LINE: usize = 16 * 1024 * 1024;

impl SseParser {
    /// A fresh parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; returns the events it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, LineTooLong> {
        let mut out = Vec::new();
        let mut rest = chunk;
        if self.skip_lf && !rest.is_empty() {
            self.skip_lf = false;
            if let Some((&b'\n', tail)) = rest.split_first() {
                rest = tail;
            }
        }
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', rest) {
            let (line_part, after) = rest.split_at(pos);
            let is_cr = after.first() == Some(&b'\r');
            let mut tail = &after[1..];
            if is_cr {
                match tail.first() {
                    Some(&b'\n') => tail = &tail[1..],
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            if self.buf.is_empty() {
                self.line(line_part, &mut out);
            } else {
                let mut line = std::mem::take(&mut self.buf);
                line.extend_from_slice(line_part);
                self.line(&line, &mut out);
            }
            rest = tail;
        }
        if self.buf.len() + rest.len() > MAX_LINE {
            return Err(LineTooLong { limit: MAX_LINE });
        }
        self.buf.extend_from_slice(rest);
        Ok(out)
    }

    /// True when the bytes seen so far end inside an event: an unterminated line, or field
    /// lines not yet followed by the blank line that dispatches them.
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty() || self.in_event
    }

    fn line(&mut self, raw: &[u8], out: &mut Vec<SseEvent>) {
        let mut line = raw;
        if !self.started {
            self.started = true;
            if let Some(stripped) = line.strip_prefix(b"\xEF\xBB\xBF") {
                line = stripped;
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // comment
        }
        self.in_event = true;
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => self.event = value.into_owned(),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"id" if !value.contains('\0') => self.last_id = Some(value.into_owned()),
            _ => {} // `retry` and unknown fields are ignored
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.in_event = false;
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event: if event.is_empty() { "message".to_owned() } else { event },
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent { event: event.into(), data: data.into(), id: None }
    }

    fn parse_all(chunks: &[&[u8]]) -> (Vec<SseEvent>, bool) {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.push(c).unwrap());
        }
        (out, p.has_partial())
    }

    const STREAM: &str = "\u{feff}: keep-alive comment\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\ndata: line one\ndata:line two\n\n:ping\n\nevent: x\rdata: cr only\r\rdata\n\ndata: é😀\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            ev("message_start", "{\"a\":1}"),
            ev("message", "line one\nline two"),
            ev("x", "cr only"),
            ev("message", ""),
            ev("message", "é😀"),
        ]
    }

    #[test]
    fn whole_stream_in_one_chunk() {
        assert_eq!(parse_all(&[STREAM.as_bytes()]), (expected(), false));
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let (a, rest) = bytes.split_at(i);
                let (b, c) = rest.split_at(j - i);
                assert_eq!(parse_all(&[a, b, c]), (expected(), false), "split at {i},{j}");
            }
        }
    }

    #[test]
    fn byte_by_byte() {
        let chunks: Vec<&[u8]> = STREAM.as_bytes().chunks(1).collect();
        assert_eq!(parse_all(&chunks), (expected(), false));
    }

    #[test]
    fn event_without_blank_line_is_partial_and_not_dispatched() {
        assert_eq!(parse_all(&[b"data: {\"ok\":true}\n\ndata: {\"cut"]), (vec![ev("message", "{\"ok\":true}")], true));
        assert_eq!(parse_all(&[b"data: complete line\n"]), (vec![], true));
        assert_eq!(parse_all(&[b": only a comment\n"]), (vec![], false));
    }

    #[test]
    fn id_is_remembered_and_event_name_resets() {
        let (events, partial) = parse_all(&[b"id: 7\nevent: a\ndata: 1\n\ndata: 2\n\n"]);
        assert_eq!(
            events,
            vec![
                SseEvent { event: "a".into(), data: "1".into(), id: Some("7".into()) },
                SseEvent { event: "message".into(), data: "2".into(), id: Some("7".into()) },
            ]
        );
        assert!(!partial);
    }

    #[test]
    fn event_field_alone_dispatches_nothing() {
        assert_eq!(parse_all(&[b"event: lonely\n\ndata: x\n\n"]), (vec![ev("message", "x")], false));
    }
}
