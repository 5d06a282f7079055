//! The limits the server advertises and keeps: frame sizes, buffers, sessions per connection,
//! timers and protocol versions.

/// Largest frame after the handshake (32 MiB): room for the documented 20 MB of attachments as
/// base64 (×4/3 ≈ 26.7 MB) plus the message and the frame around them.
pub const MAX_PAYLOAD_BYTES: usize = 32 * 1024 * 1024;
/// Longest session label or display name (`sessions.create|patch`, `sessions.label`), in chars.
pub const MAX_LABEL_CHARS: usize = 256;
/// Largest frame before `connect` succeeded (64 KiB).
pub const MAX_PREAUTH_PAYLOAD_BYTES: usize = 64 * 1024;
/// Per-connection send buffer before a slow consumer is dropped/closed (50 MiB).
pub const MAX_BUFFERED_BYTES: usize = 50 * 1024 * 1024;
/// Sessions one connection may follow at once: worked with (`chat` and `agent` events), and
/// subscribed to (`sessions.messages.subscribe`), each. Beyond it the request is refused.
pub const MAX_SESSIONS_PER_CONNECTION: usize = 4096;
/// `tick` period.
pub const TICK_INTERVAL_MS: u64 = 30_000;
/// Time allowed for `connect` after the socket opens.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Protocol versions spoken.
pub const PROTOCOL_MIN: u64 = 3;
pub const PROTOCOL_MAX: u64 = 4;
