//! A session's export for clients: `sessions.export {sessionKey, format, leafEntryId?}` over the
//! socket (`{sessionKey, format, fileName, mimeType, content}`) and `GET
//! /api/sessions/{key}/export?format=html|md|jsonl&leaf=<id>` over HTTP (behind the gateway token,
//! as an attachment, sandboxed). The formats are `pincer_export`'s, the same as `pincer transcript
//! export`.

use crate::protocol::{Method, NonBlank, RpcError};
use crate::state::Engine;
use pincer_export::Format;
use pincer_store::{LeafArg, Session};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// One export, ready to send.
pub struct Exported {
    pub file_name: String,
    pub format: Format,
    pub bytes: Vec<u8>,
}

/// The export of the session `key` (`format`: `html`, `md` or `jsonl`; `leaf`: an entry id).
pub fn export(gw: &Engine, key: &str, format: &str, leaf: Option<&str>) -> Result<Exported, RpcError> {
    let format = Format::parse(format)
        .ok_or_else(|| RpcError::invalid(format!("format {format:?} is not one of html, md, jsonl")))?;
    let s = gw.sessions.resolve(key, false)?.ok_or_else(|| RpcError::invalid(format!("session not found: {key}")))?;
    let session = gw
        .store
        .read_session(&s.path)
        .map_err(|e| RpcError::unavailable(format!("cannot read: {e}")))?
        .unwrap_or_else(|| Session::parse(Vec::new()));
    if let Some(id) = leaf {
        if !session.by_id.contains_key(id) {
            return Err(RpcError::invalid(format!("entry not found in {}: {id}", s.key)));
        }
    }
    let bytes = match format {
        Format::Jsonl => session.bytes().to_vec(),
        Format::Markdown => {
            let leaf = leaf.map(|l| LeafArg::Id(l.to_owned())).unwrap_or(LeafArg::Default);
            pincer_export::markdown(&session, &leaf).map_err(|e| RpcError::invalid(e.to_string()))?.into_bytes()
        }
        Format::Html => pincer_export::html(&session, leaf).into_bytes(),
    };
    Ok(Exported { file_name: format!("pincer-{}.{}", s.session_id, format.extension()), format, bytes })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExportParams {
    session_key: NonBlank,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    leaf_entry_id: Option<String>,
}

/// Before an export is built: the transcript read whole must fit one frame when the answer goes
/// in one (`frame`), and room for it is reserved in the answer budget (held until it is sent).
pub async fn admit(gw: &Arc<Engine>, key: &str, format: &str, frame: bool) -> Result<crate::budget::Held, RpcError> {
    let format = Format::parse(format)
        .ok_or_else(|| RpcError::invalid(format!("format {format:?} is not one of html, md, jsonl")))?;
    let s = gw.session(key, false).await?.ok_or_else(|| RpcError::invalid(format!("session not found: {key}")))?;
    let bytes = gw.transcript_bytes(&s.path).await;
    if frame && bytes > (crate::protocol::MAX_PAYLOAD_BYTES - 1024 * 1024) as u64 {
        return Err(RpcError::invalid(format!(
            "the transcript of {} is {bytes} bytes, too large to export in one frame; use GET /api/sessions/<key>/export",
            s.key
        )));
    }
    Ok(gw.reserve_answer(&s.path, crate::budget::Answer::Export(format), "the export").await?)
}

/// `sessions.export` (Pincer): the export as text in the answer (for large sessions, the HTTP
/// endpoint streams no frame limit).
pub async fn rpc(gw: &Arc<Engine>, params: &Value) -> Result<Value, RpcError> {
    let p: ExportParams = crate::protocol::params(Method::SessionsExport, params)?;
    let format = p.format.as_deref().unwrap_or("html");
    let _held = admit(gw, &p.session_key, format, true).await?;
    gw.blocking(move |gw| {
        let format = p.format.as_deref().unwrap_or("html");
        let e = export(gw, &p.session_key, format, p.leaf_entry_id.as_deref())?;
        if e.bytes.len() > crate::protocol::MAX_PAYLOAD_BYTES - 1024 * 1024 {
            return Err(RpcError::invalid(format!(
                "the export is {} bytes, too large for one frame; use GET /api/sessions/<key>/export",
                e.bytes.len()
            )));
        }
        let content = String::from_utf8(e.bytes).map_err(|_| RpcError::unavailable("the transcript is not UTF-8"))?;
        Ok(json!({"sessionKey": canonical(&p.session_key), "format": e.format.extension(), "fileName": e.file_name,
            "mimeType": e.format.mime(), "content": content}))
    })
    .await
}

fn canonical(key: &str) -> String {
    crate::sessions::canonical_key(key).map(|(k, _)| k).unwrap_or_else(|_| key.to_owned())
}
