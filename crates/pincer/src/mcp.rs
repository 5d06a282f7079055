//! `pincer mcp list` and `pincer mcp probe NAME`: what the MCP servers of the config are doing and
//! which tools each agent gets from them. `list` asks the running gateway (`GET /api/mcp`); when
//! none answers it starts the servers itself, waits for each one's first attempt, shows the result
//! and stops them. `probe` always starts the one server here and lists its tools with their hints.

use crate::table::{OutputArgs, Table};
use crate::Failure;
use clap::{Args, Subcommand};
use pincer_gateway::config::{self, AuthMode, Overrides, Settings};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum McpCmd {
    /// Each MCP server's state (starting, ready with N tools, failed: why) and each agent's MCP tools.
    List(ListArgs),
    /// Start one server here (its config name, or `<agent>/<name>`), list its tools and stop it.
    Probe(ProbeArgs),
    /// Start one server here, call one of its tools (the server's name for it) and print the result
    /// as the model would get it (Pi's toolResult content and details).
    Call(CallArgs),
}

/// Which server: one of the config, or a streamable HTTP endpoint given here.
#[derive(Args)]
pub struct Target {
    /// The server: its name in `[mcp.servers]`, or `<agent>/<name>` for an agent's own.
    #[arg(required_unless_present = "url")]
    name: Option<String>,
    /// A streamable HTTP server's endpoint instead of a configured server (named `url`).
    #[arg(long, conflicts_with = "name")]
    url: Option<String>,
}

#[derive(Args)]
pub struct CallArgs {
    #[command(flatten)]
    target: Target,
    /// The tool, as the server names it.
    #[arg(long)]
    tool: String,
    /// Its arguments, a JSON object (default `{}`).
    #[arg(long, default_value = "{}")]
    arguments: String,
    #[command(flatten)]
    place: Where,
}

#[derive(Args)]
pub struct Where {
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Config file (default <state>/pincer.toml).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    place: Where,
    /// The running gateway's address (default: the config's `gateway.bind`).
    #[arg(long)]
    bind: Option<String>,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    place: Where,
    #[command(flatten)]
    output: OutputArgs,
}

pub fn run(cmd: McpCmd) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the runtime: {e}")))?;
    match cmd {
        McpCmd::List(args) => runtime.block_on(list(args)),
        McpCmd::Probe(args) => runtime.block_on(probe(args)),
        McpCmd::Call(args) => runtime.block_on(call(args)),
    }
}

pub(crate) fn settings(place: &Where, bind: Option<String>) -> Result<Settings, Failure> {
    config::load(&Overrides {
        offline: false,
        skip_providers: true,
        bind,
        state_dir: place.state_dir.clone(),
        config: place.config.clone(),
    })
    .map_err(|e| Failure::usage(e.to_string()))
}

/// Starts `specs` here, waits for each one's first attempt, and gives their status (they are
/// stopped again).
async fn start_here(specs: Vec<pincer_agent::mcp::ServerSpec>) -> Vec<Value> {
    let manager = pincer_agent::mcp::Manager::new(specs);
    manager.start();
    manager.started().await;
    let out = manager.servers().map(|s| s.status()).collect();
    manager.shutdown().await;
    out
}

async fn list(args: ListArgs) -> Result<u8, Failure> {
    let s = settings(&args.place, args.bind)?;
    let url = format!("{}api/mcp", pincer_gateway::http::webchat_url(s.bind, &AuthMode::None));
    let status = match ask_gateway(&url, &s.auth).await {
        Ok(v) => v,
        Err(why) => {
            eprintln!("pincer: no gateway answered at {url} ({why}); starting the servers here to show their state");
            let servers = start_here(s.mcp_servers.clone()).await;
            let mut agents = serde_json::Map::new();
            for a in s.agents.configured() {
                let tools: Vec<Value> = servers
                    .iter()
                    .filter(|srv| a.mcp_servers.iter().any(|id| srv["id"] == json!(id)))
                    .flat_map(|srv| srv["tools"].as_array().cloned().unwrap_or_default())
                    .map(|t| t["name"].clone())
                    .collect();
                agents.insert(a.id.to_string(), json!({"servers": a.mcp_servers, "tools": tools}));
            }
            json!({"servers": servers, "agents": agents, "source": "started here"})
        }
    };
    if args.output.json() {
        crate::out::json_pretty(&status)?;
        return Ok(0);
    }
    print_servers(status["servers"].as_array().map_or(&[][..], Vec::as_slice))?;
    if let Some(agents) = status["agents"].as_object() {
        for (id, a) in agents {
            let tools: Vec<&str> = a["tools"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let shown = if tools.is_empty() { "(none)".to_owned() } else { tools.join(", ") };
            crate::out::line(&format!("agent {id}: {shown}"))?;
        }
    }
    Ok(0)
}

/// `GET` of a JSON route (`/api/mcp`, `/api/channels`) on the running gateway.
pub(crate) async fn ask_gateway(url: &str, auth: &AuthMode) -> Result<Value, String> {
    pincer_agent::install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(3))
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let mut req = client.get(url);
    if let AuthMode::Token(t) = auth {
        req = req.bearer_auth(t);
    }
    let resp =
        req.send().await.map_err(|e| if e.is_connect() { "connection refused".to_owned() } else { e.to_string() })?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    resp.json().await.map_err(|e| e.to_string())
}

/// One row per server, then the tools each one leaves out and why.
fn print_servers(servers: &[Value]) -> Result<(), Failure> {
    let mut table = Table::new(&["SERVER", "TRANSPORT", "STATE"]).flex(2);
    for s in servers {
        table.row(vec![str_of(&s["id"]), str_of(&s["transport"]), state_line(s)]);
    }
    crate::out::write(table.render().as_bytes())?;
    for s in servers {
        for l in s["leftOut"].as_array().into_iter().flatten() {
            crate::out::line(&format!(
                "{}: tool {} left out: {}",
                str_of(&s["id"]),
                str_of(&l["tool"]),
                str_of(&l["reason"])
            ))?;
        }
    }
    Ok(())
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// `ready with 3 tools (2025-11-25)`, `failed: …`, `starting`.
fn state_line(s: &Value) -> String {
    match s["state"].as_str().unwrap_or_default() {
        "ready" => {
            let n = s["tools"].as_array().map_or(0, Vec::len);
            let protocol = s["protocol"].as_str().map(|p| format!(" (protocol {p})")).unwrap_or_default();
            format!("ready with {n} tool{}{protocol}", if n == 1 { "" } else { "s" })
        }
        "failed" => format!("failed: {}", str_of(&s["reason"])),
        other => other.to_owned(),
    }
}

/// The server `target` names: from the config, or an HTTP endpoint named `url`.
fn target_spec(target: &Target, place: &Where) -> Result<pincer_agent::mcp::ServerSpec, Failure> {
    if let Some(url) = &target.url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(Failure::usage(format!("--url {url:?} is not an http:// or https:// URL")));
        }
        return Ok(pincer_agent::mcp::ServerSpec {
            name: "url".into(),
            id: "url".into(),
            transport: pincer_agent::mcp::Transport::Http {
                url: url.clone(),
                headers: Default::default(),
                bearer_token: None,
            },
            timeout: pincer_agent::mcp::DEFAULT_TIMEOUT,
            include: None,
            exclude: Vec::new(),
        });
    }
    let name = target.name.clone().unwrap_or_default();
    let s = settings(place, None)?;
    s.mcp_servers.iter().find(|sp| sp.id == name).cloned().ok_or_else(|| {
        let known: Vec<&str> = s.mcp_servers.iter().map(|sp| sp.id.as_str()).collect();
        Failure::usage(format!(
            "no MCP server {name:?} in the config (servers: {})",
            if known.is_empty() { "none".to_owned() } else { known.join(", ") }
        ))
    })
}

async fn call(args: CallArgs) -> Result<u8, Failure> {
    let spec = target_spec(&args.target, &args.place)?;
    let arguments: Value = serde_json::from_str(&args.arguments)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| Failure::usage(format!("--arguments {:?} is not a JSON object", args.arguments)))?;
    let name = format!("{}{}__{}", pincer_agent::mcp::PREFIX, spec.name, args.tool);
    let manager = pincer_agent::mcp::Manager::new([spec]);
    manager.start();
    manager.started().await;
    let server = manager.servers().next().cloned();
    let tool = server.as_ref().and_then(|s| s.tools().into_iter().find(|t| t.name() == name));
    let result = match tool {
        Some(tool) => Some(tool.call(arguments).await),
        None => None,
    };
    let summary = server.as_ref().map(|s| s.summary()).unwrap_or_default();
    manager.shutdown().await;
    match result {
        None => Err(Failure::failed(format!("{name}: no such tool on the server ({summary})"))),
        Some(Ok(out)) => {
            crate::out::json_pretty(&out.to_value())?;
            Ok(0)
        }
        Some(Err(e)) => {
            crate::out::json_pretty(&json!({"content": [{"type": "text", "text": e.to_string()}], "isError": true}))?;
            Ok(1)
        }
    }
}

async fn probe(args: ProbeArgs) -> Result<u8, Failure> {
    let spec = target_spec(&args.target, &args.place)?;
    let status = start_here(vec![spec]).await.pop().unwrap_or_default();
    let failed = status["state"] != "ready";
    if args.output.json() {
        crate::out::json_pretty(&status)?;
    } else {
        crate::out::line(&format!(
            "{} ({}: {}): {}",
            str_of(&status["id"]),
            str_of(&status["transport"]),
            str_of(&status["target"]),
            state_line(&status)
        ))?;
        let mut table = Table::new(&["TOOL", "HINTS"]);
        for t in status["tools"].as_array().into_iter().flatten() {
            let mut hints = Vec::new();
            if t["readOnly"] == true {
                hints.push("read-only");
            }
            if t["idempotent"] == true {
                hints.push("idempotent");
            }
            if t["readOnly"] == true || t["idempotent"] == true {
                hints.push("re-run on resume");
            }
            if t["destructive"] == true {
                hints.push("may be destructive (approval: ask)");
            }
            let hints = hints.join(", ");
            table.row(vec![str_of(&t["name"]), hints]);
        }
        if !failed {
            crate::out::write(table.render().as_bytes())?;
        }
        for l in status["leftOut"].as_array().into_iter().flatten() {
            crate::out::line(&format!("tool {} left out: {}", str_of(&l["tool"]), str_of(&l["reason"])))?;
        }
    }
    Ok(u8::from(failed))
}
