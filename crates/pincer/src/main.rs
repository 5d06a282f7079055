//! The `pincer` binary: parses the command line and hands each command to its module.

// The binary is where output to the terminal belongs.
#![allow(clippy::print_stdout)]

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
    /// Read, check, repair and append to session transcripts (Pi session format v3).
    #[command(subcommand)]
    Transcript(transcript::TranscriptCmd),
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
    let result = match cli.command {
        Command::Transcript(cmd) => transcript::run(cmd),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("pincer: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
