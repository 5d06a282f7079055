//! Differential tests of the light parse ([`super::parse_line`]): against the serde_json parse it
//! replaced (kept here as the reference) on many generated lines, nasty ones included, and against
//! Node's `JSON.parse` itself (the acceptance rule Pi applies) on the same lines.
//!
//! The reference is stricter than `JSON.parse` in a few places, which the scanner follows
//! `JSON.parse` on: nesting deeper than 128, lone surrogate escapes and bytes that are not UTF-8 in a
//! top-level key or in `type`/`id`/`parentId`/`message`, and an `id` beyond `f64` (`1e400`). So:
//! every line the reference accepts is accepted with the same keys, and every line is accepted
//! exactly when Node accepts it (the file read as UTF-8 with replacement characters, as Pi reads it).

use super::*;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// What a parse found, in a form both parsers give.
#[derive(Debug, PartialEq)]
enum Found {
    Null,
    Scalar,
    Object { ty: Option<String>, id: Option<String>, parent: Option<Option<String>>, message: Option<Vec<u8>> },
}

fn scanned(line: &[u8]) -> Option<Found> {
    Some(match parse_line(line)? {
        LineValue::Null => Found::Null,
        LineValue::Scalar => Found::Scalar,
        LineValue::Object(h) => Found::Object {
            ty: h.ty.map(Cow::into_owned),
            id: h.id.map(Cow::into_owned),
            parent: h.parent.map(|p| match p {
                ParentText::Root => None,
                ParentText::Id(p) => Some(p.into_owned()),
            }),
            message: h.message.map(<[u8]>::to_vec),
        },
    })
}

// ---- The reference: the serde_json parse used before the scanner. ----

fn reference(line: &[u8]) -> Option<Found> {
    serde_json::from_slice::<RefLine>(line).ok().map(|r| r.0)
}

struct RefLine(Found);

impl<'de> Deserialize<'de> for RefLine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RefVisitor)
    }
}

struct RefVisitor;

impl<'de> Visitor<'de> for RefVisitor {
    type Value = RefLine;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<RefLine, E> {
        Ok(RefLine(Found::Null))
    }
    fn visit_bool<E>(self, _: bool) -> Result<RefLine, E> {
        Ok(RefLine(Found::Scalar))
    }
    fn visit_i64<E>(self, _: i64) -> Result<RefLine, E> {
        Ok(RefLine(Found::Scalar))
    }
    fn visit_u64<E>(self, _: u64) -> Result<RefLine, E> {
        Ok(RefLine(Found::Scalar))
    }
    fn visit_f64<E>(self, _: f64) -> Result<RefLine, E> {
        Ok(RefLine(Found::Scalar))
    }
    fn visit_str<E>(self, _: &str) -> Result<RefLine, E> {
        Ok(RefLine(Found::Scalar))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RefLine, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(RefLine(Found::Scalar))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RefLine, A::Error> {
        let (mut ty, mut id, mut parent, mut message) = (None, None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "type" => ty = map.next_value::<RefKey>()?.into_str(),
                "id" => id = map.next_value::<RefKey>()?.into_key(),
                "message" => {
                    message = Some(map.next_value::<&'de serde_json::value::RawValue>()?.get().as_bytes().to_vec())
                }
                "parentId" => {
                    parent = Some(match map.next_value::<RefKey>()?.into_key() {
                        Some(k) if !k.is_empty() && !is_falsy_key(&k) => Some(k),
                        _ => None,
                    })
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RefLine(Found::Object { ty, id, parent, message }))
    }
}

enum RefKey {
    Str(String),
    Scalar(String),
    Other,
}

impl RefKey {
    fn into_str(self) -> Option<String> {
        match self {
            RefKey::Str(s) => Some(s),
            _ => None,
        }
    }
    fn into_key(self) -> Option<String> {
        match self {
            RefKey::Str(s) => Some(s),
            RefKey::Scalar(s) => Some(format!("{NON_STRING_KEY}{s}")),
            RefKey::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for RefKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RefKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<RefKey, E> {
                Ok(RefKey::Str(v.to_owned()))
            }
            fn visit_unit<E>(self) -> Result<RefKey, E> {
                Ok(RefKey::Other)
            }
            fn visit_bool<E>(self, v: bool) -> Result<RefKey, E> {
                Ok(RefKey::Scalar(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<RefKey, E> {
                Ok(RefKey::Scalar(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<RefKey, E> {
                Ok(RefKey::Scalar(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<RefKey, E> {
                Ok(RefKey::Scalar(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RefKey, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(RefKey::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RefKey, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(RefKey::Other)
            }
        }
        d.deserialize_any(V)
    }
}

// ---- Generated lines. ----

/// xorshift64*: deterministic, no dependency. `clean` lines use only the tokens that are JSON.
struct Rng(u64, bool);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A token of `xs`, of whose the first `good` are JSON: mostly those, always in a clean line.
    fn token<'a>(&mut self, xs: &[&'a [u8]], good: usize) -> &'a [u8] {
        if self.1 || self.below(10) != 0 {
            self.pick(&xs[..good])
        } else {
            self.pick(xs)
        }
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &[&'a [u8]]) -> &'a [u8] {
        xs[self.below(xs.len())]
    }
}

const WS: &[&[u8]] = &[b"", b"", b"", b" ", b"\t", b"\r", b"  \r\t", b"\x0b", b"\xc2\xa0"];
const KEYS: &[&[u8]] = &[
    b"\"type\"",
    b"\"id\"",
    b"\"parentId\"",
    b"\"message\"",
    b"\"x\"",
    b"\"\\u0069d\"",
    b"\"typ\\u0065\"",
    b"\"parent\\u0049d\"",
    b"\"id\\ud800\"",
    b"\"\xff\"",
    b"\"i\xc3d\"",
    b"\"\"",
];
const STRINGS: &[&[u8]] = &[
    b"\"message\"",
    b"\"session\"",
    b"\"compaction\"",
    b"\"a1\"",
    b"\"0000001e\"",
    b"\"\"",
    b"\"\\u0000\"",
    b"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
    b"\"\\u00e9\\u4e2d\"",
    b"\"\\ud83d\\ude00\"",
    b"\"\\ud800\"",
    b"\"\\udc00\\ud800\"",
    b"\"\\ud800x\"",
    b"\"\\ud800\\n\"",
    b"\"\\ud800\\ud800\\udc00\"",
    b"\"\\uD83D\\uDE00\"",
    b"\"caf\xc3\xa9\"",
    b"\"\xe2\x82\"",
    b"\"\xff\xfe\"",
    b"\"\xed\xa0\x80\"",
    b"\"\xf0\x9f\x98\x80\"",
    b"\"0\"",
    b"\"false\"",
    b"\"\\u2028\xe2\x80\xa8\"",
    b"\"a longer string value that goes beyond the first thirty-two bytes of the scan, with \\\"escapes\\\" in it\"",
    b"\"a longer string value that goes beyond the first thirty-two bytes, ending in a backslash\\\\\"",
    // Not JSON from here on.
    b"\"tab\there\"",
    b"\"bad\\x\"",
    b"\"bad\\u12\"",
    b"\"\\u12g4\"",
    b"\"a longer string value that goes beyond the first thirty-two bytes\x01 with a control char\"",
];
const GOOD_STRINGS: usize = STRINGS.len() - 5;
const NUMBERS: &[&[u8]] = &[
    b"0",
    b"-0",
    b"1",
    b"-1",
    b"42",
    b"1.5",
    b"5.0",
    b"-0.0",
    b"1e3",
    b"1E+2",
    b"1e-7",
    b"2.5e-3",
    b"1e21",
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"9007199254740993",
    // Not JSON from here on.
    b"01",
    b"1.",
    b".5",
    b"-",
    b"+1",
    b"1e",
    b"1e+",
    b"0x10",
    b"NaN",
    b"Infinity",
];
const GOOD_NUMBERS: usize = NUMBERS.len() - 10;
const LITERALS: &[&[u8]] = &[b"true", b"false", b"null", b"nul", b"True", b"undefined"];
const GOOD_LITERALS: usize = 3;

fn ws(r: &mut Rng, out: &mut Vec<u8>) {
    // Mostly JSON whitespace; now and then something JSON.parse does not skip.
    let w = r.pick(WS);
    if w == b"\x0b" || w == b"\xc2\xa0" {
        if !r.1 && r.below(8) == 0 {
            out.extend_from_slice(w);
        }
    } else {
        out.extend_from_slice(w);
    }
}

fn value(r: &mut Rng, out: &mut Vec<u8>, depth: usize) {
    ws(r, out);
    match r.below(if depth > 4 { 3 } else { 6 }) {
        0 => out.extend_from_slice(r.token(STRINGS, GOOD_STRINGS)),
        1 => out.extend_from_slice(r.token(NUMBERS, GOOD_NUMBERS)),
        2 => out.extend_from_slice(r.token(LITERALS, GOOD_LITERALS)),
        3 | 4 => {
            out.push(b'{');
            for i in 0..r.below(4) {
                if i > 0 {
                    out.push(b',');
                }
                ws(r, out);
                out.extend_from_slice(r.pick(KEYS));
                ws(r, out);
                out.push(b':');
                value(r, out, depth + 1);
                ws(r, out);
            }
            out.push(b'}');
        }
        _ => {
            out.push(b'[');
            for i in 0..r.below(4) {
                if i > 0 {
                    out.push(b',');
                }
                value(r, out, depth + 1);
            }
            ws(r, out);
            out.push(b']');
        }
    }
    ws(r, out);
}

/// An entry-like line: a top-level object with the indexed keys, of all kinds of values.
fn entry(r: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    ws(r, &mut out);
    out.push(b'{');
    for i in 0..1 + r.below(6) {
        if i > 0 {
            out.push(b',');
        }
        ws(r, &mut out);
        out.extend_from_slice(if r.below(4) == 0 { r.pick(KEYS) } else { r.pick(&KEYS[..4]) });
        ws(r, &mut out);
        out.push(b':');
        value(r, &mut out, 0);
    }
    out.push(b'}');
    ws(r, &mut out);
    out
}

/// Breaks a line now and then: cut, a byte dropped, doubled or replaced.
fn mutate(r: &mut Rng, mut line: Vec<u8>) -> Vec<u8> {
    if line.is_empty() || r.1 || r.below(3) != 0 {
        return line;
    }
    let at = r.below(line.len());
    match r.below(5) {
        0 => line.truncate(at),
        1 => {
            line.remove(at);
        }
        2 => line.insert(at, line[at]),
        3 => line[at] = r.pick(&[b",", b"}", b"]", b"\"", b"\\", b":", b"\x00", b"\x1f", b"\xff"])[0],
        _ => line.splice(at..at, r.pick(&[b",", b"{}", b"[", b"\"\\u", b"\\ud800"]).iter().copied()).for_each(drop),
    }
    line
}

fn deep(n: usize, open: &str, close: &str) -> Vec<u8> {
    format!("{{\"type\":\"message\",\"id\":\"d\",\"x\":{}1{}}}", open.repeat(n), close.repeat(n)).into_bytes()
}

/// The hand-written cases, then `n` generated ones.
fn corpus(n: usize) -> Vec<Vec<u8>> {
    let mut lines: Vec<Vec<u8>> = [
        &br#"{"type":"message","id":"ab","parentId":null,"message":{"role":"user"}}"#[..],
        br#"{"type":"message","id":"a","id":"b","parentId":"p\u0041"}"#,
        br#"{"id":{"x":1},"id":"last"}"#,
        br#"{"id":"first","id":[1]}"#,
        br#"{"id":1,"parentId":0}"#,
        br#"{"id":-0,"parentId":-0}"#,
        br#"{"id":5.0,"parentId":false}"#,
        br#"{"id":true,"parentId":true}"#,
        br#"{"id":1e21,"parentId":1e-7}"#,
        br#"{"id":1e400,"parentId":"x"}"#,
        br#"{"id":"","parentId":""}"#,
        br#"{"id":"\ud800","parentId":"\udc00"}"#,
        br#"{"id":"\ud83d\ude00","type":"\u006dessage"}"#,
        br#"{"\ud800":1,"id":"x"}"#,
        br#"{"message":"\ud800","id":"m"}"#,
        b"{\"message\":\"caf\xff\",\"id\":\"m\"}",
        b"{\"id\":\"\xff\xfe\",\"parentId\":\"\xc3\"}",
        b"{\"x\":\"\xff\",\"id\":\"ok\"}",
        b"{\"\xff\":1}",
        b"\xef\xbb\xbf{\"id\":\"bom\"}",
        b"{\"id\":\"a\"}\r",
        b"\r\t {\"id\":\"a\"} \r",
        b"{\"id\":\"a\"}\x0b",
        b"{\"id\":\"a\"}\x00",
        b"{\"id\":\"tab\there\"}",
        b"{\"id\":\"a\"",
        b"{\"id\":\"a\",}",
        b"{\"id\" \"a\"}",
        b"[1,2,]",
        b"[1 2]",
        b"{}",
        b"{ }",
        b"[]",
        b"null",
        b" null ",
        b"nul",
        b"nulll",
        b"42",
        b"-0",
        b"\"x\"",
        b"true",
        b"1e400",
        b"01",
        b"{\"a\":01}",
        b"{\"a\":-}",
        b"{\"a\":.5}",
        b"{\"a\":1.}",
        b"{\"a\":\"\\u00G0\"}",
        b"{\"a\":\"\\'\"}",
        b"{\"a\":'x'}",
        b"{a:1}",
        b"{\"a\":1}{}",
        b"{\"a\":1},",
        b"{\"message\":{\"role\":\"assistant\"} }",
        b"{\"message\" : [ 1 , { } ] , \"id\" : \"s\" }",
    ]
    .iter()
    .map(|l| l.to_vec())
    .collect();
    lines.push(deep(127, "[", "]"));
    lines.push(deep(128, "[", "]"));
    lines.push(deep(129, "{\"a\":", "}"));
    lines.push(deep(5000, "[", "]"));
    lines.push(deep(5000, "[{\"k\":", "}]"));
    lines.push(deep(300, "[", "]")[..200].to_vec());
    let mut r = Rng(0x9E37_79B9_7F4A_7C15, false);
    for i in 0..n {
        r.1 = i % 3 == 0;
        let line = if i % 4 == 0 {
            let mut v = Vec::new();
            value(&mut r, &mut v, 0);
            v
        } else {
            entry(&mut r)
        };
        lines.push(mutate(&mut r, line));
    }
    lines
}

#[test]
fn the_scanner_reads_what_the_serde_reference_reads() {
    let (mut accepted, mut only_scanner) = (0, 0);
    for line in corpus(300_000) {
        let (got, want) = (scanned(&line), reference(&line));
        match want {
            Some(want) => {
                assert_eq!(got.as_ref(), Some(&want), "line {:?}", String::from_utf8_lossy(&line));
                accepted += 1;
            }
            None => only_scanner += usize::from(got.is_some()),
        }
    }
    // The corpus exercises both sides.
    assert!(accepted > 100_000 && only_scanner > 10_000, "accepted {accepted}, only by the scanner {only_scanner}");
}

// Needs Node (`JSON.parse` is the judge): built only with the `external` feature, which `scripts/test`
// turns on; plain `cargo test` leaves it out.
#[cfg(feature = "external")]
/// Node's verdict on each line, decoded as Pi decodes a file: accepted or not, and the `type`, `id`
/// and `parentId` of an object when they are strings (as UTF-8, lone surrogates as U+FFFD).
fn node_verdicts(lines: &[Vec<u8>]) -> Vec<Option<Found>> {
    use std::io::Write;
    let script = r#"
const lines = require("fs").readFileSync(0, "utf8").trim().split("\n");
const str = (v) => typeof v === "string" ? Buffer.from(v).toString("base64") : null;
const out = lines.map((b64) => {
  const text = Buffer.from(b64, "base64").toString("utf8");
  let v;
  try { v = JSON.parse(text); } catch { return null; }
  if (v === null) return { k: "null" };
  if (typeof v !== "object" || Array.isArray(v)) return { k: "scalar" };
  return { k: "object", type: str(v.type), id: str(v.id), parent: str(v.parentId), hasParent: "parentId" in v };
});
process.stdout.write(JSON.stringify(out));
"#;
    let b64 = |b: &[u8]| {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in b.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for k in 0..4 {
                s.push(if k <= c.len() { char::from(A[(n >> (18 - 6 * k)) as usize & 63]) } else { '=' });
            }
        }
        s
    };
    let mut child = std::process::Command::new("node")
        .args(["-e", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node must be installed for this test (it is Pi's runtime)");
    let input: String = lines.iter().map(|l| b64(l) + "\n").collect();
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("node ran");
    writer.join().expect("writer").expect("written");
    assert!(out.status.success(), "node failed: {}", String::from_utf8_lossy(&out.stderr));
    let verdicts: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("node's verdicts");
    let decode = |v: &serde_json::Value| -> Option<String> {
        let s = v.as_str()?;
        let mut bytes = Vec::new();
        let val = |c: u8| A64.iter().position(|&a| a == c).unwrap_or(0) as u32;
        for q in s.as_bytes().chunks(4) {
            let n = q.iter().fold(0, |n, &c| n << 6 | if c == b'=' { 0 } else { val(c) });
            let pad = q.iter().filter(|&&c| c == b'=').count();
            bytes.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
        }
        Some(String::from_utf8(bytes).expect("node's UTF-8"))
    };
    verdicts
        .iter()
        .map(|v| match v["k"].as_str()? {
            "null" => Some(Found::Null),
            "scalar" => Some(Found::Scalar),
            _ => Some(Found::Object {
                ty: decode(&v["type"]),
                id: decode(&v["id"]),
                parent: v["hasParent"].as_bool().unwrap_or(false).then(|| decode(&v["parent"])),
                message: None,
            }),
        })
        .collect()
}

#[cfg(feature = "external")]
const A64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

#[cfg(feature = "external")]
#[test]
fn the_scanner_accepts_exactly_what_json_parse_accepts() {
    let lines: Vec<Vec<u8>> = corpus(30_000).into_iter().filter(|l| !l.contains(&b'\n') && !is_blank(l)).collect();
    let verdicts = node_verdicts(&lines);
    assert_eq!(verdicts.len(), lines.len());
    let mut compared = 0;
    for (line, node) in lines.iter().zip(verdicts) {
        let show = String::from_utf8_lossy(line);
        let got = scanned(line);
        assert_eq!(
            got.is_some(),
            node.is_some(),
            "JSON.parse {} {show:?}",
            if node.is_some() { "accepts" } else { "rejects" }
        );
        match (got, node) {
            (
                Some(Found::Object { ty, id, parent, .. }),
                Some(Found::Object { ty: nty, id: nid, parent: nparent, .. }),
            ) => {
                // Strings only: other ids are keys with a prefix, compared with the reference above.
                assert_eq!(ty, nty, "type of {show:?}");
                if nid.is_some() || id.as_deref().is_none_or(|i| !i.starts_with(NON_STRING_KEY)) {
                    assert_eq!(id, nid, "id of {show:?}");
                }
                match (parent, nparent) {
                    (Some(p), Some(np)) => {
                        // A falsy or non-string parent is a root here.
                        if let Some(np) = np.filter(|np| !np.is_empty()) {
                            assert_eq!(p.as_deref(), Some(np.as_str()), "parentId of {show:?}");
                        }
                    }
                    (p, np) => assert_eq!(p.is_some(), np.is_some(), "parentId presence of {show:?}"),
                }
                compared += 1;
            }
            (got, node) => assert_eq!(
                got.map(|f| matches!(f, Found::Object { .. })),
                node.map(|f| matches!(f, Found::Object { .. })),
                "{show:?}"
            ),
        }
    }
    assert!(compared > 10_000, "only {compared} objects compared");
}
