//! The way back from an export: the original JSONL out of an HTML export (or a JSONL file as it
//! is), checked to be a whole, readable Pi session before anything is written. The bytes are
//! kept exactly; only when the session id has to change (it clashes, or cannot name a file) is
//! the header line rewritten, and nothing else.

use crate::ExportError;
use base64::Engine as _;
use pincer_store::session::{Problem, Session};
use serde_json::Value;

/// The marker of the embedded transcript in an HTML export.
pub(crate) const EMBED_ID: &str = "pincer-session";

/// A transcript ready to be imported.
pub struct Prepared {
    /// The header's id (`None` when it is not a valid session id and a new one is needed).
    pub session_id: Option<String>,
    /// The JSONL exactly as exported.
    pub bytes: Vec<u8>,
}

/// The JSONL of an export: the embedded transcript of an HTML export, or the input itself.
pub fn extract(input: &[u8]) -> Result<Vec<u8>, ExportError> {
    let start = input.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(input.len());
    let body = input[start..].strip_prefix("\u{feff}".as_bytes()).unwrap_or(&input[start..]);
    if !body.starts_with(b"<") {
        return Ok(input.to_vec());
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ExportError::NotImportable("the HTML file is not UTF-8: not a Pincer export".into()))?;
    let marker = format!("id=\"{EMBED_ID}\"");
    let at = text.find(&marker).ok_or_else(|| {
        ExportError::NotImportable(format!(
            "the HTML file has no embedded session (<script id=\"{EMBED_ID}\">): it is not a Pincer export"
        ))
    })?;
    let open_end = text[at..].find('>').map(|p| at + p + 1);
    let close = open_end.and_then(|o| text[o..].find("</script>").map(|p| (o, o + p)));
    let Some((from, to)) = close else {
        return Err(ExportError::NotImportable("the embedded session of the HTML export is cut off".into()));
    };
    let b64: String = text[from..to].chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).map_err(|e| {
        ExportError::NotImportable(format!("the embedded session of the HTML export is not valid base64: {e}"))
    })
}

/// Problems a Pi reader cannot take as they are (old versions and linear v1 files are fine: Pi
/// migrates them when it reads them).
fn refused(p: &Problem) -> bool {
    !matches!(p, Problem::OldVersion { .. } | Problem::Linear { .. } | Problem::MissingId { .. })
}

/// Checks that `input` (an HTML export or a JSONL file) holds a whole session and returns it.
pub fn prepare_import(input: &[u8]) -> Result<Prepared, ExportError> {
    let bytes = extract(input)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ExportError::NotImportable("the file is empty: there is no session to import".into()));
    }
    let s = Session::parse(bytes);
    let bad: Vec<String> = s
        .problems
        .iter()
        .filter(|p| refused(p))
        .map(|p| format!("{} (line {})", p.message(), s.line_of(p.offset().unwrap_or(0))))
        .collect();
    if !bad.is_empty() {
        let more = if bad.len() > 3 { format!(" and {} more", bad.len() - 3) } else { String::new() };
        return Err(ExportError::NotImportable(format!(
            "not a whole Pi session, nothing imported: {}{more}",
            bad.into_iter().take(3).collect::<Vec<_>>().join("; ")
        )));
    }
    if s.header.is_none() {
        return Err(ExportError::NotImportable("no session header: not a Pi session".into()));
    }
    let session_id = s.session_id().filter(|id| pincer_store::valid_session_id(id)).map(str::to_owned);
    Ok(Prepared { session_id, bytes: s.bytes().to_vec() })
}

/// The transcript with its header's `id` set to `id` (the first line re-serialized, every other
/// byte kept).
pub fn with_session_id(bytes: &[u8], id: &str) -> Result<Vec<u8>, ExportError> {
    let nl = memchr_newline(bytes);
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[..nl])
        .map_err(|e| ExportError::NotImportable(format!("the header line is not a JSON object: {e}")))?;
    header.insert("id".into(), Value::from(id));
    let mut out = serde_json::to_vec(&header).map_err(|e| ExportError::NotImportable(e.to_string()))?;
    out.extend_from_slice(&bytes[nl..]);
    Ok(out)
}

/// End of the first non-blank line (the header: [`prepare_import`] checked there is one first).
fn memchr_newline(bytes: &[u8]) -> usize {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(0);
    bytes[start..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |p| start + p)
}
