//! `web_fetch {url, extractMode?, maxChars?}`: an HTTP GET made readable, shaped after OpenClaw's
//! tool of the same name (its schema, and its result fields in `details`: `url`, `finalUrl`,
//! `status`, `contentType`, `title`, `extractMode`, `extractor`, `truncated`, `length`,
//! `rawLength`, `fetchedAt`, `tookMs`, `warning`). The content block is the page's text itself.
//!
//! HTML becomes markdown-ish text ([`super::html`]); other text types (plain, markdown, JSON, XML…)
//! are returned as they are; any other type is refused before its body is read. Caps: the body is
//! read up to [`WebFetchConfig::max_bytes`] and the rest never read; the whole fetch, redirects
//! included, must end within [`WebFetchConfig::timeout`]; at most [`MAX_REDIRECTS`] redirects, each
//! target checked again; the text is cut at `maxChars` with a note.
//!
//! The private network is refused (unless [`WebFetchConfig::allow_private_network`]): a host is
//! resolved by this module's resolver, which refuses the name when any of its addresses is
//! loopback, private, link-local (the cloud metadata address), shared (CGNAT), unspecified,
//! multicast or reserved (IPv4-mapped and -embedding IPv6 forms too), and the connection goes to
//! the addresses it checked — no second lookup a rebinding DNS server could answer differently.
//! An IP-literal host is checked before the request. No proxy is used (a proxy would resolve the
//! name itself). Nothing is written to disk. Every failure is the tool's error, naming the URL.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;
use serde_json::{json, Value};

use super::{html, Tool, ToolError, ToolFuture, ToolOutput};
use crate::provider::{error_chain, http_client_builder};

/// The settings of `web_fetch` (`[agents.defaults.tools]` `web_fetch_private_network`,
/// `web_fetch_max_bytes`, `web_fetch_timeout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebFetchConfig {
    /// Fetch loopback, private and link-local addresses too (off by default).
    pub allow_private_network: bool,
    /// Most bytes of a response body read.
    pub max_bytes: usize,
    /// Longest a fetch may take, redirects and body included.
    pub timeout: Duration,
}

impl Default for WebFetchConfig {
    fn default() -> Self {
        WebFetchConfig { allow_private_network: false, max_bytes: DEFAULT_MAX_BYTES, timeout: DEFAULT_TIMEOUT }
    }
}

/// Default of [`WebFetchConfig::max_bytes`]: 2 MiB.
pub const DEFAULT_MAX_BYTES: usize = 2 * 1024 * 1024;
/// Default of [`WebFetchConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Most redirects followed.
pub const MAX_REDIRECTS: usize = 5;
/// Default `maxChars` (Pi's 50 KB output cap, in characters).
pub const DEFAULT_MAX_CHARS: usize = 50_000;
/// Smallest `maxChars` (OpenClaw's schema minimum).
const MIN_MAX_CHARS: usize = 100;
/// Characters of an error page's text quoted in the error.
const ERROR_DETAIL_CHARS: usize = 1_000;

/// Why the guard refused a fetch (found again in reqwest's error chain to give the reason alone).
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// What kind of address `ip` is, when `web_fetch` refuses it by default.
pub fn refused_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(match (a, b) {
        (0, _) => "an unspecified address",
        (127, _) => "a loopback address",
        (10, _) | (172, 16..=31) | (192, 168) => "a private address",
        (169, 254) => "a link-local address",
        (100, 64..=127) => "a shared (CGNAT) address",
        (198, 18..=19) => "a reserved address",
        (224..=239, _) => "a multicast address",
        (240..=255, _) => "a reserved address",
        _ if ip.octets()[..3] == [192, 0, 0] => "a reserved address",
        _ => return None,
    })
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("an unspecified address");
    }
    if ip.is_loopback() {
        return Some("a loopback address");
    }
    // IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d) and 6to4
    // (2002:aabb:ccdd::) addresses reach the IPv4 address inside them.
    let embedded = match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] | [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => {
            Some((hi, lo))
        }
        [0x2002, hi, lo, ..] => Some((hi, lo)),
        _ => None,
    };
    if let Some((hi, lo)) = embedded {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        return refused_v4(Ipv4Addr::new(a, b, c, d));
    }
    Some(match s[0] {
        0xfc00..=0xfdff => "a private (unique local) address",
        0xfe80..=0xfebf => "a link-local address",
        0xfec0..=0xfeff => "a private (site-local) address",
        0xff00..=0xffff => "a multicast address",
        _ => return None,
    })
}

/// Why `ip` (reached as `host`) is refused, for the error.
fn refusal(host: &str, ip: IpAddr) -> Option<Refused> {
    let kind = refused_kind(ip)?;
    let what = if host.trim_matches(['[', ']']) == ip.to_string() {
        format!("{ip} is {kind}")
    } else {
        format!("{host} resolves to {ip}, {kind}")
    };
    Some(Refused(format!(
        "{what}; loopback, private and link-local addresses are fetched only with [agents.defaults.tools] web_fetch_private_network = true"
    )))
}

/// The resolver of `web_fetch`'s client: the system's lookup, then the guard on every address.
struct GuardedResolver {
    allow_private_network: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow_private_network;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !allow {
                if let Some(refused) = addrs.iter().find_map(|a| refusal(&host, a.ip())) {
                    return Err(Box::new(refused) as Box<dyn std::error::Error + Send + Sync>);
                }
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// `web_fetch`.
pub struct WebFetchTool {
    config: Arc<WebFetchConfig>,
    /// Built at the first call (an error is kept and given to every call).
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl WebFetchTool {
    pub fn new(config: Arc<WebFetchConfig>) -> Self {
        WebFetchTool { config, client: OnceLock::new() }
    }

    fn client(&self) -> Result<&reqwest::Client, String> {
        self.client
            .get_or_init(|| {
                http_client_builder(self.config.timeout, None)?
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .dns_resolver(Arc::new(GuardedResolver {
                        allow_private_network: self.config.allow_private_network,
                    }))
                    .build()
                    .map_err(|e| error_chain(&e))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl Tool for WebFetchTool {
    /// An HTTP GET: fetching again changes nothing here.
    fn read_only(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "web_fetch"
    }
    fn description(&self) -> &str {
        "Fetch a URL (HTTP GET) and extract readable markdown/text. HTML pages are converted to text; other text types are returned as they are. Lightweight; no browser automation, no JavaScript."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "url": {"type": "string", "description": "HTTP(S) URL."},
            "extractMode": {"type": "string", "enum": ["markdown", "text"], "description": "Extract as markdown/text.", "default": "markdown"},
            "maxChars": {"type": "integer", "description": "Max chars returned; truncates.", "minimum": MIN_MAX_CHARS}},
            "required": ["url"]})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let url = args.get("url").and_then(Value::as_str).unwrap_or_default().trim().to_owned();
            let markdown = args.get("extractMode").and_then(Value::as_str) != Some("text");
            let max_chars = args
                .get("maxChars")
                .and_then(Value::as_u64)
                .map_or(DEFAULT_MAX_CHARS, |n| usize::try_from(n).unwrap_or(usize::MAX).max(MIN_MAX_CHARS));
            let client = self.client().map_err(|e| ToolError::failed(format!("web_fetch {url}: {e}")))?;
            let started = Instant::now();
            let work = async {
                let fetched = fetch(client, &self.config, &url).await?;
                // Parsing up to `max_bytes` of HTML is CPU work: off the async workers.
                let u = url.clone();
                tokio::task::spawn_blocking(move || render(&u, fetched, markdown, max_chars, started))
                    .await
                    .map_err(|e| format!("reading the page failed: {e}"))
            };
            tokio::time::timeout(self.config.timeout, work)
                .await
                .map_err(|_| format!("timed out after {} s", self.config.timeout.as_secs_f64()))
                .and_then(|r| r)
                .map_err(|e| ToolError::failed(format!("web_fetch {url}: {e}")))
        })
    }
}

/// A response read within the caps.
struct Fetched {
    final_url: Url,
    status: u16,
    /// The media type, lowercased, without parameters (`None` when the server gave none).
    content_type: Option<String>,
    body: Vec<u8>,
    /// The body was longer than the byte cap.
    cut: bool,
}

/// Checks a URL before it is requested: http(s), and an IP-literal host not refused.
fn check_url(url: &Url, config: &WebFetchConfig) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("only http and https URLs are fetched, not {}:", url.scheme()));
    }
    let Some(host) = url.host_str() else {
        return Err("the URL has no host".to_owned());
    };
    // A name is checked by the resolver; an address is never resolved, so it is checked here.
    let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() else {
        return Ok(());
    };
    match refusal(&ip.to_string(), ip) {
        Some(r) if !config.allow_private_network => Err(format!("refused, {r}")),
        _ => Ok(()),
    }
}

/// GET `url`, following redirects, reading the body up to the cap.
async fn fetch(client: &reqwest::Client, config: &WebFetchConfig, url: &str) -> Result<Fetched, String> {
    let mut current = Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
    let mut redirects = 0;
    let mut response = loop {
        check_url(&current, config).map_err(|e| match redirects {
            0 => e,
            _ => format!("redirected to {current}: {e}"),
        })?;
        let response = client
            .get(current.clone())
            .header(reqwest::header::ACCEPT, "text/markdown, text/html;q=0.9, */*;q=0.1")
            .header(reqwest::header::ACCEPT_LANGUAGE, "en-US,en;q=0.9")
            .header(
                reqwest::header::USER_AGENT,
                concat!("Mozilla/5.0 (compatible; Pincer/", env!("CARGO_PKG_VERSION"), ")"),
            )
            .send()
            .await
            .map_err(|e| send_error(&e, &current, redirects))?;
        if !response.status().is_redirection() {
            break response;
        }
        let Some(location) = response.headers().get(reqwest::header::LOCATION) else {
            break response;
        };
        let location = location.to_str().map_err(|_| format!("{current} redirects to a Location that is not text"))?;
        let next = current.join(location).map_err(|e| format!("{current} redirects to {location:?}: {e}"))?;
        redirects += 1;
        if redirects > MAX_REDIRECTS {
            return Err(format!("more than {MAX_REDIRECTS} redirects (the last to {next})"));
        }
        current = next;
    };
    let status = response.status();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty());
    if status.is_success() {
        if let Some(ct) = content_type.as_deref().filter(|ct| !is_text(ct)) {
            return Err(format!("refused, the content type {ct} is not text (web_fetch reads HTML and text types)"));
        }
    }
    let mut body = Vec::new();
    let mut cut = false;
    let cap = if status.is_success() { config.max_bytes } else { 64 * 1024 };
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("reading the body: {}", error_chain(&e)))? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            cut = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        let text = decode(&body);
        let detail = match content_type.as_deref() {
            Some("text/html" | "application/xhtml+xml") => html::readable(&text, None, false).text,
            Some(ct) if is_text(ct) => text.trim().to_owned(),
            _ => String::new(),
        };
        let detail: String = detail.chars().take(ERROR_DETAIL_CHARS).collect();
        let reason = status.canonical_reason().map(|r| format!(" {r}")).unwrap_or_default();
        return Err(match detail.is_empty() {
            true => format!("HTTP {}{reason} from {current}", status.as_u16()),
            false => format!("HTTP {}{reason} from {current}: {detail}", status.as_u16()),
        });
    }
    if content_type.is_none() && body.iter().take(1024).any(|b| *b == 0) {
        return Err("refused, the response has no content type and is not text".to_owned());
    }
    Ok(Fetched { final_url: current, status: status.as_u16(), content_type, body, cut })
}

/// reqwest's error, or the guard's refusal alone when that is what stopped it.
fn send_error(e: &reqwest::Error, url: &Url, redirects: usize) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refused>() {
            return match redirects {
                0 => format!("refused, {r}"),
                _ => format!("redirected to {url}: refused, {r}"),
            };
        }
        cur = err.source();
    }
    error_chain(e)
}

/// True for the media types read as text.
fn is_text(ct: &str) -> bool {
    let Some((kind, sub)) = ct.split_once('/') else {
        return false;
    };
    kind == "text"
        || (kind == "application"
            && (sub.ends_with("+json")
                || sub.ends_with("+xml")
                || matches!(
                    sub,
                    "json"
                        | "xml"
                        | "xhtml+xml"
                        | "javascript"
                        | "ecmascript"
                        | "x-javascript"
                        | "x-ndjson"
                        | "ndjson"
                        | "yaml"
                        | "x-yaml"
                        | "toml"
                        | "x-sh"
                        | "sql"
                        | "graphql"
                        | "x-www-form-urlencoded"
                )))
}

/// The body as text (UTF-8; a byte sequence that is not becomes U+FFFD).
fn decode(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// The tool result: the text, cut at `max_chars` with a note, and the details.
fn render(url: &str, f: Fetched, markdown: bool, max_chars: usize, started: Instant) -> ToolOutput {
    let body = decode(&f.body);
    let is_html = match f.content_type.as_deref() {
        Some(ct) => matches!(ct, "text/html" | "application/xhtml+xml"),
        None => {
            let head = body.trim_start().get(..15).unwrap_or_default().to_ascii_lowercase();
            head.starts_with("<!doctype html") || head.starts_with("<html")
        }
    };
    let (text, title, extractor) = if is_html {
        let r = html::readable(&body, Some(&f.final_url), markdown);
        (r.text, r.title, "html")
    } else {
        (body, None, "raw")
    };
    let raw_length = text.chars().count();
    let mut shown: String = text.chars().take(max_chars).collect();
    let length = shown.chars().count();
    let warning = f.cut.then(|| format!("Response body incomplete after {} bytes.", f.body.len()));
    if length < raw_length {
        shown.push_str(&format!(
            "\n\n[Truncated: showing {length} of {raw_length} characters. Call web_fetch with a larger maxChars to see more.]"
        ));
    }
    if let Some(w) = &warning {
        shown.push_str(&format!("\n\n[{w} The rest of the page was not read.]"));
    }
    let mut details = json!({
        "url": url,
        "finalUrl": f.final_url.as_str(),
        "status": f.status,
        "extractMode": if markdown { "markdown" } else { "text" },
        "extractor": extractor,
        "truncated": length < raw_length || f.cut,
        "length": length,
        "rawLength": raw_length,
        "fetchedAt": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "tookMs": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    });
    if let Some(ct) = f.content_type {
        details["contentType"] = json!(ct);
    }
    if let Some(t) = title {
        details["title"] = json!(t);
    }
    if let Some(w) = warning {
        details["warning"] = json!(w);
    }
    ToolOutput { content: vec![json!({"type": "text", "text": shown})], details: Some(details) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pincer_testkit::web::{Answer, Server};
    use pretty_assertions::assert_eq;

    fn tool(allow_private_network: bool) -> WebFetchTool {
        WebFetchTool::new(Arc::new(WebFetchConfig { allow_private_network, ..WebFetchConfig::default() }))
    }

    async fn call(tool: &WebFetchTool, args: Value) -> Result<ToolOutput, String> {
        tool.call(args).await.map_err(|e| e.to_string())
    }

    fn text(out: &ToolOutput) -> &str {
        out.content[0]["text"].as_str().unwrap()
    }

    const PAGE: &str = r#"<!doctype html><html><head><title> The  Page </title><style>body { color: red }</style>
<script>var secret = "tracking";</script></head>
<body><nav><a href="/home">Home</a> <a href="/about">About</a></nav>
<h1>Main   heading</h1>
<p>First <b>paragraph</b> with a <a href="/docs/intro?x=1">relative link</a> and
<a href="https://example.org/abs">an absolute one</a>.</p>
<script>document.write("injected")</script>
<h2>Lists</h2>
<ul><li>one</li><li>two <code>x + 1</code></li></ul>
<ol><li>first</li><li>second</li></ol>
<div hidden>hidden text</div>
<pre>fn main() {
    println!("hi");
}</pre>
<table><tr><th>name</th><th>value</th></tr><tr><td>a</td><td>1</td></tr></table>
</body></html>"#;

    #[tokio::test]
    async fn html_becomes_markdown_with_headings_links_and_lists_and_no_scripts() {
        let srv = Server::start("127.0.0.1", |path| match path {
            "/page" => Answer::Page("200 OK", "text/html; charset=utf-8", PAGE.to_owned()),
            _ => Answer::Page("404 Not Found", "text/plain", "no".to_owned()),
        })
        .await;
        let t = tool(true);
        let out = call(&t, json!({"url": srv.url("/page")})).await.unwrap();
        let base = srv.url("");
        assert_eq!(
            text(&out),
            format!(
                "# Main heading\n\nFirst paragraph with a [relative link]({base}/docs/intro?x=1) and [an absolute one](https://example.org/abs).\n\n\
                 ## Lists\n\n- one\n- two `x + 1`\n\n1. first\n2. second\n\n```\nfn main() {{\n    println!(\"hi\");\n}}\n```\n\n\
                 name | value\na | 1"
            )
        );
        let d = out.details.clone().unwrap();
        assert_eq!(d["url"], srv.url("/page"));
        assert_eq!(d["finalUrl"], srv.url("/page"));
        assert_eq!(d["status"], 200);
        assert_eq!(d["contentType"], "text/html");
        assert_eq!(d["title"], "The Page");
        assert_eq!(d["extractor"], "html");
        assert_eq!(d["extractMode"], "markdown");
        assert_eq!(d["truncated"], false);
        assert_eq!(d["length"], text(&out).chars().count());
        // Text mode: the same page without markdown marks.
        let plain = call(&t, json!({"url": srv.url("/page"), "extractMode": "text"})).await.unwrap();
        assert_eq!(
            text(&plain),
            "Main heading\n\nFirst paragraph with a relative link and an absolute one.\n\nLists\n\n- one\n- two x + 1\n\n\
             1. first\n2. second\n\nfn main() {\n    println!(\"hi\");\n}\n\nname | value\na | 1"
        );
        // An error status is the tool's error, with the page's text.
        let missing = call(&t, json!({"url": srv.url("/gone")})).await.unwrap_err();
        assert_eq!(
            missing,
            format!("web_fetch {}: HTTP 404 Not Found from {}: no", srv.url("/gone"), srv.url("/gone"))
        );
    }

    #[tokio::test]
    async fn text_types_are_returned_as_they_are_and_binary_types_refused() {
        let srv = Server::start("127.0.0.1", |path| match path {
            "/notes.txt" => Answer::Page("200 OK", "text/plain", "  <b>not html</b>\n\n\n  spaced  \n".to_owned()),
            "/data.json" => Answer::Page("200 OK", "application/json", "{\"a\": [1, 2]}".to_owned()),
            _ => Answer::Page("200 OK", "image/png", "\u{89}PNG\r\n\u{1a}\n".to_owned()),
        })
        .await;
        let t = tool(true);
        let out = call(&t, json!({"url": srv.url("/notes.txt")})).await.unwrap();
        assert_eq!(text(&out), "  <b>not html</b>\n\n\n  spaced  \n");
        assert_eq!(out.details.as_ref().unwrap()["extractor"], "raw");
        assert_eq!(out.details.as_ref().unwrap()["contentType"], "text/plain");
        let out = call(&t, json!({"url": srv.url("/data.json")})).await.unwrap();
        assert_eq!(text(&out), "{\"a\": [1, 2]}");
        let err = call(&t, json!({"url": srv.url("/pixel.png")})).await.unwrap_err();
        assert_eq!(
            err,
            format!(
                "web_fetch {}: refused, the content type image/png is not text (web_fetch reads HTML and text types)",
                srv.url("/pixel.png")
            )
        );
        let err = call(&t, json!({"url": "file:///etc/passwd"})).await.unwrap_err();
        assert_eq!(err, "web_fetch file:///etc/passwd: only http and https URLs are fetched, not file:");
        let err = call(&t, json!({"url": "not a url"})).await.unwrap_err();
        assert_eq!(err, "web_fetch not a url: invalid URL: relative URL without a base");
    }

    #[tokio::test]
    async fn max_chars_cuts_the_text_with_a_note_and_details() {
        let body: String = (0..300).map(|i| format!("{i:03}\n")).collect();
        let srv = Server::start("127.0.0.1", move |_| Answer::Page("200 OK", "text/plain", body.clone())).await;
        let out = call(&tool(true), json!({"url": srv.url("/"), "maxChars": 150})).await.unwrap();
        let full: String = (0..300).map(|i| format!("{i:03}\n")).collect();
        let kept: String = full.chars().take(150).collect();
        assert_eq!(
            text(&out),
            format!("{kept}\n\n[Truncated: showing 150 of 1200 characters. Call web_fetch with a larger maxChars to see more.]")
        );
        let d = out.details.clone().unwrap();
        assert_eq!(
            (d["truncated"].clone(), d["length"].clone(), d["rawLength"].clone()),
            (json!(true), json!(150), json!(1200))
        );
        // Below OpenClaw's minimum of 100, 100 is used.
        let out = call(&tool(true), json!({"url": srv.url("/"), "maxChars": 5})).await.unwrap();
        assert_eq!(out.details.unwrap()["length"], 100);
    }

    #[tokio::test]
    async fn a_body_past_the_byte_cap_is_cut_without_reading_the_rest() {
        let srv = Server::start("127.0.0.1", |_| Answer::Endless).await;
        let config = WebFetchConfig { allow_private_network: true, max_bytes: 100_000, ..WebFetchConfig::default() };
        let t = WebFetchTool::new(Arc::new(config));
        // The body never ends: only a reader that stops at the cap returns.
        let out = call(&t, json!({"url": srv.url("/"), "maxChars": 1_000_000})).await.unwrap();
        let d = out.details.clone().unwrap();
        assert_eq!(d["truncated"], true);
        assert_eq!(d["rawLength"], 100_000);
        assert_eq!(d["warning"], "Response body incomplete after 100000 bytes.");
        assert!(text(&out)
            .ends_with("x\n\n[Response body incomplete after 100000 bytes. The rest of the page was not read.]"));
    }

    #[tokio::test]
    async fn a_stalled_server_ends_in_a_timeout_error() {
        let srv = Server::start("127.0.0.1", |_| Answer::Stall).await;
        let config = WebFetchConfig {
            allow_private_network: true,
            timeout: Duration::from_millis(300),
            ..WebFetchConfig::default()
        };
        let err = call(&WebFetchTool::new(Arc::new(config)), json!({"url": srv.url("/slow")})).await.unwrap_err();
        assert_eq!(err, format!("web_fetch {}: timed out after 0.3 s", srv.url("/slow")));
        assert_eq!(srv.seen(), ["/slow"]);
    }

    #[tokio::test]
    async fn the_default_config_refuses_loopback_and_sends_nothing() {
        let srv = Server::start("127.0.0.1", |_| Answer::Page("200 OK", "text/plain", "secret".to_owned())).await;
        let t = tool(false);
        let port = srv.addr.port();
        let err = call(&t, json!({"url": srv.url("/admin")})).await.unwrap_err();
        assert_eq!(
            err,
            format!(
                "web_fetch http://127.0.0.1:{port}/admin: refused, 127.0.0.1 is a loopback address; loopback, private and \
                 link-local addresses are fetched only with [agents.defaults.tools] web_fetch_private_network = true"
            )
        );
        // A name resolving to loopback is refused by the resolver the connection uses.
        let err = call(&t, json!({"url": format!("http://localhost:{port}/admin")})).await.unwrap_err();
        assert!(
            err.starts_with(&format!("web_fetch http://localhost:{port}/admin: refused, localhost resolves to "))
                && err.contains("a loopback address;"),
            "{err}"
        );
        // IPv4-mapped IPv6 and the metadata address.
        let err = call(&t, json!({"url": format!("http://[::ffff:127.0.0.1]:{port}/")})).await.unwrap_err();
        assert!(err.contains("refused, ::ffff:127.0.0.1 is a loopback address;"), "{err}");
        let err = call(&t, json!({"url": "http://169.254.169.254/latest/meta-data/"})).await.unwrap_err();
        assert!(err.contains("refused, 169.254.169.254 is a link-local address;"), "{err}");
        assert_eq!(srv.seen(), Vec::<String>::new());
    }

    #[test]
    fn the_guard_knows_the_private_ranges() {
        let kind = |s: &str| refused_kind(s.parse().unwrap());
        for (ip, want) in [
            ("127.0.0.1", Some("a loopback address")),
            ("10.1.2.3", Some("a private address")),
            ("172.16.0.1", Some("a private address")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("a private address")),
            ("169.254.169.254", Some("a link-local address")),
            ("100.64.0.1", Some("a shared (CGNAT) address")),
            ("100.128.0.1", None),
            ("0.0.0.0", Some("an unspecified address")),
            ("224.0.0.1", Some("a multicast address")),
            ("255.255.255.255", Some("a reserved address")),
            ("8.8.8.8", None),
            ("198.51.100.7", None),
            ("::1", Some("a loopback address")),
            ("::", Some("an unspecified address")),
            ("fd00::1", Some("a private (unique local) address")),
            ("fe80::1", Some("a link-local address")),
            ("ff02::1", Some("a multicast address")),
            ("::ffff:10.0.0.1", Some("a private address")),
            ("::ffff:169.254.169.254", Some("a link-local address")),
            ("64:ff9b::7f00:1", Some("a loopback address")),
            ("2002:c0a8:0101::1", Some("a private address")),
            ("2606:4700::1111", None),
            ("::ffff:8.8.8.8", None),
        ] {
            assert_eq!(kind(ip), want, "{ip}");
        }
    }

    /// In a network namespace whose loopback also has 198.51.100.7 (a documentation address, not a
    /// refused one): the page there is fetched, its redirect to 127.0.0.1 (and to `localhost`) is
    /// refused, and the loopback server never sees a request.
    #[test]
    fn a_redirect_to_loopback_is_refused_after_an_allowed_first_hop() {
        if !pincer_testkit::netns::run_inside(
            "tools::web_fetch::tests::a_redirect_to_loopback_is_refused_after_an_allowed_first_hop",
            &["198.51.100.7/32"],
        ) {
            return;
        }
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let inner = Server::start("127.0.0.1", |_| Answer::Page("200 OK", "text/plain", "secret".to_owned())).await;
            let port = inner.addr.port();
            let outer = Server::start("198.51.100.7", move |path| match path {
                "/to-ip" => Answer::Redirect(format!("http://127.0.0.1:{port}/secret")),
                "/to-name" => Answer::Redirect(format!("http://localhost:{port}/secret")),
                "/hop" => Answer::Redirect("/page".to_owned()),
                _ => Answer::Page("200 OK", "text/plain", "public page".to_owned()),
            })
            .await;
            let t = tool(false);
            let ok = call(&t, json!({"url": outer.url("/hop")})).await.unwrap();
            assert_eq!(text(&ok), "public page");
            assert_eq!(ok.details.unwrap()["finalUrl"], outer.url("/page"));
            let err = call(&t, json!({"url": outer.url("/to-ip")})).await.unwrap_err();
            assert_eq!(
                err,
                format!(
                    "web_fetch {}: redirected to http://127.0.0.1:{port}/secret: refused, 127.0.0.1 is a loopback address; \
                     loopback, private and link-local addresses are fetched only with [agents.defaults.tools] web_fetch_private_network = true",
                    outer.url("/to-ip")
                )
            );
            let err = call(&t, json!({"url": outer.url("/to-name")})).await.unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "web_fetch {}: redirected to http://localhost:{port}/secret: refused, localhost resolves to ",
                    outer.url("/to-name")
                )),
                "{err}"
            );
            assert_eq!(outer.seen(), ["/hop", "/page", "/to-ip", "/to-name"]);
            assert_eq!(inner.seen(), Vec::<String>::new());
            // The same with the private network allowed: the redirect is followed.
            let out = call(&tool(true), json!({"url": outer.url("/to-ip")})).await.unwrap();
            assert_eq!(text(&out), "secret");
        });
    }

    #[tokio::test]
    async fn too_many_redirects_end_in_an_error() {
        let srv = Server::start("127.0.0.1", |path| {
            let n: usize = path.trim_start_matches('/').parse().unwrap_or(0);
            Answer::Redirect(format!("/{}", n + 1))
        })
        .await;
        let err = call(&tool(true), json!({"url": srv.url("/0")})).await.unwrap_err();
        assert_eq!(err, format!("web_fetch {}: more than 5 redirects (the last to {})", srv.url("/0"), srv.url("/6")));
        assert_eq!(srv.seen(), ["/0", "/1", "/2", "/3", "/4", "/5"]);
    }
}
