//! Prometheus metrics, served at `GET /metrics` behind the gateway token. The names, in one place:
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `pincer_turns_total` | counter | `status`: `ok`, `error`, `aborted`, `blocked`, `interrupted`, … |
//! | `pincer_turn_seconds` | histogram | from the start of the run (after the queue) to its end |
//! | `pincer_turn_errors_total` | counter | `kind`: the `errorKind` of the `chat` error (provider errors: `rate_limit`, `context_length`, `timeout`, …; `persistence`, `internal`) |
//! | `pincer_model_turns_total` | counter | `provider`, `model`, `status`: turns by the model they ran with |
//! | `pincer_tokens_total` | counter | `provider`, `model`, `direction` (`input`, `output`): tokens of the replies' `usage` |
//! | `pincer_runs_active` | gauge | runs executing now |
//! | `pincer_turns_queued` | gauge | turns waiting for their session's queue |
//! | `pincer_connections_open` | gauge | open HTTP/WebSocket connections |
//! | `pincer_store_append_seconds` | histogram | a transcript append, from call to durable (`pincer-store`) |
//! | `pincer_store_fdatasync_seconds` | histogram | the `fdatasync` of an append (`pincer-store`) |
//! | `pincer_request_bodies_total` | counter | model-call request bodies written (`pincer-agent`'s body pass) |
//! | `pincer_request_body_bytes_total` | counter | their bytes |
//! | `pincer_request_body_cpu_microseconds_total` | counter | CPU time spent writing them (the writing thread's clock) |
//! | `pincer_channel_messages_total` | counter | `channel` (`telegram`), `event`: `received`, `deduplicated`, `refused`, `sent`, `failed` |
//!
//! The recorder is installed once per process; every series above is there from startup (at 0;
//! the statuses and error kinds listed below, and each configured model), so a dashboard or an
//! alert sees it before the first turn. [`render`] is what the endpoint returns.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Histogram buckets in seconds: 50 µs … 30 s.
const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The turn statuses counted from startup.
const STATUSES: [&str; 5] = ["ok", "error", "aborted", "blocked", "interrupted"];

/// The error kinds counted from startup: the model call's ([`pincer_agent::ErrorKind`]) and the
/// gateway's own.
const ERROR_KINDS: [&str; 10] = [
    "refusal",
    "timeout",
    "rate_limit",
    "context_length",
    "reply_too_large",
    "internal",
    "unknown",
    "persistence",
    "conflict",
    "interrupted",
];

/// Installs the Prometheus recorder (once per process; later calls do nothing). Without it every
/// metric call is a no-op.
pub fn install() {
    HANDLE.get_or_init(|| match PrometheusBuilder::new().set_buckets(BUCKETS).and_then(|b| b.install_recorder()) {
        Ok(h) => {
            describe();
            register();
            Some(h)
        }
        Err(e) => {
            tracing::warn!("metrics are off: {e}");
            None
        }
    });
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!("pincer_turns_total", "chat turns finished, by status");
    describe_histogram!("pincer_turn_seconds", Unit::Seconds, "duration of a turn's run");
    describe_counter!("pincer_turn_errors_total", "turns that ended in an error, by errorKind");
    describe_gauge!("pincer_runs_active", "runs executing now");
    describe_gauge!("pincer_turns_queued", "turns waiting for their session's queue");
    describe_gauge!("pincer_connections_open", "open client connections");
    describe_counter!("pincer_logins_refused_total", "logins refused for a wrong or missing token or key");
    describe_histogram!("pincer_store_append_seconds", Unit::Seconds, "transcript append, call to durable");
    describe_histogram!("pincer_store_fdatasync_seconds", Unit::Seconds, "fdatasync of a transcript append");
    describe_counter!("pincer_request_bodies_total", "model-call request bodies written");
    describe_counter!("pincer_channel_messages_total", "messaging channels' messages, by channel and event");
    describe_counter!("pincer_request_body_bytes_total", Unit::Bytes, "bytes of the request bodies written");
    describe_counter!(
        "pincer_request_body_cpu_microseconds_total",
        Unit::Microseconds,
        "CPU time spent writing request bodies"
    );
}

/// Every series at 0, so that it is listed before anything happened.
fn register() {
    for status in STATUSES {
        metrics::counter!("pincer_turns_total", "status" => status).absolute(0);
    }
    for kind in ERROR_KINDS {
        metrics::counter!("pincer_turn_errors_total", "kind" => kind).absolute(0);
    }
    for name in ["pincer_turn_seconds", "pincer_store_append_seconds", "pincer_store_fdatasync_seconds"] {
        let _ = metrics::histogram!(name);
    }
    for name in ["pincer_runs_active", "pincer_turns_queued", "pincer_connections_open"] {
        metrics::gauge!(name).increment(0.0);
    }
    for name in
        ["pincer_request_bodies_total", "pincer_request_body_bytes_total", "pincer_request_body_cpu_microseconds_total"]
    {
        metrics::counter!(name).absolute(0);
    }
}

/// The per-model series of each model (`provider/model`) at 0.
pub fn register_models<'a>(models: impl IntoIterator<Item = &'a str>) {
    for spec in models {
        let (provider, model) = split_spec(spec);
        for status in STATUSES {
            model_turns(provider, model, status).absolute(0);
        }
        for direction in ["input", "output"] {
            tokens(provider, model, direction).absolute(0);
        }
    }
}

/// `provider/model` as its two labels (the model part may contain `/`).
fn split_spec(spec: &str) -> (&str, &str) {
    spec.split_once('/').unwrap_or((spec, ""))
}

fn model_turns(provider: &str, model: &str, status: &str) -> metrics::Counter {
    metrics::counter!("pincer_model_turns_total", "provider" => provider.to_owned(), "model" => model.to_owned(),
        "status" => status.to_owned())
}

fn tokens(provider: &str, model: &str, direction: &'static str) -> metrics::Counter {
    metrics::counter!("pincer_tokens_total", "provider" => provider.to_owned(), "model" => model.to_owned(),
        "direction" => direction)
}

/// A turn with `model` (`provider/model`) ended with `status`, its replies having used so many tokens.
pub fn model_turn(model: &str, status: &str, tokens_in: u64, tokens_out: u64) {
    let (provider, model) = split_spec(model);
    model_turns(provider, model, status).increment(1);
    tokens(provider, model, "input").increment(tokens_in);
    tokens(provider, model, "output").increment(tokens_out);
}

/// The Prometheus text exposition of every metric (empty when the recorder is off).
pub fn render() -> String {
    match HANDLE.get() {
        Some(Some(h)) => {
            // The body pass keeps its own totals (pincer-agent has no metrics recorder): copied in here.
            let b = pincer_agent::provider::body_pass::totals();
            metrics::counter!("pincer_request_bodies_total").absolute(b.bodies);
            metrics::counter!("pincer_request_body_bytes_total").absolute(b.bytes);
            metrics::counter!("pincer_request_body_cpu_microseconds_total").absolute(b.cpu_ns / 1000);
            h.run_upkeep();
            h.render()
        }
        _ => String::new(),
    }
}

/// A turn ended with `status`.
pub fn turn_finished(status: &str) {
    metrics::counter!("pincer_turns_total", "status" => status.to_owned()).increment(1);
}

/// A turn's run took `d`.
pub fn turn_seconds(d: std::time::Duration) {
    metrics::histogram!("pincer_turn_seconds").record(d.as_secs_f64());
}

/// A turn failed with `kind` (its `errorKind`).
pub fn turn_error(kind: &str) {
    metrics::counter!("pincer_turn_errors_total", "kind" => kind.to_owned()).increment(1);
}

/// A channel's event ([`crate::board::Event`]).
pub fn channel_event(channel: &str, event: &'static str) {
    metrics::counter!("pincer_channel_messages_total", "channel" => channel.to_owned(), "event" => event).increment(1);
}

/// A channel's series at 0 (when the channel starts).
pub fn channel_event_register(channel: &str, event: &'static str) {
    metrics::counter!("pincer_channel_messages_total", "channel" => channel.to_owned(), "event" => event).increment(0);
}

/// A login (WebSocket `connect`, an HTTP route's token, a `/v1` key) was refused.
pub fn login_refused() {
    metrics::counter!("pincer_logins_refused_total").increment(1);
}

/// A gauge that is raised while the value lives (a run executing, a turn waiting, a connection).
pub struct Live(&'static str);

impl Live {
    /// `pincer_runs_active`.
    pub fn run() -> Live {
        Live::up("pincer_runs_active")
    }
    /// `pincer_turns_queued`.
    pub fn queued() -> Live {
        Live::up("pincer_turns_queued")
    }
    /// `pincer_connections_open`.
    pub fn connection() -> Live {
        Live::up("pincer_connections_open")
    }
    fn up(name: &'static str) -> Live {
        metrics::gauge!(name).increment(1.0);
        Live(name)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        metrics::gauge!(self.0).decrement(1.0);
    }
}
