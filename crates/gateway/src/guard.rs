//! The one gate in front of every HTTP route and the WebSocket upgrade ([`layer`]), in every auth
//! mode:
//!
//! - **Host**: a request must name this gateway by a name DNS cannot rebind to it — an IP literal,
//!   `localhost` (or `*.localhost`) — or by a name the operator configured (`gateway.allowed_hosts`,
//!   and the hosts of `gateway.allowed_origins`). A web page that rebinds `evil.example` to
//!   127.0.0.1 reaches nothing, with or without token auth.
//! - **Origin**: a browser's request from another origin is refused unless that origin is in
//!   `gateway.allowed_origins` (requests without `Origin` — CLIs, SDKs, navigations — pass).
//! - **Bodies**: a `POST` must say `Content-Type: application/json`, so no page can send one as a
//!   CORS "simple request" (`text/plain`) that skips the browser's preflight.
//! - **CORS**: preflights are answered for the configured origins only; responses to them carry
//!   `Access-Control-Allow-Origin` for that origin and `Vary: Origin`. Nothing else gets CORS
//!   headers.
//! - **Failed logins** are throttled per client address ([`Logins`]): a few wrong tokens in a row,
//!   then about one guess a second; every refusal is logged with the peer and the reason.

use crate::config::Settings;
use crate::conn::Conn;
use crate::state::Engine;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pincer_pi::lock;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The host part of a `Host` header or origin authority (`[v6]:port`, `name:port`, `name`),
/// lowercased.
fn host_name(authority: &str) -> String {
    let name = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A name that cannot be rebound to this machine by someone else's DNS: an IP literal or localhost.
fn fixed_host(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost")
}

/// The `Host` check: `Err` names the host and the setting that would allow it.
pub fn check_host(settings: &Settings, headers: &HeaderMap) -> Result<(), String> {
    let Some(host) = headers.get(header::HOST) else { return Ok(()) };
    let host = host.to_str().map_err(|_| "the Host header is not ASCII".to_string())?;
    let name = host_name(host);
    let configured = settings.allowed_hosts.contains(&name)
        || settings.allowed_origins.iter().any(|o| o.split_once("://").is_some_and(|(_, a)| host_name(a) == name));
    if fixed_host(&name) || configured {
        return Ok(());
    }
    Err(format!(
        "host {name:?} is not a name of this gateway (a DNS-rebinding page?); add it to gateway.allowed_hosts in pincer.toml"
    ))
}

/// The `Origin` check (after [`check_host`]): no `Origin`, the gateway's own origin, or a configured one.
pub fn check_origin(settings: &Settings, headers: &HeaderMap) -> Result<(), String> {
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().map_err(|_| "the Origin header is not ASCII".to_string())?.to_ascii_lowercase();
    if settings.allowed_origins.contains(&origin) {
        return Ok(());
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let authority = origin.split_once("://").map(|(_, a)| a).unwrap_or("");
    if !host.is_empty() && authority == host {
        return Ok(());
    }
    Err(format!(
        "origin {origin} may not use this gateway (host {host:?}); add it to gateway.allowed_origins in pincer.toml"
    ))
}

/// A `POST` body must be JSON (`application/json`, parameters allowed).
fn check_body_type(method: &Method, headers: &HeaderMap) -> Result<(), String> {
    if method != Method::POST {
        return Ok(());
    }
    let given = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = given.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(format!(
        "a POST body must be sent as Content-Type: application/json (got {:?})",
        if given.is_empty() { "none" } else { given }
    ))
}

/// Request headers a configured cross origin may send.
const CORS_HEADERS: &str =
    "authorization, content-type, idempotency-key, x-request-id, x-pincer-session-key, x-openclaw-session-key, last-event-id";

/// Paths anyone may fetch without credentials: the WebChat's files and the health check. A
/// throttled address still gets these (they hold no data).
fn public_path(method: &Method, path: &str) -> bool {
    method == Method::GET
        && (path == "/"
            || path == "/index.html"
            || path == "/healthz"
            || path.starts_with(crate::assets::PREFIX)
            || path.starts_with("/control"))
}

fn refuse(status: StatusCode, why: String) -> Response {
    (status, axum::Json(serde_json::json!({"error": why}))).into_response()
}

/// The client's address (unspecified when the request did not come through the accept loop).
pub fn peer(req_conn: Option<&Arc<Conn>>) -> IpAddr {
    req_conn.map_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), |c| c.peer)
}

/// The middleware: Host, Origin, body type, CORS, and the login throttle, before any handler.
pub async fn layer(
    State(gw): State<Arc<Engine>>,
    State(logins): State<Arc<Logins>>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let ip = peer(req.extensions().get::<Arc<Conn>>());
    let checks = check_host(&gw.settings, headers)
        .and_then(|()| check_origin(&gw.settings, headers))
        .map_err(|why| (StatusCode::FORBIDDEN, why))
        .and_then(|()| check_body_type(&method, headers).map_err(|why| (StatusCode::UNSUPPORTED_MEDIA_TYPE, why)));
    if let Err((status, why)) = checks {
        tracing::warn!(peer = %ip, %method, path, "refused a request: {why}");
        return refuse(status, why);
    }
    let cross = headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_ascii_lowercase)
        .filter(|o| gw.settings.allowed_origins.contains(o));
    if method == Method::OPTIONS {
        let Some(origin) = cross else {
            return refuse(
                StatusCode::FORBIDDEN,
                "CORS preflights are answered for gateway.allowed_origins only".into(),
            );
        };
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static(CORS_HEADERS));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        return r;
    }
    let guarded = !public_path(&method, &path);
    if guarded {
        if let Err(wait) = logins.admit(ip) {
            return throttled(wait);
        }
    }
    let mut response = next.run(req).await;
    if guarded && response.status() == StatusCode::UNAUTHORIZED {
        logins.failed(ip, &format!("{method} {path}: wrong or missing credentials"));
    }
    if let Some(origin) = cross.and_then(|o| HeaderValue::from_str(&o).ok()) {
        response.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        response.headers_mut().insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// 429 with `Retry-After` for an address that used up its failed logins.
fn throttled(wait: Duration) -> Response {
    let secs = wait.as_secs().max(1);
    let mut r =
        refuse(StatusCode::TOO_MANY_REQUESTS, format!("too many failed logins from this address; retry in {secs} s"));
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Failed logins an address may make in a row before it is slowed down.
pub const LOGIN_BURST: f64 = 10.0;
/// Failed logins an address regains per second after that.
pub const LOGIN_REFILL_PER_SEC: f64 = 1.0;
/// Addresses remembered at most (the table is pruned of recovered ones beyond it).
const MAX_TRACKED: usize = 10_000;

/// Failed-login throttle per client address: a token bucket of [`LOGIN_BURST`] failures that
/// refills at [`LOGIN_REFILL_PER_SEC`]. A login from an address with no failure left is refused
/// without checking its credentials (else guessing would go on at full speed).
#[derive(Default)]
pub struct Logins {
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl Logins {
    fn level(entry: (f64, Instant), now: Instant) -> f64 {
        (entry.0 + now.duration_since(entry.1).as_secs_f64() * LOGIN_REFILL_PER_SEC).min(LOGIN_BURST)
    }

    /// `Err(wait)` when `ip` has no failed login left now.
    pub fn admit(&self, ip: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let buckets = lock(&self.buckets);
        match buckets.get(&ip) {
            Some(&e) if Self::level(e, now) < 1.0 => {
                Err(Duration::from_secs_f64((1.0 - Self::level(e, now)) / LOGIN_REFILL_PER_SEC))
            }
            _ => Ok(()),
        }
    }

    /// A failed login from `ip` (logged with the address and the reason).
    pub fn failed(&self, ip: IpAddr, why: &str) {
        tracing::warn!(peer = %ip, "refused a login: {why}");
        crate::metrics::login_refused();
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        if buckets.len() >= MAX_TRACKED && !buckets.contains_key(&ip) {
            buckets.retain(|_, e| Self::level(*e, now) < LOGIN_BURST);
            if buckets.len() >= MAX_TRACKED {
                return; // a flood from many addresses: each still pays a round trip per guess
            }
        }
        let left = buckets.get(&ip).map_or(LOGIN_BURST, |e| Self::level(*e, now));
        buckets.insert(ip, ((left - 1.0).max(0.0), now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_parsed_and_fixed_ones_recognised() {
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("LocalHost:18789"), "localhost");
        assert_eq!(host_name("evil.example."), "evil.example");
        assert!(fixed_host("127.0.0.1") && fixed_host("::1") && fixed_host("a.localhost"));
        assert!(!fixed_host("evil.example") && !fixed_host("localhost.evil.example"));
    }

    #[test]
    fn an_address_is_slowed_after_its_burst_of_failures() {
        let l = Logins::default();
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        for _ in 0..LOGIN_BURST as usize {
            assert!(l.admit(ip).is_ok());
            l.failed(ip, "test");
        }
        let wait = l.admit(ip).expect_err("throttled");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        let other: IpAddr = "127.0.0.2".parse().expect("ip");
        assert!(l.admit(other).is_ok(), "another address is not affected");
    }
}
