//! Binding, accepting, serving and shutting down.
//!
//! The accept loop is our own (hyper's HTTP/1 with upgrades under the axum router) so that every
//! connection is bounded: request headers must arrive within `header_timeout`; at most
//! `max_connections` are open, and when a newcomer finds the table full the oldest connection that
//! has not authenticated yet (a slowloris socket, an idle keep-alive) is closed to make room, so an
//! attack by half-open sockets never locks out a real client; and a WebSocket reads at most the
//! pre-auth limit from the socket until its `connect` succeeded ([`crate::conn::Conn::limit_reads`]).
//!
//! On SIGINT/SIGTERM the gateway stops accepting, aborts running turns and waits for them (their
//! partials are persisted and their `aborted` events queued), then tells connected clients with a
//! `shutdown` event and a close frame (1012), flushes the session index and returns (exit 0).

use crate::config::Settings;
use crate::conn::{ConnTable, Metered};
use crate::error::GatewayError;
use crate::state::Engine;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// A started gateway (for tests and the binary).
pub struct Listening {
    pub addr: SocketAddr,
    pub gateway: Arc<Engine>,
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
    let gw = Arc::new(Engine::new(settings)?);
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
        let io = TokioIo::new(Metered::new(tcp, conn.clone()));
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
    // Off the async threads: the flush waits for the index, whose holder may wait for this runtime.
    let last = gw.clone();
    let _ = tokio::task::spawn_blocking(move || {
        last.sessions.flush();
        last.store.close();
    })
    .await;
    tracing::info!("stopped");
    Ok(())
}

/// Publishes `mcp.server` (the server's status, as `status` has it) to every client whenever an MCP
/// server's state, reason or number of tools changes: a client can show a server that failed.
fn announce_mcp(gw: &Arc<Engine>) {
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
