//! The runs of every replica (`runs` table): registered when a run starts, heart-beaten by its
//! replica, removed when it ends. `chat.abort` on one replica reaches a run on another through the
//! row's `abort_requested` and `abort_origin` (seen by the owner's next heartbeat) and a
//! notification on [`CONTROL_CHANNEL`] (seen at once). A replica that stops beating loses its rows to the first
//! survivor that claims them ([`PgStore::claim_stale_runs`]).

use crate::{PgError, PgStore};
use std::time::Duration;

/// The channel of cross-replica run control; the payload is `<origin>:<run id>` of a run to abort
/// (the origin never holds a `:`).
pub const CONTROL_CHANNEL: &str = "pincer_control";

impl PgStore {
    /// Records a run this replica started.
    pub async fn run_started(&self, run_id: String, session_key: String, replica: String) -> Result<(), PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            c.execute(
                "INSERT INTO runs (run_id, session_key, replica) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id) DO UPDATE SET session_key = $2, replica = $3, heartbeat = now()",
                &[&run_id, &session_key, &replica],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// The replica a run is recorded for (`None`: no row), whether it still beats or not.
    pub async fn run_replica(&self, run_id: String) -> Result<Option<String>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            Ok(c.query_opt("SELECT replica FROM runs WHERE run_id = $1", &[&run_id]).await?.map(|r| r.get(0)))
        })
        .await
    }

    /// Forgets a run that ended.
    pub async fn run_finished(&self, run_id: String) -> Result<(), PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            c.execute("DELETE FROM runs WHERE run_id = $1", &[&run_id]).await?;
            Ok(())
        })
        .await
    }

    /// Beats for this replica's runs (`runs`: every run it has now; its other rows go) and returns
    /// those another replica asked to abort.
    pub async fn heartbeat(&self, replica: String, runs: Vec<String>) -> Result<Vec<(String, String)>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            c.execute("UPDATE runs SET heartbeat = now() WHERE replica = $1 AND run_id = ANY($2)", &[&replica, &runs])
                .await?;
            c.execute("DELETE FROM runs WHERE replica = $1 AND NOT (run_id = ANY($2))", &[&replica, &runs]).await?;
            let rows = c
                .query(
                    "SELECT run_id, coalesce(abort_origin, '') FROM runs WHERE replica = $1 AND abort_requested",
                    &[&replica],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .await
    }

    /// Asks whichever replica runs them to abort the session's runs (one run when `run_id`),
    /// because of `origin` (no `:` in it); returns the run ids found.
    pub async fn request_abort(
        &self,
        session_key: String,
        run_id: Option<String>,
        origin: String,
    ) -> Result<Vec<String>, PgError> {
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            let rows = c
                .query(
                    "UPDATE runs SET abort_requested = true, abort_origin = $3 \
                     WHERE session_key = $1 AND ($2::text IS NULL OR run_id = $2) RETURNING run_id",
                    &[&session_key, &run_id, &origin],
                )
                .await?;
            let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            for id in &ids {
                c.execute("SELECT pg_notify($1, $2)", &[&CONTROL_CHANNEL, &format!("{origin}:{id}")]).await?;
            }
            Ok(ids)
        })
        .await
    }

    /// Takes over the runs whose replica has not beaten for `stale_after`: they become this
    /// replica's (so one survivor handles each); returns `(run_id, session_key)`.
    pub async fn claim_stale_runs(
        &self,
        replica: String,
        stale_after: Duration,
    ) -> Result<Vec<(String, String)>, PgError> {
        let secs = stale_after.as_secs_f64();
        self.run(move |inner| async move {
            let c = inner.pool.get().await?;
            let rows = c
                .query(
                    "UPDATE runs SET replica = $1, heartbeat = now(), abort_requested = false, abort_origin = NULL \
                     WHERE replica <> $1 AND heartbeat < now() - make_interval(secs => $2) RETURNING run_id, session_key",
                    &[&replica, &secs],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .await
    }
}
