//! A TCP proxy that makes its client a late reader: what the server sends is held for a moment
//! after its first byte and then written to the client at once, so the client reads in one go
//! frames a busy machine or a slow link would have let pile up. What the client sends passes at
//! once. Used to show that a client sees a request's answer before the events that follow it.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The proxy's listening address; it runs until the test process ends.
pub struct LateReader {
    pub addr: String,
}

impl LateReader {
    /// Proxies to `upstream` (`host:port`), holding the server's bytes `hold` after each first one.
    pub fn start(upstream: &str, hold: Duration) -> LateReader {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the late-reader proxy");
        let addr = listener.local_addr().expect("proxy address");
        let upstream: SocketAddr = upstream.parse().expect("upstream is host:port");
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                std::thread::spawn(move || pass(c2, s2));
                std::thread::spawn(move || hold_back(server, client, hold));
            }
        });
        LateReader { addr: addr.to_string() }
    }
}

/// Client to server, as it comes.
fn pass(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// Server to client, in batches: everything that arrives within `hold` of a batch's first byte.
fn hold_back(mut from: TcpStream, mut to: TcpStream, hold: Duration) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let _ = from.set_read_timeout(None);
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut batch = buf[..n].to_vec();
        let until = Instant::now() + hold;
        let mut open = true;
        while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            let _ = from.set_read_timeout(Some(left));
            match from.read(&mut buf) {
                Ok(0) => {
                    open = false;
                    break;
                }
                Ok(n) => batch.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(_) => {
                    open = false;
                    break;
                }
            }
        }
        if to.write_all(&batch).is_err() || !open {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
