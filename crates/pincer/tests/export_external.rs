//! `pincer transcript import` checked against the real Pi library (the part of `export.rs` that
//! needs the Pi oracle on Node, so it builds only with the `external` feature): an HTML export
//! imported restores the tree exactly and Pi reads it as the original at every leaf; a clashing
//! session id is replaced, and only it.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};

#[path = "export/common.rs"]
mod common;
use common::*;

/// Every entry id of a transcript, in file order.
fn ids(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?.get("id")?.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn html_import_restores_the_tree_exactly_and_pi_reads_it_the_same_at_every_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let f = fixture();
    let html_path = dir.path().join("export.html");
    ok(&["transcript", "export", s(&f), "--format", "html", "--output", s(&html_path)]);
    let printed: Value =
        serde_json::from_slice(&ok(&["transcript", "import", s(&html_path), "--state-dir", s(&state)])).unwrap();
    assert_eq!(printed["sessionKey"], "agent:main:import:export-fixture");
    assert_eq!(printed["sessionId"], "export-fixture");
    let imported = PathBuf::from(printed["file"].as_str().unwrap());
    assert_eq!(imported, state.join("agents/main/sessions/export-fixture.jsonl"));
    assert_eq!(std::fs::read(&imported).unwrap(), std::fs::read(&f).unwrap(), "byte-identical");
    // export → import → export: the same embedded JSONL (and the same page).
    let html2 = ok(&["transcript", "export", s(&imported), "--format", "html"]);
    assert_eq!(embedded(&html2), std::fs::read(&f).unwrap());
    assert_eq!(html2, std::fs::read(&html_path).unwrap());
    // The session is in the index, so the gateway (and `sessions list`) sees it.
    let listed: Value = serde_json::from_slice(&ok(&["sessions", "list", "--json", "--state-dir", s(&state)])).unwrap();
    assert!(listed.as_array().unwrap().iter().any(|r| r["key"] == "agent:main:import:export-fixture"), "{listed}");
    // The real Pi library: the same context at the file's leaf and at every entry.
    let mut leaves: Vec<Option<String>> = vec![None];
    leaves.extend(ids(&f).into_iter().map(Some));
    for leaf in &leaves {
        let a = pincer_testkit::oracle_context(&f, leaf.as_deref());
        let b = pincer_testkit::oracle_context(&imported, leaf.as_deref());
        assert!(a.get("error").is_none(), "{a}");
        assert_eq!(a, b, "Pi context at {leaf:?}");
    }
}

#[test]
fn a_clashing_session_id_is_replaced_and_nothing_else_changes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let f = fixture();
    let first: Value = serde_json::from_slice(&ok(&["transcript", "import", s(&f), "--state-dir", s(&state)])).unwrap();
    let second: Value =
        serde_json::from_slice(&ok(&["transcript", "import", s(&f), "--state-dir", s(&state)])).unwrap();
    assert_eq!(first["sessionId"], "export-fixture");
    let new_id = second["sessionId"].as_str().unwrap();
    assert_ne!(new_id, "export-fixture");
    assert_eq!(second["sessionKey"], format!("agent:main:import:{new_id}"));
    let original = std::fs::read_to_string(&f).unwrap();
    let copy = std::fs::read_to_string(second["file"].as_str().unwrap()).unwrap();
    let (h1, rest1) = original.split_once('\n').unwrap();
    let (h2, rest2) = copy.split_once('\n').unwrap();
    assert_eq!(rest1, rest2, "every entry byte-identical");
    let (mut h1, h2): (Value, Value) = (serde_json::from_str(h1).unwrap(), serde_json::from_str(h2).unwrap());
    h1["id"] = Value::from(new_id);
    assert_eq!(h1, h2, "only the header's id changed");
    let a = pincer_testkit::oracle_context(&f, None);
    let b = pincer_testkit::oracle_context(Path::new(second["file"].as_str().unwrap()), None);
    let b: Value = serde_json::from_str(&b.to_string().replace(new_id, "export-fixture")).unwrap();
    assert_eq!(a, b, "Pi reads the same session but for its id");
    assert_eq!(
        std::fs::read_to_string(first["file"].as_str().unwrap()).unwrap(),
        original,
        "the first import untouched"
    );
}
