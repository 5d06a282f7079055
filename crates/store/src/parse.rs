//! Line scanning and the light per-line parse used to index a session file.
//!
//! Pi reads a file as `content.trim().split("\n")`, skips whitespace-only lines and `JSON.parse`s the
//! rest, silently dropping lines that fail. Indexing a large file only needs `type`, `id`,
//! `parentId` (and where `message` is) of each line, so [`parse_line`] is a hand-written JSON scanner
//! that decodes those keys of the top-level object (borrowed where possible) and skips every other
//! value while still validating it, without allocating: a line is indexed exactly when Pi's
//! `JSON.parse` would accept it. As in Pi, which reads the file as UTF-8 with replacement
//! characters, bytes that are not UTF-8 are accepted inside strings (and decoded as U+FFFD where a
//! key is read); lone surrogate escapes (`"\ud800"`), any nesting depth and numbers beyond `f64`
//! (`1e400`) are accepted too.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// Byte ranges of the lines Pi would try to parse: split on `\n`, blank lines skipped, a UTF-8 BOM at
/// the start ignored. The ranges exclude the `\n` (a trailing `\r` is JSON whitespace and harmless).
pub(crate) fn line_ranges(buf: &[u8]) -> Vec<(usize, usize)> {
    lines_iter(buf, bom_len(buf), buf.len()).collect()
}

/// 3 when the buffer starts with a UTF-8 BOM.
pub(crate) fn bom_len(buf: &[u8]) -> usize {
    if buf.starts_with(b"\xEF\xBB\xBF") {
        3
    } else {
        0
    }
}

/// [`line_ranges`] of the bytes `start..end` of `buf` (which start at a line start), one line at a
/// time.
pub(crate) fn lines_iter(buf: &[u8], start: usize, end: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut newlines = memchr::memchr_iter(b'\n', &buf[start..end]);
    let (mut pos, mut done) = (start, false);
    std::iter::from_fn(move || loop {
        if done {
            return None;
        }
        let line = match newlines.next() {
            Some(nl) => {
                let line = (pos, start + nl);
                pos = start + nl + 1;
                line
            }
            None => {
                done = true;
                (pos, end)
            }
        };
        if line.0 < line.1 && !is_blank(&buf[line.0..line.1]) {
            return Some(line);
        }
    })
}

pub(crate) fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c))
}

/// An id or parent id as a map key. Strings are kept as they are; other JSON scalars (which Pi would
/// also use as `Map` keys) get a prefix that no string id can carry, so `1` never matches `"1"`.
///
/// A key is a range of a shared text: the keys of a whole file are a few allocations (see
/// [`KeyText`]), not one each. So a key kept after its session is gone keeps that text alive: copy
/// it (`Arc::<str>::from(key.as_str())`) to keep it long.
#[derive(Clone)]
pub struct Key {
    /// A thin pointer (the text of a file's keys is not copied once more into an `Arc<str>`).
    text: Arc<String>,
    /// The key's bytes in `text`; `end == 0` means all of it (16 bytes in all).
    start: u32,
    end: u32,
}

impl Key {
    /// The key's text.
    pub fn as_str(&self) -> &str {
        if self.end == 0 {
            return &self.text;
        }
        self.text.get(self.start as usize..self.end as usize).unwrap_or_default()
    }
}

impl std::ops::Deref for Key {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for Key {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// Hashes as the `str` does, so maps of keys can be searched with a `&str`.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Key {
        Key { text: Arc::new(s.to_owned()), start: 0, end: 0 }
    }
}

impl From<String> for Key {
    fn from(s: String) -> Key {
        Key { text: Arc::new(s), start: 0, end: 0 }
    }
}

impl From<Cow<'_, str>> for Key {
    fn from(s: Cow<'_, str>) -> Key {
        match s {
            Cow::Borrowed(b) => b.into(),
            Cow::Owned(o) => o.into(),
        }
    }
}

/// The texts of many keys gathered in one string, to be cut into [`Key`]s once complete.
#[derive(Default)]
pub(crate) struct KeyText {
    text: String,
}

impl KeyText {
    /// Room for `bytes` of key text.
    pub fn with_capacity(bytes: usize) -> KeyText {
        KeyText { text: String::with_capacity(bytes) }
    }

    /// Adds a key's text; the range it got.
    pub fn push(&mut self, s: &str) -> (usize, usize) {
        let start = self.text.len();
        self.text.push_str(s);
        (start, self.text.len())
    }

    /// Bytes of text so far.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    /// The text of a range given by [`KeyText::push`].
    pub fn get(&self, (start, end): (usize, usize)) -> &str {
        self.text.get(start..end).unwrap_or_default()
    }

    /// The shared text the keys are cut from (with [`KeyText::key`]).
    pub fn finish(self) -> Arc<String> {
        Arc::new(self.text)
    }

    /// The key of a range given by [`KeyText::push`], in the text [`KeyText::finish`] returned.
    pub fn key(text: &Arc<String>, (start, end): (usize, usize)) -> Key {
        match (u32::try_from(start), u32::try_from(end)) {
            (Ok(start), Ok(end)) if end > 0 => Key { text: text.clone(), start, end },
            // An empty key, or one beyond 4 GiB of key text.
            _ => text.get(start..end).unwrap_or_default().into(),
        }
    }
}

/// Marker for keys that came from non-string JSON values.
const NON_STRING_KEY: char = '\u{0}';

/// What the light parse found on one line.
pub(crate) enum LineValue<'a> {
    /// A JSON object: the entry's head.
    Object(Head<'a>),
    /// A bare `null` (Pi crashes on it; Pincer skips it and reports it).
    Null,
    /// Any other JSON value (`42`, `"x"`, `[1]`, `true`): Pi keeps it as a typeless, id-less entry.
    Scalar,
}

/// `parentId` of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parent {
    /// No `parentId` key at all (v1 entries, raw OpenClaw appends).
    Absent,
    /// `parentId` is `null` or another falsy value: a root.
    Root,
    /// A parent id.
    Id(Key),
}

/// The keys indexing needs, as text borrowed from the line where possible.
#[derive(Default)]
pub(crate) struct Head<'a> {
    pub ty: Option<Cow<'a, str>>,
    /// The key text of `id` (see [`Key`]).
    pub id: Option<Cow<'a, str>>,
    /// `parentId`, when the key is there.
    pub parent: Option<ParentText<'a>>,
    /// The raw JSON of `message` (validated, borrowed from the line).
    pub message: Option<&'a [u8]>,
}

/// `parentId` of a [`Head`]: a root (`null` or another falsy value), or the key text of a parent.
pub(crate) enum ParentText<'a> {
    Root,
    Id(Cow<'a, str>),
}

impl Head<'_> {
    /// The entry's id as a key.
    pub fn id_key(&self) -> Option<Key> {
        self.id.as_deref().map(Key::from)
    }

    /// The entry's parent.
    pub fn parent_key(&self) -> Parent {
        match &self.parent {
            None => Parent::Absent,
            Some(ParentText::Root) => Parent::Root,
            Some(ParentText::Id(p)) => Parent::Id(p.as_ref().into()),
        }
    }
}

/// Parses one line; `None` when Pi's `JSON.parse` would throw (the line is skipped).
pub(crate) fn parse_line(line: &[u8]) -> Option<LineValue<'_>> {
    let mut c = Cursor { b: line, i: 0 };
    c.ws();
    let v = match c.peek()? {
        b'{' => LineValue::Object(c.head()?),
        b'n' => {
            c.literal(b"null")?;
            LineValue::Null
        }
        _ => {
            c.value()?;
            LineValue::Scalar
        }
    };
    c.ws();
    (c.i == line.len()).then_some(v)
}

/// `0`, `false` and `NaN`-like keys are falsy in JS: a walk stops there.
fn is_falsy_key(k: &str) -> bool {
    matches!(k.strip_prefix(NON_STRING_KEY), Some("0" | "false" | "-0"))
}

/// The value of `type`, `id` or `parentId`: a string, another scalar (as its key text), or
/// something unusable.
enum KeyValue<'a> {
    Str(Cow<'a, str>),
    Scalar(String),
    Null,
    Other,
}

impl<'a> KeyValue<'a> {
    fn into_str(self) -> Option<Cow<'a, str>> {
        match self {
            KeyValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The key text.
    fn into_key(self) -> Option<Cow<'a, str>> {
        match self {
            KeyValue::Str(s) => Some(s),
            KeyValue::Scalar(s) => Some(Cow::Owned(format!("{NON_STRING_KEY}{s}"))),
            KeyValue::Null | KeyValue::Other => None,
        }
    }
}

/// The key text of a number used as an id: integers that fit `u64`/`i64` as they are, anything else
/// as the nearest `f64` printed by Rust (`5.0` → `5`, `-0` → `-0`, `1e400` → `inf`).
fn number_text(token: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Number>(token) {
        Ok(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), ..) => u.to_string(),
            (None, Some(i), _) => i.to_string(),
            (None, None, f) => f.unwrap_or(f64::NAN).to_string(),
        },
        // Out of `f64` range: JSON.parse gives ±Infinity.
        Err(_) => std::str::from_utf8(token).ok().and_then(|t| t.parse::<f64>().ok()).unwrap_or(f64::NAN).to_string(),
    }
}

/// Which of the keys indexing needs a top-level key is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Type,
    Id,
    ParentId,
    Message,
    Other,
}

impl Field {
    fn of(name: &[u8]) -> Field {
        match name {
            b"type" => Field::Type,
            b"id" => Field::Id,
            b"parentId" => Field::ParentId,
            b"message" => Field::Message,
            _ => Field::Other,
        }
    }
}

/// A string's body between its quotes, as it is in the line.
#[derive(Clone, Copy)]
struct RawStr<'a> {
    body: &'a [u8],
    escaped: bool,
}

impl<'a> RawStr<'a> {
    /// The string's value: escapes decoded, bytes that are not UTF-8 and lone surrogates as U+FFFD.
    #[inline(always)]
    fn text(self) -> Cow<'a, str> {
        if self.escaped {
            return Cow::Owned(unescape(self.body));
        }
        lossy(self.body)
    }
}

/// The value of a string body with escapes (see [`RawStr::text`]).
fn unescape(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    // A high surrogate waiting for its low half.
    let mut high: Option<u32> = None;
    let mut i = 0;
    while i < b.len() {
        let at = memchr::memchr(b'\\', &b[i..]).map_or(b.len(), |p| i + p);
        if at > i {
            if high.take().is_some() {
                out.push(char::REPLACEMENT_CHARACTER);
            }
            out.push_str(&lossy(&b[i..at]));
        }
        let Some(&e) = b.get(at + 1) else { break };
        if e == b'u' {
            let n = b.get(at + 2..at + 6).map_or(0xFFFD, hex4);
            match (high.take(), n) {
                (Some(h), 0xDC00..=0xDFFF) => {
                    out.push(char::from_u32(0x10000 + ((h - 0xD800) << 10) + (n - 0xDC00)).unwrap_or('\u{FFFD}'))
                }
                (h, _) => {
                    if h.is_some() {
                        out.push(char::REPLACEMENT_CHARACTER);
                    }
                    if (0xD800..=0xDBFF).contains(&n) {
                        high = Some(n);
                    } else {
                        out.push(char::from_u32(n).unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                }
            }
            i = at + 6;
        } else {
            if high.take().is_some() {
                out.push(char::REPLACEMENT_CHARACTER);
            }
            out.push(match e {
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                other => char::from(other),
            });
            i = at + 2;
        }
    }
    if high.is_some() {
        out.push(char::REPLACEMENT_CHARACTER);
    }
    out
}

/// Bytes as text, as Node decodes a file: sequences that are not UTF-8 become U+FFFD. (Checks
/// first: `from_utf8_lossy` is several times slower than `from_utf8` on valid text.)
pub(crate) fn lossy(b: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(b),
    }
}

/// The first `"`, `\\` or control character at or after `i`. Most strings are short (keys, ids,
/// small values): their first 32 bytes are searched 8 at a time in a register; a longer string's
/// rest is searched for `"` and `\\` with `memchr2`, then checked for control characters.
#[inline(always)]
fn special(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let short_end = i + 32;
    while let Some(word) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let w = u64::from_le_bytes(*word);
        let (q, s) = (w ^ (ONES * u64::from(b'"')), w ^ (ONES * u64::from(b'\\')));
        // The lowest flagged byte is exact for each test (borrows only propagate upwards).
        let m = ((q.wrapping_sub(ONES) & !q) | (s.wrapping_sub(ONES) & !s) | (w.wrapping_sub(ONES * 0x20) & !w)) & HIGH;
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
        if i >= short_end {
            let at = i + memchr::memchr2(b'"', b'\\', &b[i..])?;
            // The smallest byte, without an early exit: this vectorizes.
            return match b[i..at].iter().fold(u8::MAX, |m, &c| m.min(c)) {
                0x20.. => Some(at),
                _ => b[i..at].iter().position(|&c| c < 0x20).map(|p| i + p),
            };
        }
    }
    b[i..].iter().position(|&c| matches!(c, b'"' | b'\\' | 0..0x20)).map(|p| i + p)
}

/// Four hex digits (already validated).
fn hex4(h: &[u8]) -> u32 {
    h.iter().fold(0, |n, &d| n << 4 | char::from(d).to_digit(16).unwrap_or(0))
}

/// Nesting below a value being skipped: whether each open container is an object. The first 128
/// levels live in a bit set; deeper ones (JSON.parse has no depth limit) spill into a vector.
#[derive(Default)]
struct Nesting {
    depth: usize,
    bits: u128,
    deep: Vec<bool>,
}

impl Nesting {
    fn push(&mut self, object: bool) {
        if self.depth < 128 {
            self.bits = (self.bits & !(1 << self.depth)) | (u128::from(object) << self.depth);
        } else {
            self.deep.push(object);
        }
        self.depth += 1;
    }
    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 128 {
            self.deep.pop();
        }
    }
    /// Whether the innermost open container is an object; `None` at the top.
    fn top(&self) -> Option<bool> {
        let d = self.depth.checked_sub(1)?;
        if d < 128 {
            Some(self.bits >> d & 1 == 1)
        } else {
            self.deep.last().copied()
        }
    }
}

/// A position in one line. Every method returns `None` when the JSON is invalid.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    /// Skips JSON whitespace (space, tab, LF, CR: JSON.parse accepts nothing else).
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..].starts_with(word).then(|| self.i += word.len())
    }

    /// A string starting at its opening quote. Raw control characters are rejected; other bytes
    /// are not checked (Pi decodes the file with replacement characters before parsing).
    // Inlined: returned through memory, the string's range is read back with a wider load than
    // it was written with, which stalls (a fifth of the parse's own time).
    #[inline(always)]
    fn string(&mut self) -> Option<RawStr<'a>> {
        if self.peek()? != b'"' {
            return None;
        }
        let b = self.b;
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = special(b, i)?;
            match b[i] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i = match b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i + 2,
                        b'u' if b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => i + 6,
                        _ => return None,
                    };
                }
                _ => return None,
            }
        }
        self.i = i + 1;
        Some(RawStr { body: &b[start..i], escaped })
    }

    /// A number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let b = self.b;
        let mut i = self.i;
        let digits = |mut i: usize| {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        i = match b.get(i)? {
            b'0' => i + 1,
            b'1'..=b'9' => digits(i + 1),
            _ => return None,
        };
        if b.get(i) == Some(&b'.') {
            let d = digits(i + 1);
            if d == i + 1 {
                return None;
            }
            i = d;
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            let d = digits(i);
            if d == i {
                return None;
            }
            i = d;
        }
        self.i = i;
        Some(())
    }

    /// An object key and its colon.
    #[inline(always)]
    fn key(&mut self) -> Option<RawStr<'a>> {
        let k = self.string()?;
        self.ws();
        self.eat(b':')?;
        Some(k)
    }

    /// Validates and skips one value of any depth (iteratively: JSON.parse has no depth limit).
    fn value(&mut self) -> Option<()> {
        let mut nesting = Nesting::default();
        loop {
            self.ws();
            match self.peek()? {
                b'{' => {
                    self.i += 1;
                    self.ws();
                    if self.peek()? != b'}' {
                        self.key()?;
                        nesting.push(true);
                        continue;
                    }
                    self.i += 1;
                }
                b'[' => {
                    self.i += 1;
                    self.ws();
                    if self.peek()? != b']' {
                        nesting.push(false);
                        continue;
                    }
                    self.i += 1;
                }
                b'"' => {
                    self.string()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => self.number()?,
            }
            // A value ended: close the containers it ends, up to the next value.
            loop {
                let Some(object) = nesting.top() else { return Some(()) };
                self.ws();
                match (self.peek()?, object) {
                    (b',', _) => {
                        self.i += 1;
                        if object {
                            self.ws();
                            self.key()?;
                        }
                        break;
                    }
                    (b'}', true) | (b']', false) => {
                        self.i += 1;
                        nesting.pop();
                    }
                    _ => return None,
                }
            }
        }
    }

    /// The value of `type`, `id` or `parentId` (inlined, as [`Cursor::string`] is).
    #[inline(always)]
    fn key_value(&mut self) -> Option<KeyValue<'a>> {
        let start = self.i;
        Some(match self.peek()? {
            b'"' => KeyValue::Str(self.string()?.text()),
            b't' => {
                self.literal(b"true")?;
                KeyValue::Scalar("true".into())
            }
            b'f' => {
                self.literal(b"false")?;
                KeyValue::Scalar("false".into())
            }
            b'n' => {
                self.literal(b"null")?;
                KeyValue::Null
            }
            b'{' | b'[' => {
                self.value()?;
                KeyValue::Other
            }
            _ => {
                self.number()?;
                KeyValue::Scalar(number_text(&self.b[start..self.i]))
            }
        })
    }

    /// The top-level object, at its `{`. Duplicate keys: the last one wins, as in JSON.parse.
    fn head(&mut self) -> Option<Head<'a>> {
        let mut head = Head::default();
        self.i += 1;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(head);
        }
        loop {
            self.ws();
            let k = self.key()?;
            let field = if k.escaped { Field::of(k.text().as_bytes()) } else { Field::of(k.body) };
            self.ws();
            match field {
                Field::Type => head.ty = self.key_value()?.into_str(),
                Field::Id => head.id = self.key_value()?.into_key(),
                Field::ParentId => {
                    head.parent = Some(match self.key_value()?.into_key() {
                        Some(k) if !k.is_empty() && !is_falsy_key(&k) => ParentText::Id(k),
                        _ => ParentText::Root,
                    })
                }
                Field::Message => {
                    let start = self.i;
                    self.value()?;
                    head.message = Some(&self.b[start..self.i]);
                }
                Field::Other => self.value()?,
            }
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(head);
                }
                _ => return None,
            }
        }
    }
}

/// Turns a JSON value used as an id into the same key the light parse produces.
pub(crate) fn value_key(v: &serde_json::Value) -> Option<Key> {
    match v {
        serde_json::Value::String(s) => Some(s.as_str().into()),
        serde_json::Value::Number(n) => Some(format!("{NON_STRING_KEY}{n}").into()),
        serde_json::Value::Bool(b) => Some(format!("{NON_STRING_KEY}{b}").into()),
        _ => None,
    }
}

/// The parent of a fully parsed entry object.
pub(crate) fn value_parent(obj: &serde_json::Map<String, serde_json::Value>) -> Parent {
    match obj.get("parentId") {
        None => Parent::Absent,
        Some(v) => match value_key(v) {
            Some(k) if !k.is_empty() && !is_falsy_key(&k) => Parent::Id(k),
            _ => Parent::Root,
        },
    }
}

/// The printable form of a key (the JSON value Pi would print).
pub fn key_to_value(k: &str) -> serde_json::Value {
    match k.strip_prefix(NON_STRING_KEY) {
        Some(raw) => serde_json::from_str(raw).unwrap_or(serde_json::Value::Null),
        None => serde_json::Value::String(k.to_owned()),
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod differential;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_skip_blank_lines_and_bom() {
        let buf = b"\xEF\xBB\xBF{\"a\":1}\n\n  \r\n{\"b\":2}\r\n{\"c\"";
        let got: Vec<&[u8]> = line_ranges(buf).iter().map(|&(s, e)| &buf[s..e]).collect();
        assert_eq!(got, vec![&b"{\"a\":1}"[..], b"{\"b\":2}\r", b"{\"c\""]);
    }

    #[test]
    fn head_reads_keys_and_validates_the_rest() {
        let Some(LineValue::Object(h)) = parse_line(br#"{"type":"message","id":"ab","x":{"y":[1,2]},"parentId":null}"#)
        else {
            panic!("not an object")
        };
        assert_eq!(h.ty.as_deref(), Some("message"));
        assert_eq!(h.id.as_deref(), Some("ab"));
        assert_eq!(h.parent_key(), Parent::Root);
        assert!(parse_line(br#"{"type":"message","id":"ab","x":{"y":[1,2}}"#).is_none());
        assert!(matches!(parse_line(b"42"), Some(LineValue::Scalar)));
        assert!(matches!(parse_line(b"null"), Some(LineValue::Null)));
        let Some(LineValue::Object(h)) = parse_line(br#"{"id":"a","id":"b","parentId":"p\u0041"}"#) else {
            panic!("not an object")
        };
        assert_eq!(h.id.as_deref(), Some("b"));
        assert_eq!(h.parent_key(), Parent::Id("pA".into()));
    }
}
