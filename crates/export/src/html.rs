//! The HTML export: one self-contained file (no network: its Content-Security-Policy allows its
//! own inline scripts and style, by hash, and `data:` images, nothing else) holding the original
//! JSONL (base64, so every byte survives and [`crate::import::extract`] gets it back) and a viewer
//! (assets/viewer.js) that shows the whole tree: every branch, compaction and branch summaries,
//! labels, tool calls and results, images; Markdown through the WebChat's vendored marked and
//! DOMPurify; a "user messages only" filter; deep links `#entry=<id>`.

use crate::import::EMBED_ID;
use base64::Engine as _;
use pincer_store::session::Session;
use sha2::{Digest, Sha256};

const VIEWER_JS: &str = include_str!("../assets/viewer.js");
const VIEWER_CSS: &str = include_str!("../assets/viewer.css");
/// The WebChat's vendored libraries (pinned in crates/gateway/web/vendor/vendor.lock.json).
const MARKED: &str = include_str!("../../gateway/web/vendor/marked.esm.js");
const PURIFY: &str = include_str!("../../gateway/web/vendor/purify.es.mjs");

/// An ES module without imports as a classic script: its one `export {a as b, …}` becomes
/// `globalThis.PincerVendor[name] = {b: a, …}`, the rest runs in a strict function scope.
fn module_as_script(src: &str, name: &str) -> String {
    let Some(at) = src.rfind("export{").or_else(|| src.rfind("export {")) else {
        return format!("(function(){{\"use strict\";\n{src}\n}})();");
    };
    let open = at + src[at..].find('{').unwrap_or(0);
    let close = open + src[open..].find('}').unwrap_or(0);
    let names: Vec<String> = src[open + 1..close]
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split_whitespace();
            let local = parts.next()?;
            let exported = match (parts.next(), parts.next()) {
                (Some("as"), Some(e)) => e,
                _ => local,
            };
            Some(format!("{exported:?}:{local}"))
        })
        .collect();
    let rest = src[close + 1..].strip_prefix(';').unwrap_or(&src[close + 1..]);
    format!(
        "(function(){{\"use strict\";\n{}\n(globalThis.PincerVendor=globalThis.PincerVendor||{{}})[{name:?}]={{{}}};\n{}\n}})();",
        &src[..at],
        names.join(","),
        rest
    )
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn hash(s: &str) -> String {
    format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s.as_bytes())))
}

/// The export of `s` (its bytes exactly as read), opening at `leaf` (default: the file's leaf).
pub fn html(s: &Session, leaf: Option<&str>) -> String {
    let title = crate::title(s).unwrap_or_else(|| "Untitled session".into());
    let scripts = [module_as_script(MARKED, "marked"), module_as_script(PURIFY, "purify"), VIEWER_JS.to_owned()];
    let csp = format!(
        "default-src 'none'; script-src {}; style-src {}; img-src data:; base-uri 'none'; form-action 'none'",
        scripts.iter().map(|s| hash(s)).collect::<Vec<_>>().join(" "),
        hash(VIEWER_CSS)
    );
    let data = base64::engine::general_purpose::STANDARD.encode(s.bytes());
    let mut out = String::with_capacity(data.len() + 200_000);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str(&format!("<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n"));
    out.push_str(&format!("<meta name=\"generator\" content=\"Pincer {}\">\n", env!("CARGO_PKG_VERSION")));
    out.push_str(&format!("<title>{}</title>\n<style>{VIEWER_CSS}</style>\n</head>\n<body>\n", escape(&title)));
    out.push_str("<noscript>This export shows the session with JavaScript; the transcript itself is the base64 JSONL below.</noscript>\n");
    out.push_str("<div id=\"app\"></div>\n");
    let leaf_attr = leaf.map(|l| format!(" data-leaf=\"{}\"", escape(l))).unwrap_or_default();
    out.push_str(&format!(
        "<script type=\"application/x-pi-session+jsonl\" id=\"{EMBED_ID}\" data-encoding=\"base64\"{leaf_attr}>\n"
    ));
    for chunk in data.as_bytes().chunks(76 * 1024) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("</script>\n");
    for s in &scripts {
        out.push_str("<script>");
        out.push_str(s);
        out.push_str("</script>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inlined_code_cannot_end_its_script_element() {
        for (name, src) in [("marked", MARKED), ("purify", PURIFY), ("viewer", VIEWER_JS)] {
            let lower = src.to_ascii_lowercase();
            assert!(!lower.contains("</script") && !lower.contains("<script"), "{name}");
        }
    }

    #[test]
    fn module_exports_become_globals() {
        let s = module_as_script("var a=1,b=2;export{a as A,b};\n//# map", "x");
        assert!(s.contains("[\"x\"]={\"A\":a,\"b\":b};"), "{s}");
        assert!(!s.contains("export"), "{s}");
        assert!(
            MARKED.contains("export{") && PURIFY.contains("export {"),
            "the vendored files still end in one export"
        );
    }
}
