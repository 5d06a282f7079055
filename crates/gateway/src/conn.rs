//! The accepted connections: each one's read limit before it authenticates, its eviction, and
//! the table that bounds how many are open (the oldest unauthenticated one makes room for a
//! newcomer). The accept loop that fills it is [`crate::server`]'s.

use pincer_pi::lock;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

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
pub struct Metered {
    tcp: TcpStream,
    conn: Arc<Conn>,
}

impl Metered {
    pub fn new(tcp: TcpStream, conn: Arc<Conn>) -> Metered {
        Metered { tcp, conn }
    }
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
