//! The store contract ([`cases`], shared with `crates/pg/tests/contract.rs`) over the JSONL store:
//! a state directory of files, as `pincer gateway` keeps by default.
#![allow(clippy::disallowed_methods)] // tests read their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "contract/cases.rs"]
mod cases;

use pincer_store::{Store, StoreOptions, Transcripts};
use std::path::Path;

fn files(_case: &str, _state: &Path) -> Box<dyn Transcripts> {
    Box::new(Store::new(StoreOptions::default()))
}

contract_tests!(files);
