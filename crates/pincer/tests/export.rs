//! `pincer transcript export` and `import` as a user runs them: the Markdown of a branch
//! (snapshot-tested), the HTML export's embedded JSONL back through `import` byte for byte, and bad
//! input refused with nothing written. The tests that also need the Pi oracle (Node) are in
//! `export_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "export/common.rs"]
mod common;
use common::*;

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
