//! The SSE parser (`pincer_agent::sse::SseParser`) over arbitrary bytes in arbitrary chunkings.
//!
//! Input: the first two bytes choose a chunking, the rest is the stream. Properties:
//! - the same bytes give the same events and the same `has_partial` whether fed whole, byte by
//!   byte, or in pseudo-random chunks (empty chunks included);
//! - the events are those of an independent, straightforward implementation of the WHATWG
//!   "event stream interpretation" over the whole (lossily decoded) stream;
//! - every event has a non-empty type without line ends, data without `\r`, an id without NUL or
//!   line ends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pincer_agent::sse::{SseEvent, SseParser};

fuzz_target!(|data: &[u8]| {
    let (seed, stream) = match data {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => (0, data),
    };

    let whole = feed(std::iter::once(stream));
    let bytewise = feed(stream.chunks(1));
    let random = feed(Chunks { rest: stream, state: u32::from(seed) | 1, first: true });
    assert_eq!(whole, bytewise, "one chunk vs byte by byte");
    assert_eq!(whole, random, "one chunk vs chunks from seed {seed}");

    let (events, partial) = whole;
    let (expected, expected_partial) = oracle(stream);
    assert_eq!(events, expected, "events differ from the reference interpretation");
    assert_eq!(partial, expected_partial, "has_partial differs from the reference interpretation");
    for e in &events {
        assert!(!e.event.is_empty());
        assert!(!e.event.contains(['\r', '\n']), "event type with a line end: {:?}", e.event);
        assert!(!e.data.contains('\r'), "data with a CR: {:?}", e.data);
        if let Some(id) = &e.id {
            assert!(!id.contains(['\0', '\r', '\n']), "bad id {id:?}");
        }
    }
});

fn feed<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> (Vec<SseEvent>, bool) {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        // Fuzz inputs are far below the 16 MiB line limit.
        out.extend(p.push(c).expect("line limit"));
    }
    (out, p.has_partial())
}

/// Chunk sizes 0..=15 from a xorshift generator (the first chunk may be empty, too).
struct Chunks<'a> {
    rest: &'a [u8],
    state: u32,
    first: bool,
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.rest.is_empty() && !std::mem::take(&mut self.first) {
            return None;
        }
        self.first = false;
        self.state ^= self.state << 13;
        self.state ^= self.state >> 17;
        self.state ^= self.state << 5;
        let n = (self.state % 16) as usize;
        let (a, b) = self.rest.split_at(n.min(self.rest.len()));
        self.rest = b;
        Some(a)
    }
}

/// The spec's algorithm, written as plainly as possible: decode, strip one BOM, split into lines on
/// CRLF / LF / CR, then process line by line. The bytes after the last line end are an incomplete
/// line (never processed).
fn oracle(bytes: &[u8]) -> (Vec<SseEvent>, bool) {
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                lines.push(std::mem::take(&mut cur));
            }
            '\n' => lines.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    let unterminated = !bytes.is_empty() && !bytes.ends_with(b"\n") && !bytes.ends_with(b"\r");

    let mut events = Vec::new();
    let (mut event_type, mut data, mut last_id) = (String::new(), String::new(), None::<String>);
    let mut has_data = false;
    let mut in_event = false;
    for line in lines {
        if line.is_empty() {
            in_event = false;
            if has_data {
                events.push(SseEvent {
                    event: if event_type.is_empty() { "message".into() } else { event_type.clone() },
                    data: data.clone(),
                    id: last_id.clone(),
                });
            }
            event_type.clear();
            data.clear();
            has_data = false;
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        in_event = true;
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        match field {
            "event" => event_type = value.to_owned(),
            "data" => {
                if has_data {
                    data.push('\n');
                }
                data.push_str(value);
                has_data = true;
            }
            "id" if !value.contains('\0') => last_id = Some(value.to_owned()),
            _ => {}
        }
    }
    (events, unterminated || in_event)
}
