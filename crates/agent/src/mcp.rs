//! The MCP client: tools of Model Context Protocol servers as agent tools, on the official Rust SDK
//! (`rmcp`).
//!
//! A [`Manager`] runs one supervisor task per configured server ([`ServerSpec`]): a stdio server is
//! a child process the gateway starts itself (its own process group, an environment holding only
//! `PATH`, `HOME` and what the config names, its stderr in the gateway's log), a streamable HTTP
//! server is reached with the providers' HTTP client. The supervisor connects (the 2026-07-28
//! revision where the server speaks it, else the `initialize` handshake of 2025-11-25), lists the
//! tools (every page), lists them again on `notifications/tools/list_changed`, and when the
//! connection ends (the process died, the server went away) marks the server failed with the reason
//! and connects again after a backoff (1 s doubling to 60 s; back to 1 s after a minute of life).
//!
//! Each listed tool becomes an [`McpTool`] named `mcp__<server>__<tool>` with the server's input
//! schema as it is. A call is `tools/call` under the server's timeout, counted from the call's last
//! progress notification; dropping it (an abort of the turn) or its timeout sends
//! `notifications/cancelled`. `isError` results, protocol errors and a
//! connection lost during the call are tool errors naming the server and the failure. Results map
//! onto Pi's `toolResult` blocks ([`to_output`]), under the built-in tools' output caps.
//! Annotations feed the tool's hints: `readOnlyHint` or `idempotentHint` make a call safe to run
//! again on resume ([`Tool::read_only`]); a tool that may be destructive (the spec's default unless
//! `readOnlyHint` is true or `destructiveHint` false) asks for approval by default
//! ([`Tool::destructive`]).
//!
//! Nothing is silent: every server has a [`ServerState`] (starting, ready with its tools, failed
//! with the reason) in [`Manager::status`], and a tool left out (its name unusable, filtered by the
//! config) is listed there with why.

mod http;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientNotification, ClientRequest, Implementation, ProtocolVersion, ServerResult,
};
use rmcp::service::{ClientLifecycleMode, MaybeSendFuture, NotificationContext, Peer, PeerRequestOptions, RoleClient};
use rmcp::{ClientHandler, ServiceError};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use crate::tools::truncate::{format_size, truncate_head, MAX_BYTES, MAX_LINES};
use crate::tools::{Tool, ToolError, ToolFuture, ToolOutput};

/// Prefix of every MCP tool's name (Pi's and Claude's convention: `mcp__<server>__<tool>`).
pub const PREFIX: &str = "mcp__";
/// Default of [`ServerSpec::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a connection (process start, handshake, first tool list) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection over HTTP waits for the server to answer its standalone event stream
/// before it counts as up anyway ([`http::Client::standalone_answered`]).
const STANDALONE_WAIT: Duration = Duration::from_secs(5);
/// First wait before a failed server is started again; doubled after each failure.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between two starts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A server that lived this long starts again after [`FIRST_BACKOFF`].
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Longest a stdio server is given to exit after SIGTERM before its group is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Longest line of a server's stderr copied to the log.
const STDERR_LINE: usize = 2000;
/// Most tool name characters a provider accepts (OpenAI's limit).
const MAX_NAME: usize = 64;

/// A configured server, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The name in its tools' names (`[mcp.servers.<name>]`).
    pub name: String,
    /// What identifies its process or connection: the name for a server of `[mcp.servers]`,
    /// `<agent>/<name>` for one of `[agents.<agent>.mcp.servers]`.
    pub id: String,
    pub transport: Transport,
    /// Longest a `tools/call` may take.
    pub timeout: Duration,
    /// Only these tools (the server's names), when set.
    pub include: Option<Vec<String>>,
    /// Never these tools.
    pub exclude: Vec<String>,
}

/// How the server is reached.
#[derive(Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking JSON-RPC lines on its stdin and stdout.
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String>, cwd: Option<PathBuf> },
    /// Streamable HTTP at `url`, with these headers (and `Authorization: Bearer <token>`).
    Http { url: String, headers: BTreeMap<String, String>, bearer_token: Option<String> },
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { command, args, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Transport::Http { url, headers, bearer_token } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .field("bearer_token", &bearer_token.is_some())
                .finish(),
        }
    }
}

impl Transport {
    /// What the status shows: the command line or the URL (never a header or a variable's value).
    pub fn describe(&self) -> String {
        match self {
            Transport::Stdio { command, args, .. } => {
                std::iter::once(command.as_str()).chain(args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
            }
            Transport::Http { url, .. } => url.clone(),
        }
    }
}

/// Whether `name` may be a server's name: letters, digits, `-` and `_`, no `__` (the separator of
/// the tools' names).
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.contains("__")
        && !name.starts_with('_')
        && !name.ends_with('_')
}

/// Where a server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Being started or connected (again).
    Starting,
    /// Connected, its tools listed.
    Ready,
    /// Not connected, and why (tried again after a backoff, staying `Failed` until it is ready).
    Failed(String),
    /// Stopped with the gateway.
    Stopped,
}

impl ServerState {
    /// `starting`, `ready`, `failed` or `stopped`.
    pub fn name(&self) -> &'static str {
        match self {
            ServerState::Starting => "starting",
            ServerState::Ready => "ready",
            ServerState::Failed(_) => "failed",
            ServerState::Stopped => "stopped",
        }
    }
}

/// A server's state and tools, changed by its supervisor.
struct Live {
    state: ServerState,
    tools: Vec<Arc<McpTool>>,
    /// Tools the server listed that the agent does not get, with why.
    left_out: Vec<(String, String)>,
    peer: Option<Peer<RoleClient>>,
    /// Counts the connections made, so a call knows whether the one it used ended.
    connection: u64,
    /// How many times it was started again after a failure.
    restarts: u64,
    /// The negotiated protocol revision.
    protocol: Option<String>,
    /// The last lines of a stdio server's stderr (for the failure's reason).
    stderr_tail: Vec<String>,
}

/// One configured server.
pub struct Server {
    spec: ServerSpec,
    live: Mutex<Live>,
    /// Bumped on every change of state or tools.
    changed: tokio::sync::watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Server {
    fn new(spec: ServerSpec) -> Arc<Server> {
        let live = Live {
            state: ServerState::Starting,
            tools: Vec::new(),
            left_out: Vec::new(),
            peer: None,
            connection: 0,
            restarts: 0,
            protocol: None,
            stderr_tail: Vec::new(),
        };
        Arc::new(Server { spec, live: Mutex::new(live), changed: tokio::sync::watch::channel(0).0 })
    }

    /// The server's configuration.
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// Changes whenever its state or tools change.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Its state now.
    pub fn state(&self) -> ServerState {
        lock(&self.live).state.clone()
    }

    /// Its tools, when it is ready (none otherwise).
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let live = lock(&self.live);
        if live.state != ServerState::Ready {
            return Vec::new();
        }
        live.tools.iter().map(|t| t.clone() as Arc<dyn Tool>).collect()
    }

    fn update(&self, f: impl FnOnce(&mut Live)) {
        f(&mut lock(&self.live));
        self.changed.send_modify(|v| *v += 1);
    }

    fn set_state(&self, state: ServerState) {
        tracing::debug!(server = %self.spec.id, "MCP server {}: {}", self.spec.id, state.name());
        self.update(|l| {
            l.state = state;
            if l.state != ServerState::Ready {
                l.peer = None;
            }
        });
    }

    /// `{id, name, transport, target, state, reason?, protocol?, restarts, tools: [{name, tool,
    /// readOnly, idempotent, destructive}], leftOut: [{tool, reason}]}`.
    pub fn status(&self) -> Value {
        let live = lock(&self.live);
        let tools: Vec<Value> = live
            .tools
            .iter()
            .map(|t| {
                json!({"name": t.name, "tool": t.tool, "readOnly": t.read_only, "idempotent": t.idempotent,
                    "destructive": t.destructive})
            })
            .collect();
        let left_out: Vec<Value> = live.left_out.iter().map(|(t, why)| json!({"tool": t, "reason": why})).collect();
        let mut v = json!({
            "id": self.spec.id,
            "name": self.spec.name,
            "transport": match self.spec.transport { Transport::Stdio { .. } => "stdio", Transport::Http { .. } => "http" },
            "target": self.spec.transport.describe(),
            "state": live.state.name(),
            "restarts": live.restarts,
            "tools": if live.state == ServerState::Ready { tools } else { Vec::new() },
            "leftOut": left_out,
        });
        if let ServerState::Failed(reason) = &live.state {
            v["reason"] = json!(reason);
        }
        if let Some(p) = &live.protocol {
            v["protocol"] = json!(p);
        }
        v
    }

    /// One line for a person: `ready with 3 tools`, `failed: …`.
    pub fn summary(&self) -> String {
        let live = lock(&self.live);
        match &live.state {
            ServerState::Ready => {
                let n = live.tools.len();
                format!("ready with {n} tool{}", if n == 1 { "" } else { "s" })
            }
            ServerState::Failed(reason) => format!("failed: {reason}"),
            other => other.name().to_owned(),
        }
    }

    /// Calls `tool` (the server's name for it) with `arguments`.
    async fn call(&self, tool: &str, arguments: Value) -> Result<ToolOutput, ToolError> {
        let name = &self.spec.name;
        let (peer, connection) = {
            let live = lock(&self.live);
            match (&live.state, &live.peer) {
                (ServerState::Ready, Some(peer)) => (peer.clone(), live.connection),
                (state, _) => {
                    let why = match state {
                        ServerState::Failed(reason) => format!("failed: {reason}"),
                        other => other.name().to_owned(),
                    };
                    return Err(ToolError::failed(format!(
                        "MCP server {name} is not available ({why}); {tool} did not run."
                    )));
                }
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(args) = arguments {
            params = params.with_arguments(args);
        }
        let timeout = self.spec.timeout;
        // The timeout counts from the last progress notification of the call; when it runs out,
        // rmcp sends `notifications/cancelled`, and so does the guard when this future is dropped
        // before the answer (an abort of the turn).
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let options = PeerRequestOptions::with_timeout(timeout).reset_timeout_on_progress();
        let answer = match peer.send_request_with_option(request, options).await {
            Ok(handle) => {
                let mut guard = CancelOnDrop { peer: peer.clone(), id: Some(handle.id.clone()) };
                let answer = handle.await_response().await;
                guard.id = None;
                answer
            }
            Err(e) => Err(e),
        };
        let answer = match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(other) => Err(ServiceError::McpError(rmcp::ErrorData::internal_error(
                format!("the server answered tools/call with {other:?}"),
                None,
            ))),
            Err(e) => Err(e),
        };
        match answer {
            Err(ServiceError::Timeout { .. }) => Err(ToolError::failed(format!(
                "MCP server {name}: {tool} did not answer within {} s of its last progress (timeout_secs); the call was cancelled.",
                timeout.as_secs()
            ))),
            Ok(result) => {
                let value = serde_json::to_value(&result).map_err(|e| ToolError::failed(e.to_string()))?;
                to_output(&value)
            }
            Err(ServiceError::McpError(e)) => {
                Err(ToolError::failed(format!("MCP server {name}: {tool} failed: {} (error {})", e.message, e.code.0)))
            }
            Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                let why = self.ended(connection).await.unwrap_or_else(|| e.to_string());
                Err(ToolError::failed(format!(
                    "MCP server {name} stopped during the call to {tool} ({why}); the call's outcome is unknown. The server is being restarted."
                )))
            }
            Err(e) => Err(ToolError::failed(format!("MCP server {name}: {tool} failed: {e}"))),
        }
    }

    /// Why connection `connection` ended, once its supervisor knows (a few seconds at most).
    async fn ended(&self, connection: u64) -> Option<String> {
        let mut rx = self.changed.subscribe();
        let done = |_: &u64| {
            let live = lock(&self.live);
            live.connection != connection || matches!(live.state, ServerState::Failed(_) | ServerState::Stopped)
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(done)).await;
        match &lock(&self.live).state {
            ServerState::Failed(reason) => Some(reason.clone()),
            _ => None,
        }
    }
}

/// Sends `notifications/cancelled` for request `id` when dropped with it still set (the call's
/// future dropped before its answer).
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<rmcp::model::RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current()) else { return };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let params = CancelledNotificationParam::new(Some(id), Some("the turn was aborted".to_owned()));
            let note = ClientNotification::CancelledNotification(CancelledNotification::new(params));
            let _ = peer.send_notification(note).await;
        });
    }
}

/// An MCP server's tool, as an agent tool.
pub struct McpTool {
    /// `mcp__<server>__<tool>`.
    name: String,
    /// The server's name for it.
    tool: String,
    description: String,
    schema: Value,
    /// `readOnlyHint`.
    read_only: bool,
    /// `idempotentHint`.
    idempotent: bool,
    destructive: bool,
    server: std::sync::Weak<Server>,
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.schema.clone()
    }
    /// `readOnlyHint` or `idempotentHint`: running the call again after a crash changes nothing more.
    fn read_only(&self) -> bool {
        self.read_only || self.idempotent
    }
    /// Unless the server says it is read-only or not destructive (the spec's default).
    fn destructive(&self) -> bool {
        self.destructive
    }
    fn call(&self, arguments: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let Some(server) = self.server.upgrade() else {
                return Err(ToolError::failed(format!("{}: its MCP server was stopped; it did not run.", self.name)));
            };
            server.call(&self.tool, arguments).await
        })
    }
}

/// An MCP `CallToolResult` (as JSON) as a tool's output: `text` blocks as they are, `image` blocks
/// as Pi's (`data`, `mimeType`), a `resource_link` or an embedded resource as a text naming it (its
/// text when it has one; an image blob as an image), audio as a text saying it is not shown;
/// `structuredContent` in `details.structuredContent` (and as the text when there is no content).
/// The text is cut like the built-in tools' (2,000 lines or 50 KB, `details.truncation`).
/// `isError: true` is the tool's error, its text the message.
pub fn to_output(result: &Value) -> Result<ToolOutput, ToolError> {
    let mut content = Vec::new();
    for block in result["content"].as_array().into_iter().flatten() {
        let s = |k: &str| block[k].as_str().unwrap_or_default();
        match s("type") {
            "text" => content.push(json!({"type": "text", "text": s("text")})),
            "image" => content.push(json!({"type": "image", "data": s("data"), "mimeType": s("mimeType")})),
            "audio" => content.push(text(format!(
                "[audio ({}, {} of base64) not shown]",
                s("mimeType"),
                format_size(s("data").len())
            ))),
            "resource_link" => {
                let mut t = format!("Resource link: {} <{}>", s("name"), s("uri"));
                if !s("mimeType").is_empty() {
                    t.push_str(&format!(" ({})", s("mimeType")));
                }
                if !s("description").is_empty() {
                    t.push_str(&format!(": {}", s("description")));
                }
                content.push(text(t));
            }
            "resource" => {
                let r = &block["resource"];
                let rs = |k: &str| r[k].as_str().unwrap_or_default();
                if let Some(body) = r["text"].as_str() {
                    content.push(text(format!("Resource {}:\n{body}", rs("uri"))));
                } else if rs("mimeType").starts_with("image/") {
                    content.push(json!({"type": "image", "data": rs("blob"), "mimeType": rs("mimeType")}));
                } else {
                    content.push(text(format!(
                        "[resource {} ({}, {} of base64) not shown]",
                        rs("uri"),
                        if rs("mimeType").is_empty() { "binary" } else { rs("mimeType") },
                        format_size(rs("blob").len())
                    )));
                }
            }
            other => content.push(text(format!("[{other} content not shown]"))),
        }
    }
    let structured = result.get("structuredContent").filter(|v| !v.is_null());
    if content.is_empty() {
        content.push(text(structured.map_or_else(|| "(no output)".to_owned(), Value::to_string)));
    }
    if result["isError"] == true {
        let message: Vec<&str> = content.iter().filter_map(|b| b["text"].as_str()).collect();
        return Err(ToolError::failed(message.join("\n")));
    }
    let mut details = serde_json::Map::new();
    if let Some(s) = structured {
        details.insert("structuredContent".into(), s.clone());
    }
    // The caps: the text blocks share Pi's 2,000 lines / 50 KB; the block that crosses them is cut
    // with a note and the text blocks after it are dropped.
    let (mut lines, mut bytes) = (MAX_LINES, MAX_BYTES);
    let mut capped = Vec::with_capacity(content.len());
    let mut cut = false;
    for block in content {
        let Some(t) = block["text"].as_str() else {
            capped.push(block);
            continue;
        };
        if cut {
            continue;
        }
        let tr = truncate_head(t, lines, bytes);
        if tr.truncated {
            let note = format!(
                "\n\n[Output truncated: {} of {} lines ({} of {}) shown.]",
                tr.output_lines,
                tr.total_lines,
                format_size(tr.output_bytes),
                format_size(tr.total_bytes)
            );
            capped.push(text(format!("{}{note}", tr.content)));
            details.insert("truncation".into(), tr.to_value());
            cut = true;
        } else {
            lines = lines.saturating_sub(tr.total_lines);
            bytes = bytes.saturating_sub(tr.total_bytes);
            capped.push(block);
        }
    }
    Ok(ToolOutput { content: capped, details: (!details.is_empty()).then_some(Value::Object(details)) })
}

fn text(t: String) -> Value {
    json!({"type": "text", "text": t})
}

/// Lists the tools of `peer` (every page) and makes the agent's tools of them: the config's
/// include/exclude applied, names that do not fit a provider's rules left out with the reason.
async fn list_tools(
    server: &Arc<Server>,
    peer: &Peer<RoleClient>,
) -> Result<(Vec<Arc<McpTool>>, Vec<(String, String)>), String> {
    let listed = tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools())
        .await
        .map_err(|_| format!("tools/list did not answer within {} s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| format!("tools/list failed: {e}"))?;
    let spec = &server.spec;
    let mut tools = Vec::new();
    let mut left_out = Vec::new();
    for t in listed {
        let tool = t.name.to_string();
        if spec.include.as_ref().is_some_and(|inc| !inc.contains(&tool)) {
            left_out.push((tool, "not in tools.include".to_owned()));
            continue;
        }
        if spec.exclude.contains(&tool) {
            left_out.push((tool, "in tools.exclude".to_owned()));
            continue;
        }
        let name = format!("{PREFIX}{}__{tool}", spec.name);
        if name.len() > MAX_NAME
            || !tool.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            || tool.is_empty()
        {
            left_out.push((
                tool,
                format!("{name} is not a usable tool name (letters, digits, - and _, at most {MAX_NAME} characters)"),
            ));
            continue;
        }
        let hints = t.annotations.as_ref();
        let read_only_hint = hints.and_then(|a| a.read_only_hint) == Some(true);
        let idempotent = hints.and_then(|a| a.idempotent_hint) == Some(true);
        let destructive_hint = hints.and_then(|a| a.destructive_hint);
        let description =
            t.description.as_deref().map(str::to_owned).or(t.title.clone()).unwrap_or_else(|| tool.clone());
        tools.push(Arc::new(McpTool {
            name,
            tool,
            description,
            schema: Value::Object((*t.input_schema).clone()),
            read_only: read_only_hint,
            idempotent,
            destructive: !read_only_hint && destructive_hint != Some(false),
            server: Arc::downgrade(server),
        }));
    }
    for (tool, why) in &left_out {
        tracing::info!(server = %spec.id, "MCP server {}: tool {tool} left out: {why}", spec.id);
    }
    Ok((tools, left_out))
}

/// The client side of a connection: the tool list's changes wake the supervisor.
#[derive(Clone)]
struct Handler {
    refresh: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        let mut info =
            ClientConfig::new(ClientCapabilities::default(), Implementation::new("pincer", env!("CARGO_PKG_VERSION")));
        // The revision `initialize` asks for (the stateless one is negotiated by `server/discover`).
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info
    }

    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        self.refresh.notify_one();
        std::future::ready(())
    }
}

/// A live connection and what ends it.
struct Connection {
    service: rmcp::service::RunningService<RoleClient, Handler>,
    child: Option<tokio::process::Child>,
}

impl Connection {
    /// Waits until the connection ends; the reason.
    async fn ended(&mut self) -> String {
        let Connection { service, child } = self;
        let closed = async {
            // The service ends when the transport does (EOF on the child's stdout, HTTP gone).
            while !service.is_transport_closed() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        match child {
            Some(child) => {
                tokio::select! {
                    status = child.wait() => match status {
                        Ok(s) => format!("the process exited ({s})"),
                        Err(e) => format!("the process could not be waited for: {e}"),
                    },
                    () = closed => "the server closed its output".to_owned(),
                }
            }
            None => {
                closed.await;
                "the connection closed".to_owned()
            }
        }
    }

    /// Closes the connection; a stdio server's process group gets SIGTERM, then SIGKILL.
    async fn stop(mut self) {
        let _ = tokio::time::timeout(STOP_GRACE, self.service.close()).await;
        if let Some(mut child) = self.child.take() {
            kill_group(&child, rustix::process::Signal::TERM);
            if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                kill_group(&child, rustix::process::Signal::KILL);
                let _ = child.wait().await;
            }
            // Whatever of the group is still there (a child that outlived its parent).
            kill_group(&child, rustix::process::Signal::KILL);
        }
    }
}

/// Sends `signal` to the process group led by `child` (it was started as its own group).
fn kill_group(child: &tokio::process::Child, signal: rustix::process::Signal) {
    let pid = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32));
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// The environment a stdio server gets: `PATH` and `HOME` from the gateway's, then its own.
fn server_env(env: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        ["PATH", "HOME"].iter().filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v))).collect();
    out.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// Protocol revisions offered: the stateless 2026-07-28 (`server/discover`) where the server speaks
/// it, else the `initialize` handshake with 2025-11-25; only the latter once a server answered the
/// discovery with something that is not a discovery result (`legacy`).
fn lifecycle(legacy: bool) -> ClientLifecycleMode {
    if legacy {
        return ClientLifecycleMode::Initialize;
    }
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Why a connection was not made, and whether the `initialize` handshake alone may do better (the
/// server misunderstood the discovery: a wrong result, an error).
struct ConnectError {
    reason: String,
    try_legacy: bool,
}

impl From<String> for ConnectError {
    fn from(reason: String) -> Self {
        ConnectError { reason, try_legacy: false }
    }
}

/// Whether a handshake failure is the server's answer rather than the transport's.
fn misunderstood(e: &rmcp::service::ClientInitializeError) -> bool {
    use rmcp::service::ClientInitializeError as E;
    matches!(
        e,
        E::ExpectedInitResponse(_)
            | E::ExpectedInitResult(_)
            | E::UncorrelatedErrorResponse { .. }
            | E::JsonRpcError(_)
            | E::NoCompatibleProtocolVersion { .. }
            | E::LegacyFallbackFailed { .. }
    )
}

/// Starts (stdio) or reaches (HTTP) the server and makes the MCP handshake.
async fn connect(
    server: &Arc<Server>,
    handler: Handler,
    stop: &CancellationToken,
    legacy: bool,
) -> Result<Connection, ConnectError> {
    let spec = &server.spec;
    let ct = stop.child_token();
    match &spec.transport {
        Transport::Stdio { command, args, env, cwd } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args)
                .env_clear()
                .envs(server_env(env))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let mut child = cmd.spawn().map_err(|e| format!("cannot start {command}: {e}"))?;
            let (Some(stdin), Some(stdout), stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err("the process's pipes were not made".to_owned().into());
            };
            let copier = stderr.map(|e| tokio::spawn(copy_stderr(server.clone(), e)));
            let started = tokio::time::timeout(
                CONNECT_TIMEOUT,
                rmcp::service::serve_client_with_lifecycle_and_ct(handler, (stdout, stdin), lifecycle(legacy), ct),
            )
            .await;
            match started {
                Ok(Ok(service)) => Ok(Connection { service, child: Some(child) }),
                Ok(Err(e)) => {
                    // An exit is the better reason (with what the process said last).
                    let exited = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
                    kill_group(&child, rustix::process::Signal::KILL);
                    if let Some(copier) = copier {
                        // Its last words, read to the end of its stderr.
                        let _ = tokio::time::timeout(Duration::from_secs(2), copier).await;
                    }
                    let tail = lock(&server.live).stderr_tail.last().cloned();
                    let try_legacy = !legacy && misunderstood(&e);
                    let reason = match (exited, tail) {
                        (Ok(Ok(s)), Some(line)) if !try_legacy => format!("the process exited ({s}): {line}"),
                        (Ok(Ok(s)), None) if !try_legacy => {
                            format!("the process exited ({s}) during the MCP handshake")
                        }
                        _ => format!("the MCP handshake failed: {e}"),
                    };
                    Err(ConnectError { reason, try_legacy })
                }
                Err(_) => {
                    kill_group(&child, rustix::process::Signal::KILL);
                    Err(format!("no MCP handshake within {} s", CONNECT_TIMEOUT.as_secs()).into())
                }
            }
        }
        Transport::Http { url, headers, bearer_token } => {
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let client = crate::provider::http_client_builder(CONNECT_TIMEOUT, None)?
                .build()
                .map_err(|e| crate::provider::error_chain(&e))?;
            let mut custom = std::collections::HashMap::new();
            for (k, v) in headers {
                let name =
                    reqwest::header::HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header {k:?}: {e}"))?;
                let value = reqwest::header::HeaderValue::from_str(v).map_err(|e| format!("header {k:?}: {e}"))?;
                custom.insert(name, value);
            }
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            if let Some(token) = bearer_token {
                config = config.auth_header(token.clone());
            }
            let client = http::Client::new(client);
            let transport = rmcp::transport::StreamableHttpClientTransport::with_client(client.clone(), config);
            let service = tokio::time::timeout(
                CONNECT_TIMEOUT,
                rmcp::service::serve_client_with_lifecycle_and_ct(handler, transport, lifecycle(legacy), ct),
            )
            .await
            .map_err(|_| format!("no MCP handshake with {url} within {} s", CONNECT_TIMEOUT.as_secs()))?
            .map_err(|e| ConnectError {
                reason: format!("the MCP handshake with {url} failed: {e}"),
                try_legacy: !legacy && misunderstood(&e),
            })?;
            client.standalone_answered(STANDALONE_WAIT).await;
            Ok(Connection { service, child: None })
        }
    }
}

/// Copies a stdio server's stderr into the gateway's log, line by line, keeping the last lines.
async fn copy_stderr(server: Arc<Server>, stderr: tokio::process::ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line: String = line.chars().take(STDERR_LINE).collect();
        tracing::info!(server = %server.spec.id, "MCP server {}: {line}", server.spec.id);
        let mut live = lock(&server.live);
        if live.stderr_tail.len() == 5 {
            live.stderr_tail.remove(0);
        }
        live.stderr_tail.push(line);
    }
}

/// Keeps one server connected until `stop`: connects, lists, relists on change, and after an end
/// or a failure waits the backoff and starts again. `first` is told when the first attempt is over.
async fn supervise(server: Arc<Server>, stop: CancellationToken, first: tokio::sync::oneshot::Sender<()>) {
    let mut first = Some(first);
    let mut backoff = FIRST_BACKOFF;
    let mut legacy = false;
    let id = server.spec.id.clone();
    loop {
        // A failed server stays `failed` (with its reason) while it is tried again.
        if !matches!(server.state(), ServerState::Failed(_)) {
            server.set_state(ServerState::Starting);
        }
        let refresh = Arc::new(tokio::sync::Notify::new());
        let handler = Handler { refresh: refresh.clone() };
        let started = Instant::now();
        let failure = match connect(&server, handler, &stop, legacy).await {
            Err(ConnectError { reason, try_legacy: true }) => {
                tracing::info!(server = %id, "MCP server {id}: {reason}; trying the initialize handshake alone");
                legacy = true;
                continue;
            }
            Err(ConnectError { reason, .. }) => reason,
            Ok(mut conn) => {
                let peer = conn.service.peer().clone();
                match list_tools(&server, &peer).await {
                    Err(reason) => {
                        conn.stop().await;
                        reason
                    }
                    Ok((tools, left_out)) => {
                        let protocol = peer.peer_info().map(|i| i.protocol_version.to_string());
                        tracing::info!(
                            server = %id,
                            "MCP server {id}: ready with {} tools ({})",
                            tools.len(),
                            protocol.as_deref().unwrap_or("?")
                        );
                        server.update(|l| {
                            l.tools = tools;
                            l.left_out = left_out;
                            l.peer = Some(peer.clone());
                            l.connection += 1;
                            l.protocol = protocol;
                            l.state = ServerState::Ready;
                        });
                        if let Some(tx) = first.take() {
                            let _ = tx.send(());
                        }
                        let reason = loop {
                            tokio::select! {
                                biased;
                                () = stop.cancelled() => {
                                    conn.stop().await;
                                    server.set_state(ServerState::Stopped);
                                    return;
                                }
                                () = refresh.notified() => match list_tools(&server, &peer).await {
                                    Ok((tools, left_out)) => {
                                        tracing::info!(server = %id, "MCP server {id}: tool list changed, now {} tools", tools.len());
                                        server.update(|l| { l.tools = tools; l.left_out = left_out; });
                                    }
                                    Err(_) if stop.is_cancelled() => {}
                                    Err(e) => tracing::warn!(server = %id, "MCP server {id}: {e}; keeping its previous tools"),
                                },
                                why = conn.ended() => break why,
                            }
                        };
                        conn.stop().await;
                        reason
                    }
                }
            }
        };
        if started.elapsed() >= HEALTHY_AFTER {
            backoff = FIRST_BACKOFF;
        }
        if stop.is_cancelled() {
            server.set_state(ServerState::Stopped);
            return;
        }
        tracing::warn!(
            server = %id,
            "MCP server {id}: {failure}; its tools are left out; starting it again in {} s",
            backoff.as_secs()
        );
        server.set_state(ServerState::Failed(failure));
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        tokio::select! {
            () = stop.cancelled() => {
                server.set_state(ServerState::Stopped);
                return;
            }
            () = tokio::time::sleep(backoff) => {}
        }
        server.update(|l| l.restarts += 1);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Every configured server and its supervisor.
pub struct Manager {
    servers: BTreeMap<String, Arc<Server>>,
    stop: CancellationToken,
    /// The first attempts not over yet.
    first: tokio::sync::Mutex<Vec<tokio::sync::oneshot::Receiver<()>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Sum of the servers' change counters' subscriptions: see [`Manager::version`].
    watchers: Vec<tokio::sync::watch::Receiver<u64>>,
}

impl Manager {
    /// The servers, not started ([`Manager::start`]).
    pub fn new(specs: impl IntoIterator<Item = ServerSpec>) -> Manager {
        let servers: BTreeMap<String, Arc<Server>> =
            specs.into_iter().map(|s| (s.id.clone(), Server::new(s))).collect();
        let watchers = servers.values().map(|s| s.changed.subscribe()).collect();
        Manager {
            servers,
            stop: CancellationToken::new(),
            first: tokio::sync::Mutex::default(),
            tasks: Mutex::default(),
            watchers,
        }
    }

    /// Starts every server's supervisor (inside a Tokio runtime).
    pub fn start(&self) {
        let mut tasks = lock(&self.tasks);
        let mut first = Vec::new();
        for server in self.servers.values() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            first.push(rx);
            tasks.push(tokio::spawn(supervise(server.clone(), self.stop.clone(), tx)));
        }
        if let Ok(mut f) = self.first.try_lock() {
            *f = first;
        }
    }

    /// Waits until every server's first attempt is over (ready or failed).
    pub async fn started(&self) {
        let pending = std::mem::take(&mut *self.first.lock().await);
        for rx in pending {
            let _ = rx.await;
        }
    }

    /// Whether no server is configured.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Server `id`.
    pub fn server(&self, id: &str) -> Option<&Arc<Server>> {
        self.servers.get(id)
    }

    /// Every server, by id.
    pub fn servers(&self) -> impl Iterator<Item = &Arc<Server>> {
        self.servers.values()
    }

    /// A number that changes whenever some server's state or tools change.
    pub fn version(&self) -> u64 {
        self.watchers.iter().map(|w| *w.borrow()).fold(0u64, u64::wrapping_add)
    }

    /// The tools of servers `ids` that are ready.
    pub fn tools(&self, ids: &[String]) -> Vec<Arc<dyn Tool>> {
        ids.iter().filter_map(|id| self.servers.get(id)).flat_map(|s| s.tools()).collect()
    }

    /// Stops every server (stdio process groups ended) and waits for their supervisors.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for t in tasks {
            let _ = t.await;
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    /// A server over HTTP that answers its session's standalone event stream 300 ms late: the
    /// connection is up, and its tools are listed, only once that stream was answered (before, a
    /// response or list change the server sent there could be taken before it had the stream).
    #[tokio::test]
    async fn an_http_connection_is_up_once_its_standalone_stream_was_answered() {
        use axum::http::{header, StatusCode};
        use axum::response::IntoResponse;
        let said = Arc::new(Mutex::new(Vec::<String>::new()));
        let (post_said, get_said) = (said.clone(), said.clone());
        let rpc = move |body: axum::Json<Value>| {
            let said = post_said.clone();
            async move {
                let method = body["method"].as_str().unwrap_or_default().to_owned();
                said.lock().unwrap().push(method.clone());
                let result = match method.as_str() {
                    _ if body.get("id").is_none() => return StatusCode::ACCEPTED.into_response(),
                    "initialize" => json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "late", "version": "1"}}),
                    "tools/list" => json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}),
                    _ => json!({}),
                };
                let reply = json!({"jsonrpc": "2.0", "id": body["id"], "result": result});
                ([("mcp-session-id", "s1")], axum::Json(reply)).into_response()
            }
        };
        let stream = move || {
            let said = get_said.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                said.lock().unwrap().push("standalone stream answered".into());
                use futures::StreamExt as _;
                let events = futures::stream::once(async { Ok::<_, std::io::Error>(": primed\n\n") })
                    .chain(futures::stream::pending());
                ([(header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(events))
            }
        };
        let app = axum::Router::new().route("/mcp", axum::routing::post(rpc).get(stream).delete(|| async { "" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let spec = ServerSpec {
            name: "late".into(),
            id: "late".into(),
            transport: Transport::Http { url, headers: Default::default(), bearer_token: None },
            timeout: DEFAULT_TIMEOUT,
            include: None,
            exclude: Vec::new(),
        };
        let manager = Manager::new([spec]);
        manager.start();
        manager.started().await;
        let tools = manager.servers().next().map(|s| s.tools().len());
        manager.shutdown().await;
        let said = said.lock().unwrap().clone();
        assert_eq!(tools, Some(1), "{said:?}");
        let answered = said.iter().position(|m| m == "standalone stream answered");
        let listed = said.iter().position(|m| m == "tools/list");
        assert!(answered.is_some() && answered < listed, "what the server was asked, in order: {said:?}");
    }

    #[test]
    fn results_map_onto_pi_blocks() {
        let out = to_output(&json!({"content": [
            {"type": "text", "text": "hi"},
            {"type": "image", "data": "iVBO", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt", "mimeType": "text/plain"},
            {"type": "resource", "resource": {"uri": "test://r", "text": "body"}},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}
        ], "structuredContent": {"sum": 3}}))
        .unwrap();
        assert_eq!(
            out.content,
            vec![
                json!({"type": "text", "text": "hi"}),
                json!({"type": "image", "data": "iVBO", "mimeType": "image/png"}),
                json!({"type": "text", "text": "Resource link: a.txt <file:///a.txt> (text/plain)"}),
                json!({"type": "text", "text": "Resource test://r:\nbody"}),
                json!({"type": "text", "text": "[audio (audio/wav, 4B of base64) not shown]"}),
            ]
        );
        assert_eq!(out.details, Some(json!({"structuredContent": {"sum": 3}})));
        let err = to_output(&json!({"content": [{"type": "text", "text": "no such file"}], "isError": true}));
        assert_eq!(err, Err(ToolError::failed("no such file")));
        let only_structured = to_output(&json!({"content": [], "structuredContent": {"a": 1}})).unwrap();
        assert_eq!(only_structured.content, vec![json!({"type": "text", "text": "{\"a\":1}"})]);
    }

    #[test]
    fn long_text_is_cut_like_the_built_in_tools() {
        let long: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let out = to_output(&json!({"content": [{"type": "text", "text": long}, {"type": "text", "text": "after"}]}))
            .unwrap();
        assert_eq!(out.content.len(), 1);
        let t = out.content[0]["text"].as_str().unwrap();
        assert!(
            t.starts_with("line 0\n") && t.contains("[Output truncated: 2000 of 3001 lines"),
            "{}",
            &t[t.len() - 100..]
        );
        assert_eq!(out.details.unwrap()["truncation"]["truncatedBy"], "lines");
    }

    #[test]
    fn server_names_must_fit_tool_names() {
        for ok in ["everything", "fs-1", "a_b"] {
            assert!(valid_server_name(ok), "{ok}");
        }
        for bad in ["", "a__b", "a b", "a.b", "_a", "é"] {
            assert!(!valid_server_name(bad), "{bad}");
        }
    }
}
