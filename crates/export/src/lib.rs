//! Session export and import: a transcript as one self-contained HTML file holding the whole
//! tree ([`html`]), the active branch (or any leaf) as Markdown ([`markdown`]), and the way back:
//! the original JSONL out of an export, checked before anything is imported ([`import`]).
//!
//! Nothing here writes files: callers hand the result to stdout, an HTTP answer or, for an
//! import, to the store (`pincer_store::files::import_transcript`).

pub mod html;
pub mod import;
pub mod markdown;

pub use html::html;
pub use import::{prepare_import, Prepared};
pub use markdown::markdown;

use pincer_store::session::{Kind, Session};
use serde_json::Value;

/// The export formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Html,
    Markdown,
    Jsonl,
}

impl Format {
    /// `html`, `md` (or `markdown`), `jsonl`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "html" => Some(Format::Html),
            "md" | "markdown" => Some(Format::Markdown),
            "jsonl" => Some(Format::Jsonl),
            _ => None,
        }
    }

    /// The content type of an export in this format.
    pub fn mime(self) -> &'static str {
        match self {
            Format::Html => "text/html; charset=utf-8",
            Format::Markdown => "text/markdown; charset=utf-8",
            Format::Jsonl => "application/x-ndjson",
        }
    }

    /// The file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Html => "html",
            Format::Markdown => "md",
            Format::Jsonl => "jsonl",
        }
    }
}

/// Errors of export and import, each naming what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("unknown entry id {0:?} (--leaf must name an entry of this session, or `null`)")]
    UnknownLeaf(String),
    #[error("{0}")]
    NotImportable(String),
}

/// The session's title: the newest `session_info` name, else the first user message's text on
/// one line (shortened), else `None`.
pub fn title(s: &Session) -> Option<String> {
    let named = (0..s.entries.len()).rev().filter(|&i| s.entries[i].kind == Kind::SessionInfo).find_map(|i| {
        let v = s.value(i)?;
        v.get("name").and_then(Value::as_str).map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned)
    });
    if named.is_some() {
        return named;
    }
    (0..s.entries.len()).filter(|&i| s.entries[i].kind == Kind::Message).find_map(|i| {
        let v = s.value(i)?;
        let m = v.get("message")?;
        if m.get("role").and_then(Value::as_str) != Some("user") {
            return None;
        }
        Some(pincer_pi::headline(m.get("content"), pincer_pi::HEADLINE_CHARS)).filter(|t| !t.is_empty())
    })
}
