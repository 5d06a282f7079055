//! Line scanning and the light per-line parse used to index a session file.
//!
//! Pi reads a file as `content.trim().split("\n")`, skips whitespace-only lines and `JSON.parse`s the
//! rest, silently dropping lines that fail. Indexing a large file only needs `type`, `id` and
//! `parentId` of each line, so [`LineValue`] decodes those three keys (borrowed where possible) and
//! skips every other value while still validating it: a line is indexed exactly when Pi would parse it.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// Byte ranges of the lines Pi would try to parse: split on `\n`, blank lines skipped, a UTF-8 BOM at
/// the start ignored. The ranges exclude the `\n` (a trailing `\r` is JSON whitespace and harmless).
pub(crate) fn line_ranges(buf: &[u8]) -> Vec<(usize, usize)> {
    let start = if buf.starts_with(b"\xEF\xBB\xBF") { 3 } else { 0 };
    let mut out = Vec::with_capacity(buf.len() / 256 + 1);
    let mut pos = start;
    for nl in memchr::memchr_iter(b'\n', &buf[start..]) {
        let end = start + nl;
        if !is_blank(&buf[pos..end]) {
            out.push((pos, end));
        }
        pos = end + 1;
    }
    if pos < buf.len() && !is_blank(&buf[pos..]) {
        out.push((pos, buf.len()));
    }
    out
}

pub(crate) fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c))
}

/// An id or parent id as a map key. Strings are kept as they are; other JSON scalars (which Pi would
/// also use as `Map` keys) get a prefix that no string id can carry, so `1` never matches `"1"`.
pub type Key = std::sync::Arc<str>;

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

/// The three keys indexing needs.
#[derive(Default)]
pub(crate) struct Head<'a> {
    pub ty: Option<Cow<'a, str>>,
    pub id: Option<Key>,
    pub parent: Option<Parent>,
    /// The raw JSON of `message` (validated, borrowed from the line).
    pub message: Option<&'a serde_json::value::RawValue>,
}

/// Parses one line; `None` when Pi's `JSON.parse` would throw (the line is skipped).
pub(crate) fn parse_line(line: &[u8]) -> Option<LineValue<'_>> {
    serde_json::from_slice::<LineValue<'_>>(line).ok()
}

impl<'de> Deserialize<'de> for LineValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LineVisitor)
    }
}

struct LineVisitor;

impl<'de> Visitor<'de> for LineVisitor {
    type Value = LineValue<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(LineValue::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(LineValue::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LineValue::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LineValue::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LineValue::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LineValue::Scalar)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LineValue::Scalar)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut head = Head::default();
        // Duplicate keys: the last one wins, as in JSON.parse.
        while let Some(key) = map.next_key::<BorrowedStr<'de>>()? {
            match key.0.as_ref() {
                "type" => head.ty = map.next_value::<KeyValue<'de>>()?.into_str(),
                "id" => head.id = map.next_value::<KeyValue<'de>>()?.into_key(),
                "message" => head.message = Some(map.next_value::<&'de serde_json::value::RawValue>()?),
                "parentId" => {
                    head.parent = Some(match map.next_value::<KeyValue<'de>>()?.into_key() {
                        Some(k) if !k.is_empty() && !is_falsy_key(&k) => Parent::Id(k),
                        _ => Parent::Root,
                    })
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(LineValue::Object(head))
    }
}

/// `0`, `false` and `NaN`-like keys are falsy in JS: a walk stops there.
fn is_falsy_key(k: &str) -> bool {
    matches!(k.strip_prefix(NON_STRING_KEY), Some("0" | "false" | "-0"))
}

/// A string that borrows from the input when it has no escapes.
pub(crate) struct BorrowedStr<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for BorrowedStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The value of `type`, `id` or `parentId`: a string, another scalar, or something unusable.
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
    fn into_key(self) -> Option<Key> {
        match self {
            KeyValue::Str(s) => Some(s.into()),
            KeyValue::Scalar(s) => Some(format!("{NON_STRING_KEY}{s}").into()),
            KeyValue::Null | KeyValue::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for KeyValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyValue<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(KeyValue::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(KeyValue::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(KeyValue::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(KeyValue::Scalar(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(KeyValue::Scalar(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(KeyValue::Scalar(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(KeyValue::Scalar(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(KeyValue::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(KeyValue::Other)
            }
        }
        d.deserialize_any(V)
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
        assert_eq!(h.parent, Some(Parent::Root));
        assert!(parse_line(br#"{"type":"message","id":"ab","x":{"y":[1,2}}"#).is_none());
        assert!(matches!(parse_line(b"42"), Some(LineValue::Scalar)));
        assert!(matches!(parse_line(b"null"), Some(LineValue::Null)));
        let Some(LineValue::Object(h)) = parse_line(br#"{"id":"a","id":"b","parentId":"p\u0041"}"#) else {
            panic!("not an object")
        };
        assert_eq!(h.id.as_deref(), Some("b"));
        assert_eq!(h.parent, Some(Parent::Id("pA".into())));
    }
}
