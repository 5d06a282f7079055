//! The WebChat's files (crates/gateway/web/), built into the binary: the page at `/`, its modules,
//! styles and vendored libraries under `/webchat/`. Each answer has its content type, an `ETag`
//! (the file's hash) and `Cache-Control: no-cache` (revalidated, so a new binary is seen at once);
//! the page itself carries the Content-Security-Policy that allows only these same-origin files.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::hash::{Hash, Hasher};

/// Where the page's files are served.
pub const PREFIX: &str = "/webchat/";

/// Scripts, styles and connections from this origin only; no inline code, plugins, frames or forms
/// elsewhere. Images may be data:/blob: URLs (attachment previews).
pub const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
    connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

macro_rules! web {
    ($($path:literal => $mime:expr),* $(,)?) => {
        &[$(($path, include_bytes!(concat!("../web/", $path)) as &[u8], $mime)),*]
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// Every file: path under [`PREFIX`], bytes, content type.
static FILES: &[(&str, &[u8], &str)] = web! {
    "index.html" => "text/html; charset=utf-8",
    "app.css" => CSS,
    "js/main.js" => JS,
    "js/rpc.js" => JS,
    "js/markdown.js" => JS,
    "js/outbox.js" => JS,
    "js/sessions.js" => JS,
    "js/messages.js" => JS,
    "js/composer.js" => JS,
    "js/util.js" => JS,
    "js/approvals.js" => JS,
    "vendor/marked.esm.js" => JS,
    "vendor/purify.es.mjs" => JS,
    "vendor/highlight.min.js" => JS,
    "vendor/hljs-github.min.css" => CSS,
    "vendor/hljs-github-dark.min.css" => CSS,
    "vendor/LICENSE.marked" => TEXT,
    "vendor/LICENSE.dompurify" => TEXT,
    "vendor/LICENSE.highlightjs" => TEXT,
    "vendor/vendor.lock.json" => "application/json",
};

fn etag(bytes: &[u8]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    format!("\"{:016x}-{}\"", h.finish(), bytes.len())
}

/// The file at `rel` (a path under [`PREFIX`]), if there is one.
pub fn find(rel: &str) -> Option<(&'static [u8], &'static str)> {
    FILES.iter().find(|(p, _, _)| *p == rel).map(|(_, b, m)| (*b, *m))
}

/// Serves one file, or 304 when the client's copy is current.
pub fn serve(rel: &str, headers: &HeaderMap) -> Response {
    let Some((bytes, mime)) = find(rel) else {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    };
    let tag = etag(bytes);
    let mut out = match headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        Some(v) if v.split(',').any(|t| t.trim() == tag) => StatusCode::NOT_MODIFIED.into_response(),
        _ => ([(header::CONTENT_TYPE, mime)], bytes).into_response(),
    };
    let h = out.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&tag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if rel == "index.html" {
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PAGE_CSP));
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_there_with_its_type_and_the_page_has_a_csp() {
        for (path, bytes, mime) in FILES {
            assert!(!bytes.is_empty(), "{path} is empty");
            let want = match path.rsplit('.').next() {
                Some("js" | "mjs") => JS,
                Some("css") => CSS,
                Some("html") => "text/html; charset=utf-8",
                Some("json") => "application/json",
                _ => TEXT,
            };
            assert_eq!(*mime, want, "{path}");
        }
        let page = serve("index.html", &HeaderMap::new());
        assert_eq!(page.status(), StatusCode::OK);
        let csp = page.headers().get(header::CONTENT_SECURITY_POLICY).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
        let tag = page.headers().get(header::ETAG).cloned().expect("etag");
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, tag);
        assert_eq!(serve("index.html", &h).status(), StatusCode::NOT_MODIFIED);
        assert_eq!(serve("nope.js", &HeaderMap::new()).status(), StatusCode::NOT_FOUND);
        // The page and its modules load only files that are served.
        let mut refs = 0;
        for (path, bytes, _) in FILES.iter().filter(|(p, _, _)| p.ends_with(".html") || p.starts_with("js/")) {
            let text = String::from_utf8_lossy(bytes).into_owned();
            for part in text.split(&format!("\"{PREFIX}")).skip(1) {
                let rel = part.split('"').next().unwrap_or("");
                assert!(find(rel).is_some(), "{path} refers to {PREFIX}{rel}, which is not served");
                refs += 1;
            }
        }
        assert!(refs >= 10, "the page's references were found ({refs})");
    }
}
