//! The store contract (`crates/store/tests/contract/cases.rs`, shared with the JSONL store's
//! `crates/store/tests/contract.rs`) over PostgreSQL: a real cluster, a database per case.
#![allow(clippy::disallowed_methods)] // tests read their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "../../store/tests/contract/cases.rs"]
mod cases;

use pincer_pg::{PgOptions, PgStore};
use pincer_store::Transcripts;
use pincer_testkit::postgres::Postgres;
use std::path::Path;
use std::sync::Arc;

fn database(case: &str, state: &Path) -> Arc<dyn Transcripts> {
    let url = Postgres::shared().database(&case.replace('_', "").chars().take(20).collect::<String>());
    let store = PgStore::connect(PgOptions {
        url,
        pool_size: 2,
        state_dir: state.to_path_buf(),
        redactor: Arc::new(pincer_store::redact::SecretRedactor::default()),
        cwd: "/work".into(),
    })
    .expect("connect");
    Arc::new(store)
}

contract_tests!(database);
