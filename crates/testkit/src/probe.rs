//! Probes for adversarial tests of a real gateway process: its memory (`VmRSS`, `VmHWM`) and open
//! descriptors read from `/proc`, a background sampler of both, the test process's own file limit,
//! a WebSocket upgrade written by hand on a raw socket (client frames built byte by byte, server
//! frames parsed), plain HTTP/SSE reads, the transcript rows of a session key found through
//! `sessions.json`, `pincer transcript verify`, polling with a deadline and a small seeded RNG.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, …); `None` once the process is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..].split_whitespace().next()?.parse().ok()
}

/// Resident memory now, in KiB (0 when the process is gone).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS").unwrap_or(0)
}

/// Peak resident memory since the process started, in KiB.
pub fn hwm_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM").unwrap_or(0)
}

/// Open file descriptors of the process (0 when it is gone).
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Raises this process's soft limit on open files to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    let (Some(cur), max) = (lim.current, lim.maximum) else { return u64::MAX };
    let target = max.unwrap_or(cur);
    if cur < target && setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum: max }).is_ok() {
        return target;
    }
    cur
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Sends `signal` (a signal number such as `libc::SIGTERM`) to `pid`.
pub fn signal(pid: u32, signal: i32) -> bool {
    let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    match (pid, rustix::process::Signal::from_named_raw(signal)) {
        (Some(pid), Some(sig)) => rustix::process::kill_process(pid, sig).is_ok(),
        _ => false,
    }
}

/// What a [`Sampler`] saw.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub max_rss_kib: u64,
    pub max_fds: usize,
    pub samples: usize,
}

/// Samples a process's RSS and descriptor count on a thread until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Samples>,
}

impl Sampler {
    pub fn start(pid: u32, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut s = Samples::default();
            loop {
                s.max_rss_kib = s.max_rss_kib.max(rss_kib(pid));
                s.max_fds = s.max_fds.max(fd_count(pid));
                s.samples += 1;
                if flag.load(Ordering::Acquire) {
                    return s;
                }
                std::thread::sleep(every);
            }
        });
        Sampler { stop, thread }
    }

    /// Stops (after one last sample) and returns the maxima.
    pub fn stop(self) -> Samples {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// Calls `f` every `every` until it returns `Some` or `timeout` has passed.
pub fn poll<T>(timeout: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// [`poll`] for async tests (does not block the runtime).
pub async fn poll_async<T, F: std::future::Future<Output = Option<T>>>(
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> F,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// A WebSocket upgrade done by hand: the socket, the response head and what came after it.
pub struct Upgraded {
    pub stream: TcpStream,
    /// `101`, `403`, …
    pub status: u16,
    pub status_line: String,
    pub head: String,
    /// Bytes read past the head (the first frames).
    pub rest: Vec<u8>,
}

/// Writes `GET / HTTP/1.1` with the WebSocket upgrade headers (`Host` is `addr` unless `host` is
/// given) plus `extra`, and reads the response head.
pub async fn raw_upgrade(addr: &str, host: Option<&str>, extra: &[(&str, &str)]) -> std::io::Result<Upgraded> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut req = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n",
        host.unwrap_or(addr)
    );
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut tmp))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no response head within 10 s"))??;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before the response head"));
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let status_line = head.lines().next().unwrap_or("").to_owned();
    let status = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok(Upgraded { stream, status, status_line, head, rest: buf[end..].to_vec() })
}

/// The header of a masked client frame (FIN set) of `len` payload bytes.
pub fn client_frame_header(opcode: u8, len: u64, mask: [u8; 4]) -> Vec<u8> {
    let mut h = vec![0x80 | (opcode & 0x0f)];
    if len < 126 {
        h.push(0x80 | len as u8);
    } else if len <= u64::from(u16::MAX) {
        h.push(0x80 | 126);
        h.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        h.push(0x80 | 127);
        h.extend_from_slice(&len.to_be_bytes());
    }
    h.extend_from_slice(&mask);
    h
}

/// A whole masked client frame.
pub fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = client_frame_header(opcode, payload.len() as u64, mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// A frame the server sent (servers do not mask).
#[derive(Clone, Debug)]
pub struct ServerFrame {
    pub opcode: u8,
    pub payload: Vec<u8>,
}

impl ServerFrame {
    /// The status code of a close frame.
    pub fn close_code(&self) -> Option<u16> {
        (self.opcode == 8 && self.payload.len() >= 2).then(|| u16::from_be_bytes([self.payload[0], self.payload[1]]))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.payload).to_string()
    }
}

/// Takes the complete server frames off the front of `buf`.
pub fn take_server_frames(buf: &mut Vec<u8>) -> Vec<ServerFrame> {
    let mut out = Vec::new();
    loop {
        if buf.len() < 2 {
            return out;
        }
        let opcode = buf[0] & 0x0f;
        let (len, at) = match buf[1] & 0x7f {
            126 if buf.len() >= 4 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
            127 if buf.len() >= 10 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&buf[2..10]);
                (u64::from_be_bytes(b), 10)
            }
            126 | 127 => return out,
            n => (u64::from(n), 2),
        };
        let end = at + len as usize;
        if buf.len() < end {
            return out;
        }
        out.push(ServerFrame { opcode, payload: buf[at..end].to_vec() });
        buf.drain(..end);
    }
}

/// `GET path` on a fresh socket with `headers`; returns everything read until the server closes or
/// `read_for` passes without data.
pub async fn http_get(addr: &str, path: &str, headers: &[(&str, &str)], read_for: Duration) -> String {
    let Ok(mut sock) = TcpStream::connect(addr).await else { return String::new() };
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    if sock.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&read_response(&mut sock, read_for).await).to_string()
}

/// Reads an HTTP/1.1 response: until it is complete (its `content-length` arrived, or a status
/// without a body), the server closes, or nothing came for `idle` (a stream such as SSE).
pub async fn read_response(sock: &mut TcpStream, idle: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while !response_complete(&out) {
        match tokio::time::timeout(idle, sock.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    out
}

/// Whether `bytes` hold a whole response whose end is known without waiting: a head with a
/// `content-length` and that many body bytes, or a 1xx/204/304 head.
pub fn response_complete(bytes: &[u8]) -> bool {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('1') || status == "204" || status == "304" {
        return true;
    }
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|len| bytes.len() >= end + 4 + len)
}

/// One Server-Sent Event.
#[derive(Clone, Debug, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// The events of an SSE response (headers and chunk-size lines are skipped).
pub fn sse_events(body: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    let mut cur = SseEvent::default();
    for line in body.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            cur.id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("event:") {
            cur.event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            cur.data.push_str(v.strip_prefix(' ').unwrap_or(v));
        } else if line.trim().is_empty() && (!cur.data.is_empty() || cur.event.is_some()) {
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

/// An open SSE stream read event by event (`GET path` with `headers`).
pub struct SseStream {
    sock: TcpStream,
    buf: Vec<u8>,
    /// The response head, once read.
    pub head: String,
}

impl SseStream {
    /// Opens the stream; `None` when the server cannot be reached.
    pub async fn open(addr: &str, path: &str, headers: &[(&str, &str)]) -> Option<SseStream> {
        let mut sock = TcpStream::connect(addr).await.ok()?;
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        sock.write_all(req.as_bytes()).await.ok()?;
        Some(SseStream { sock, buf: Vec::new(), head: String::new() })
    }

    /// The next event, waiting up to `patience` for it; `None` when none came (or the stream ended).
    pub async fn next(&mut self, patience: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if self.head.is_empty() {
                if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    self.head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                    self.buf.drain(..end + 4);
                }
            }
            if !self.head.is_empty() {
                // Chunked framing: events are whole within their chunks; a blank line ends one.
                let text = String::from_utf8_lossy(&self.buf).to_string();
                if let Some(end) = text.find("\n\n") {
                    let block: String = text[..end + 2].to_owned();
                    self.buf.drain(..block.len());
                    if let Some(ev) = sse_events(&block).into_iter().next() {
                        return Some(ev);
                    }
                    continue;
                }
            }
            let mut chunk = [0u8; 65536];
            match tokio::time::timeout_at(deadline, self.sock.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => self.buf.extend_from_slice(&chunk[..n]),
                _ => return None,
            }
        }
    }

    /// Every event that comes until none came for `quiet`.
    pub async fn until_quiet(&mut self, quiet: Duration) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(ev) = self.next(quiet).await {
            out.push(ev);
        }
        out
    }
}

/// `<state>/agents/<agent>/sessions`.
pub fn sessions_dir(state_dir: &Path, agent: &str) -> PathBuf {
    state_dir.join("agents").join(agent).join("sessions")
}

/// The agent's `sessions.json` (`Null` when missing or unreadable).
pub fn session_index(state_dir: &Path, agent: &str) -> Value {
    std::fs::read(sessions_dir(state_dir, agent).join("sessions.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

/// The transcript file of a canonical session key (`agent:<id>:<rest>`), as `sessions.json` has it.
pub fn transcript_path(state_dir: &Path, key: &str) -> Option<PathBuf> {
    let agent = key.strip_prefix("agent:")?.split(':').next()?;
    let index = session_index(state_dir, agent);
    let id = index.get(key)?.get("sessionId")?.as_str()?;
    Some(sessions_dir(state_dir, agent).join(format!("{id}.jsonl")))
}

/// The visible text of a Pi message: its string content, or its text blocks joined.
pub fn message_text(msg: &Value) -> String {
    match &msg["content"] {
        Value::String(s) => s.clone(),
        Value::Array(b) => b.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join(""),
        _ => String::new(),
    }
}

/// The rows of a JSONL file that parse, and how many lines did not.
pub fn read_rows_lossy(path: &Path) -> (Vec<Value>, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut rows = Vec::new();
    let mut bad = 0;
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str(l) {
            Ok(v) => rows.push(v),
            Err(_) => bad += 1,
        }
    }
    (rows, bad)
}

/// Every row of a JSONL file; panics on a line that is not JSON.
pub fn read_rows(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{} line {}: not JSON: {e}", path.display(), i + 1))
        })
        .collect()
}

/// The rows of a session's transcript (empty when it has none yet).
pub fn transcript_rows(state_dir: &Path, key: &str) -> Vec<Value> {
    transcript_path(state_dir, key).map(|p| read_rows(&p)).unwrap_or_default()
}

/// `pincer transcript verify FILE`: the exit code and what it printed.
pub fn verify(bin: &str, file: &Path) -> (Option<i32>, String) {
    match std::process::Command::new(bin).args(["transcript", "verify"]).arg(file).output() {
        Ok(o) => {
            (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        }
        Err(e) => (None, format!("cannot run {bin}: {e}")),
    }
}

/// A small xorshift generator, seeded so a failing run can be repeated.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }
}

/// The kernel's TCP state of a socket of this process (1 established, 7 closed, 8 close-wait, …:
/// the `st` column of `/proc/net/tcp{,6}`, numbered as `tcpi_state`), found by the socket's inode,
/// without touching the data queued on it.
pub fn tcp_state(fd: std::os::fd::RawFd) -> Option<u8> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for row in text.lines().skip(1) {
            let cols: Vec<&str> = row.split_whitespace().collect();
            if cols.get(9) == Some(&inode.as_str()) {
                return u8::from_str_radix(cols.get(3)?, 16).ok();
            }
        }
    }
    None
}

/// `tcpi_state` of an established connection.
pub const TCP_ESTABLISHED: u8 = 1;

/// CPU time the process has used (user + system), in clock ticks (`/proc/<pid>/stat`).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after it start at ") ".
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
