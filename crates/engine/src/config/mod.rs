//! Gateway configuration: `<state>/pincer.toml` (or `--config`), overridden by the environment, turned
//! into a validated [`Settings`] value. Secrets (the gateway token, API keys) never reach the logs.

pub mod approvals;
pub mod channels;

use crate::sessions::AgentId;
use pincer_agent::{Api, ProviderConfig, Providers};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The JSON bytes of the messages of the sessions whose context is kept in memory (by default;
/// `[gateway] context_cache_mb`), each context also charged `CONTEXT_OVERHEAD` (the engine's state) (in memory a
/// message takes a few times its JSON: its text, its wire form, and the bytes the last request
/// body sent for it, which the next turn's body refers to). The budget alone bounds the cache: many
/// short sessions fit as well as a few long ones. Idle contexts go first, least recently used
/// first; a context that does not fit is not kept.
pub const CONTEXT_CACHE_BYTES: usize = 128 * 1024 * 1024;

/// The file as written by the user.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub gateway: GatewaySection,
    pub models: ModelsSection,
    pub agents: AgentsSection,
    pub logging: LoggingSection,
    pub hooks: HooksSection,
    pub store: StoreSection,
    /// `[mcp.servers.<name>]`: MCP servers whose tools every agent gets.
    pub mcp: McpSection,
    /// `[channels.<name>]`: messaging platforms ([`channels`]).
    pub channels: channels::ChannelsSection,
}

/// `[mcp]` (and `[agents.<id>.mcp]`): MCP servers by name.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpSection {
    pub servers: BTreeMap<String, McpServerSection>,
}

/// `[mcp.servers.<name>]`: a stdio server (`command`) or a streamable HTTP one (`url`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerSection {
    /// The program of a stdio server (found on `PATH`).
    pub command: Option<String>,
    pub args: Vec<String>,
    /// Variables of its environment, which otherwise holds only `PATH` and `HOME`.
    pub env: BTreeMap<String, String>,
    /// Variables copied from the gateway's environment into the server's.
    pub env_pass: Vec<String>,
    /// Its working directory (default: the gateway's).
    pub cwd: Option<PathBuf>,
    /// The endpoint of a streamable HTTP server.
    pub url: Option<String>,
    /// Headers sent with every request to `url`.
    pub headers: BTreeMap<String, String>,
    /// A variable holding the token sent as `Authorization: Bearer <token>`.
    pub bearer_token_env: Option<String>,
    /// `false` leaves the server out (per agent: this agent does not get it).
    pub enabled: Option<bool>,
    /// Seconds a tool call may take (default 60).
    pub timeout_secs: Option<u64>,
    pub tools: McpToolsFilter,
}

/// `[mcp.servers.<name>.tools]`: which of the server's tools the agents get.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpToolsFilter {
    /// Only these (the server's names for them).
    pub include: Option<Vec<String>>,
    /// Never these.
    pub exclude: Vec<String>,
}

/// Validates `[mcp.servers.<name>]` (`section` names it in errors) into a server of id `id`.
fn mcp_server(
    name: &str,
    id: &str,
    s: &McpServerSection,
    section: &str,
) -> Result<pincer_agent::mcp::ServerSpec, String> {
    use pincer_agent::mcp::{ServerSpec, Transport};
    if !pincer_agent::mcp::valid_server_name(name) {
        return Err(format!(
            "{section}: the name {name:?} must be letters, digits, - and _ (no \"__\"): it is part of the tools' names mcp__<server>__<tool>"
        ));
    }
    let transport = match (&s.command, &s.url) {
        (Some(command), None) => {
            if command.trim().is_empty() {
                return Err(format!("{section}: command is empty"));
            }
            if !s.headers.is_empty() || s.bearer_token_env.is_some() {
                return Err(format!("{section}: headers and bearer_token_env are for url servers, not command ones"));
            }
            let mut env = s.env.clone();
            for k in &s.env_pass {
                let v = std::env::var(k).map_err(|_| format!("{section}: env_pass names {k}, which is not set"))?;
                env.insert(k.clone(), v);
            }
            Transport::Stdio { command: command.clone(), args: s.args.clone(), env, cwd: s.cwd.clone() }
        }
        (None, Some(url)) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("{section}: url {url:?} is not an http:// or https:// URL"));
            }
            if !s.args.is_empty() || !s.env.is_empty() || !s.env_pass.is_empty() || s.cwd.is_some() {
                return Err(format!("{section}: args, env, env_pass and cwd are for command servers, not url ones"));
            }
            let bearer_token = match &s.bearer_token_env {
                Some(var) => {
                    Some(env(var).ok_or_else(|| format!("{section}: bearer_token_env names {var}, which is not set"))?)
                }
                None => None,
            };
            Transport::Http { url: url.clone(), headers: s.headers.clone(), bearer_token }
        }
        (Some(_), Some(_)) => {
            return Err(format!("{section}: set command (a stdio server) or url (an HTTP one), not both"))
        }
        (None, None) => return Err(format!("{section}: set command (a stdio server) or url (a streamable HTTP one)")),
    };
    Ok(ServerSpec {
        name: name.to_owned(),
        id: id.to_owned(),
        transport,
        timeout: s
            .timeout_secs
            .map_or(pincer_agent::mcp::DEFAULT_TIMEOUT, |t| std::time::Duration::from_secs(t.max(1))),
        include: s.tools.include.clone(),
        exclude: s.tools.exclude.clone(),
    })
}

/// Whether a header or variable of this name holds a secret (redacted by value).
fn secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["auth", "key", "token", "secret", "password", "cookie"].iter().any(|w| n.contains(w))
}

/// `[store]`: where transcripts and session indexes live.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// `"jsonl"` (the default: files in the state directory) or `"postgres"`.
    pub backend: Option<StoreBackendName>,
    /// `postgres://user:password@host:port/db` (or env `PINCER_DATABASE_URL`).
    pub url: Option<String>,
    /// Most database connections of this process (default 16).
    pub pool_size: Option<usize>,
    /// This replica's name in the runs table (or env `PINCER_REPLICA_ID`; default host-pid).
    pub replica_id: Option<String>,
}

/// `store.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackendName {
    Jsonl,
    Postgres,
}

/// The store the gateway uses, validated.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreSettings {
    /// Files in the state directory.
    Jsonl,
    /// One PostgreSQL database shared by every replica.
    Postgres { url: String, pool_size: usize, replica_id: String },
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSettings::Jsonl => f.write_str("Jsonl"),
            StoreSettings::Postgres { url, pool_size, replica_id } => f
                .debug_struct("Postgres")
                .field("url", &pincer_pg::redact_url(url))
                .field("pool_size", pool_size)
                .field("replica_id", replica_id)
                .finish(),
        }
    }
}

impl StoreSettings {
    /// The password in the database URL, if any (a secret the redactor knows by value).
    fn password(&self) -> Option<String> {
        let StoreSettings::Postgres { url, .. } = self else { return None };
        let config: pincer_pg::PgConfig = url.parse().ok()?;
        config.get_password().map(|p| String::from_utf8_lossy(p).into_owned())
    }
}

/// Validates `[store]` with the environment.
fn store_settings(section: &StoreSection, config_path: &Path) -> Result<StoreSettings, String> {
    let url = env("PINCER_DATABASE_URL").or(section.url.clone());
    match section.backend.unwrap_or(StoreBackendName::Jsonl) {
        StoreBackendName::Jsonl => Ok(StoreSettings::Jsonl),
        StoreBackendName::Postgres => {
            let url = url.ok_or_else(|| {
                format!(
                    "{}: store.backend = \"postgres\" needs store.url = \"postgres://user:password@host/db\" \
                     (or PINCER_DATABASE_URL)",
                    config_path.display()
                )
            })?;
            if let Err(e) = url.parse::<pincer_pg::PgConfig>() {
                return Err(format!("store.url {} is not a PostgreSQL URL: {e}", pincer_pg::redact_url(&url)));
            }
            let replica_id = env("PINCER_REPLICA_ID").or(section.replica_id.clone()).unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            });
            let pool_size = section.pool_size.unwrap_or(16);
            if pool_size == 0 {
                return Err("store.pool_size must be at least 1".into());
            }
            Ok(StoreSettings::Postgres { url, pool_size, replica_id })
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySection {
    pub bind: Option<String>,
    pub auth: AuthSection,
    /// A folder with OpenClaw's Control UI (`dist/control-ui`), served under `/control/`.
    pub control_ui_dir: Option<PathBuf>,
    /// Web origins (`https://host[:port]`) allowed to open the WebSocket besides the gateway's own.
    pub allowed_origins: Vec<String>,
    /// Host names (besides IP literals and `localhost`) this gateway answers to: the names a reverse
    /// proxy or a LAN uses for it. Requests naming any other host are refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Open connections at most (default: from the process's file limit).
    pub max_connections: Option<usize>,
    /// Time a client has to send its request headers (default 10 s).
    pub header_timeout_ms: Option<u64>,
    /// Message JSON of the sessions' contexts kept in memory, in MiB (default 128; 0: none).
    pub context_cache_mb: Option<u64>,
    /// `[gateway.openai_api]`: the OpenAI-compatible endpoint (off unless enabled).
    pub openai_api: OpenAiApiSection,
}

/// `[gateway.openai_api]`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiApiSection {
    /// Serve `POST /v1/chat/completions` and `GET /v1/models` (or env `PINCER_OPENAI_API=1`).
    pub enabled: Option<bool>,
    /// API keys accepted as `Authorization: Bearer <key>` besides the gateway token (one per client).
    pub api_keys: Vec<String>,
}

/// `gateway.auth.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthModeName {
    /// The default: every client sends the gateway token.
    Token,
    /// No auth (refused unless the gateway listens on loopback only).
    None,
}

/// An `"on"`/`"off"` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    pub mode: Option<AuthModeName>,
    pub token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelsSection {
    pub providers: BTreeMap<String, ProviderConfig>,
}

/// `[agents]`: the defaults every agent starts from, and agents of their own.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AgentsSection {
    pub defaults: AgentDefaults,
    /// `[agents.<id>]`: an agent with its own model, prompt, workspace or tools over the defaults.
    #[serde(flatten)]
    pub each: BTreeMap<String, AgentSection>,
}

/// `[agents.<id>]`: what this agent sets differently from `[agents.defaults]`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    /// Default: `<state>/workspace/<id>`.
    pub workspace: Option<PathBuf>,
    /// Keys set here replace the same keys of `[agents.defaults.tools]`.
    pub tools: ToolsConfig,
    /// `[agents.<id>.mcp.servers.<name>]`: servers of this agent only; one named like a server of
    /// `[mcp.servers]` replaces it for this agent (`enabled = false` alone: the agent goes without it).
    pub mcp: McpSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentDefaults {
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    /// The directory the file tools work in (default: `<state>/workspace/<agent id>`).
    pub workspace: Option<PathBuf>,
    /// `[agents.defaults.tools]`: which tools the agent has.
    pub tools: ToolsConfig,
    /// Most model calls per run (tool loops included).
    pub max_turns: Option<usize>,
    /// How many times the gateway runs a turn again by itself after a crash or restart cut it
    /// (default 3; 0: never, the turn is marked interrupted).
    pub resume_attempts: Option<usize>,
    /// Largest reply (text + reasoning of one message) before the stream is cut (default 4 MiB).
    pub max_reply_bytes: Option<usize>,
    /// `[agents.defaults.compaction]`, passed to compaction as it is.
    pub compaction: Option<toml::Value>,
}

/// `[agents.defaults.tools]`: a profile (`minimal`, `coding` — the default —, `full`), plus `allow`,
/// minus `deny` ([`pincer_agent::ToolPolicy`]).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    pub profile: Option<String>,
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    /// `bash`'s sandbox: `"bwrap"` (the default) or `"off"`.
    pub sandbox: Option<SandboxName>,
    /// `bash` keeps the network (default false).
    pub network: Option<bool>,
    /// Seconds a `bash` call may run when it gives no timeout (default 600).
    pub timeout: Option<u64>,
    /// `web_fetch` may fetch loopback, private and link-local addresses (default false).
    pub web_fetch_private_network: Option<bool>,
    /// Most bytes of a response body `web_fetch` reads (default 2 MiB).
    pub web_fetch_max_bytes: Option<usize>,
    /// Seconds a `web_fetch` call may take, redirects and body included (default 30).
    pub web_fetch_timeout: Option<u64>,
    /// `allow`, `ask` or `deny` for every tool, or a table of them per tool (default: `ask` for
    /// `bash`, `write` and `edit`, `allow` for the others; [`crate::approvals`]).
    pub approval: Option<approvals::ApprovalConfig>,
    /// Seconds an approval request waits before the call is denied (default 1800).
    pub approval_timeout: Option<u64>,
}

impl ToolsConfig {
    /// These keys, each falling back to `base`'s when not set here.
    fn over(&self, base: &ToolsConfig) -> ToolsConfig {
        ToolsConfig {
            profile: self.profile.clone().or_else(|| base.profile.clone()),
            allow: self.allow.clone().or_else(|| base.allow.clone()),
            deny: self.deny.clone().or_else(|| base.deny.clone()),
            sandbox: self.sandbox.or(base.sandbox),
            network: self.network.or(base.network),
            timeout: self.timeout.or(base.timeout),
            web_fetch_private_network: self.web_fetch_private_network.or(base.web_fetch_private_network),
            web_fetch_max_bytes: self.web_fetch_max_bytes.or(base.web_fetch_max_bytes),
            web_fetch_timeout: self.web_fetch_timeout.or(base.web_fetch_timeout),
            approval: self.approval.clone().or_else(|| base.approval.clone()),
            approval_timeout: self.approval_timeout.or(base.approval_timeout),
        }
    }
}

/// `[agents.defaults.tools] sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxName {
    Bwrap,
    Off,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingSection {
    /// `"on"` (default) or `"off"`: secret redaction in transcripts and logs.
    pub redact: Option<Switch>,
    /// Extra regular expressions to redact.
    pub redact_patterns: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HooksSection {
    pub before_agent_run: Option<HookConfig>,
}

/// An external command run before each agent run (JSON on stdin, JSON decision on stdout).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Fails closed after this long (default 10 s).
    pub timeout_ms: Option<u64>,
}

/// How clients authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMode {
    Token(String),
    None,
}

/// Everything the gateway needs, validated.
pub struct Settings {
    pub state_dir: PathBuf,
    pub bind: SocketAddr,
    pub auth: AuthMode,
    /// Where the token came from, for the startup log (never the token itself).
    pub token_source: String,
    pub providers: Providers,
    pub model: String,
    pub model_is_fallback: bool,
    /// Each agent's model, prompt, workspace and tools.
    pub agents: Agents,
    pub max_turns: usize,
    /// `[agents.defaults] resume_attempts`.
    pub resume_attempts: usize,
    pub compaction: pincer_compaction::CompactionSettings,
    pub redact: bool,
    pub redact_patterns: Vec<String>,
    pub hook: Option<HookConfig>,
    pub control_ui_dir: Option<PathBuf>,
    /// Extra origins allowed on WebSocket upgrades (normalised: scheme://host[:port], lowercase).
    pub allowed_origins: Vec<String>,
    /// `gateway.allowed_hosts`, lowercased (the gateway's `guard::check_host`).
    pub allowed_hosts: Vec<String>,
    pub max_connections: usize,
    pub header_timeout: std::time::Duration,
    /// Bytes of message JSON the context cache holds at most (`context_cache_mb`).
    pub context_cache_bytes: usize,
    pub max_reply_bytes: usize,
    /// The OpenAI-compatible endpoint, when enabled.
    pub openai_api: Option<OpenAiApi>,
    /// `[store]`.
    pub store: StoreSettings,
    /// Every MCP server to run: `[mcp.servers]` and the agents' own.
    pub mcp_servers: Vec<pincer_agent::mcp::ServerSpec>,
    /// `[channels]`: the enabled messaging channels.
    pub channels: channels::ChannelSettings,
}

/// Default of [`Settings::resume_attempts`].
pub const DEFAULT_RESUME_ATTEMPTS: usize = 3;

/// One agent's settings: `[agents.defaults]`, with its own `[agents.<id>]` over them.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub id: AgentId,
    /// `provider/model` of the agent's sessions that choose none.
    pub model: String,
    pub system_prompt: Option<String>,
    /// The directory its file tools and `bash` work in.
    pub workspace: PathBuf,
    /// The tools it has.
    pub tools: pincer_agent::ToolPolicy,
    /// `bash`'s settings (sandbox, network, timeout), checked at startup when `bash` is enabled.
    pub bash: std::sync::Arc<pincer_agent::tools::bash::BashConfig>,
    /// `web_fetch`'s settings (the private network, the caps).
    pub web_fetch: std::sync::Arc<pincer_agent::tools::web_fetch::WebFetchConfig>,
    /// Which of its tool calls wait for a human's approval.
    pub approvals: approvals::AgentApprovals,
    /// The MCP servers whose tools it gets (ids of [`Settings::mcp_servers`]).
    pub mcp_servers: Vec<String>,
}

/// Every agent's settings: `main` and the configured ones, resolved at startup; an agent known only
/// from its sessions on disk (imported from OpenClaw) gets the defaults over its own workspace.
#[derive(Debug, Clone)]
pub struct Agents {
    resolved: BTreeMap<AgentId, std::sync::Arc<AgentSettings>>,
    /// `[agents.defaults]` as `main` has them when it is not configured itself.
    defaults: std::sync::Arc<AgentSettings>,
    /// `[agents.defaults] workspace` was set: every unconfigured agent works there.
    shared_workspace: bool,
    state_dir: PathBuf,
}

impl Agents {
    /// The settings of agent `id` (a session's `agent_id`, checked when its key was read).
    pub fn get(&self, id: &str) -> std::sync::Arc<AgentSettings> {
        if let Some(a) = self.resolved.get(id) {
            return a.clone();
        }
        let Ok(id) = AgentId::parse(id) else { return self.defaults.clone() };
        let mut a = (*self.defaults).clone();
        a.id = id;
        if !self.shared_workspace {
            a.workspace = default_workspace(&self.state_dir, &a.id);
        }
        std::sync::Arc::new(a)
    }

    /// `main` and the configured agents, by id.
    pub fn configured(&self) -> impl Iterator<Item = &std::sync::Arc<AgentSettings>> {
        self.resolved.values()
    }
}

/// `<state>/workspace/<id>`.
fn default_workspace(state_dir: &Path, id: &AgentId) -> PathBuf {
    state_dir.join("workspace").join(id.as_str())
}

/// The enabled OpenAI-compatible endpoint.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct OpenAiApi {
    /// Bearer keys accepted besides the gateway token.
    pub api_keys: Vec<String>,
}

impl std::fmt::Debug for OpenAiApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiApi").field("api_keys", &self.api_keys.len()).finish()
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("state_dir", &self.state_dir)
            .field("bind", &self.bind)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The redactor the settings ask for: the default secret patterns plus the configured ones and
    /// every secret known by value ([`Settings::known_secrets`]), or none.
    pub fn redactor(&self) -> Result<std::sync::Arc<dyn pincer_store::redact::Redactor>, String> {
        use pincer_store::redact::{NoRedaction, SecretRedactor};
        Ok(if self.redact {
            std::sync::Arc::new(SecretRedactor::new(&self.redact_patterns)?.with_known_values(self.known_secrets())?)
        } else {
            std::sync::Arc::new(NoRedaction)
        })
    }

    /// Secrets the gateway knows by value, redacted wherever they appear whatever they look like:
    /// the gateway token, the providers' API keys (configured, or read from `api_key_env`,
    /// `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) and credential headers, and the value of every
    /// environment variable named `*_API_KEY` or `*_TOKEN` (`PINCER_GATEWAY_TOKEN` among them).
    /// Values shorter than 8 bytes are skipped by the redactor.
    pub fn known_secrets(&self) -> Vec<String> {
        let mut out = self.providers.secret_values();
        if let AuthMode::Token(t) = &self.auth {
            out.push(t.clone());
        }
        if let Some(api) = &self.openai_api {
            out.extend(api.api_keys.iter().cloned());
        }
        out.extend(self.store.password());
        out.extend(self.channels.secrets());
        for server in &self.mcp_servers {
            match &server.transport {
                pincer_agent::mcp::Transport::Http { headers, bearer_token, .. } => {
                    out.extend(bearer_token.iter().cloned());
                    out.extend(headers.iter().filter(|(k, _)| secret_name(k)).map(|(_, v)| v.clone()));
                }
                pincer_agent::mcp::Transport::Stdio { env, .. } => {
                    out.extend(env.iter().filter(|(k, _)| secret_name(k)).map(|(_, v)| v.clone()));
                }
            }
        }
        out.extend(
            std::env::vars_os()
                .filter(|(k, _)| k.to_str().is_some_and(|k| k.ends_with("_API_KEY") || k.ends_with("_TOKEN")))
                .filter_map(|(_, v)| v.into_string().ok()),
        );
        out
    }
}

/// Command-line overrides.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// Load for a one-off command (no token is generated or required).
    pub offline: bool,
    /// Load for a command that only reads the store (`pincer transcript export --session`):
    /// providers are left out (none is built, so the variables their `api_key_env` names need
    /// not be set) and the model is not checked.
    pub skip_providers: bool,
    pub bind: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
}

/// The default state directory: `$PINCER_STATE_DIR` or `~/.pincer`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PINCER_STATE_DIR") {
        return PathBuf::from(d);
    }
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp")).join(".pincer")
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Loads and validates the configuration. Errors name the file or variable at fault.
pub fn load(o: &Overrides) -> Result<Settings, crate::error::GatewayError> {
    load_settings(o).map_err(crate::error::GatewayError::Config)
}

fn load_settings(o: &Overrides) -> Result<Settings, String> {
    let state_dir = o.state_dir.clone().unwrap_or_else(default_state_dir);
    let config_path = o.config.clone().unwrap_or_else(|| state_dir.join("pincer.toml"));
    let file = read_config_file(&config_path, o.config.is_some())?;
    let bind_text = o.bind.clone().or(file.gateway.bind.clone()).unwrap_or_else(|| "127.0.0.1:18789".into());
    let bind: SocketAddr = bind_text
        .parse()
        .map_err(|e| format!("bind address {bind_text:?} is not HOST:PORT ({e}); e.g. 127.0.0.1:18789"))?;
    let (auth, token_source) = auth_settings(o, &file.gateway.auth, bind, &state_dir, &config_path)?;
    let providers = if o.skip_providers { BTreeMap::new() } else { with_env_providers(file.models.providers) };
    let first_model = providers.iter().find_map(|(name, p)| p.models.first().map(|m| format!("{name}/{}", m.id)));
    let providers = Providers::new(providers).map_err(|e| format!("{}: {e}", config_path.display()))?;
    let chosen = env("PINCER_MODEL").or(file.agents.defaults.model.clone()).or(first_model);
    let model_is_fallback = chosen.is_none();
    let model = chosen.unwrap_or_else(|| "pincer/echo".into());
    let compaction = match file.agents.defaults.compaction.clone() {
        None => pincer_compaction::CompactionSettings::default(),
        Some(v) => v.try_into().map_err(|e| format!("{}: [agents.defaults.compaction]: {e}", config_path.display()))?,
    };
    if !o.skip_providers {
        providers.resolve(&model).map_err(|e| format!("model {model:?}: {e}"))?;
        if let Some(m) = &compaction.model {
            providers.resolve(m).map_err(|e| format!("agents.defaults.compaction.model {m:?}: {e}"))?;
        }
    }
    let redact = file.logging.redact != Some(Switch::Off);
    let openai_api = openai_api(&file.gateway.openai_api, &config_path)?;
    let store = store_settings(&file.store, &config_path)?;
    if let Some(h) = &file.hooks.before_agent_run {
        if h.command.is_empty() {
            return Err("hooks.before_agent_run.command is empty".into());
        }
    }
    let mut mcp_servers = Vec::new();
    let mut global_mcp = Vec::new();
    for (name, sec) in &file.mcp.servers {
        let spec = mcp_server(name, name, sec, &format!("{}: [mcp.servers.{name}]", config_path.display()))?;
        if sec.enabled != Some(false) {
            global_mcp.push(spec.id.clone());
            mcp_servers.push(spec);
        }
    }
    let mut agent_mcp = BTreeMap::new();
    for (id, own) in &file.agents.each {
        let mut ids = global_mcp.clone();
        for (name, sec) in &own.mcp.servers {
            ids.retain(|g| g != name);
            let only_disables = sec.enabled == Some(false) && sec.command.is_none() && sec.url.is_none();
            if only_disables {
                continue;
            }
            let sid = format!("{id}/{name}");
            let spec =
                mcp_server(name, &sid, sec, &format!("{}: [agents.{id}.mcp.servers.{name}]", config_path.display()))?;
            if sec.enabled != Some(false) {
                ids.push(sid);
                mcp_servers.push(spec);
            }
        }
        agent_mcp.insert(id.clone(), ids);
    }
    let bash_output = std::env::temp_dir().join(format!("pincer-bash-{}", uuid::Uuid::new_v4().simple()));
    let agent = |id: AgentId, own: Option<&AgentSection>| -> Result<AgentSettings, String> {
        let d = &file.agents.defaults;
        let section = format!("[agents.{}]", if own.is_some() { id.as_str() } else { "defaults" });
        let t = own.map_or_else(|| d.tools.clone(), |a| a.tools.over(&d.tools));
        let none = Vec::new();
        let tools = pincer_agent::ToolPolicy::new(
            t.profile.as_deref(),
            t.allow.as_ref().unwrap_or(&none),
            t.deny.as_ref().unwrap_or(&none),
        )
        .map_err(|e| format!("{}: {}.tools]: {e}", config_path.display(), section.trim_end_matches(']')))?;
        let approvals = approvals::AgentApprovals::new(t.approval.as_ref(), t.approval_timeout)
            .map_err(|e| format!("{}: {}.tools]: {e}", config_path.display(), section.trim_end_matches(']')))?;
        let model = match own.and_then(|a| a.model.clone()) {
            Some(m) => {
                if !o.skip_providers {
                    providers.resolve(&m).map_err(|e| format!("{section} {e}"))?;
                }
                m
            }
            None => model.clone(),
        };
        let bash = std::sync::Arc::new(pincer_agent::tools::bash::BashConfig {
            sandbox: match t.sandbox {
                Some(SandboxName::Off) => pincer_agent::tools::bash::Sandbox::Off,
                // Found (and checked to work) when the gateway starts with `bash` enabled.
                Some(SandboxName::Bwrap) | None => pincer_agent::tools::bash::Sandbox::Bwrap(PathBuf::from("bwrap")),
            },
            network: t.network.unwrap_or(false),
            default_timeout: t
                .timeout
                .map_or(pincer_agent::tools::bash::DEFAULT_TIMEOUT, |s| std::time::Duration::from_secs(s.max(1))),
            hidden: vec![state_dir.clone(), config_path.clone()],
            output_dir: bash_output.join(id.as_str()),
        });
        let workspace = own
            .and_then(|a| a.workspace.clone())
            .or_else(|| d.workspace.clone())
            .unwrap_or_else(|| default_workspace(&state_dir, &id));
        let system_prompt = own.and_then(|a| a.system_prompt.clone()).or_else(|| d.system_prompt.clone());
        let web_fetch = std::sync::Arc::new(pincer_agent::tools::web_fetch::WebFetchConfig {
            allow_private_network: t.web_fetch_private_network.unwrap_or(false),
            max_bytes: t.web_fetch_max_bytes.unwrap_or(pincer_agent::tools::web_fetch::DEFAULT_MAX_BYTES).max(1),
            timeout: t
                .web_fetch_timeout
                .map_or(pincer_agent::tools::web_fetch::DEFAULT_TIMEOUT, |s| std::time::Duration::from_secs(s.max(1))),
        });
        let mcp_servers = agent_mcp.get(id.as_str()).cloned().unwrap_or_else(|| global_mcp.clone());
        Ok(AgentSettings { id, model, system_prompt, workspace, tools, bash, web_fetch, approvals, mcp_servers })
    };
    let defaults = std::sync::Arc::new(agent(AgentId::main(), None)?);
    let mut resolved = BTreeMap::new();
    resolved.insert(AgentId::main(), defaults.clone());
    for (id, own) in &file.agents.each {
        let id = AgentId::parse(id).map_err(|e| format!("{}: [agents.{id}]: {e}", config_path.display()))?;
        resolved.insert(id.clone(), std::sync::Arc::new(agent(id, Some(own))?));
    }
    let agents = Agents {
        resolved,
        defaults,
        shared_workspace: file.agents.defaults.workspace.is_some(),
        state_dir: state_dir.clone(),
    };
    Ok(Settings {
        agents,
        state_dir,
        bind,
        auth,
        token_source,
        providers,
        model,
        model_is_fallback,
        max_turns: file.agents.defaults.max_turns.unwrap_or(8).max(1),
        resume_attempts: file.agents.defaults.resume_attempts.unwrap_or(DEFAULT_RESUME_ATTEMPTS),
        compaction,
        redact,
        redact_patterns: file.logging.redact_patterns,
        hook: file.hooks.before_agent_run,
        control_ui_dir: file.gateway.control_ui_dir,
        allowed_origins: allowed_origins(&file.gateway.allowed_origins)?,
        allowed_hosts: allowed_hosts(&file.gateway.allowed_hosts)?,
        max_connections: file.gateway.max_connections.unwrap_or_else(default_max_connections).max(1),
        header_timeout: std::time::Duration::from_millis(file.gateway.header_timeout_ms.unwrap_or(10_000).max(100)),
        context_cache_bytes: file
            .gateway
            .context_cache_mb
            .map_or(CONTEXT_CACHE_BYTES, |mb| usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)),
        max_reply_bytes: file
            .agents
            .defaults
            .max_reply_bytes
            .unwrap_or(pincer_agent::DEFAULT_MAX_REPLY_BYTES)
            .max(1024),
        openai_api,
        store,
        mcp_servers,
        channels: channels::ChannelSettings::parse(&file.channels)
            .map_err(|e| format!("{}: {e}", config_path.display()))?,
    })
}

/// `[gateway.openai_api]`, switched on by `enabled = true` or `PINCER_OPENAI_API=1`
/// (`PINCER_OPENAI_API=0` switches it off whatever the file says).
/// `pincer.toml` (a missing default file is an empty config; a missing `--config` file is an error).
fn read_config_file(path: &Path, explicit: bool) -> Result<FileConfig, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(FileConfig::default()),
        Err(e) => Err(format!("{}: cannot read: {e}", path.display())),
    }
}

/// The auth mode and where its token comes from: `PINCER_GATEWAY_TOKEN`, `gateway.auth.token`,
/// else `<state>/gateway.token` (made on first start). No auth only on loopback.
fn auth_settings(
    o: &Overrides,
    section: &AuthSection,
    bind: SocketAddr,
    state_dir: &Path,
    config_path: &Path,
) -> Result<(AuthMode, String), String> {
    let mode = if o.offline { AuthModeName::None } else { section.mode.unwrap_or(AuthModeName::Token) };
    Ok(match mode {
        AuthModeName::None => {
            if !bind.ip().is_loopback() && !o.offline {
                return Err(format!(
                    "gateway.auth.mode = \"none\" is refused on {bind}: without auth the gateway may only listen on loopback"
                ));
            }
            (AuthMode::None, "auth disabled (loopback only)".to_string())
        }
        AuthModeName::Token => {
            if let Some(t) = env("PINCER_GATEWAY_TOKEN") {
                (AuthMode::Token(t), "PINCER_GATEWAY_TOKEN".into())
            } else if let Some(t) = section.token.clone().filter(|t| !t.trim().is_empty()) {
                (AuthMode::Token(t), format!("gateway.auth.token in {}", config_path.display()))
            } else {
                let path = state_dir.join("gateway.token");
                (AuthMode::Token(load_or_create_token(&path)?), path.display().to_string())
            }
        }
    })
}

/// The configured providers plus `openai` from `OPENAI_API_KEY` (+ `OPENAI_BASE_URL`) and
/// `anthropic` from `ANTHROPIC_API_KEY`, unless the file already names them.
fn with_env_providers(mut providers: BTreeMap<String, ProviderConfig>) -> BTreeMap<String, ProviderConfig> {
    if let Some(key) = env("OPENAI_API_KEY") {
        let base = env("OPENAI_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".into());
        providers.entry("openai".into()).or_insert_with(|| {
            let mut p = ProviderConfig::new(Api::OpenaiCompletions, base);
            p.api_key = Some(key);
            p
        });
    }
    if let Some(key) = env("ANTHROPIC_API_KEY") {
        providers.entry("anthropic".into()).or_insert_with(|| {
            let mut p = ProviderConfig::new(Api::AnthropicMessages, "https://api.anthropic.com");
            p.api_key = Some(key);
            p
        });
    }
    providers
}

fn openai_api(section: &OpenAiApiSection, config_path: &Path) -> Result<Option<OpenAiApi>, String> {
    let enabled = match env("PINCER_OPENAI_API").as_deref().map(str::trim) {
        None => section.enabled.unwrap_or(false),
        Some("1" | "true" | "on" | "yes") => true,
        Some("0" | "false" | "off" | "no") => false,
        Some(other) => return Err(format!("PINCER_OPENAI_API={other:?} is not 1 or 0")),
    };
    if let Some(k) = section.api_keys.iter().find(|k| k.trim().len() < 16) {
        let shown: String = k.chars().take(3).collect();
        return Err(format!(
            "{}: gateway.openai_api.api_keys: the key starting {shown:?} is shorter than 16 characters; use long random keys",
            config_path.display()
        ));
    }
    Ok(enabled.then(|| OpenAiApi { api_keys: section.api_keys.iter().map(|k| k.trim().to_owned()).collect() }))
}

/// Checks and normalises `gateway.allowed_hosts`: bare host names, no scheme, port or path.
fn allowed_hosts(list: &[String]) -> Result<Vec<String>, String> {
    list.iter()
        .map(|h| {
            let n = h.trim().trim_end_matches('.').to_ascii_lowercase();
            let ok = !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'));
            ok.then_some(n).ok_or_else(|| {
                format!("gateway.allowed_hosts: {h:?} is not a host name like \"chat.example.com\" (no scheme or port)")
            })
        })
        .collect()
}

/// Checks and normalises `gateway.allowed_origins`.
fn allowed_origins(list: &[String]) -> Result<Vec<String>, String> {
    list.iter()
        .map(|o| {
            let n = o.trim().trim_end_matches('/').to_ascii_lowercase();
            let ok = (n.starts_with("http://") || n.starts_with("https://"))
                && !n.split_once("://").is_some_and(|(_, rest)| rest.is_empty() || rest.contains('/'));
            if ok {
                Ok(n)
            } else {
                Err(format!("gateway.allowed_origins: {o:?} is not an origin like \"https://chat.example.com\""))
            }
        })
        .collect()
}

/// Connections allowed by default: half the file-descriptor limit (transcript handles take up to a
/// quarter, lock files, provider sockets and the runtime the rest), at most 10,000.
fn default_max_connections() -> usize {
    let soft = open_file_limit().unwrap_or(1024);
    (soft / 2).saturating_sub(32).clamp(16, 10_000)
}

/// The soft limit on open files, from `/proc/self/limits`.
pub fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Reads `<state>/gateway.token`, creating it (0600) with a random token the first time.
fn load_or_create_token(path: &Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: cannot read the gateway token: {e}", path.display())),
    }
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    pincer_store::files::write_token_file(path, &token)
        .map_err(|e| format!("{}: cannot write the gateway token: {e}", path.display()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use pincer_store::{NewEntry, Store, StoreOptions};
    use serde_json::json;

    #[test]
    fn enum_settings_name_the_field_and_the_choices() {
        let err = toml::from_str::<FileConfig>("[gateway.auth]\nmode = \"tokn\"\n").unwrap_err().to_string();
        assert!(err.contains("unknown variant `tokn`, expected `token` or `none`") && err.contains("mode"), "{err}");
        let err = toml::from_str::<FileConfig>("[logging]\nredact = \"no\"\n").unwrap_err().to_string();
        assert!(err.contains("unknown variant `no`, expected `on` or `off`"), "{err}");
        let ok: FileConfig = toml::from_str("[gateway.auth]\nmode = \"none\"\n[logging]\nredact = \"off\"\n").unwrap();
        assert_eq!((ok.gateway.auth.mode, ok.logging.redact), (Some(AuthModeName::None), Some(Switch::Off)));
    }

    #[test]
    fn the_context_cache_budget_is_given_in_mib_and_can_be_off() {
        for (text, want) in [
            ("", 128usize << 20),
            ("[gateway]\ncontext_cache_mb = 0\n", 0),
            ("[gateway]\ncontext_cache_mb = 2048\n", 2048 << 20),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("pincer.toml"), text).unwrap();
            let o = Overrides {
                state_dir: Some(dir.path().to_path_buf()),
                config: Some(dir.path().join("pincer.toml")),
                ..Overrides::default()
            };
            assert_eq!(load(&o).unwrap().context_cache_bytes, want, "{text:?}");
        }
        let err = toml::from_str::<FileConfig>("[gateway]\ncontext_cache_mb = -1\n").unwrap_err().to_string();
        assert!(err.contains("context_cache_mb"), "{err}");
    }

    #[test]
    fn mcp_servers_are_every_agents_unless_an_agent_replaces_or_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[mcp.servers.docs]\nurl = \"http://127.0.0.1:9/mcp\"\n\
                    [mcp.servers.everything]\ncommand = \"node\"\nargs = [\"e.js\"]\n\
                    [mcp.servers.off]\ncommand = \"node\"\nenabled = false\n\
                    [agents.writer.mcp.servers.docs]\nenabled = false\n\
                    [agents.writer.mcp.servers.everything]\ncommand = \"node\"\nargs = [\"mine.js\"]\ntimeout_secs = 5\n\
                    [agents.plain]\nmodel = \"pincer/echo\"\n";
        std::fs::write(dir.path().join("pincer.toml"), text).unwrap();
        let o = Overrides {
            state_dir: Some(dir.path().to_path_buf()),
            config: Some(dir.path().join("pincer.toml")),
            ..Overrides::default()
        };
        let s = load(&o).unwrap();
        let ids: Vec<&str> = s.mcp_servers.iter().map(|sp| sp.id.as_str()).collect();
        assert_eq!(ids, ["docs", "everything", "writer/everything"]);
        assert_eq!(s.agents.get("main").mcp_servers, ["docs", "everything"]);
        assert_eq!(s.agents.get("plain").mcp_servers, ["docs", "everything"]);
        assert_eq!(s.agents.get("writer").mcp_servers, ["writer/everything"]);
        assert_eq!(s.agents.get("unconfigured").mcp_servers, ["docs", "everything"]);
        let mine = &s.mcp_servers[2];
        assert_eq!((mine.name.as_str(), mine.timeout), ("everything", std::time::Duration::from_secs(5)));
    }

    const GATEWAY_TOKEN: &str = "gw-token-3f9a1c77b2e04d55";
    const CONFIG_KEY: &str = "local-config-key-0001";
    const OPENAI_ENV_KEY: &str = "oa-env-key-98765432";
    const KEY_ENV_VALUE: &str = "envd-secret-value-777";
    const OTHER_TOKEN: &str = "svc-token-xyz-12345";
    const MCP_BEARER: &str = "mcp-bearer-value-5150";
    const MCP_HEADER: &str = "hdr-secret-value-4242";

    /// Loads real settings in a child process (its environment set by the parent, so no test
    /// mutates this process's environment), appends a message quoting every secret through a
    /// store with `Settings::redactor()`, and checks the file and `redact_str`.
    #[test]
    fn known_secrets_are_redacted_in_transcripts_and_logs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("pincer.toml"),
            format!(
                r#"
[models.providers.local]
api = "openai-completions"
base_url = "http://127.0.0.1:9/v1"
api_key = "{CONFIG_KEY}"
[[models.providers.local.models]]
id = "m"

[models.providers.envd]
api = "anthropic-messages"
base_url = "http://127.0.0.1:9"
api_key_env = "PINCER_TEST_ENVD_SECRET"
[[models.providers.envd.models]]
id = "m"

[mcp.servers.docs]
url = "http://127.0.0.1:9/mcp"
bearer_token_env = "PINCER_TEST_MCP_BEARER"
headers = {{ X-Api-Secret = "{MCP_HEADER}", X-Team = "support" }}
"#
            ),
        )
        .unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["config::tests::redaction_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("PINCER_REDACTION_CHILD_DIR", dir.path())
            .env("PINCER_GATEWAY_TOKEN", GATEWAY_TOKEN)
            .env("OPENAI_API_KEY", OPENAI_ENV_KEY)
            .env("PINCER_TEST_ENVD_SECRET", KEY_ENV_VALUE)
            .env("SOME_SERVICE_TOKEN", OTHER_TOKEN)
            .env("PINCER_TEST_MCP_BEARER", MCP_BEARER)
            .output()
            .unwrap();
        assert!(
            out.status.success() && dir.path().join("child-ok").exists(),
            "child failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn redaction_child() {
        let Ok(dir) = std::env::var("PINCER_REDACTION_CHILD_DIR") else { return };
        let dir = PathBuf::from(dir);
        let o =
            Overrides { state_dir: Some(dir.clone()), config: Some(dir.join("pincer.toml")), ..Overrides::default() };
        let settings = load(&o).unwrap();
        assert_eq!(settings.auth, AuthMode::Token(GATEWAY_TOKEN.into()));
        let secrets = [GATEWAY_TOKEN, CONFIG_KEY, OPENAI_ENV_KEY, KEY_ENV_VALUE, OTHER_TOKEN, MCP_BEARER, MCP_HEADER];
        let text = secrets.join(" | ");
        let store = Store::new(StoreOptions { redactor: settings.redactor().unwrap(), ..StoreOptions::default() });
        let file = dir.join("sessions/s.jsonl");
        let msg = json!({"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1});
        store.append(&file, NewEntry::message(msg)).unwrap();
        store.close();
        let on_disk = std::fs::read_to_string(&file).unwrap();
        let line: serde_json::Value = serde_json::from_str(on_disk.lines().nth(1).unwrap()).unwrap();
        let expected = "gw-…[REDACTED] | lo…[REDACTED] | oa…[REDACTED] | en…[REDACTED] | sv…[REDACTED] | mc…[REDACTED] | hd…[REDACTED]";
        assert_eq!(line["message"]["content"][0]["text"], expected);
        for s in secrets {
            assert!(!on_disk.contains(s), "{s} reached the transcript");
        }
        assert_eq!(settings.redactor().unwrap().redact_str(&format!("log: {text}")), format!("log: {expected}"));
        // Off means off.
        let mut off = settings;
        off.redact = false;
        assert_eq!(off.redactor().unwrap().redact_str(GATEWAY_TOKEN), GATEWAY_TOKEN);
        std::fs::write(dir.join("child-ok"), b"ok").unwrap();
    }
}
