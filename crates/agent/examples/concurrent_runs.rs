//! Starts 1,000 concurrent agent runs against a fake OpenAI-compatible provider (in this
//! process) that streams a first chunk and then holds every stream open, waits until every
//! run has received its first text delta, and prints the process RSS (VmRSS from
//! /proc/self/status) before and while they are all in flight; then aborts them all.
//!
//! Run: `cargo run --release -p pincer-agent --example concurrent_runs [N]`
#![allow(clippy::print_stdout)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;

use pincer_agent::{start_run, CancellationToken, MemorySink, RunEvent, ToolRegistry};
use support::*;

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let model = fake.model();
    let events = script(Format::OpenaiCompletions, &turn(vec![text(&["Hel", "lo"])], (10, 5, 0)));
    let held = split_after_first_text(Format::OpenaiCompletions, &events);
    for _ in 0..n {
        let mut steps: Vec<Step> = events[..held].iter().cloned().map(Step::Send).collect();
        steps.push(Step::Stall);
        fake.push(Reply::Stream(steps, Framing::Chunked));
    }
    let before = vm_rss_kib();
    let started = std::time::Instant::now();
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let cancel = CancellationToken::new();
        let mut req = run_request(
            model.clone(),
            vec![user("hi")],
            ToolRegistry::new(),
            Arc::new(MemorySink::new()),
            cancel.clone(),
        );
        req.run_id = format!("run-{i}");
        runs.push((cancel, start_run(req)));
    }
    for (_, rx) in &mut runs {
        match next_event(rx).await {
            RunEvent::TextDelta { .. } => {}
            other => panic!("expected a text delta, got {other:?}"),
        }
    }
    let during = vm_rss_kib();
    println!("runs in flight:              {n} (each holding an open stream)");
    println!("time until all streaming:    {:.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    println!("VmRSS before runs:           {before} KiB");
    println!("VmRSS with all runs open:    {during} KiB");
    println!("per run (client + fake server side): {:.1} KiB", (during.saturating_sub(before)) as f64 / n as f64);
    let mut aborted = 0;
    for (cancel, rx) in runs {
        cancel.cancel();
        if let Some(RunEvent::Aborted { .. }) = collect(rx).await.last() {
            aborted += 1;
        }
    }
    println!("aborted cleanly:             {aborted}/{n}");
    println!("VmRSS after aborting:        {} KiB", vm_rss_kib());
}
