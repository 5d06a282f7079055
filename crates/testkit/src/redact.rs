//! The one redaction of wire snapshots: what varies from run to run (ids, timestamps, durations,
//! ports, temp paths, byte counts that follow them) becomes a stable placeholder, and nothing else
//! changes: objects keep their keys in wire order (serde_json is built with `preserve_order`), so a
//! snapshot of redacted JSON still catches a renamed, added, removed or reordered field. Ids are
//! numbered by first appearance (`<id:1>`, `<id:2>`, …) within one [`Redactor`], so the links between
//! them (an entry's `parentId` naming the entry before it, a `runId` seen again in a later event)
//! stay visible in the snapshot.

use regex::Regex;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Keys whose numbers are clock readings in seconds or durations (any key ending in `At` or `AtMs`
/// is a clock reading too; so is any number that reads as a millisecond clock, see [`CLOCK_MS`]).
const TIME_KEYS: &[&str] = &["ts", "timestamp", "created", "uptimeMs", "durationMs", "elapsedMs"];

/// Numbers in this range are millisecond clock readings (2017 to 2049), whatever their key.
const CLOCK_MS: std::ops::Range<u64> = 1_500_000_000_000..2_500_000_000_000;

/// Redacts JSON values and text for a snapshot; one per snapshot (or per group of snapshots whose
/// ids should be numbered together).
pub struct Redactor {
    /// Exact substrings replaced first (temp dirs, the gateway's and the fake's addresses), longest first.
    literals: Vec<(String, String)>,
    /// Whole words replaced next (the host name, which may be as short as `vm`).
    words: Vec<(Regex, String)>,
    ids: HashMap<String, usize>,
    uuid: Regex,
    iso: Regex,
    date: Regex,
    stamp: Regex,
    port: Regex,
    duration: Regex,
    /// Keys whose string values are ids even when they are not UUIDs.
    id_keys: Vec<String>,
    /// Keys whose numbers are sizes to hide.
    size_keys: Vec<String>,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

impl Redactor {
    pub fn new() -> Redactor {
        Redactor {
            literals: Vec::new(),
            words: Vec::new(),
            ids: HashMap::new(),
            uuid: Regex::new(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}").unwrap(),
            // 2026-12-06T05:11:53.123Z, the file-name form 2026-12-06T05-11-53-123Z, and the
            // human one of exports, 2026-12-06 05:11:53 UTC.
            iso: Regex::new(
                r"\d{4}-\d{2}-\d{2}[T ]\d{2}[:-]\d{2}[:-]\d{2}(?:[.-]\d{1,9})?(?:Z| UTC|[+-]\d{2}:?\d{2})?",
            )
            .unwrap(),
            // A day alone (`sessions.usage`'s `startDate`): the test's date.
            date: Regex::new(r"\b\d{4}-\d{2}-\d{2}\b").unwrap(),
            // A bare millisecond clock reading inside text.
            stamp: Regex::new(r"\b[12]\d{12}\b").unwrap(),
            port: Regex::new(r"(127\.0\.0\.1|localhost|\[::1\]):\d{2,5}").unwrap(),
            // Durations in log lines: `duration_ms=15`.
            duration: Regex::new(r"\b(\w+_ms)=\d+").unwrap(),
            id_keys: Vec::new(),
            size_keys: Vec::new(),
        }
    }

    /// Replaces every occurrence of `from` in strings by `to` (before any other rule).
    pub fn literal(mut self, from: impl Into<String>, to: impl Into<String>) -> Redactor {
        let from = from.into();
        if !from.is_empty() {
            self.literals.push((from, to.into()));
            self.literals.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
        }
        self
    }

    /// Replaces `from` where it stands as a whole word by `to` (after the literals).
    pub fn word(mut self, from: &str, to: impl Into<String>) -> Redactor {
        if !from.is_empty() {
            self.words.push((Regex::new(&format!(r"\b{}\b", regex::escape(from))).unwrap(), to.into()));
        }
        self
    }

    /// This machine's host name (as the gateway reads it) becomes `<host>`.
    pub fn host(self) -> Redactor {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        self.word(host.trim(), "<host>")
    }

    /// Treats the string values of `key` as ids (numbered) whatever they look like.
    pub fn id_key(mut self, key: &str) -> Redactor {
        self.id_keys.push(key.to_owned());
        self
    }

    /// Hides the numbers of `key`: a size of something that holds a temp path or a timestamp.
    pub fn size_key(mut self, key: &str) -> Redactor {
        self.size_keys.push(key.to_owned());
        self
    }

    /// The placeholder of an id: the same id always gets the same number.
    pub fn id(&mut self, raw: &str) -> String {
        let next = self.ids.len() + 1;
        format!("<id:{}>", self.ids.entry(raw.to_owned()).or_insert(next))
    }

    /// A redacted copy of `v`, keys in their order.
    pub fn value(&mut self, v: &Value) -> Value {
        self.walk(None, v)
    }

    fn walk(&mut self, key: Option<&str>, v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, x) in m {
                    let r = self.walk(Some(k), x);
                    out.insert(k.clone(), r);
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(|x| self.walk(key, x)).collect()),
            Value::Number(n) if key.is_some_and(is_time_key) && n.as_u64().is_some_and(|n| n > 0) => {
                Value::String("<time>".into())
            }
            Value::Number(n) if n.as_u64().is_some_and(|n| CLOCK_MS.contains(&n)) => Value::String("<time>".into()),
            Value::Number(_) if key.is_some_and(|k| self.size_keys.iter().any(|s| s == k)) => {
                Value::String("<size>".into())
            }
            Value::String(s) if key.is_some_and(|k| self.id_keys.iter().any(|i| i == k)) => {
                let s = self.text(s);
                Value::String(if s.starts_with("<id:") { s } else { self.id(&s) })
            }
            Value::String(s) => Value::String(self.text(s)),
            other => other.clone(),
        }
    }

    /// Text with the same rules applied inside it (ids, timestamps, ports, literals).
    pub fn text(&mut self, s: &str) -> String {
        let mut s = s.to_owned();
        for (from, to) in &self.literals {
            if s.contains(from.as_str()) {
                s = s.replace(from.as_str(), to);
            }
        }
        for (word, to) in &self.words {
            s = word.replace_all(&s, regex::NoExpand(to)).into_owned();
        }
        let uuid = self.uuid.clone();
        let s = uuid.replace_all(&s, |c: &regex::Captures<'_>| self.id(&c[0]));
        let s = self.iso.replace_all(&s, "<iso>");
        let s = self.date.replace_all(&s, "<date>");
        let s = self.stamp.replace_all(&s, "<ms>");
        let s = self.duration.replace_all(&s, "$1=<ms>");
        self.port.replace_all(&s, "$1:<port>").into_owned()
    }
}

fn is_time_key(k: &str) -> bool {
    TIME_KEYS.contains(&k) || k.ends_with("At") || k.ends_with("AtMs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_are_numbered_by_first_appearance_and_order_is_kept() {
        let a = "0192f1e0-0000-7000-8000-000000000001";
        let b = "0192f1e0-0000-7000-8000-000000000002";
        let v = json!({"z": 1, "id": b, "parentId": a, "ts": 1765000000000u64, "createdAt": 1765000000001u64,
            "seen": 1765000000002u64, "text": format!("see {a} on 127.0.0.1:40123 at 2026-12-06T05:11:53.123Z"),
            "path": "/tmp/x1/state/f", "log": "x duration_ms=15 at 2026-12-06 05:22:30 UTC", "day": "2026-12-06"});
        let out = Redactor::new().literal("/tmp/x1", "<tmp>").value(&v);
        assert_eq!(
            serde_json::to_string(&out).unwrap(),
            r#"{"z":1,"id":"<id:1>","parentId":"<id:2>","ts":"<time>","createdAt":"<time>","seen":"<time>","text":"see <id:2> on 127.0.0.1:<port> at <iso>","path":"<tmp>/state/f","log":"x duration_ms=<ms> at <iso>","day":"<date>"}"#
        );
    }
}
