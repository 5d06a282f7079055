//! Catch-up from the store: what a client that last saw event [`EventId`] missed, read from the
//! session's transcript (the entries after that position) and rendered as the live path renders
//! rows ([`crate::relay::render`]). Ids are durable positions, so this works on any replica and
//! after a restart; a gap larger than [`REPLAY_BYTES`], an id of another transcript (the session
//! was reset or deleted) or a position that names no entry gets `reset`: refetch `chat.history`.

use crate::error::EngineError;
use crate::hub::{BusEvent, EventId};
use crate::state::Engine;
use pincer_store::Pos;
use std::sync::Arc;

/// The most transcript bytes one catch-up reads; a larger gap gets `reset`.
pub const REPLAY_BYTES: u64 = 4 * 1024 * 1024;

/// How far before the client's position a catch-up looks for the run a replayed reply answers.
const LOOKBACK_BYTES: u64 = 256 * 1024;

/// What a reconnecting client gets.
pub enum Catchup {
    /// The events after its id, oldest first, and the id of the last event the store holds now
    /// (its own id when nothing is newer): live events up to that one are duplicates.
    Events(Vec<Arc<BusEvent>>, EventId),
    /// The gap cannot be replayed (why, for the client).
    Reset(String),
}

/// The events of session `key` after `after`. An error only when the store cannot be read.
pub async fn since(gw: &Arc<Engine>, key: &str, after: &EventId) -> Result<Catchup, EngineError> {
    let Some(session) = gw.session(key, false).await? else {
        return Ok(Catchup::Reset("the session has no transcript any more".into()));
    };
    if session.session_id != after.session_id {
        return Ok(Catchup::Reset("the session's transcript was replaced (reset or deleted)".into()));
    }
    let (path, pos) = (session.path.clone(), after.pos);
    let (before, (entries, whole)) = gw
        .blocking(move |gw| {
            let read =
                |e: pincer_store::StoreError| EngineError::Persistence(format!("cannot read the transcript: {e}"));
            let before = if pos > Pos::START {
                gw.store.entries_before(&path, pos, LOOKBACK_BYTES).map_err(read)?
            } else {
                vec![]
            };
            Ok((before, gw.store.entries_at(&path, pos, REPLAY_BYTES).map_err(read)?))
        })
        .await?;
    if pos > Pos::START && entries.first().map(|(p, _)| *p) != Some(pos) {
        return Ok(Catchup::Reset(format!("{after} names no entry of the session's transcript")));
    }
    if !whole {
        return Ok(Catchup::Reset(format!("more than {REPLAY_BYTES} bytes of the transcript were missed")));
    }
    let mut run = before.iter().rev().find_map(|(_, e)| crate::relay::user_run(e).map(str::to_owned));
    let mut last = after.clone();
    let mut out = Vec::new();
    for (p, entry) in &entries {
        for ev in crate::relay::render(gw, &session, *p, entry, &mut run) {
            if !ev.id.after(after) {
                continue;
            }
            last = ev.id.clone();
            out.push(Arc::new(BusEvent {
                name: ev.name,
                session_key: Some(session.key.clone()),
                payload_json: ev.payload.to_string(),
                droppable: false,
                audience: ev.audience,
                id: Some(ev.id),
            }));
        }
        // Rows that announce nothing still move the mark: their live events cannot come either.
        if *p > last.pos {
            last = EventId { session_id: session.session_id.clone(), pos: *p, part: 1 };
        }
    }
    Ok(Catchup::Events(out, last))
}

/// Whether a live event is already covered by a catch-up that ended at `last`.
pub fn covered(ev: &BusEvent, last: &EventId) -> bool {
    ev.id.as_ref().is_some_and(|id| id.session_id == last.session_id && !id.after(last))
}
