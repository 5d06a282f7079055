//! Overhead of an agent run: a whole run (request mapping, HTTP round trip on loopback, SSE
//! parsing, decoding, events, one in-memory append) against a fake OpenAI-compatible provider
//! that answers instantly, side by side with the offline echo model (no HTTP). Criterion
//! reports the estimates; a second pass times 2,000 single runs and prints median and p99.
//!
//! Run: `cargo bench -p pincer-agent --bench run`
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use pincer_agent::{start_run, CancellationToken, MemorySink, ResolvedModel, RunEvent, ToolRegistry};
use support::*;

async fn one_run(fake: Option<&FakeProvider>, model: &ResolvedModel, events: &[String]) {
    if let Some(fake) = fake {
        fake.push(Reply::stream(events.to_vec()));
    }
    let req = run_request(
        model.clone(),
        vec![user("hi")],
        ToolRegistry::new(),
        Arc::new(MemorySink::new()),
        CancellationToken::new(),
    );
    let mut rx = start_run(req);
    let mut last = None;
    while let Some(e) = rx.recv().await {
        last = Some(e);
    }
    assert!(matches!(last, Some(RunEvent::Final { .. })), "{last:?}");
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(FakeProvider::start(Format::OpenaiCompletions));
    let model = fake.model();
    let events = script(Format::OpenaiCompletions, &turn(vec![text(&["Hello", " there", "!"])], (10, 3, 0)));
    let echo = ResolvedModel::echo();
    let mut g = c.benchmark_group("run");
    g.bench_function("openai_completions_fake_instant", |b| {
        b.to_async(&rt).iter(|| one_run(Some(&fake), &model, &events));
    });
    g.bench_function("echo_offline", |b| b.to_async(&rt).iter(|| one_run(None, &echo, &[])));
    g.finish();

    for (name, f) in [("openai_completions_fake_instant", Some(&fake)), ("echo_offline", None)] {
        let m = if f.is_some() { model.clone() } else { echo.clone() };
        let mut times: Vec<Duration> = rt.block_on(async {
            let mut t = Vec::with_capacity(2000);
            for _ in 0..2000 {
                let start = Instant::now();
                one_run(f, &m, &events).await;
                t.push(start.elapsed());
            }
            t
        });
        times.sort();
        eprintln!(
            "run/{name}: 2000 sequential runs: median {:?}, p99 {:?}",
            times[times.len() / 2],
            times[times.len() * 99 / 100]
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
