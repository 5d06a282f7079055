//! Model calls: one module per wire format, and the shared machinery around them.
//!
//! [`ModelStream::open`] sends the request (retrying HTTP 429/5xx and connect errors with
//! backoff and `retry-after`, only before anything streamed), then [`ModelStream::next`] reads the
//! body through the SSE parser and the wire format's decoder, which fills an [`AssistantDraft`]
//! and yields text/thinking deltas. Every failure is a [`ProviderError`] naming the provider,
//! the model and what happened, with an [`ErrorKind`] for the gateway's `errorKind`.
//!
//! - `openai_completions` — `POST {base}/chat/completions` (also local OpenAI-compatible servers)
//! - `openai_responses` — `POST {base}/responses`
//! - `anthropic` — `POST {base}/v1/messages`
//! - `echo` — the offline `pincer/echo` model
//! - `wire` — helpers shared by the three request mappers
//! - `body_pass` — size and CPU time of the request bodies written (the O(context) pass)

pub(crate) mod anthropic;
pub mod body_pass;
pub mod echo;
pub(crate) mod openai_completions;
pub(crate) mod openai_responses;
pub(crate) mod wire;

pub use wire::Payload;

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::config::{Api, ResolvedModel};
use crate::message::AssistantDraft;
use crate::sse::{SseEvent, SseParser};

/// What kind of failure ended a model call (the gateway's `errorKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The model refused (content filter, Anthropic `refusal`).
    Refusal,
    /// Connect, first-byte or idle timeout.
    Timeout,
    /// HTTP 429 (after the retries).
    RateLimit,
    /// The prompt does not fit the context window: compaction can react.
    ContextLength,
    /// The reply grew past the run's `max_reply_bytes`; the stream was cut.
    ReplyTooLarge,
    /// A bug: the run panicked.
    Internal,
    /// Anything else.
    Unknown,
}

impl ErrorKind {
    /// The gateway's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Refusal => "refusal",
            ErrorKind::Timeout => "timeout",
            ErrorKind::RateLimit => "rate_limit",
            ErrorKind::ContextLength => "context_length",
            ErrorKind::ReplyTooLarge => "reply_too_large",
            ErrorKind::Internal => "internal",
            ErrorKind::Unknown => "unknown",
        }
    }
}

/// A failed model call. Display: `provider <name> (<api>, model <id>): <what happened>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider {provider} ({api}, model {model}): {detail}")]
pub struct ProviderError {
    /// Provider name.
    pub provider: String,
    /// Wire format.
    pub api: Api,
    /// Model id.
    pub model: String,
    /// Classification.
    pub kind: ErrorKind,
    /// What happened.
    pub detail: String,
}

/// A failure inside a decoder, before the provider name is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub kind: ErrorKind,
    pub detail: String,
}

impl Fault {
    pub(crate) fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self { kind, detail: detail.into() }
    }
}

/// A tool as offered to the model. Build it with [`ToolSpec::new`]: its declaration is serialized
/// once per wire format and then shared by every request that offers it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
    /// The declaration's JSON per wire format, made on first use.
    spelled: wire::Spelled,
}

impl ToolSpec {
    /// A tool declaration.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> ToolSpec {
        ToolSpec { name: name.into(), description: description.into(), parameters, spelled: wire::Spelled::default() }
    }
}

/// One model call's input.
#[derive(Debug, Clone, Default)]
pub struct ModelRequest {
    /// System prompt.
    pub system_prompt: Option<String>,
    /// Pi context messages (`convert_to_llm` is applied by the mappers), shared, never copied.
    pub messages: crate::context::Messages,
    /// Tools offered.
    pub tools: std::sync::Arc<[ToolSpec]>,
}

/// Something streamed by the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamDelta {
    /// Visible text appended.
    Text(String),
    /// Reasoning appended.
    Thinking(String),
}

/// Decodes one wire format's SSE events into the draft.
pub(crate) trait Decoder: Send {
    /// Handles one event; pushes deltas; returns `true` when the response is complete.
    fn event(
        &mut self,
        ev: &SseEvent,
        draft: &mut AssistantDraft,
        out: &mut VecDeque<StreamDelta>,
    ) -> Result<bool, Fault>;
    /// The body ended cleanly without a terminal event: `Ok` if the response is complete anyway.
    fn eof(&mut self, draft: &mut AssistantDraft) -> Result<(), Fault>;
}

/// The HTTP request and stream decoder of a model call (`None` for the offline echo model).
fn wire_request(model: &ResolvedModel, request: &ModelRequest) -> Option<(WireRequest, Box<dyn Decoder>)> {
    body_pass::measured(|| {
        wire_request_unmeasured(model, request).map(|r| {
            let n = r.0.body.len();
            (r, n)
        })
    })
}

fn wire_request_unmeasured(model: &ResolvedModel, request: &ModelRequest) -> Option<(WireRequest, Box<dyn Decoder>)> {
    Some(match model.provider.api {
        Api::PincerEcho => return None,
        Api::OpenaiCompletions => {
            (openai_completions::request(model, request), Box::new(openai_completions::Decoder::default()))
        }
        Api::OpenaiResponses => {
            (openai_responses::request(model, request), Box::new(openai_responses::Decoder::default()))
        }
        Api::AnthropicMessages => (anthropic::request(model, request), Box::new(anthropic::Decoder::default())),
    })
}

/// The JSON body a model call sends for `request` (`None` for the offline echo model): what
/// [`ModelStream::open`] posts, for benchmarks and tests of the request-body pass.
pub fn request_body(model: &ResolvedModel, request: &ModelRequest) -> Option<Payload> {
    wire_request(model, request).map(|(w, _)| w.body)
}

/// Makes *ring* the process's rustls crypto provider, unless one is installed already (reqwest is
/// built with `rustls-no-provider`; see the workspace Cargo.toml for why ring).
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // An error only says another provider was installed first: that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The HTTP client of a provider: HTTPS through rustls, the system's roots plus the PEM
/// certificates of `ca_file`. The error names the file or reqwest's reason.
pub(crate) fn http_client(
    connect_timeout: Duration,
    ca_file: Option<&std::path::Path>,
) -> Result<reqwest::Client, String> {
    http_client_builder(connect_timeout, ca_file)?.build().map_err(|e| error_chain(&e))
}

/// [`http_client`]'s settings, for a client that adds its own (`web_fetch`'s guarded resolver).
pub(crate) fn http_client_builder(
    connect_timeout: Duration,
    ca_file: Option<&std::path::Path>,
) -> Result<reqwest::ClientBuilder, String> {
    install_crypto_provider();
    let mut builder =
        reqwest::Client::builder().connect_timeout(connect_timeout).pool_idle_timeout(Duration::from_secs(30));
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("ca_file {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file {}: {}", path.display(), error_chain(&e)))?;
        if certs.is_empty() {
            return Err(format!("ca_file {}: no PEM certificate in it", path.display()));
        }
        builder = builder.tls_certs_merge(certs);
    }
    Ok(builder)
}

/// How `api` lists a request's messages (the echo model's requests are spelled as OpenAI's).
pub(crate) fn layout(api: Api) -> &'static wire::Layout {
    match api {
        Api::OpenaiResponses => &openai_responses::LAYOUT,
        Api::AnthropicMessages => &anthropic::LAYOUT,
        Api::OpenaiCompletions | Api::PincerEcho => &openai_completions::LAYOUT,
    }
}

/// A client with default settings (the offline model never sends with it).
pub(crate) fn default_client() -> reqwest::Client {
    install_crypto_provider();
    reqwest::Client::new()
}

/// An HTTP request ready to send.
pub(crate) struct WireRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// The JSON body (shared by the attempts of a retried request).
    pub body: Payload,
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

struct HttpState {
    body: ByteStream,
    parser: SseParser,
    decoder: Box<dyn Decoder>,
    received: u64,
}

enum Inner {
    Http(Box<HttpState>),
    Echo(VecDeque<String>),
    Done,
}

/// A model call in progress. Dropping it closes the connection.
pub struct ModelStream {
    model: ResolvedModel,
    inner: Inner,
    pending: VecDeque<StreamDelta>,
    draft: AssistantDraft,
}

/// A model request about to be sent again, told to [`ModelStream::open_with`]'s caller before the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Which retry this is (1 for the first).
    pub attempt: u32,
    /// How many retries the provider's policy allows.
    pub max_retries: u32,
    /// The provider said 429 Too Many Requests.
    pub rate_limited: bool,
    /// How long the request waits before it is sent again.
    pub delay: Duration,
}

impl ModelStream {
    /// Sends the request; retries 429/5xx/connect errors per the provider's policy.
    pub async fn open(model: &ResolvedModel, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        Self::open_with(model, request, &|_| {}).await
    }

    /// [`ModelStream::open`], telling `on_retry` of each retry before its wait.
    pub async fn open_with(
        model: &ResolvedModel,
        request: &ModelRequest,
        on_retry: &(dyn Fn(Retry) + Send + Sync),
    ) -> Result<ModelStream, ProviderError> {
        let draft = AssistantDraft::new();
        let Some((wire, decoder)) = wire_request(model, request) else {
            return Ok(ModelStream {
                model: model.clone(),
                inner: Inner::Echo(echo::reply_chunks(&request.messages)),
                pending: VecDeque::new(),
                draft,
            });
        };
        let response = send_with_retries(model, &wire, on_retry).await?;
        Ok(ModelStream {
            model: model.clone(),
            inner: Inner::Http(Box::new(HttpState {
                body: Box::pin(response.bytes_stream()),
                parser: SseParser::new(),
                decoder,
                received: 0,
            })),
            pending: VecDeque::new(),
            draft,
        })
    }

    /// The next delta; `Ok(None)` when the response is complete (see [`Self::draft`]).
    pub async fn next(&mut self) -> Result<Option<StreamDelta>, ProviderError> {
        loop {
            if let Some(d) = self.pending.pop_front() {
                return Ok(Some(d));
            }
            match &mut self.inner {
                Inner::Done => return Ok(None),
                Inner::Echo(chunks) => match chunks.pop_front() {
                    Some(chunk) => {
                        tokio::task::yield_now().await;
                        self.draft.push_text(&chunk);
                        return Ok(Some(StreamDelta::Text(chunk)));
                    }
                    None => {
                        self.draft.stop_reason = Some(crate::message::StopReason::Stop);
                        self.inner = Inner::Done;
                    }
                },
                Inner::Http(state) => {
                    let limit = if state.received == 0 {
                        self.model.provider.timeouts.first_byte
                    } else {
                        self.model.provider.timeouts.idle
                    };
                    let chunk = match tokio::time::timeout(limit, state.body.next()).await {
                        Err(_) => {
                            let what = if state.received == 0 {
                                format!("timed out after {} waiting for the first byte of the stream", secs(limit))
                            } else {
                                format!(
                                    "stream stalled: nothing received for {} (idle timeout) after {} bytes",
                                    secs(limit),
                                    state.received
                                )
                            };
                            return Err(self.fail(ErrorKind::Timeout, what));
                        }
                        Ok(c) => c,
                    };
                    match chunk {
                        Some(Ok(bytes)) => {
                            state.received += bytes.len() as u64;
                            let events = match state.parser.push(&bytes) {
                                Ok(ev) => ev,
                                Err(e) => return Err(self.fail(ErrorKind::Unknown, e.to_string())),
                            };
                            for ev in &events {
                                match state.decoder.event(ev, &mut self.draft, &mut self.pending) {
                                    Ok(false) => {}
                                    Ok(true) => {
                                        self.inner = Inner::Done;
                                        break;
                                    }
                                    Err(f) => return Err(self.fail(f.kind, f.detail)),
                                }
                            }
                        }
                        Some(Err(e)) => {
                            let detail = format!(
                                "stream cut after {} bytes, before the response was complete: {}",
                                state.received,
                                error_chain(&e)
                            );
                            return Err(self.fail(ErrorKind::Unknown, detail));
                        }
                        None => {
                            if state.parser.has_partial() {
                                let detail =
                                    format!("stream cut mid-event after {} bytes (connection closed)", state.received);
                                return Err(self.fail(ErrorKind::Unknown, detail));
                            }
                            if let Err(f) = state.decoder.eof(&mut self.draft) {
                                return Err(self.fail(f.kind, f.detail));
                            }
                            self.inner = Inner::Done;
                        }
                    }
                }
            }
        }
    }

    /// The assistant message so far.
    pub fn draft(&self) -> &AssistantDraft {
        &self.draft
    }

    /// Takes the draft out (after the stream ended or failed).
    pub fn into_draft(self) -> AssistantDraft {
        self.draft
    }

    fn fail(&mut self, kind: ErrorKind, detail: String) -> ProviderError {
        self.inner = Inner::Done;
        self.pending.clear();
        provider_error(&self.model, kind, detail)
    }
}

pub(crate) fn provider_error(model: &ResolvedModel, kind: ErrorKind, detail: String) -> ProviderError {
    ProviderError {
        provider: model.provider.name.clone(),
        api: model.provider.api,
        model: model.model.id.clone(),
        kind,
        detail,
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// `e` and its sources, joined with `: ` (reqwest's own Display hides the cause).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// Statuses worth another attempt: rate limits, overload and the gateway errors of a proxy.
const RETRYABLE: [u16; 6] = [429, 500, 502, 503, 504, 529];

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Retry,
    Fail,
}

/// The one retry rule: a connect failure (`status: None`) or a [`RETRYABLE`] status is tried again
/// while attempts are left; anything else fails at once.
fn classify(status: Option<u16>, attempt: u32, max_retries: u32) -> Verdict {
    let retryable = status.is_none_or(|s| RETRYABLE.contains(&s));
    if retryable && attempt < max_retries {
        Verdict::Retry
    } else {
        Verdict::Fail
    }
}

/// Exponential backoff with jitter: `base · 2^attempt`, scaled by a random factor in [½, 1], so
/// that clients that failed together do not come back together.
fn backoff(base: Duration, attempt: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let full = base.saturating_mul(1u32 << attempt.min(16));
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64; // uniform in [0, 1)
    full.mul_f64(0.5 + unit / 2.0)
}
const MAX_ERROR_BODY: usize = 64 * 1024;

async fn send_with_retries(
    model: &ResolvedModel,
    wire: &WireRequest,
    on_retry: &(dyn Fn(Retry) + Send + Sync),
) -> Result<reqwest::Response, ProviderError> {
    let p = &model.provider;
    let body = wire.body.clone();
    let mut attempt: u32 = 0;
    loop {
        let req = match p.url(&wire.url) {
            Some(url) => p.client.post(url),
            None => p.client.post(&wire.url),
        };
        // The body goes out as its pieces (see `wire::Payload`); its length is known, so it goes with
        // a Content-Length (hyper keeps the header's), not chunked transfer coding, which some local
        // servers do not take.
        let mut req = req.header("content-type", "application/json").header("content-length", body.len());
        for (k, v) in &wire.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        for (k, v) in &p.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(reqwest::Body::wrap_stream(body.stream()));
        let attempts = || {
            if attempt == 0 {
                String::new()
            } else {
                format!(" (after {} attempts)", attempt + 1)
            }
        };
        let (retry_detail, retry_after, kind) = match tokio::time::timeout(p.timeouts.first_byte, req.send()).await {
            Err(_) => {
                let detail = format!(
                    "no response from {} within {} (first-byte timeout){}",
                    wire.url,
                    secs(p.timeouts.first_byte),
                    attempts()
                );
                return Err(provider_error(model, ErrorKind::Timeout, detail));
            }
            Ok(Err(e)) if e.is_connect() => {
                let timed_out = e.is_timeout();
                let what = if timed_out {
                    format!("connect timeout ({}) to {}", secs(p.timeouts.connect), wire.url)
                } else {
                    format!("cannot connect to {}: {}", wire.url, error_chain(&e))
                };
                let kind = if timed_out { ErrorKind::Timeout } else { ErrorKind::Unknown };
                if classify(None, attempt, p.retry.max_retries) == Verdict::Fail {
                    return Err(provider_error(model, kind, format!("{what}{}", attempts())));
                }
                (what, None, kind)
            }
            Ok(Err(e)) => {
                let kind = if e.is_timeout() { ErrorKind::Timeout } else { ErrorKind::Unknown };
                let detail = format!("request to {} failed: {}{}", wire.url, error_chain(&e), attempts());
                return Err(provider_error(model, kind, detail));
            }
            Ok(Ok(resp)) if resp.status().is_success() => return Ok(resp),
            Ok(Ok(resp)) => {
                let status = resp.status();
                let retry_after = parse_retry_after(resp.headers());
                let text = read_error_body(resp, p.timeouts.first_byte).await;
                let message = wire::error_message_from_body(&text);
                let kind = classify_http(status.as_u16(), &text);
                let what = format!("HTTP {status}: {message}");
                if classify(Some(status.as_u16()), attempt, p.retry.max_retries) == Verdict::Fail {
                    return Err(provider_error(model, kind, format!("{what}{}", attempts())));
                }
                (what, retry_after, kind)
            }
        };
        let delay = retry_after.unwrap_or_else(|| backoff(p.retry.base_delay, attempt));
        if delay > p.retry.max_delay {
            let detail = format!(
                "{retry_detail}; the server asks to wait {}, longer than retry_max_delay_ms ({})",
                secs(delay),
                secs(p.retry.max_delay)
            );
            return Err(provider_error(model, kind, detail));
        }
        tracing::warn!(provider = %p.name, model = %model.model.id, attempt, delay_ms = delay.as_millis() as u64,
            "retrying model request: {retry_detail}");
        let rate_limited = kind == ErrorKind::RateLimit;
        on_retry(Retry { attempt: attempt + 1, max_retries: p.retry.max_retries, rate_limited, delay });
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

/// Longest wait a `retry-after` header can ask for; larger values are clamped to it (and are then
/// still refused as longer than `retry_max_delay_ms`, unless that is set higher).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// `retry-after-ms` (OpenAI), else `retry-after` in seconds. Values that are not finite numbers
/// (`inf`, `NaN`) are ignored, negative ones mean no wait, huge ones are clamped to
/// [`MAX_RETRY_AFTER`]; whatever a server sends, this never panics.
fn parse_retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
    let secs = |s: f64| s.is_finite().then(|| Duration::from_secs_f64(s.clamp(0.0, MAX_RETRY_AFTER.as_secs_f64())));
    let number = |k: &str| get(k).and_then(|v| v.parse::<f64>().ok());
    number("retry-after-ms").and_then(|ms| secs(ms / 1000.0)).or_else(|| number("retry-after").and_then(secs))
}

async fn read_error_body(resp: reqwest::Response, limit: Duration) -> String {
    let mut body = resp.bytes_stream();
    let mut buf = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = body.next().await {
            buf.extend_from_slice(&chunk);
            if buf.len() >= MAX_ERROR_BODY {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(limit, read).await;
    buf.truncate(MAX_ERROR_BODY);
    String::from_utf8_lossy(&buf).into_owned()
}

fn classify_http(status: u16, body: &str) -> ErrorKind {
    if status == 429 {
        ErrorKind::RateLimit
    } else if wire::is_context_length_message(body) {
        ErrorKind::ContextLength
    } else if status == 408 || status == 504 {
        ErrorKind::Timeout
    } else {
        ErrorKind::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    fn retry_after(pairs: &[(&'static str, &str)]) -> Option<Duration> {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("?")));
        }
        parse_retry_after(&h)
    }

    #[test]
    fn retries_are_classified_by_status_and_attempts_and_jittered() {
        assert_eq!(classify(Some(429), 0, 2), Verdict::Retry);
        assert_eq!(classify(Some(503), 1, 2), Verdict::Retry);
        assert_eq!(classify(Some(503), 2, 2), Verdict::Fail, "no attempts left");
        assert_eq!(classify(None, 0, 2), Verdict::Retry, "a connect failure");
        for s in [400, 401, 403, 404, 422] {
            assert_eq!(classify(Some(s), 0, 5), Verdict::Fail, "{s}");
        }
        let base = Duration::from_millis(100);
        let waits: Vec<Duration> = (0..64).map(|_| backoff(base, 3)).collect();
        assert!(
            waits.iter().all(|w| *w >= Duration::from_millis(400) && *w <= Duration::from_millis(800)),
            "{waits:?}"
        );
        assert!(waits.iter().any(|w| *w != waits[0]), "jittered: {waits:?}");
    }

    #[test]
    fn retry_after_never_panics_and_stays_sane() {
        let ms = |v: &str| retry_after(&[("retry-after-ms", v)]);
        let s = |v: &str| retry_after(&[("retry-after", v)]);
        assert_eq!(ms("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(s("2"), Some(Duration::from_secs(2)));
        assert_eq!(s(" 0.5 "), Some(Duration::from_millis(500)));
        for nasty in ["inf", "-inf", "infinity", "NaN", "nan", "", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"] {
            assert_eq!(ms(nasty), None, "retry-after-ms: {nasty:?}");
            assert_eq!(s(nasty), None, "retry-after: {nasty:?}");
        }
        for huge in ["1e300", "1e309", "18446744073709551616", "99999999999999999999999"] {
            let want = if huge == "1e309" { None } else { Some(MAX_RETRY_AFTER) }; // 1e309 parses as inf
            assert_eq!(ms(huge), want, "retry-after-ms: {huge}");
            assert_eq!(s(huge), want, "retry-after: {huge}");
        }
        assert_eq!(ms("-5"), Some(Duration::ZERO));
        assert_eq!(s("-1e300"), Some(Duration::ZERO));
        assert_eq!(ms("-0"), Some(Duration::ZERO));
        // A useless retry-after-ms falls back to retry-after.
        assert_eq!(retry_after(&[("retry-after-ms", "inf"), ("retry-after", "3")]), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&[]), None);
    }
}
