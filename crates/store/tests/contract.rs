//! The store contract ([`cases`], shared with `crates/pg/tests/contract.rs`) over the JSONL store:
//! a state directory of files, as `pincer gateway` keeps by default.
#![allow(clippy::disallowed_methods)] // tests read their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "contract/cases.rs"]
mod cases;

use pincer_store::{Store, StoreOptions, Transcripts};
use std::path::Path;
use std::sync::Arc;

fn files(_case: &str, _state: &Path) -> Arc<dyn Transcripts> {
    Arc::new(Store::new(StoreOptions::default()))
}

contract_tests!(files);
