//! Binding, accepting, serving and shutting down.
//!
//! The accept loop is our own (hyper's HTTP/1 with upgrades under the axum router) so that every
//! connection is bounded: request headers must arrive within `header_timeout`; at most
//! `max_connections` are open, and when a newcomer finds the table full the oldest connection that
//! has not authenticated yet (a slowloris socket, an idle keep-alive) is closed to make room, so an
//! attack by half-open sockets never locks out a real client; and a WebSocket reads at most the
//! pre-auth limit from the socket until its `connect` succeeded ([`Conn::limit_reads`]).
//!
//! On SIGINT/SIGTERM the gateway stops accepting, aborts running turns and waits for them (their
//! partials are persisted and their `aborted` events queued), then tells connected clients with a
//! `shutdown` event and a close frame (1012), flushes the session index and returns (exit 0).

use crate::config::Settings;
use crate::error::GatewayError;
use crate::state::Gateway;
use hyper_util::rt::{TokioIo, TokioTimer};
use pincer_pi::lock;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// A started gateway (for tests and the binary).
pub struct Listening {
    pub addr: SocketAddr,
    pub gateway: Arc<Gateway>,
}

/// Bytes a WebSocket may send beyond the pre-auth frame limit before `connect` (frame headers).
const PREAUTH_SLACK: usize = 1024;

/// Connections over `max` while evicted ones are still closing; beyond it newcomers are refused.
const EVICTION_SLACK: usize = 32;

/// One accepted connection, shared by its socket wrapper, its request handlers and the table.
pub struct Conn {
    /// The client's address (for the login throttle and the logs).
    pub peer: std::net::IpAddr,
    /// Bytes the socket may still deliver; `usize::MAX` is unlimited.
    read_limit: AtomicUsize,
    /// Authenticated (WebSocket after `connect`, an authorized SSE stream): never evicted.
    protected: AtomicBool,
    evict: CancellationToken,
    table: Weak<ConnTable>,
    /// Counts the connection in `pincer_connections_open` while it lives.
    _open: crate::metrics::Live,
}

impl Conn {
    /// From now on the socket may deliver at most `bytes` more.
    pub fn limit_reads(&self, bytes: usize) {
        self.read_limit.store(bytes, Ordering::Release);
    }

    /// Authenticated: reads are unlimited and the connection is never evicted.
    pub fn authenticated(&self) {
        self.read_limit.store(usize::MAX, Ordering::Release);
        self.protected.store(true, Ordering::Release);
    }

    /// Resolves when the connection was chosen to make room for a newer one.
    pub async fn evicted(&self) {
        self.evict.cancelled().await
    }

    /// Caps what a WebSocket reads before `connect`.
    pub fn before_connect(&self) {
        self.limit_reads(crate::protocol::MAX_PREAUTH_PAYLOAD_BYTES + PREAUTH_SLACK);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(t) = self.table.upgrade() {
            t.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The open connections, oldest first.
pub struct ConnTable {
    max: usize,
    live: AtomicUsize,
    order: Mutex<VecDeque<Weak<Conn>>>,
    evictions: AtomicU64,
}

impl ConnTable {
    pub fn new(max: usize) -> Arc<ConnTable> {
        Arc::new(ConnTable {
            max,
            live: AtomicUsize::new(0),
            order: Mutex::new(VecDeque::new()),
            evictions: AtomicU64::new(0),
        })
    }

    /// Open connections.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Admits a new connection, evicting the oldest unauthenticated one when full; `None` when
    /// every open connection is authenticated.
    pub fn admit(self: &Arc<Self>, peer: std::net::IpAddr) -> Option<Arc<Conn>> {
        let mut order = lock(&self.order);
        while order.front().is_some_and(|w| w.strong_count() == 0) {
            order.pop_front();
        }
        if self.live() >= self.max + EVICTION_SLACK {
            // Evicted sockets have not closed yet: refuse rather than run out of descriptors.
            return None;
        }
        if self.live() >= self.max {
            let victim = order
                .iter()
                .filter_map(Weak::upgrade)
                .find(|c| !c.protected.load(Ordering::Acquire) && !c.evict.is_cancelled());
            match victim {
                Some(v) => {
                    v.evict.cancel();
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
                None => return None,
            }
        }
        if order.len() > 2 * self.live() + 64 {
            order.retain(|w| w.strong_count() > 0);
        }
        let conn = Arc::new(Conn {
            peer,
            read_limit: AtomicUsize::new(usize::MAX),
            protected: AtomicBool::new(false),
            evict: CancellationToken::new(),
            table: Arc::downgrade(self),
            _open: crate::metrics::Live::connection(),
        });
        self.live.fetch_add(1, Ordering::AcqRel);
        order.push_back(Arc::downgrade(&conn));
        Some(conn)
    }
}

/// The error a socket read returns once the pre-auth limit is used up.
#[derive(Debug)]
struct ReadLimit;

impl std::fmt::Display for ReadLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("read limit before connect exceeded")
    }
}

impl std::error::Error for ReadLimit {}

/// Whether a WebSocket error is the pre-auth read limit.
pub fn is_read_limit(e: &axum::Error) -> bool {
    e.to_string().contains("read limit before connect exceeded")
}

/// A TCP stream that enforces its connection's read limit.
struct Metered {
    tcp: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Metered {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let limit = self.conn.read_limit.load(Ordering::Acquire);
        if limit == 0 {
            return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, ReadLimit)));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if limit != usize::MAX {
            let n = buf.filled().len() - before;
            // Only a concurrent `authenticated()` raises the limit; keep that.
            let _ = self.conn.read_limit.compare_exchange(
                limit,
                limit.saturating_sub(n),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        r
    }
}

impl AsyncWrite for Metered {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// The listen backlog asked for; the kernel caps it at `net.core.somaxconn` (4096 by default).
/// tokio's default of 1024 overflowed under a burst of thousands of connections (a slowloris
/// flood on a busy machine): the kernel then drops the handshake's last ACK, and each such client
/// waits for SYN-ACK retransmits (1 s, 2 s, 4 s) before the gateway even sees it.
const LISTEN_BACKLOG: u32 = 65_535;

/// A listening socket on `addr` (`SO_REUSEADDR`, as tokio's own `bind`) with [`LISTEN_BACKLOG`].
fn bind_listener(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds and serves until `stop` resolves; then shuts down gracefully.
pub async fn serve(
    settings: Settings,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    on_listening: impl FnOnce(&Listening),
) -> Result<(), GatewayError> {
    // A hook that cannot run would fail every turn: refuse to start instead.
    if let Some(program) = settings.hook.as_ref().and_then(|h| h.command.first()) {
        crate::hook::find_program(program).map_err(|e| {
            GatewayError::Config(format!(
                "hooks.before_agent_run.command: {e}; a hook that cannot run would fail every turn"
            ))
        })?;
    }
    let bind = settings.bind;
    let listen = |source| GatewayError::Listen { addr: bind, source };
    let listener = bind_listener(bind).map_err(listen)?;
    let addr = listener.local_addr().map_err(listen)?;
    pincer_store::files::create_state_dir(&settings.state_dir)
        .map_err(|source| GatewayError::StateDir { path: settings.state_dir.clone(), source })?;
    // One gateway per JSONL state directory (two would interleave turns of one session); held
    // until this function returns. PostgreSQL replicas coordinate through the database instead.
    let _state_lock = match settings.store {
        crate::config::StoreSettings::Jsonl => {
            Some(pincer_store::files::lock_state_dir(&settings.state_dir).map_err(|e| match e {
                Ok(pid) => GatewayError::StateDirInUse { path: settings.state_dir.clone(), pid },
                Err(source) => GatewayError::StateDir { path: settings.state_dir.clone(), source },
            })?)
        }
        crate::config::StoreSettings::Postgres { .. } => None,
    };
    // Only the holder of the state directory cleans it.
    for stale in pincer_store::files::remove_stale_temps(&settings.state_dir) {
        tracing::info!("removed {}: a temp file an interrupted write left", stale.display());
    }
    crate::metrics::install();
    let gw = Arc::new(Gateway::new(settings)?);
    let models = gw.settings.providers.configured();
    crate::metrics::register_models(
        models.iter().map(String::as_str).chain([gw.settings.model.as_str()]).filter(|m| !m.contains('<')),
    );
    on_listening(&Listening { addr, gateway: gw.clone() });
    // MCP servers start with the gateway; turns (the resumed ones first) wait for their first
    // attempt, so a turn sees the tools of every server that could start.
    gw.mcp.start();
    announce_mcp(&gw);
    crate::takeup::recover_interrupted(&gw);
    crate::relay::start(&gw);
    let app = crate::http::router(crate::channels::start(&gw));
    // Activity timestamps of the session index reach disk every few seconds (and at shutdown).
    let flusher = gw.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = flusher.shutdown.cancelled() => break,
            }
            let gw = flusher.clone();
            let _ = tokio::task::spawn_blocking(move || gw.sessions.flush()).await;
        }
    });
    let stopping = CancellationToken::new();
    let stop_signal = stopping.clone();
    tokio::spawn(async move {
        stop.await;
        stop_signal.cancel();
    });

    let table = ConnTable::new(gw.settings.max_connections);
    let connections = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(gw.settings.header_timeout).max_buf_size(64 * 1024);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopping.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(conn) = table.admit(peer.ip()) else {
            tracing::warn!("refusing a connection: {} connections are open or closing", table.live());
            drop(tcp);
            continue;
        };
        // Small frames (deltas, acks) must not wait for Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let io = TokioIo::new(Metered { tcp, conn: conn.clone() });
        let router = app.clone();
        let req_conn = conn.clone();
        let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(req_conn.clone());
            router.clone().oneshot(req)
        });
        let served = http.serve_connection(io, svc).with_upgrades();
        let shutdown = gw.shutdown.clone();
        connections.spawn(async move {
            let mut served = std::pin::pin!(served);
            tokio::select! {
                _ = served.as_mut() => {}
                _ = conn.evicted() => {}
                _ = shutdown.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(2), served).await;
                }
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: aborting runs and flushing appends");
    gw.stop_runs();
    gw.tasks.close();
    if tokio::time::timeout(Duration::from_secs(15), gw.tasks.wait()).await.is_err() {
        tracing::warn!("some runs did not finish within 15 s of shutdown");
    }
    // Runs have published their ends; now clients get `shutdown` and a close frame.
    gw.shutdown.cancel();
    connections.close();
    // Closed, or the wait would last its whole timeout even with no socket open.
    gw.sockets.close();
    let _ = tokio::time::timeout(Duration::from_secs(3), gw.sockets.wait()).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), connections.wait()).await;
    // MCP servers after the runs: a run's last call may still have needed one.
    let _ = tokio::time::timeout(Duration::from_secs(10), gw.mcp.shutdown()).await;
    gw.sessions.flush();
    gw.store.close();
    tracing::info!("stopped");
    Ok(())
}

/// Publishes `mcp.server` (the server's status, as `status` has it) to every client whenever an MCP
/// server's state, reason or number of tools changes: a client can show a server that failed.
fn announce_mcp(gw: &Arc<Gateway>) {
    for server in gw.mcp.servers() {
        let (gw, server) = (gw.clone(), server.clone());
        let mut changes = server.watch();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { break },
                    () = gw.shutdown.cancelled() => break,
                }
                let status = server.status();
                let now =
                    (status["state"].clone(), status["reason"].clone(), status["tools"].as_array().map_or(0, Vec::len));
                if last.as_ref() != Some(&now) {
                    last = Some(now);
                    gw.hub.publish("mcp.server", None, status, false, crate::hub::Audience::All);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_evicts_the_oldest_unauthenticated_connection() {
        let t = ConnTable::new(3);
        let a = t.admit(std::net::Ipv4Addr::LOCALHOST.into()).expect("a");
        let b = t.admit(std::net::Ipv4Addr::LOCALHOST.into()).expect("b");
        let c = t.admit(std::net::Ipv4Addr::LOCALHOST.into()).expect("c");
        a.authenticated();
        let d = t.admit(std::net::Ipv4Addr::LOCALHOST.into()).expect("d: b is evicted");
        assert!(!a.evict.is_cancelled() && b.evict.is_cancelled() && !c.evict.is_cancelled());
        drop(b);
        assert_eq!(t.live(), 3);
        c.authenticated();
        d.authenticated();
        assert!(
            t.admit(std::net::Ipv4Addr::LOCALHOST.into()).is_none(),
            "every connection is authenticated: the newcomer is refused"
        );
        drop((a, c, d));
        assert_eq!(t.live(), 0);
    }
}
