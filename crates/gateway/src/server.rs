//! Binding, serving and shutting down. On SIGINT/SIGTERM the gateway stops accepting, aborts running
//! turns (their partials are persisted), waits for every pending append, tells connected clients
//! with a `shutdown` event, and returns so the process exits 0.

use crate::config::Settings;
use crate::state::Gateway;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A started gateway (for tests and the binary).
pub struct Listening {
    pub addr: SocketAddr,
    pub gateway: Arc<Gateway>,
}

/// Binds and serves until `stop` resolves; then shuts down gracefully.
pub async fn serve(
    settings: Settings,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    on_listening: impl FnOnce(&Listening),
) -> Result<(), String> {
    let bind = settings.bind;
    let listener = tokio::net::TcpListener::bind(bind).await.map_err(|e| format!("cannot listen on {bind}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    pincer_store::fsutil::create_private_dir(&settings.state_dir)
        .map_err(|e| format!("{}: cannot create the state directory: {e}", settings.state_dir.display()))?;
    let gw = Arc::new(Gateway::new(settings)?);
    on_listening(&Listening { addr, gateway: gw.clone() });
    let app = crate::http::router(gw.clone());
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
    let shutdown = gw.shutdown.clone();
    let gw_stop = gw.clone();
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutting down: aborting runs and flushing appends");
        for r in gw_stop.all_runs() {
            r.abort("shutdown");
        }
        gw_stop.shutdown.cancel();
    });
    // Small frames (deltas, acks) must not wait for Nagle's algorithm.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await });
    server.await.map_err(|e| format!("server error: {e}"))?;
    gw.tasks.close();
    if tokio::time::timeout(Duration::from_secs(15), gw.tasks.wait()).await.is_err() {
        tracing::warn!("some runs did not finish within 15 s of shutdown");
    }
    gw.sessions.flush();
    gw.store.close();
    tracing::info!("stopped");
    Ok(())
}
