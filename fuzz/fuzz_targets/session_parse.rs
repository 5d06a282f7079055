//! `Session::parse` over arbitrary file bytes.
//!
//! Properties (beyond "never panics"):
//! - a file without a valid header exposes no entries and no leaf;
//! - the leaf is `Empty` exactly when there are no entries, and an `Entry` leaf is in bounds;
//! - every `by_id` index is in bounds and names an entry carrying that id (the last one with it);
//! - every resolved parent is in bounds and is the entry its `parentId` names;
//! - the active path ends at the leaf, is root-first and stays in bounds; context building works;
//! - `render(false)` is a faithful rewrite: parsing it again gives the same entries (kind, id,
//!   parent) and the same leaf;
//! - the light parse (a hand-written scanner) against serde_json: every line serde_json parses is
//!   indexed, an object with the `type`, string `id`, `parentId` and `message` serde_json reads (the
//!   scanner is differentially tested against the serde parse it replaced and against Node's
//!   `JSON.parse` in crates/store/src/parse_tests.rs);
//! - the in-memory `repair` flow (adopt a header, link linear entries, `render(true)`) leaves a file
//!   with a header, a newline at the end, no torn tail, no `null` line and no old version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pincer_store::parse::Parent;
use pincer_store::{build_context, Kind, Leaf, Problem, Session};
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let s = Session::parse(data.to_vec());
    check(&s);
    against_serde(data, &s);

    if s.header.is_some() {
        let again = Session::parse(s.render(false));
        check(&again);
        assert_eq!(again.entries.len(), s.entries.len(), "render(false) changed the entry count");
        for (a, b) in s.entries.iter().zip(&again.entries) {
            assert_eq!((a.kind, &a.id, &a.parent), (b.kind, &b.id, &b.parent), "render(false) changed an entry");
        }
        assert_eq!(again.leaf, s.leaf, "render(false) moved the leaf");
        assert_eq!(again.session_id(), s.session_id());
    }

    // What `pincer transcript repair` does, without the file system.
    let mut r = Session::parse(data.to_vec());
    if r.header.is_none() {
        let Value::Object(h) =
            json!({"type": "session", "version": 3, "id": "fuzz", "timestamp": "2024-01-01T00:00:00.000Z", "cwd": "/"})
        else {
            unreachable!()
        };
        r.adopt_headerless(h);
        check(&r);
    }
    if r.is_linear() {
        r.link_linear();
        check(&r);
        // Every entry that decodes is linked now. (A line the light parse indexes may still not
        // decode fully: invalid UTF-8 inside a string value, or a number like 1e400.)
        for (i, e) in r.entries.iter().enumerate() {
            if matches!(r.value(i), Some(Value::Object(_))) {
                assert!(e.parent != Parent::Absent && e.id.is_some(), "entry {i} not linked");
            }
        }
    }
    let content = r.render(true);
    assert_eq!(content.last(), Some(&b'\n'), "a repaired file ends with a newline");
    let after = Session::parse(content);
    check(&after);
    assert!(after.header.is_some(), "a repaired file has a header: {:?}", after.problems);
    for p in &after.problems {
        assert!(
            !matches!(
                p,
                Problem::NoHeader { .. }
                    | Problem::TornTail { .. }
                    | Problem::MissingNewline { .. }
                    | Problem::NullLine { .. }
                    | Problem::OldVersion { .. }
            ),
            "repair left {p:?}"
        );
    }
    assert_eq!(after.entries.len(), r.entries.len(), "repair lost or added entries");
});

fn check(s: &Session) {
    let n = s.entries.len();
    if s.header.is_none() {
        assert_eq!(n, 0, "entries without a header");
        assert_eq!(s.leaf, Leaf::Empty);
        assert!(s.by_id.is_empty());
    } else {
        assert!(s.headerless_entries.is_empty());
        assert!(s.session_id().is_some(), "a header without a string id");
    }
    match s.leaf {
        Leaf::Empty => assert_eq!(n, 0, "Empty leaf with entries"),
        Leaf::Null => assert!(n > 0, "Null leaf without entries"),
        Leaf::Entry(i) => assert!(i < n, "leaf {i} out of bounds ({n} entries)"),
    }
    for (id, &i) in &s.by_id {
        assert!(i < n, "by_id[{id:?}] = {i} out of bounds ({n} entries)");
        assert_eq!(s.entries[i].id.as_ref(), Some(id), "by_id points at an entry with another id");
        assert!(
            s.entries[i + 1..].iter().all(|e| e.id.as_ref() != Some(id)),
            "by_id does not point at the last entry with id {id:?}"
        );
    }
    for (i, e) in s.entries.iter().enumerate() {
        if let Some(id) = &e.id {
            assert!(s.by_id.contains_key(id), "entry {i}'s id is not indexed");
        }
        match (s.parent_index(i), &e.parent) {
            (Some(p), Parent::Id(pid)) => {
                assert!(p < n, "parent of {i} out of bounds");
                assert_eq!(s.entries[p].id.as_ref(), Some(pid), "parent of {i} has another id");
            }
            (Some(_), other) => panic!("entry {i} has parent {other:?} but a resolved parent index"),
            (None, Parent::Id(pid)) => assert!(!s.by_id.contains_key(pid), "parent of {i} not resolved"),
            (None, _) => {}
        }
        if s.header.is_some() {
            let _ = s.value(i);
            let _ = s.raw_line(i);
            if e.kind == Kind::Message {
                let _ = s.raw_message(i);
            }
        }
    }
    if let Leaf::Entry(leaf) = s.leaf {
        let (path, _cycle) = s.path_from(leaf);
        assert_eq!(path.last(), Some(&leaf), "the path does not end at the leaf");
        assert!(path.iter().all(|&i| i < n));
        let mut seen = vec![false; n];
        for &i in &path {
            assert!(!std::mem::replace(&mut seen[i], true), "an entry twice on the path");
        }
        assert!(s.parent_index(path[0]).is_none_or(|p| seen[p]), "the path does not start at a root");
        assert!(s.leaf_id().is_some() == s.entries[leaf].id.is_some());
    }
    let ctx = build_context(s, &s.leaf);
    let _ = ctx.to_json();
    let mut sink = Vec::new();
    ctx.write_json(&mut sink).expect("writing to a Vec");
    // Valid JSON text (raw messages are copied verbatim, so numbers may be beyond f64).
    let raw: Box<serde_json::value::RawValue> = serde_json::from_slice(&sink).expect("the context is valid JSON");
    assert!(raw.get().starts_with('{'));
}

/// Every line serde_json parses is indexed with the keys serde_json reads.
fn against_serde(data: &[u8], s: &Session) {
    if s.migrated {
        return; // ids rewritten in memory
    }
    let entries = if s.header.is_some() { &s.entries } else { &s.headerless_entries };
    let start = if data.starts_with(b"\xEF\xBB\xBF") { 3 } else { 0 };
    let mut offset = start;
    for line in data[start..].split(|&b| b == b'\n') {
        let at = offset;
        offset += line.len() + 1;
        let Ok(v) = serde_json::from_slice::<Value>(line) else { continue };
        let entry = entries.iter().find(|e| e.offset == at);
        let obj = match &v {
            Value::Null => {
                assert!(entry.is_none(), "a null line at {at} is an entry");
                continue;
            }
            Value::Object(obj) => obj,
            _ => {
                assert!(entry.is_some_and(|e| !e.is_object), "the JSON line at {at} is not a non-object entry");
                continue;
            }
        };
        if obj.get("type").and_then(Value::as_str) == Some("session") {
            continue; // a header, or an extra one
        }
        let Some(e) = entry else { panic!("the object line at {at} is not an entry") };
        assert!(e.is_object);
        let ty = obj.get("type").and_then(Value::as_str);
        let known = ["message", "thinking_level_change", "model_change", "compaction", "branch_summary", "custom",
            "custom_message", "label", "session_info", "leaf"];
        assert_eq!(e.kind == Kind::Other, !ty.is_some_and(|t| known.contains(&t)), "kind of the line at {at}");
        match obj.get("id") {
            None | Some(Value::Null | Value::Array(_) | Value::Object(_)) => assert!(e.id.is_none()),
            Some(Value::String(id)) => assert_eq!(e.id.as_deref(), Some(id.as_str()), "id of the line at {at}"),
            Some(_) => assert!(e.id.is_some()),
        }
        match obj.get("parentId") {
            None => assert_eq!(e.parent, Parent::Absent),
            Some(Value::String(p)) if !p.is_empty() => {
                assert!(matches!(&e.parent, Parent::Id(k) if k.as_str() == p), "parent of the line at {at}")
            }
            Some(Value::String(_) | Value::Null | Value::Array(_) | Value::Object(_)) => {
                assert_eq!(e.parent, Parent::Root)
            }
            Some(_) => {}
        }
        if e.kind == Kind::Message {
            let i = entries.iter().position(|x| x.offset == at).unwrap_or(0);
            if s.header.is_some() {
                let raw = s.raw_message(i).map(|m| serde_json::from_str::<Value>(&m).ok());
                assert_eq!(raw.flatten().as_ref(), obj.get("message"), "message of the line at {at}");
            }
        }
    }
}
