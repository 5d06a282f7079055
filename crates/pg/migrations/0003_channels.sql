-- Pincer's PostgreSQL store, version 3: the read positions of messaging channels (a Telegram bot's
-- update offset, a Matrix sync token), one row per channel account, shared by every replica.
CREATE TABLE channel_cursors (
    name TEXT PRIMARY KEY,
    cursor TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
