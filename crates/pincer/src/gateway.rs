//! `pincer gateway` and `pincer sessions list`: start the gateway with logs that say where the
//! WebChat is and where the token is; list the sessions of a state directory.

use crate::Failure;
use clap::Args;
use pincer_gateway::config::{self, AuthMode, Overrides};
use pincer_gateway::sessions::AgentId;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
pub struct GatewayArgs {
    /// Address to listen on (default 127.0.0.1:18789).
    #[arg(long)]
    bind: Option<String>,
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Config file (default <state>/pincer.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the ready-to-open WebChat URL (with the token) and exit without starting the gateway.
    #[arg(long)]
    print_url: bool,
}

pub fn run(args: GatewayArgs) -> Result<u8, Failure> {
    let settings = config::load(&Overrides {
        offline: false,
        skip_providers: false,
        bind: args.bind,
        state_dir: args.state_dir,
        config: args.config,
    })
    .map_err(|e| Failure::usage(e.to_string()))?;
    if args.print_url {
        crate::out::line(&pincer_gateway::http::webchat_url(settings.bind, &settings.auth))?;
        return Ok(0);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the runtime: {e}")))?;
    let token_source = settings.token_source.clone();
    let auth = settings.auth.clone();
    let auth_none = settings.auth == AuthMode::None;
    let model = settings.model.clone();
    let openai_api = settings.openai_api.is_some();
    let fallback = settings.model_is_fallback;
    let state_dir = settings.state_dir.clone();
    runtime
        .block_on(async move {
            let stop = shutdown_signal();
            pincer_gateway::serve(settings, stop, move |l| {
            tracing::info!("Pincer gateway listening on ws://{} (state {})", l.addr, state_dir.display());
            // The token is a secret: the ready-to-open link goes to a person's terminal, never
            // into a log file or journal (there the link comes from `pincer gateway --print-url`).
            if std::io::stderr().is_terminal() {
                tracing::info!("WebChat: open {}", pincer_gateway::http::webchat_url(l.addr, &auth));
            } else {
                tracing::info!(
                    "WebChat: open {} (for the link with the token, run `pincer gateway --print-url`)",
                    pincer_gateway::http::webchat_url(l.addr, &AuthMode::None)
                );
            }
            tracing::info!(
                "metrics: {}metrics (Authorization: Bearer <gateway token>, or ?token=)",
                pincer_gateway::http::webchat_url(l.addr, &AuthMode::None)
            );
            if openai_api {
                tracing::info!(
                    "OpenAI-compatible API: {}v1 (Authorization: Bearer <the gateway token or a key of gateway.openai_api.api_keys>)",
                    pincer_gateway::http::webchat_url(l.addr, &AuthMode::None)
                );
            }
            if auth_none {
                tracing::warn!("authentication is off (gateway.auth.mode = \"none\"); loopback only");
            } else {
                tracing::info!("gateway token: {token_source} (the WebChat link carries it; the page stores it and drops it from the address bar)");
            }
            if fallback {
                tracing::warn!("no model provider configured: using the offline echo model pincer/echo; set OPENAI_API_KEY or ANTHROPIC_API_KEY, or add [models.providers.<name>] to {}", state_dir.join("pincer.toml").display());
            } else {
                tracing::info!("model: {model}");
            }
            })
            .await
        })
        .map_err(|e| Failure::failed(e.to_string()))?;
    Ok(0)
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called (inside the
/// runtime), not when it is first polled: a SIGTERM right after startup must stop the gateway
/// gracefully instead of killing it.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut term = signal(SignalKind::terminate()).ok();
    async move {
        tokio::select! {
            _ = received(int.as_mut()) => {},
            _ = received(term.as_mut()) => {},
        }
    }
}

/// Resolves when `signal` arrives (never without a handler).
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[derive(Args)]
pub struct ListArgs {
    /// Only this agent's sessions.
    #[arg(long)]
    agent: Option<String>,
    #[command(flatten)]
    output: crate::table::OutputArgs,
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

pub fn list(args: ListArgs) -> Result<u8, Failure> {
    let dir = args.state_dir.unwrap_or_else(config::default_state_dir);
    let store: std::sync::Arc<dyn pincer_store::Transcripts> =
        std::sync::Arc::new(pincer_store::Store::new(Default::default()));
    let sessions = pincer_gateway::sessions::Sessions::new(&dir, store.clone());
    let agent = args.agent.as_deref().map(AgentId::parse).transpose().map_err(|e| Failure::usage(e.to_string()))?;
    let rows = sessions.list(agent.as_ref()).map_err(|e| Failure::failed(e.to_string()))?;
    if args.output.json() {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let mut row = r.row();
                row["path"] = serde_json::json!(r.path.display().to_string());
                row
            })
            .collect();
        crate::out::json_pretty(&serde_json::Value::Array(v))?;
    } else if rows.is_empty() {
        crate::out::line(&format!("no sessions in {}", dir.display()))?;
    } else {
        use crate::table::{local_time, one_line, Table};
        let mut t = Table::new(&["KEY", "TITLE", "MESSAGES", "UPDATED", "SESSION"]).flex(1);
        for r in rows {
            let (derived, count) = pincer_gateway::openclaw::methods::transcript_summary(store.as_ref(), &r.path);
            let label = r.entry.get("label").and_then(serde_json::Value::as_str).map(str::to_owned);
            let mut title = label.or(derived).map_or_else(|| "-".to_owned(), |t| one_line(&t, 48));
            if r.entry.get("archivedAt").is_some_and(|a| !a.is_null()) {
                title.push_str(" (archived)");
            }
            let updated = local_time(r.entry.get("updatedAt").and_then(serde_json::Value::as_i64));
            t.row(vec![r.key, title, count.to_string(), updated, r.session_id]);
        }
        crate::out::write(t.render().as_bytes())?;
    }
    Ok(0)
}
