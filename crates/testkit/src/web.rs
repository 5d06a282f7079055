//! A web server for `web_fetch`'s tests: real HTTP/1.1 over TCP, answering each path as the test's
//! route says (a page, a redirect, a body that never ends, or nothing at all), and recording the
//! paths it was asked for (so a test can show a refused fetch never reached it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the test server answers to a path.
pub enum Answer {
    /// A whole response: status line's code and reason, content type, body.
    Page(&'static str, &'static str, String),
    /// A redirect to this location.
    Redirect(String),
    /// A text/plain body that never ends.
    Endless,
    /// Nothing, ever.
    Stall,
}

/// A real HTTP/1.1 server on `bind` (port 0) answering with `route`; it records the paths asked.
pub struct Server {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub async fn start(bind: &str, route: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Server {
        let listener = tokio::net::TcpListener::bind((bind, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (route, log) = (Arc::new(route), seen.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (route, log) = (route.clone(), log.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                    log.lock().unwrap().push(path.clone());
                    let reply = |code: &str, ct: &str, extra: &str, body: &str| {
                        format!("HTTP/1.1 {code}\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}", body.len())
                    };
                    let out = match route(&path) {
                        Answer::Page(code, ct, body) => reply(code, ct, "", &body),
                        Answer::Redirect(to) => reply("302 Found", "text/plain", &format!("Location: {to}\r\n"), ""),
                        Answer::Endless => {
                            let _ = sock
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
                                .await;
                            let chunk = "x".repeat(16 * 1024);
                            let mut sent = 0usize;
                            while sock.write_all(chunk.as_bytes()).await.is_ok() {
                                sent += chunk.len();
                            }
                            eprintln!("endless body: the server wrote {sent} bytes before the client hung up");
                            return;
                        }
                        Answer::Stall => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        }
                    };
                    let _ = sock.write_all(out.as_bytes()).await;
                });
            }
        });
        Server { addr, seen }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}
