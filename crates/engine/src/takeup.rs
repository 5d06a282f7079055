//! Taking up the turns a stop or a dead replica cut: at startup this replica's own
//! ([`recover_interrupted`]), on a replica's takeover the runs it claimed from a dead one
//! ([`take_up`]): the session's unanswered turn at the leaf first, then the turns that waited
//! behind it, in order. What the transcript says about a turn is [`crate::durable`]'s.

use crate::durable::{marker, on_disk, queued_unstarted, unanswered_at_leaf, OnDisk, INTERRUPTED};
use crate::sessions::SessionRef;
use crate::state::{Engine, TurnSlot};
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;

/// In the background after startup: takes up this replica's turns of every session
/// ([`take_up`]). Each session is looked at in its queue, so a turn resumed meanwhile is left alone.
pub fn recover_interrupted(gw: &Arc<Engine>) {
    let gw = gw.clone();
    // Taken now, before the first connection is served; new turns wait for it to end.
    let recovering = gw.recovering.clone().try_write_owned();
    tokio::spawn(async move {
        let _recovering = recovering;
        gw.mcp.started().await;
        let list = {
            let gw = gw.clone();
            tokio::task::spawn_blocking(move || gw.sessions.list(None)).await
        };
        let Ok(Ok(sessions)) = list else { return };
        let looked = sessions.len();
        let mut all = TakenUp::default();
        for s in sessions {
            if let Ok(t) = take_up(&gw, s, Whose::Mine, |_| {}).await {
                all.resumed += t.resumed;
                all.gave_up += t.gave_up;
                all.queued.extend(t.queued);
            }
        }
        let TakenUp { resumed, gave_up, queued, .. } = all;
        let queued = queued.len();
        tracing::info!(
            "startup check done: {looked} session(s), {resumed} interrupted turn(s) resumed, {gave_up} out of attempts, \
             {queued} queued message(s) taken up"
        );
    });
}

/// Whose turns [`take_up`] takes.
pub enum Whose<'a> {
    /// At startup: this replica's own, and those of runs no replica recorded ([`mine`]).
    Mine,
    /// The runs of a dead replica that this replica claimed.
    Claimed(&'a HashSet<String>),
}

impl Whose<'_> {
    async fn take(&self, gw: &Arc<Engine>, s: &SessionRef, run_id: &str) -> bool {
        match self {
            Whose::Mine => mine(gw, s, run_id).await,
            Whose::Claimed(runs) => runs.contains(run_id),
        }
    }

    /// Why such a turn has no reply.
    fn why(&self) -> &'static str {
        match self {
            Whose::Mine => "the gateway stopped before this turn's reply was written",
            Whose::Claimed(_) => "the replica running this turn stopped before its reply was written",
        }
    }
}

/// What [`take_up`] did.
#[derive(Debug, Default)]
pub struct TakenUp {
    pub resumed: usize,
    pub gave_up: usize,
    /// The queued turns that will run, in order, in the background.
    pub queued: Vec<String>,
}

/// Takes up session `s`'s turns that `whose` says are this replica's: first the unanswered turn at
/// its leaf ([`recover`]), then, in the background and in their order, the turns queued behind it
/// that never started ([`queued_unstarted`]), each in its turn of the session's queue; `started`
/// is told each queued run once it was started (or could not be). `Err`: the store could not be
/// read now.
pub async fn take_up(
    gw: &Arc<Engine>,
    s: SessionRef,
    whose: Whose<'_>,
    started: impl Fn(&str) + Send + 'static,
) -> Result<TakenUp, ()> {
    let mut out = TakenUp::default();
    if let Some((run_id, slot)) = unanswered(gw, &s).await? {
        if whose.take(gw, &s, &run_id).await {
            match recover(gw, &s, &run_id, slot, whose.why()).await? {
                Recovered::Resumed => out.resumed += 1,
                Recovered::GaveUp => out.gave_up += 1,
                Recovered::Nothing => {}
            }
        }
    }
    let (store, path) = (gw.store.clone(), s.path.clone());
    let queued = match tokio::task::spawn_blocking(move || queued_unstarted(store.as_ref(), &path)).await {
        Ok(Ok(queued)) => queued,
        _ => return Err(()),
    };
    let mut ours = Vec::new();
    for (run_id, data) in queued {
        if whose.take(gw, &s, &run_id).await {
            ours.push((run_id, data));
        }
    }
    out.queued = ours.iter().map(|(run_id, _)| run_id.clone()).collect();
    if !ours.is_empty() {
        tokio::spawn(run_queued(gw.clone(), s, ours, started));
    }
    Ok(out)
}

/// With replicas, whether turn `run_id` is this replica's to take up at startup: a run another
/// replica recorded is that replica's, live or not (if it died, a survivor takes the run over);
/// this scan is for turns of this replica's own previous life, and of runs no replica recorded.
async fn mine(gw: &Arc<Engine>, s: &SessionRef, run_id: &str) -> bool {
    let (Some(pg), Some(me)) = (&gw.pg, gw.replica_id()) else { return true };
    match pg.run_replica(run_id.to_owned()).await {
        Ok(Some(owner)) => owner == me,
        Ok(None) => true,
        Err(e) => {
            tracing::warn!(session = %s.key, "cannot check an unanswered turn's run: {e}");
            false
        }
    }
}

/// Runs the turns queued in session `s` before a restart or a replica's death
/// ([`queued_unstarted`]), one after the other in their order: each waits for the session's queue
/// (behind a turn resumed there first); `started` is told each one once it was started.
async fn run_queued(gw: Arc<Engine>, s: SessionRef, queued: Vec<(String, Value)>, started: impl Fn(&str)) {
    let cancel = gw.stopping();
    for (run_id, data) in queued {
        let Ok(slot) = gw.turn_slot(&s.key, &cancel).await else { return };
        tracing::warn!(session = %s.key, run = %run_id, "running a message queued before its gateway stopped");
        if let Err(e) = crate::turn::run_queued(&gw, s.clone(), &run_id, &data, slot).await {
            tracing::warn!(session = %s.key, run = %run_id, "cannot run a queued message: {e}");
        }
        started(&run_id);
    }
}

/// The run id of the unanswered turn at session `s`'s leaf, read in its queue, with the queue slot
/// still held (for [`recover`]); `None` when there is none, or when the session was reset or deleted
/// meanwhile; `Err` when it could not be read now.
pub async fn unanswered(gw: &Arc<Engine>, s: &SessionRef) -> Result<Option<(String, TurnSlot)>, ()> {
    let cancel = gw.stopping();
    let slot = gw.turn_slot(&s.key, &cancel).await.map_err(drop)?;
    if slot.moved(gw, s).await {
        return Ok(None); // the turn went aside with its transcript
    }
    let (store, path) = (gw.store.clone(), s.path.clone());
    match tokio::task::spawn_blocking(move || unanswered_at_leaf(store.as_ref(), &path)).await {
        Ok(Ok(found)) => Ok(found.map(|run_id| (run_id, slot))),
        _ => Err(()),
    }
}

/// What [`recover`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovered {
    /// The turn runs again (or was already running again).
    Resumed,
    /// Out of attempts: marked interrupted and announced.
    GaveUp,
    /// Answered or moved past meanwhile.
    Nothing,
}

/// Takes up turn `run_id` of session `s`, unanswered at its leaf, interrupted because `why`, in the
/// session's queue `slot` (from [`unanswered`]): runs it again from where the transcript stands
/// ([`crate::turn::resume`], keeping the slot) while it has attempts left, else marks it
/// interrupted (a chained marker, then a `chat` error). `Err`: the store could not be asked; try
/// again later.
pub async fn recover(
    gw: &Arc<Engine>,
    s: &SessionRef,
    run_id: &str,
    slot: TurnSlot,
    why: &str,
) -> Result<Recovered, ()> {
    let attempts = gw.settings.resume_attempts;
    let (store, path, id) = (gw.store.clone(), s.path.clone(), run_id.to_owned());
    let state = match tokio::task::spawn_blocking(move || on_disk(store.as_ref(), &path, &id, attempts)).await {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => {
            tracing::warn!(session = %s.key, run = %run_id, "cannot read an interrupted turn: {e}");
            return Err(());
        }
        Err(_) => return Err(()),
    };
    match state {
        OnDisk::Resume(user) => match crate::turn::resume(gw, s.clone(), run_id, &user, slot).await {
            Ok(_) => {
                tracing::warn!(session = %s.key, run = %run_id, "resuming a turn interrupted before its reply: {why}");
                Ok(Recovered::Resumed)
            }
            Err(e) => {
                tracing::warn!(session = %s.key, run = %run_id, "cannot resume an interrupted turn: {e}");
                Err(())
            }
        },
        OnDisk::Interrupted => {
            let reason = format!("{why}; it could not be completed after {attempts} attempt(s): send it again");
            match gw.append(s, marker(INTERRUPTED, run_id, &reason)).await {
                Ok(a) => {
                    tracing::warn!(session = %s.key, run = %run_id, "an interrupted turn is out of attempts");
                    // Clients may be here already (or, with replicas, watching on another one).
                    crate::announce::publish_interrupted(gw, s, run_id, &reason, a.pos);
                    Ok(Recovered::GaveUp)
                }
                Err(e) => {
                    tracing::warn!(session = %s.key, "cannot mark an interrupted turn: {e}");
                    Err(())
                }
            }
        }
        OnDisk::New | OnDisk::Done(_) => Ok(Recovered::Nothing),
    }
}
