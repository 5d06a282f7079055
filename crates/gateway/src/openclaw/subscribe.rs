//! A WebSocket connection's `sessions.messages.subscribe` with Pincer's `afterSeq`: the events it
//! missed, replayed from the store ([`crate::catchup::since`]), then the live ones, none missing and
//! none twice (live events wait while the store is read).

use crate::catchup::{covered, since, Catchup};
use crate::hub::{BusEvent, EventId};
use crate::protocol::RpcError;
use crate::state::Engine;
use pincer_store::Pos;
use std::sync::Arc;

/// Live events a connection holds for one session at most while it reads the store.
const MAX_WAITING: usize = 4096;

/// A session a WebSocket connection caught up on (see [`subscribe_messages`]).
#[derive(Default)]
pub struct CatchingUp {
    /// The replayed events, sent first.
    replay: Vec<Arc<BusEvent>>,
    /// Live events that came while the store was read (`None`: released; live events pass).
    waiting: Option<Vec<Arc<BusEvent>>>,
    /// The last event the store held: live events up to it are duplicates of the replay.
    last: Option<EventId>,
}

/// What [`CatchingUp::hold`] did with a live event.
pub enum Held {
    /// Kept for later, or dropped as a duplicate.
    Taken,
    /// Send it now.
    Pass,
    /// Too many waited: the connection is too slow.
    Overflow,
}

impl CatchingUp {
    /// Decides about a live event of the session.
    pub fn hold(&mut self, ev: &Arc<BusEvent>) -> Held {
        if self.last.as_ref().is_some_and(|l| covered(ev, l)) {
            return Held::Taken;
        }
        match &mut self.waiting {
            Some(w) if w.len() >= MAX_WAITING => Held::Overflow,
            Some(w) => {
                w.push(ev.clone());
                Held::Taken
            }
            None => Held::Pass,
        }
    }

    /// The events to send now, in order (the replay, then the live events that are not in it);
    /// live events pass from now on.
    pub fn release(&mut self) -> Vec<Arc<BusEvent>> {
        let mut out = std::mem::take(&mut self.replay);
        let last = self.last.clone();
        let waiting = self.waiting.take().unwrap_or_default();
        out.extend(waiting.into_iter().filter(|e| !last.as_ref().is_some_and(|l| covered(e, l))));
        out
    }
}

/// `sessions.messages.subscribe`. With Pincer's `afterSeq` (the `messageSeq` of the last
/// `session.message` the client saw; and optionally the `sessionId` it was of), the connection
/// first gets the session's `session.message` events after it, read from the store, then the live
/// ones, with none missing and none twice: live events wait while the store is read and go out
/// after the answer. The answer says how many were replayed, or `reset` (refetch `chat.history`)
/// when they cannot be (see the module doc).
pub async fn subscribe_messages(
    gw: &Arc<Engine>,
    ctx: &super::Ctx,
    params: &serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    use crate::protocol::{Bounded, Method, NonBlank};
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct SubscribeParams {
        key: NonBlank,
        after_seq: Option<Bounded<0, { i64::MAX as u64 }>>,
        session_id: Option<NonBlank>,
    }
    let p: SubscribeParams = crate::protocol::params(Method::SessionsMessagesSubscribe, params)?;
    let key = crate::sessions::canonical_key(&p.key)?.0;
    let Some(after) = p.after_seq.map(|a| Pos(a.0)) else {
        ctx.subs.add_messages(key.clone())?;
        return Ok(serde_json::json!({"subscribed": true, "key": key}));
    };
    // Live events wait from now on; the store is read after the subscription, so none is missed.
    pincer_pi::lock(&ctx.subs.catchup)
        .insert(key.clone(), CatchingUp { waiting: Some(vec![]), ..CatchingUp::default() });
    if gw.pg.is_some() {
        gw.relay_from(&key, after);
    }
    if let Err(e) = ctx.subs.add_messages(key.clone()) {
        pincer_pi::lock(&ctx.subs.catchup).remove(&key);
        return Err(e);
    }
    let read = match gw.session(&key, false).await {
        Ok(Some(s)) => {
            let sid = p.session_id.map_or(s.session_id, |id| id.0);
            since(gw, &key, &EventId { session_id: sid, pos: after, part: 1 }).await
        }
        Ok(None) => Ok(Catchup::Reset("the session has no transcript".into())),
        Err(e) => Err(e),
    };
    let answer = match read {
        Ok(Catchup::Events(evs, last)) => {
            let replay: Vec<Arc<BusEvent>> = evs.into_iter().filter(|e| e.name == "session.message").collect();
            let n = replay.len();
            if let Some(c) = pincer_pi::lock(&ctx.subs.catchup).get_mut(&key) {
                c.replay = replay;
                c.last = Some(last.clone());
            }
            Ok(serde_json::json!({"subscribed": true, "key": key, "sessionId": last.session_id, "replayed": n,
                "lastSeq": last.pos}))
        }
        Ok(Catchup::Reset(why)) => {
            Ok(serde_json::json!({"subscribed": true, "key": key, "reset": format!("{why}; refetch chat.history")}))
        }
        Err(e) => {
            pincer_pi::lock(&ctx.subs.messages).remove(&key);
            Err(e.into())
        }
    };
    // What waited goes out after the answer (and live events after it).
    let (done, subs) = (ctx.after_response(), ctx.subs.clone());
    tokio::spawn(async move {
        let _ = done.await;
        if let Some(flush) = subs.flush.get() {
            flush(&key);
        }
    });
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::Audience;

    fn ev(pos: u64, part: u8) -> Arc<BusEvent> {
        Arc::new(BusEvent {
            name: "session.message",
            session_key: Some("k".into()),
            payload_json: "{}".into(),
            droppable: false,
            audience: Audience::SessionSubscribers,
            id: Some(EventId { session_id: "s".into(), pos: Pos(pos), part }),
        })
    }

    fn ids(evs: &[Arc<BusEvent>]) -> Vec<u64> {
        evs.iter().filter_map(|e| e.id.as_ref().map(|i| i.pos.0)).collect()
    }

    #[test]
    fn live_events_wait_for_the_replay_and_are_not_sent_twice() {
        let mut c = CatchingUp { waiting: Some(vec![]), ..CatchingUp::default() };
        // Live events while the store is read: one the replay has too, one newer.
        assert!(matches!(c.hold(&ev(5, 0)), Held::Taken));
        assert!(matches!(c.hold(&ev(9, 0)), Held::Taken));
        c.replay = vec![ev(4, 0), ev(5, 0)];
        c.last = Some(EventId { session_id: "s".into(), pos: Pos(5), part: 1 });
        assert_eq!(ids(&c.release()), vec![4, 5, 9], "the replay, then what is newer, each once");
        // Afterwards: duplicates (a relay announcing rows again) are dropped, the rest passes.
        assert!(matches!(c.hold(&ev(5, 0)), Held::Taken));
        assert!(matches!(c.hold(&ev(10, 0)), Held::Pass));
        assert!(c.release().is_empty());
        let mut full = CatchingUp { waiting: Some(vec![]), ..CatchingUp::default() };
        for p in 0..MAX_WAITING as u64 {
            assert!(matches!(full.hold(&ev(p, 0)), Held::Taken));
        }
        assert!(matches!(full.hold(&ev(0, 1)), Held::Overflow), "a connection that falls this far behind is closed");
    }
}
