//! The database schema: versioned SQL files embedded in the binary (`crates/pg/migrations/`),
//! applied in order on start under an advisory lock, so replicas starting together apply each one
//! exactly once. `pincer_migrations` records what was applied.

use tokio_postgres::Client;

/// Version, name, SQL. Append only: an applied migration is never edited.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (2, "search", include_str!("../migrations/0002_search.sql")),
    (3, "channels", include_str!("../migrations/0003_channels.sql")),
    (4, "abort origin", include_str!("../migrations/0004_abort_origin.sql")),
];

/// Key of the advisory lock held while migrating.
const MIGRATION_LOCK: i64 = 0x7069_6e63_6572_0001;

/// Applies the migrations this database does not have yet; returns how many were applied.
pub async fn migrate(client: &mut Client) -> Result<usize, tokio_postgres::Error> {
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
    let r = apply(client).await;
    let unlocked = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await;
    let n = r?;
    unlocked?;
    Ok(n)
}

async fn apply(client: &mut Client) -> Result<usize, tokio_postgres::Error> {
    let exists: bool = client.query_one("SELECT to_regclass('pincer_migrations') IS NOT NULL", &[]).await?.get(0);
    if !exists {
        client
            .batch_execute(
                "CREATE TABLE pincer_migrations (version INT PRIMARY KEY, name TEXT NOT NULL, \
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .await?;
    }
    let applied: Vec<i32> =
        client.query("SELECT version FROM pincer_migrations", &[]).await?.iter().map(|r| r.get(0)).collect();
    let mut n = 0;
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute("INSERT INTO pincer_migrations (version, name) VALUES ($1, $2)", &[version, name]).await?;
        tx.commit().await?;
        tracing::info!(version, name, "applied database migration");
        n += 1;
    }
    Ok(n)
}
