//! Pincer's model providers and agent runs.
//!
//! Layout:
//! - [`config`] — `[models.providers.*]` config and the [`Providers`] registry resolving
//!   `"provider/model"` (always including the offline `pincer/echo`).
//! - [`sse`] — a Server-Sent Events parser over a byte stream.
//! - [`context`] — [`ContextMessage`]: a shared context message with its model view and wire
//!   forms, each computed once.
//! - [`message`] — Pi message shapes: [`convert_to_llm`], the streamed assistant draft, usage and cost.
//! - [`provider`] — one module per wire format (`openai-completions`, `openai-responses`,
//!   `anthropic-messages`, echo) behind [`ModelStream`]; retries, timeouts and error classification.
//! - [`tools`] — the tool trait, registry (JSON schema per tool), Pi's file tools over a workspace, the tool policy.
//! - [`mcp`] — the MCP client: servers' tools as agent tools (`mcp__<server>__<tool>`).
//! - [`run`] — [`start_run`]: the model/tool loop, streaming [`RunEvent`]s, appending each
//!   complete message through a [`TranscriptSink`], abort through a `CancellationToken`.
//! - [`sink`] — [`TranscriptSink`] and the in-memory [`MemorySink`].
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_types))] // unit tests write fixtures

pub mod config;
pub mod context;
pub mod mcp;
pub mod message;
pub mod provider;
pub mod run;
pub mod sink;
pub mod sse;
pub mod tools;

pub use config::{Api, ConfigError, ModelConfig, ModelCost, ProviderConfig, Providers, ResolvedModel};
pub use context::{ContextMessage, Messages, SharedMessage};
pub use message::convert_to_llm;
pub use provider::echo::ECHO_PREFIX;
pub use provider::{
    install_crypto_provider, ErrorKind, ModelRequest, ModelStream, ProviderError, StreamDelta, ToolSpec,
};
pub use run::{start_run, RunEvent, RunRequest, CLIENT_CALLS_FIELD, DEFAULT_MAX_REPLY_BYTES};
pub use sink::{MemorySink, SinkError, SinkFuture, TranscriptSink};
pub use tokio_util::sync::CancellationToken;
pub use tools::{CurrentTimeTool, Tool, ToolError, ToolOutput, ToolPolicy, ToolRegistry, Workspace};
