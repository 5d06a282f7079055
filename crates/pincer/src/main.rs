//! The `pincer` binary: parses the command line and hands each command to its module.

// The binary is where output to the terminal belongs.
#![allow(clippy::print_stdout)]

mod gateway;
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

/// A failure with the exit code it maps to (1: the operation failed, 2: bad usage or input).
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // stderr, and the bounded ring `logs.tail` reads (pincer_gateway::logs).
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("PINCER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(pincer_gateway::logs::layer())
        .init();
    let result = match cli.command {
        Command::Gateway(args) => gateway::run(args),
        Command::Transcript(cmd) => transcript::run(cmd),
        Command::Sessions(SessionsCmd::List(args)) => gateway::list(args),
        Command::Sessions(SessionsCmd::Search(args)) => search::search(args),
        Command::Sessions(SessionsCmd::Reindex(args)) => search::reindex(args),
        Command::Store(cmd) => store::run(cmd),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("pincer: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
