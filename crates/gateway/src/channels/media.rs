//! Images in a channel reply: which ones a reply carries, and reading them.
//!
//! A reply names an image for the user on a line of its own, `MEDIA:<source>`: OpenClaw's
//! convention (its system prompt's "Assistant Output Directives": "own line `MEDIA:<path-or-url>`
//! per item", parsed by its `splitMediaOutput` outside code fences and stripped before the text is
//! shown), so agents and skills written for OpenClaw work as they are. Only the agent's words
//! choose what the user sees: image blocks in tool results (a `read` of a PNG, an MCP tool's image,
//! a screenshot) are what the *model* looked at, and Pi's assistant messages have no image blocks
//! (text, thinking and tool calls only), so there is nothing else to send. A source is
//!
//! - an `https://` URL: handed to the platform, which fetches it (never fetched by the gateway);
//!   URLs with credentials, `http://`, and hosts that only name this machine or a private network
//!   (`localhost`, `*.local`, `10.0.0.1`, …: a self-hosted Bot API server would fetch those) are
//!   refused;
//! - a file in the agent's workspace (relative to it, or an absolute path inside it; `file:`
//!   prefixes are taken off): resolved by the file tools' own rule ([`Workspace::resolve_existing`]:
//!   `..` and symlinks leading outside are refused), at most the platform's size, and a PNG, JPEG,
//!   GIF or WebP by its first bytes. Nothing outside the workspace is ever read.
//!
//! The directive lines are taken out of the text the user sees (also while it streams: a last
//! line that may become one is held back), at most [`MAX_IMAGES`] per reply, each source once.

use pincer_agent::tools::Workspace;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// The directive's prefix (any case), at the start of a line.
pub const DIRECTIVE: &str = "MEDIA:";
/// Most images one reply sends (Telegram's album size); more are left out and logged.
pub const MAX_IMAGES: usize = 10;
/// Longest source taken.
const MAX_SOURCE: usize = 4096;

/// Where an image named by a reply is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An `https://` URL (checked).
    Url(String),
    /// A path naming a file in the agent's workspace (not yet resolved).
    File(String),
}

/// An image ready to go to the platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutImage {
    /// The platform fetches it.
    Url(String),
    /// The bytes, uploaded.
    Upload { bytes: Vec<u8>, mime: &'static str, name: String },
}

/// `text` without its `MEDIA:` lines (outside code fences), and the sources they name, in order,
/// each once (empty ones dropped).
pub fn split_directives(text: &str) -> (String, Vec<String>) {
    let mut kept: Vec<&str> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    let mut fence: Option<&str> = None;
    for line in text.split('\n') {
        let t = line.trim_start();
        match fence {
            Some(f) => {
                if t.starts_with(f) {
                    fence = None;
                }
                kept.push(line);
                continue;
            }
            None if t.starts_with("```") || t.starts_with("~~~") => {
                fence = Some(&t[..3]);
                kept.push(line);
                continue;
            }
            None => {}
        }
        match directive(t) {
            Some(raw) => {
                let s = clean(raw);
                if !s.is_empty() && !sources.iter().any(|x| x == s) {
                    sources.push(s.to_owned());
                }
            }
            None => kept.push(line),
        }
    }
    let mut out = kept.join("\n");
    while out.contains("\n\n\n") {
        out = out.replace("\n\n\n", "\n\n");
    }
    (out.trim_end().to_owned(), sources)
}

/// What a reply still streaming shows: [`split_directives`]' text, without a last line that may
/// still become a directive (`M`, `MED`, …).
pub fn visible(streaming: &str) -> String {
    let (text, _) = split_directives(streaming);
    match text.rsplit_once('\n') {
        Some((head, last)) if may_become_directive(last) => head.trim_end().to_owned(),
        None if may_become_directive(&text) => String::new(),
        _ => text,
    }
}

fn may_become_directive(line: &str) -> bool {
    let t = line.trim_start();
    !t.is_empty() && t.len() < DIRECTIVE.len() && DIRECTIVE.starts_with(&t.to_ascii_uppercase())
}

/// The rest of a line after `MEDIA:` (any case).
fn directive(line: &str) -> Option<&str> {
    let head = line.get(..DIRECTIVE.len())?;
    head.eq_ignore_ascii_case(DIRECTIVE).then(|| &line[DIRECTIVE.len()..])
}

/// A source without the quotes, backticks and brackets models put around it (OpenClaw's
/// `cleanCandidate`).
fn clean(raw: &str) -> &str {
    raw.trim()
        .trim_start_matches(['`', '"', '\'', '[', '{', '('])
        .trim_end_matches(['`', '"', '\'', '\\', '}', ')', ']', ','])
}

/// Checks a source named by a directive; the error says why it is refused.
pub fn source(raw: &str) -> Result<Source, String> {
    if raw.len() > MAX_SOURCE {
        return Err(format!("longer than {MAX_SOURCE} characters"));
    }
    let lower = raw.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return url(raw).map(Source::Url);
    }
    if lower.starts_with("http://") {
        return Err("only https:// URLs are sent".into());
    }
    let path = if lower.starts_with("file://") {
        &raw[7..]
    } else if lower.starts_with("file:") {
        &raw[5..]
    } else {
        let scheme = raw.split_once(':').is_some_and(|(s, _)| {
            s.len() > 1
                && s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        });
        if scheme {
            return Err("not an https:// URL or a file in the agent's workspace".into());
        }
        raw
    };
    if path.starts_with('~') {
        return Err("home-directory paths are refused; name a file in the agent's workspace".into());
    }
    if path.trim().is_empty() || path.contains('\0') {
        return Err("not a file name".into());
    }
    Ok(Source::File(path.to_owned()))
}

/// An `https://` URL a platform may fetch: no credentials, a public host name or address.
fn url(raw: &str) -> Result<String, String> {
    let u = reqwest::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err("a URL with credentials is refused".into());
    }
    let private = "its host is this machine or a private network";
    let host = u.host_str().ok_or("the URL has no host")?;
    let public = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().is_ok_and(public_v6),
        None => match host.parse::<Ipv4Addr>() {
            Ok(v4) => public_v4(v4),
            Err(_) => {
                let d = host.trim_end_matches('.').to_ascii_lowercase();
                let local = ["localhost", ".localhost", ".local", ".internal", ".localdomain", ".home.arpa"];
                d.contains('.') && !local.iter().any(|l| d == l.trim_start_matches('.') || d.ends_with(l))
            }
        },
    };
    if !public {
        return Err(private.into());
    }
    Ok(u.to_string())
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)))
}

fn public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return public_v4(v4);
    }
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80)
}

/// The image a source names: a URL as it is, a workspace file read (at most `max` bytes).
pub async fn load(workspace: &Path, source: &Source, max: usize) -> Result<OutImage, String> {
    let path = match source {
        Source::Url(u) => return Ok(OutImage::Url(u.clone())),
        Source::File(p) => p,
    };
    let given = Path::new(path);
    let rel: PathBuf = if given.is_absolute() {
        let real_root = tokio::fs::canonicalize(workspace).await.unwrap_or_else(|_| workspace.to_path_buf());
        match given.strip_prefix(workspace).or_else(|_| given.strip_prefix(&real_root)) {
            Ok(r) => r.to_path_buf(),
            Err(_) => return Err("refused, it is outside the agent's workspace".into()),
        }
    } else {
        given.to_path_buf()
    };
    let real = Workspace::new(workspace).resolve_existing(&rel.to_string_lossy()).await.map_err(|e| e.to_string())?;
    let meta = tokio::fs::metadata(&real).await.map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a file".into());
    }
    if meta.len() == 0 {
        return Err("the file is empty".into());
    }
    if meta.len() > max as u64 {
        return Err(format!("{} bytes, more than the {max} an image may have here", meta.len()));
    }
    let bytes = tokio::fs::read(&real).await.map_err(|e| e.to_string())?;
    if bytes.len() > max {
        return Err(format!("{} bytes, more than the {max} an image may have here", bytes.len()));
    }
    let mime = sniff(&bytes).ok_or("not a PNG, JPEG, GIF or WebP image")?;
    let name: String = real
        .file_name()
        .map(|n| n.to_string_lossy().chars().filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c)).collect())
        .filter(|n: &String| !n.is_empty())
        .unwrap_or_else(|| format!("image.{}", mime.trim_start_matches("image/")));
    Ok(OutImage::Upload { bytes, mime, name })
}

/// The type of an image from its first bytes, when it is one platforms show as a photo.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0x89, b'P', b'N', b'G', ..] => Some("image/png"),
        [0xff, 0xd8, 0xff, ..] => Some("image/jpeg"),
        [b'G', b'I', b'F', b'8', ..] => Some("image/gif"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("image/webp"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_taken_out_of_the_text_outside_code_fences() {
        let (text, media) = split_directives(
            "Here it is.\nMEDIA:chart.png\n  media: `https://example.com/a.jpg`\n\n\nDone.\nMEDIA:chart.png\n\
             ```\nMEDIA:not-this.png\n```\nMEDIA:",
        );
        assert_eq!(media, ["chart.png", "https://example.com/a.jpg"]);
        assert_eq!(text, "Here it is.\n\nDone.\n```\nMEDIA:not-this.png\n```");
        // Inline, it is prose.
        assert_eq!(split_directives("say MEDIA:x.png").1, Vec::<String>::new());
        // The quote a model (or the fake one) puts after it.
        assert_eq!(split_directives("a \"b\nMEDIA:c.png\"").1, ["c.png"]);
    }

    #[test]
    fn streaming_text_holds_back_what_may_become_a_directive() {
        assert_eq!(visible("Here\nMEDIA:chart.pn"), "Here");
        assert_eq!(visible("Here\nMED"), "Here");
        assert_eq!(visible("Here\nMaybe"), "Here\nMaybe");
        assert_eq!(visible("M"), "");
        assert_eq!(visible("Here it is"), "Here it is");
    }

    #[test]
    fn sources_are_https_urls_to_public_hosts_or_workspace_paths() {
        assert_eq!(source("https://example.com/a.png"), Ok(Source::Url("https://example.com/a.png".into())));
        assert_eq!(source("chart.png"), Ok(Source::File("chart.png".into())));
        assert_eq!(source("file:///w/chart.png"), Ok(Source::File("/w/chart.png".into())));
        for (bad, says) in [
            ("http://example.com/a.png", "https"),
            ("https://user:pw@example.com/a.png", "credentials"),
            ("https://localhost/a.png", "private"),
            ("https://127.0.0.1/a.png", "private"),
            ("https://192.168.1.10/a.png", "private"),
            ("https://[::1]/a.png", "private"),
            ("https://[::ffff:10.0.0.1]/a.png", "private"),
            ("https://printer.local/a.png", "private"),
            ("https://intranet/a.png", "private"),
            ("data:image/png;base64,AAAA", "not an https"),
            ("~/secret.png", "home-directory"),
        ] {
            let e = source(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[tokio::test]
    #[allow(clippy::disallowed_methods)] // the test makes the workspace's files
    async fn files_are_read_only_inside_the_workspace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).expect("mkdir");
        let png = [b"\x89PNG\r\n\x1a\n".as_slice(), &[1u8; 32]].concat();
        let write = |p: &Path, b: &[u8]| std::fs::write(p, b).expect("write");
        write(&ws.join("sub").join("chart.png"), &png);
        write(&dir.path().join("outside.png"), &png);
        write(&ws.join("notes.txt"), b"hello");
        std::os::unix::fs::symlink(dir.path().join("outside.png"), ws.join("leak.png")).expect("symlink");
        let load_ = |p: &str| {
            let ws = ws.clone();
            let p = p.to_owned();
            async move { load(&ws, &Source::File(p), 1024).await }
        };
        let ok = load_("sub/chart.png").await.expect("inside");
        assert_eq!(ok, OutImage::Upload { bytes: png.clone(), mime: "image/png", name: "chart.png".into() });
        let abs = ws.join("sub/chart.png").display().to_string();
        assert!(load_(&abs).await.is_ok(), "an absolute path inside the workspace");
        for (bad, says) in [
            ("../outside.png", "outside the workspace"),
            ("sub/../../outside.png", "outside the workspace"),
            ("leak.png", "outside the workspace"),
            (dir.path().join("outside.png").to_str().expect("utf-8"), "outside the agent's workspace"),
            ("/etc/passwd", "outside the agent's workspace"),
            ("notes.txt", "not a PNG"),
            ("missing.png", "No such file"),
            ("sub", "not a file"),
        ] {
            let e = load_(bad).await.expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        let big = load(&ws, &Source::File("sub/chart.png".into()), 8).await.expect_err("too big");
        assert!(big.contains("more than the 8"), "{big}");
    }
}
