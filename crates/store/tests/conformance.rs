//! Conformance with the real Pi library: every fixture of `shared/pi-oracle` read by Pincer gives the
//! same `{sessionId, leafId, entries, context}` as the library produced (nondeterministic paths skipped).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use pincer_store::{context_report, LeafArg, Session};
use pincer_testkit::fixtures_dir;
use pretty_assertions::assert_eq;
use serde_json::Value;

fn strip(v: &mut Value, path: &str) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut cur = v;
    for p in &parts[..parts.len() - 1] {
        match cur.get_mut(*p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(obj) = cur.as_object_mut() {
        obj.remove(parts[parts.len() - 1]);
    }
}

#[test]
fn every_fixture_reads_like_pi() {
    let dir = fixtures_dir();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest")).expect("json");
    let mut checked = 0;
    for fx in manifest["fixtures"].as_array().expect("fixtures") {
        let name = fx["name"].as_str().expect("name");
        let file = dir.join(fx["file"].as_str().expect("file"));
        let before = std::fs::read(&file).expect("read fixture");
        let session = Session::parse(before.clone());
        let pi_fails = fx["piFails"].as_bool().unwrap_or(false);
        for exp in fx["expected"].as_array().expect("expected") {
            let leaf = exp["leaf"].as_str().expect("leaf");
            let leaf = if leaf.starts_with('(') { LeafArg::Default } else { LeafArg::parse(leaf) };
            let mut got = context_report(&session, &leaf).expect("context").to_value();
            if pi_fails {
                // Pi crashes or hangs here; Pincer must give a usable context and say what it did.
                assert!(got.get("warnings").is_some(), "{name}: no warning in {got}");
                checked += 1;
                continue;
            }
            let mut want: Value =
                serde_json::from_slice(&std::fs::read(dir.join(exp["file"].as_str().expect("file"))).expect("read"))
                    .expect("json");
            want.as_object_mut().expect("object").remove("extra");
            got.as_object_mut().expect("object").remove("warnings");
            for p in fx["nondeterministic"].as_array().into_iter().flatten() {
                let p = p.as_str().expect("path");
                strip(&mut want, p);
                strip(&mut got, p);
            }
            if name.starts_with("10-") || name.starts_with("16-") {
                // v1 ids are random on every read: check their shape instead.
                let leaf = context_report(&session, &LeafArg::Default).expect("context").to_value()["leafId"].clone();
                let leaf = leaf.as_str().expect("v1 leaf id");
                assert!(leaf.len() == 8 && leaf.chars().all(|c| c.is_ascii_hexdigit()), "{leaf}");
            }
            assert_eq!(got, want, "fixture {name} leaf {:?}", exp["leaf"]);
            checked += 1;
        }
        assert_eq!(std::fs::read(&file).expect("reread"), before, "{name} was modified");
    }
    assert!(checked >= 30, "only {checked} expectations checked");
}

#[test]
fn pi_failures_are_handled_safely() {
    let dir = fixtures_dir();
    let null_line = Session::parse(std::fs::read(dir.join("22e-null-line.jsonl")).expect("read"));
    let got = context_report(&null_line, &LeafArg::Default).expect("context").to_value();
    assert_eq!(got["context"]["messages"].as_array().map(Vec::len), Some(1));
    assert_eq!(got["context"]["messages"][0]["content"], "hi");

    let cycle = Session::parse(std::fs::read(dir.join("22f-parent-cycle.jsonl")).expect("read"));
    let got = context_report(&cycle, &LeafArg::Default).expect("context").to_value();
    let texts: Vec<&str> =
        got["context"]["messages"].as_array().expect("messages").iter().filter_map(|m| m["content"].as_str()).collect();
    assert_eq!(texts, vec!["a", "b"]);
    assert!(cycle.problems.iter().any(|p| matches!(p, pincer_store::Problem::Cycle { .. })));
}
