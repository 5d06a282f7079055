//! The `pincer` binary: parses the command line and hands each command to its module.

// Output to stdout goes through `out` (a closed pipe ends a command quietly), never `println!`.

mod channels;
mod doctor;
mod gateway;
mod mcp;
mod openclaw;
mod out;
mod search;
mod store;
mod table;
mod transcript;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Pincer: a gateway between people and LLM agents, with durable Pi-format transcripts.
#[derive(Parser)]
#[command(name = "pincer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway: WebSocket RPC and the WebChat page on one port.
    Gateway(gateway::GatewayArgs),
    /// Read, check, repair and append to session transcripts (Pi session format v3).
    #[command(subcommand)]
    Transcript(transcript::TranscriptCmd),
    /// The sessions of a state directory.
    #[command(subcommand)]
    Sessions(SessionsCmd),
    /// Move transcripts between store backends (a JSONL state directory, PostgreSQL).
    #[command(subcommand)]
    Store(store::StoreCmd),
    /// The MCP servers: their state and the tools each agent gets from them.
    #[command(subcommand)]
    Mcp(mcp::McpCmd),
    /// The messaging channels (Telegram): their state and message counters.
    #[command(subcommand)]
    Channels(channels::ChannelsCmd),
    /// Check the config, the providers (key, reachable), the hook, the state directory and the store.
    Doctor(doctor::DoctorArgs),
}

#[derive(Subcommand)]
enum SessionsCmd {
    /// List sessions, most recent first.
    List(gateway::ListArgs),
    /// Full-text search over the messages of every session: {sessionKey, sessionId, entryId, snippet} per hit.
    Search(search::SearchArgs),
    /// Rebuild the search index from the transcripts.
    Reindex(search::ReindexArgs),
}

/// A failure with the exit code it maps to (1: the operation failed, 2: bad usage or input; 0
/// with no message: stdout was closed by its reader, which is not an error).
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure { code: 2, message: message.into() }
    }
    pub fn failed(message: impl Into<String>) -> Failure {
        Failure { code: 1, message: message.into() }
    }
    /// The reader of stdout went away (`| head`): stop quietly, successfully.
    pub fn closed_pipe() -> Failure {
        Failure { code: 0, message: String::new() }
    }
}

/// mimalloc: its per-thread free lists make the many small allocations of a turn (events, frames,
/// JSON values) cheaper than glibc's malloc (issue 9's note has the figures).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's settings for the gateway: arenas committed lazily and freed memory purged at once, so
/// what a burst of load (or a slow consumer's queue) took goes back to the system when it is freed,
/// also when the gateway then sits idle. With mimalloc's defaults it stayed in the process (~3x
/// glibc's RSS after a 100-session load; `tests/edges.rs` t03 failed). mimalloc reads them from the
/// environment when it makes its first arena, before `main`, so the gateway sets them by executing
/// itself once more.
const ALLOCATOR_ENV: [(&str, &str); 2] = [("MIMALLOC_ARENA_EAGER_COMMIT", "0"), ("MIMALLOC_PURGE_DELAY", "0")];

/// `pincer gateway` runs with [`ALLOCATOR_ENV`]: when the first of them is not set, the same binary
/// is executed again with them (same process id and arguments). If that cannot be done the gateway
/// runs as it is, keeping more memory.
fn with_allocator_env() {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let (Some(_), Some(cmd)) = (args.next(), args.next()) else { return };
    if cmd != "gateway" || std::env::var_os(ALLOCATOR_ENV[0].0).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let err = std::process::Command::new(exe).arg(cmd).args(args).envs(ALLOCATOR_ENV).exec();
    eprintln!("pincer: could not execute itself with the allocator's settings ({err}); continuing");
}

/// Large buffers freed by C code (SQLite) go back to the system: glibc raises its mmap threshold
/// after the first such free, after which they would come from the heap and keep their memory.
fn return_large_c_allocations() {
    // SAFETY: mallopt only sets a parameter of the allocator; called first in `main`, before any
    // thread starts.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

fn main() -> ExitCode {
    with_allocator_env();
    return_large_c_allocations();
    let cli = Cli::parse();
    let json_logs = match std::env::var("PINCER_LOG_FORMAT").as_deref().map(str::trim) {
        Err(_) | Ok("" | "text") => false,
        Ok("json") => true,
        Ok(other) => {
            eprintln!("pincer: PINCER_LOG_FORMAT={other:?} is not `text` or `json`");
            return ExitCode::from(2);
        }
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // stderr (text, or one JSON object a line with the event's fields at the top level), and the
    // bounded ring `logs.tail` reads (pincer_gateway::logs).
    let text = (!json_logs).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
    });
    let json =
        json_logs.then(|| tracing_subscriber::fmt::layer().json().flatten_event(true).with_writer(std::io::stderr));
    // The gateway logs what it does; a one-off command only its warnings (its output and its
    // error are what the user reads), unless PINCER_LOG says otherwise.
    let level = if matches!(cli.command, Command::Gateway(_)) { "info" } else { "warn" };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("PINCER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with(text)
        .with(json)
        .with(pincer_gateway::logs::layer())
        .init();
    let result = match cli.command {
        Command::Gateway(args) => gateway::run(args),
        Command::Transcript(cmd) => transcript::run(cmd),
        Command::Sessions(SessionsCmd::List(args)) => gateway::list(args),
        Command::Sessions(SessionsCmd::Search(args)) => search::search(args),
        Command::Sessions(SessionsCmd::Reindex(args)) => search::reindex(args),
        Command::Store(cmd) => store::run(cmd),
        Command::Doctor(args) => doctor::run(args),
        Command::Mcp(cmd) => mcp::run(cmd),
        Command::Channels(cmd) => channels::run(cmd),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            if !f.message.is_empty() {
                eprintln!("pincer: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}
