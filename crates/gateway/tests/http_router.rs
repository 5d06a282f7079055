//! The gateway's HTTP edges in process: requests go straight into `http::router()` with tower's
//! `oneshot` (no socket, no process): `/healthz`, the WebChat page's security and cache headers
//! (CSP, nosniff, ETag and 304), the 401 of every route behind the token without it, a WebSocket upgrade from
//! a hostile Origin (403), and an unknown path (404).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use pincer_gateway::config::{AuthMode, Overrides};
use pincer_gateway::state::Engine;
use std::sync::Arc;
use tower::ServiceExt;

const TOKEN: &str = "router-test-token";

/// A gateway on a fresh state dir (token auth), and its router.
fn router() -> (axum::Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pincer.toml");
    std::fs::write(&config, "[gateway]\nallowed_origins = [\"https://chat.example.com\"]\n").unwrap();
    let mut settings = pincer_gateway::config::load(&Overrides {
        state_dir: Some(dir.path().to_owned()),
        config: Some(config),
        ..Overrides::default()
    })
    .unwrap();
    settings.auth = AuthMode::Token(TOKEN.into());
    let gw = Arc::new(Engine::new(settings).unwrap());
    (pincer_gateway::http::router(pincer_gateway::channels::start(&gw)), dir)
}

async fn send(app: &axum::Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

fn get(uri: &str) -> axum::http::request::Builder {
    Request::builder().method("GET").uri(uri).header(header::HOST, "127.0.0.1:18789")
}

async fn body_text(resp: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(resp.into_body(), 16 * 1024 * 1024).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn header_of(resp: &Response<Body>, name: header::HeaderName) -> &str {
    resp.headers().get(&name).and_then(|v| v.to_str().ok()).unwrap_or_else(|| panic!("no {name} header"))
}

#[tokio::test]
async fn healthz_answers_ok_with_the_version() {
    let (app, _dir) = router();
    let resp = send(&app, get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["uptimeMs"].is_u64(), "{v}");
}

#[tokio::test]
async fn the_webchat_page_has_its_security_headers_and_an_etag_that_gives_304() {
    let (app, _dir) = router();
    let resp = send(&app, get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header_of(&resp, header::CONTENT_TYPE), "text/html; charset=utf-8");
    let csp = header_of(&resp, header::CONTENT_SECURITY_POLICY).to_owned();
    for directive in ["default-src 'none'", "script-src 'self';", "connect-src 'self';", "frame-ancestors 'none'"] {
        assert!(csp.contains(directive), "CSP {csp:?} lacks {directive:?}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(header_of(&resp, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_eq!(header_of(&resp, header::X_FRAME_OPTIONS), "DENY");
    assert_eq!(header_of(&resp, header::CACHE_CONTROL), "no-cache");
    let etag = header_of(&resp, header::ETAG).to_owned();
    assert!(body_text(resp).await.contains("<html"), "not the page");

    let again = send(&app, get("/").header(header::IF_NONE_MATCH, &etag).body(Body::empty()).unwrap()).await;
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header_of(&again, header::ETAG), etag);
    assert!(body_text(again).await.is_empty());

    // A module of the page: its own type, nosniff, and no page-only headers.
    let js = send(&app, get("/webchat/js/main.js").body(Body::empty()).unwrap()).await;
    assert_eq!(js.status(), StatusCode::OK);
    assert!(header_of(&js, header::CONTENT_TYPE).starts_with("text/javascript"));
    assert_eq!(header_of(&js, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_ne!(header_of(&js, header::ETAG), etag);
}

#[tokio::test]
async fn the_sse_endpoint_wants_the_token() {
    let (app, _dir) = router();
    let uri = "/api/sessions/main/events";
    for req in [
        get(uri).body(Body::empty()).unwrap(),
        get(uri).header(header::AUTHORIZATION, "Bearer wrong").body(Body::empty()).unwrap(),
        get(&format!("{uri}?token=wrong")).body(Body::empty()).unwrap(),
    ] {
        let resp = send(&app, req).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(body_text(resp).await.contains("unauthorized"));
    }
    let ok = send(&app, get(uri).header(header::AUTHORIZATION, format!("Bearer {TOKEN}")).body(Body::empty()).unwrap())
        .await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header_of(&ok, header::CONTENT_TYPE), "text/event-stream");
}

#[tokio::test]
async fn every_route_behind_the_token_wants_it() {
    for uri in
        ["/metrics", "/api/mcp", "/api/channels", "/api/sessions/main/export?format=md", "/api/sessions/main/events"]
    {
        // A gateway each: four failures per route, within the failed-login burst.
        let (app, _dir) = router();
        let with = |q: &str| if uri.contains('?') { format!("{uri}&{q}") } else { format!("{uri}?{q}") };
        for req in [
            get(uri).body(Body::empty()).unwrap(),
            get(uri).header(header::AUTHORIZATION, "Bearer wrong").body(Body::empty()).unwrap(),
            get(&with("token=wrong")).body(Body::empty()).unwrap(),
            get(&with("token=")).body(Body::empty()).unwrap(),
        ] {
            let resp = send(&app, req).await;
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{uri}");
            assert!(body_text(resp).await.contains("unauthorized"), "{uri}");
        }
        for req in [
            get(uri).header(header::AUTHORIZATION, format!("Bearer {TOKEN}")).body(Body::empty()).unwrap(),
            get(&with(&format!("token={TOKEN}"))).body(Body::empty()).unwrap(),
        ] {
            let resp = send(&app, req).await;
            assert_ne!(resp.status(), StatusCode::UNAUTHORIZED, "{uri}");
        }
    }
}

/// A WebSocket upgrade request; hyper's upgrade handle is attached (none here: no socket) so that
/// axum's extractor accepts it as it does on a real connection.
fn upgrade(origin: Option<&str>) -> Request<Body> {
    let mut b = get("/")
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==");
    if let Some(o) = origin {
        b = b.header(header::ORIGIN, o);
    }
    let mut req = b.body(Body::empty()).unwrap();
    let on_upgrade = hyper::upgrade::on(&mut req);
    req.extensions_mut().insert(on_upgrade);
    req
}

#[tokio::test]
async fn an_upgrade_from_a_hostile_origin_is_refused() {
    let (app, _dir) = router();
    for origin in ["https://evil.example", "http://127.0.0.1:9999", "null"] {
        let resp = send(&app, upgrade(Some(origin))).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{origin}");
        let why = body_text(resp).await;
        assert!(why.contains("may not use this gateway"), "{why}");
    }
    // The gateway's own origin and a configured one pass the check (and reach the upgrade, which
    // needs the real connection's state: not a 403).
    for origin in ["http://127.0.0.1:18789", "https://chat.example.com"] {
        let resp = send(&app, upgrade(Some(origin))).await;
        assert_ne!(resp.status(), StatusCode::FORBIDDEN, "{origin}");
    }
}

#[tokio::test]
async fn an_unknown_path_is_404() {
    let (app, _dir) = router();
    for uri in ["/nope", "/webchat/nope.js", "/control/index.html", "/api/sessions"] {
        let resp = send(&app, get(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{uri}");
    }
}
