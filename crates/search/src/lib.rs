//! Pincer's full-text index of session messages (SQLite FTS5 in the state directory): filled in
//! by the next commits.
