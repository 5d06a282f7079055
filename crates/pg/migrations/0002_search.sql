-- Pincer's PostgreSQL store, version 2: full-text search over the messages of every transcript,
-- transcripts by the time they last changed, and a count of in-place rewrites.
--
-- One row per user or assistant message with text (the rule is pincer_search::text::line_message),
-- written in the transaction that appends (or imports) its entry, so a search on any replica finds
-- what any replica committed. `words` is the tsvector of the message's words as pincer_search folds
-- them (lowercase, no diacritics), so both indexes read a query alike; `text` is kept for snippets
-- and titles.
CREATE TABLE search_messages (
    id BIGSERIAL PRIMARY KEY,
    transcript BIGINT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    entry_id TEXT NOT NULL,
    role TEXT NOT NULL,
    ts BIGINT NOT NULL,
    text TEXT NOT NULL,
    words TSVECTOR NOT NULL,
    UNIQUE (transcript, seq)
);
CREATE INDEX search_messages_words ON search_messages USING GIN (words);

-- The last seq whose message (if any) is in search_messages: transcripts of a database written
-- before this version are indexed on start, from there.
ALTER TABLE transcripts ADD COLUMN indexed_seq BIGINT NOT NULL DEFAULT 0;

-- Transcripts changed since a moment (the OpenAI endpoint's index learns other replicas' appends).
CREATE INDEX transcripts_updated_at ON transcripts (updated_at);

-- How many times a transcript was rewritten in place (sessions.compact {maxLines}): other replicas'
-- cached contexts of it are stale when it moved.
ALTER TABLE transcripts ADD COLUMN rewrites BIGINT NOT NULL DEFAULT 0;
