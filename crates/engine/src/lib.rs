//! Pincer's session engine: everything a turn is, with no HTTP or WebSocket in it (the gateway
//! crate's adapters — the OpenClaw WebSocket protocol, the OpenAI endpoint, SSE, the messaging
//! channels — call it).
//!
//! Layout:
//! - [`config`]: `pincer.toml` + environment → validated settings (token generated on first start);
//!   [`config::channels`] the messaging channels' sections.
//! - [`state`]: the engine ([`state::Engine`]): store, session index, runs, dedupe;
//!   [`owner`]: one task per session in use, which orders its turns and makes its appends;
//!   [`abort`]: stopping a session's runs wherever they run (every entry point).
//! - [`turn`]: the one turn pipeline, [`announce`] its events, [`follow`] a turn followed to its end
//!   (typed: its text, then how it ended), [`commands`] the slash commands,
//!   [`approvals`] tool calls waiting for a person's decision, [`hook`] the `before_agent_run` hook,
//!   [`compact`] compaction.
//! - [`durable`]: what the transcript says about a turn (durable dedupe, queued and interrupted
//!   turns) and taking up the turns a stop or a dead replica cut.
//! - [`sessions`]: the session index (`sessions.json`) and key canonicalisation; [`tree`]: the
//!   session tree's methods (branches, rewind, fork, labels).
//! - [`hub`]: the one in-process event bus, events of persisted entries under durable ids;
//!   [`relay`]: other replicas' appends onto it (the PostgreSQL store); [`catchup`]: what a
//!   reconnecting client missed, replayed from the store on any replica.
//! - [`budget`]: the memory budget of answers built whole
//!   (history, exports); [`usage`]: token usage from the transcripts.
//! - [`logs`]: the bounded, redacted ring of recent log lines; [`metrics`]: Prometheus counters;
//!   [`board`]: what each messaging channel reports; [`error`]: start-up errors.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_types))] // unit tests write fixtures

pub mod abort;
pub mod announce;
pub mod approvals;
pub mod board;
pub mod budget;
pub mod catchup;
pub mod commands;
pub mod compact;
pub mod config;
pub mod durable;
pub mod error;
pub mod follow;
pub mod hook;
pub mod hub;
pub mod logs;
pub mod metrics;
pub mod owner;
pub mod pending;
pub use pincer_protocol as protocol;
pub mod relay;
pub mod sessions;
pub mod state;
pub mod takeup;
pub mod tree;
pub mod turn;
pub mod usage;
