//! Pincer's gateway: the product a user meets (`pincer gateway`): the adapters between clients
//! and the session engine (`pincer-engine`, re-exported below under its module names).
//!
//! Layout:
//! - [`server`]: binds, serves HTTP + WebSocket on one port, and shuts down gracefully.
//! - [`guard`]: Host, Origin, body type and CORS checks in front of every route; the failed-login throttle.
//! - [`http`]: the WebChat page, `/healthz`, the per-session SSE stream, the optional Control UI.
//! - [`openclaw`]: OpenClaw's gateway protocol over WebSocket: the connection, its dispatch and
//!   one module per family of methods.
//! - [`search`], [`export`]: session search, export and import (methods and HTTP routes).
//! - [`openai`]: the OpenAI-compatible endpoint, mapping stateless clients onto session trees.
//! - [`channels`]: messaging platforms (Telegram, Matrix) on the turn pipeline, exactly once both ways.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_types))] // unit tests write fixtures

// The engine's modules, under the names the adapters have always used.
pub use pincer_engine::{
    abort, announce, approvals, board, budget, catchup, commands, compact, config, durable, error, follow, hook, hub,
    logs, metrics, pending, protocol, relay, sessions, state, takeup, tree, turn, usage,
};

pub mod assets;
pub mod channels;
pub mod conn;
pub mod export;
pub mod guard;
pub mod http;
pub mod openai;
pub mod openclaw;
pub mod search;
pub mod server;

pub use server::{serve, Listening};
