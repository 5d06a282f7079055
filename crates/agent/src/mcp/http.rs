//! The HTTP client of MCP's streamable HTTP transport: rmcp's own reqwest client, which also tells
//! when the session's standalone event stream (the `GET` the transport opens once the server gave
//! the session an id) was answered. A connection is up only then ([`Client::standalone_answered`]),
//! so the first requests do not race that stream: a server may send on it what follows them (a
//! list change, or a response it routes there), which the transport would otherwise take before
//! the server had the stream, or lose.

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Headers = HashMap<HeaderName, HeaderValue>;
type Failed = StreamableHttpError<reqwest::Error>;

#[derive(Clone)]
pub(super) struct Client {
    http: reqwest::Client,
    seen: Arc<Seen>,
}

struct Seen {
    /// A response of the server named a session (the transport then opens the standalone stream).
    session: AtomicBool,
    /// The standalone stream's `GET` was answered (a stream, a refusal or an error).
    standalone: tokio::sync::watch::Sender<bool>,
}

impl Client {
    pub(super) fn new(http: reqwest::Client) -> Client {
        let seen = Seen { session: AtomicBool::new(false), standalone: tokio::sync::watch::Sender::new(false) };
        Client { http, seen: Arc::new(seen) }
    }

    /// Waits, at most `within`, until the standalone stream's `GET` was answered; at once when
    /// the server named no session (no such stream is opened).
    pub(super) async fn standalone_answered(&self, within: Duration) {
        if !self.seen.session.load(Ordering::Acquire) {
            return;
        }
        let mut answered = self.seen.standalone.subscribe();
        let _ = tokio::time::timeout(within, answered.wait_for(|a| *a)).await;
    }
}

impl StreamableHttpClient for Client {
    type Error = reqwest::Error;

    // As in rmcp's own reqwest client, the plain methods are the limited ones with the default
    // limits: every post and stream goes through the two that are watched.
    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits).await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits).await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let r = (self.http)
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await;
        if let Ok(StreamableHttpPostResponse::Json(_, Some(_)) | StreamableHttpPostResponse::Sse(_, Some(_))) = &r {
            self.seen.session.store(true, Ordering::Release);
        }
        r
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<(), Failed> {
        self.http.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<BoxStream<'static, Result<sse_stream::Sse, SseError>>, Failed> {
        let size = StreamableHttpResponseLimits::default().max_sse_event_size;
        self.get_stream_with_max_sse_event_size(uri, session_id, last_event_id, auth_header, custom_headers, size).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<sse_stream::Sse, SseError>>, Failed> {
        let standalone = session_id.is_some() && last_event_id.is_none();
        let r = (self.http)
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        if standalone {
            self.seen.standalone.send_replace(true);
        }
        r
    }
}
