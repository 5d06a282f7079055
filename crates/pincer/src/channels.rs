//! `pincer channels status`: each messaging channel of the running gateway (`GET /api/channels`):
//! its state, account and counters (received, deduplicated, refused, sent, failed). With no gateway
//! answering, the channels the config enables are listed as not running.

use crate::mcp::{ask_gateway, settings, Where};
use crate::table::{OutputArgs, Table};
use crate::Failure;
use clap::{Args, Subcommand};
use pincer_gateway::config::AuthMode;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum ChannelsCmd {
    /// Each channel's state, account and message counters.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    place: Where,
    /// The running gateway's address (default: the config's `gateway.bind`).
    #[arg(long)]
    bind: Option<String>,
    #[command(flatten)]
    output: OutputArgs,
}

pub fn run(cmd: ChannelsCmd) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the runtime: {e}")))?;
    match cmd {
        ChannelsCmd::Status(args) => runtime.block_on(status(args)),
    }
}

async fn status(args: StatusArgs) -> Result<u8, Failure> {
    let s = settings(&args.place, args.bind)?;
    let url = format!("{}api/channels", pincer_gateway::http::webchat_url(s.bind, &AuthMode::None));
    let status = match ask_gateway(&url, &s.auth).await {
        Ok(v) => v,
        Err(why) => {
            eprintln!("pincer: no gateway answered at {url} ({why}); showing the configured channels");
            let mut list = Vec::new();
            if let Some(t) = &s.channels.telegram {
                list.push(json!({"id": "telegram", "state": "not running", "account": t.api_base_url}));
            }
            if let Some(m) = &s.channels.matrix {
                list.push(json!({"id": "matrix", "state": "not running", "account": m.user_id}));
            }
            json!({"channels": list, "source": "config"})
        }
    };
    if args.output.json() {
        crate::out::json_pretty(&status)?;
        return Ok(0);
    }
    let list = status["channels"].as_array().map_or(&[][..], Vec::as_slice);
    if list.is_empty() {
        crate::out::line("no channel is enabled (see [channels.telegram] and [channels.matrix] in the README)")?;
        return Ok(0);
    }
    let mut table =
        Table::new(&["CHANNEL", "STATE", "ACCOUNT", "RECEIVED", "DEDUPLICATED", "REFUSED", "SENT", "FAILED"]).flex(1);
    for c in list {
        let n = |k: &str| c[k].as_u64().map_or_else(|| "-".to_owned(), |n| n.to_string());
        table.row(vec![
            str_of(&c["id"]),
            str_of(&c["state"]),
            str_of(&c["account"]),
            n("received"),
            n("deduplicated"),
            n("refused"),
            n("sent"),
            n("failed"),
        ]);
    }
    crate::out::write(table.render().as_bytes())?;
    Ok(0)
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}
