-- Pincer's PostgreSQL store, version 4: why another replica asked a run to stop (`chat.abort`, a
-- `/stop` message, ...), so that the replica running it records the same origin on its aborted
-- partial as it would for a local abort.
ALTER TABLE runs ADD COLUMN abort_origin TEXT;
