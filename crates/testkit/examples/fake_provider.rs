//! The testkit's fake OpenAI-compatible provider ([`pincer_testkit::fake_openai`]) as a process, for
//! tests outside Rust (the browser tests' harness): prints `{"baseUrl": …}` as its first stdout
//! line, then each request body it receives as one JSON line, and serves until stdin closes.
//!
//! cargo run -p pincer-testkit --example fake_provider -- [--word-ms 40] [--slow-ms 150]
//!
//! `--word-ms` pauses after each word of an ordinary reply, `--slow-ms` after each of the 40 words
//! of a `[slow]` one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a test tool

use pincer_testkit::fake_openai::{FakeOpenAi, Pacing};
use serde_json::json;
use std::io::Write;
use std::time::Duration;

fn ms(args: &[String], flag: &str) -> Option<Duration> {
    let i = args.iter().position(|a| a == flag)?;
    let v = args.get(i + 1).unwrap_or_else(|| panic!("{flag} needs a number of milliseconds"));
    Some(Duration::from_millis(v.parse().unwrap_or_else(|e| panic!("{flag} {v}: {e}"))))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut pacing = Pacing::default();
    pacing.word = ms(&args, "--word-ms").unwrap_or(pacing.word);
    pacing.slow = ms(&args, "--slow-ms").unwrap_or(pacing.slow);
    let fake = FakeOpenAi::start_paced(pacing).await;
    let mut out = std::io::stdout();
    writeln!(out, "{}", json!({"baseUrl": fake.base_url()})).unwrap();
    out.flush().unwrap();
    // Stops when the parent closes stdin (or dies).
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    });
    tokio::pin!(stdin_closed);
    let mut printed = 0;
    loop {
        tokio::select! {
            _ = &mut stdin_closed => return,
            () = fake.wait_requests(printed + 1) => {}
        }
        let bodies = fake.requests();
        for b in &bodies[printed..] {
            if writeln!(out, "{b}").and_then(|()| out.flush()).is_err() {
                return;
            }
        }
        printed = bodies.len();
    }
}
