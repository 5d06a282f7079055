//! `pincer transcript export` and `import` as a user runs them: the Markdown of a branch
//! (snapshot-tested), the HTML export's embedded JSONL back through `import` byte for byte, the
//! real Pi library reading the imported file exactly as the original at every leaf, a clashing
//! session id replaced (and only it), and bad input refused with nothing written.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

fn fixture() -> PathBuf {
    pincer_testkit::repo_root().join("crates/export/tests/fixtures/three-branches.jsonl")
}

fn pincer(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("TZ", "UTC").env_remove("PINCER_STATE_DIR").output().unwrap()
}

fn ok(args: &[&str]) -> Vec<u8> {
    let out = pincer(args);
    assert!(out.status.success(), "pincer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The JSONL embedded in an HTML export, decoded.
fn embedded(html: &[u8]) -> Vec<u8> {
    pincer_export::import::extract(html).unwrap()
}

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
fn markdown_of_the_active_branch_and_of_another_leaf() {
    let f = fixture();
    let md = String::from_utf8(ok(&["transcript", "export", s(&f), "--format", "md"])).unwrap();
    insta::assert_snapshot!("active_branch", md);
    let md = String::from_utf8(ok(&["transcript", "export", s(&f), "--format", "md", "--leaf", "a5"])).unwrap();
    insta::assert_snapshot!("branch_c", md);
    let out = pincer(&["transcript", "export", s(&f), "--format", "md", "--leaf", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown entry id \"nope\""));
}

#[test]
fn jsonl_export_is_the_file_and_html_embeds_it() {
    let f = fixture();
    let original = std::fs::read(&f).unwrap();
    assert_eq!(ok(&["transcript", "export", s(&f), "--format", "jsonl"]), original);
    let html = ok(&["transcript", "export", s(&f), "--format", "html"]);
    assert_eq!(embedded(&html), original);
    let text = String::from_utf8(html).unwrap();
    assert!(text.contains("<title>Plan a trip to **Lisbon**, please.</title>"), "title");
    assert!(text.contains("script-src 'sha256-") && text.contains("default-src 'none'"), "a CSP without network");
    assert!(!text.contains("window.__injected"), "message text only inside the base64 JSONL");
    let at_c = String::from_utf8(ok(&["transcript", "export", s(&f), "--leaf", "a5"])).unwrap();
    assert!(
        at_c.contains("id=\"pincer-session\" data-encoding=\"base64\" data-leaf=\"a5\""),
        "--leaf opens that branch"
    );
    let out = pincer(&["transcript", "export", s(&f), "--format", "pdf"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn output_files_are_new_and_private() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture();
    let out = dir.path().join("export.html");
    ok(&["transcript", "export", s(&f), "--output", s(&out)]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
    let before = std::fs::read(&out).unwrap();
    let again = pincer(&["transcript", "export", s(&f), "--format", "md", "--output", s(&out)]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists; nothing written"));
    assert_eq!(std::fs::read(&out).unwrap(), before, "never overwritten");
    let copy = dir.path().join("s.jsonl");
    std::fs::copy(&f, &copy).unwrap();
    let onto = pincer(&["transcript", "export", s(&copy), "--output", s(&copy)]);
    assert_eq!(onto.status.code(), Some(2));
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&f).unwrap());
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

#[test]
fn bad_input_is_refused_naming_the_problem_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let original = std::fs::read_to_string(fixture()).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("empty.jsonl", String::new(), "the file is empty"),
        ("torn.jsonl", original[..original.len() - 20].to_owned(), "not a whole Pi session"),
        ("garbage.jsonl", format!("{original}not json\n"), "line is not valid JSON"),
        ("headless.jsonl", original.split_once('\n').unwrap().1.to_owned(), "no valid session header"),
        ("page.html", "<!DOCTYPE html><html><body>hi</body></html>".into(), "not a Pincer export"),
        ("cut.html", "<html><script id=\"pincer-session\">abc".into(), "cut off"),
        ("bad64.html", "<html><script id=\"pincer-session\">@@@</script>".into(), "not valid base64"),
    ];
    for (name, content, why) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        let out = pincer(&["transcript", "import", s(&p), "--state-dir", s(&state)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(why) && err.contains(name), "{name}: {err}");
        assert!(!state.exists(), "{name}: nothing written");
    }
    let out = pincer(&["transcript", "import", s(&dir.path().join("missing.html")), "--state-dir", s(&state)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.html: cannot read"));
    assert!(!state.exists());
}
