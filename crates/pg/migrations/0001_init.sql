-- Pincer's PostgreSQL store, version 1: transcripts and their entries (the verbatim Pi v3 lines),
-- the session index, and the runs of every replica.

-- One row per transcript: the append lock row (SELECT ... FOR UPDATE), its leaf and last seq.
-- `file` is the transcript's name in the JSONL layout (agents/<agent>/sessions/<sessionId>.jsonl,
-- or <that>.<reason>.<timestamp> once archived), so both backends name sessions alike.
CREATE TABLE transcripts (
    id BIGSERIAL PRIMARY KEY,
    file TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    header TEXT NOT NULL,
    leaf TEXT,
    last_seq BIGINT NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Every entry after the header, in append order (seq = last_seq + 1 under the row lock).
CREATE TABLE entries (
    transcript BIGINT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    id TEXT,
    parent_id TEXT,
    type TEXT NOT NULL,
    idempotency_key TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    line TEXT NOT NULL,
    PRIMARY KEY (transcript, seq)
);
CREATE UNIQUE INDEX entries_idempotency_key ON entries (transcript, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX entries_id ON entries (transcript, id);

-- The session index (sessions.json of each agent), one row per session key; `entry` is the whole
-- OpenClaw session entry, the columns before it are read from it for queries.
CREATE TABLE sessions (
    agent TEXT NOT NULL,
    key TEXT NOT NULL,
    session_id TEXT NOT NULL,
    label TEXT,
    archived BOOLEAN NOT NULL DEFAULT false,
    model TEXT,
    updated_at BIGINT,
    entry JSON NOT NULL,
    PRIMARY KEY (agent, key)
);

-- One row per agent with an index; `version` changes on every write (the index's stamp).
CREATE TABLE session_indexes (
    agent TEXT PRIMARY KEY,
    version BIGINT NOT NULL DEFAULT 0
);

-- Runs in progress on every replica, heart-beaten by the replica running them; a survivor takes
-- over the rows of a replica that stopped beating (and marks their turns interrupted).
-- `abort_requested` is chat.abort from another replica (with a notification on pincer_control).
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    session_key TEXT NOT NULL,
    replica TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat TIMESTAMPTZ NOT NULL DEFAULT now(),
    abort_requested BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX runs_replica ON runs (replica);
CREATE INDEX runs_session ON runs (session_key);
