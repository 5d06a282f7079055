//! The real `pincer gateway` process on port 0 with a temp state dir, and a WebSocket client that
//! speaks the gateway protocol (challenge → connect → hello-ok, then req/res/event frames).

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const TOKEN: &str = "test-token-0123456789";

/// How to start the gateway besides the defaults of [`GatewayProcess::start`].
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// A command the gateway runs under, e.g. `["prlimit", "--nofile=1024:1024", "--"]`; it must
    /// exec the gateway (so the child's pid is the gateway's).
    pub wrapper: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Write the config here and pass `--config` (instead of `<state>/pincer.toml`).
    pub config_path: Option<PathBuf>,
    /// The process's working directory (the test's when `None`); new transcripts record it.
    pub cwd: Option<PathBuf>,
}

/// Writes `config` to `<state>/pincer.toml` and runs `bin gateway --bind 127.0.0.1:0` on it, which
/// must refuse to start: its stderr. A gateway that starts anyway (it is still running after 30 s)
/// is killed and the test fails.
pub fn refused_startup(bin: &str, state_dir: &Path, config: &str) -> String {
    std::fs::create_dir_all(state_dir).expect("state dir");
    std::fs::write(state_dir.join("pincer.toml"), config).expect("config");
    let mut child = Command::new(bin)
        .args(["gateway", "--bind", "127.0.0.1:0", "--state-dir"])
        .arg(state_dir)
        .env("PINCER_GATEWAY_TOKEN", TOKEN)
        .env_remove("PINCER_MODEL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the gateway");
    let status =
        crate::probe::poll(Duration::from_secs(30), Duration::from_millis(20), || child.try_wait().ok().flatten());
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        if status.is_some() {
            let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
        }
    }
    match status {
        Some(s) => assert!(!s.success(), "the gateway exited {s} instead of refusing to start: {stderr}"),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gateway started with this config:\n{config}");
        }
    }
    stderr
}

/// A running gateway process; killed on drop.
pub struct GatewayProcess {
    pub child: Child,
    pub addr: String,
    pub state_dir: PathBuf,
    /// Everything the process logged so far.
    pub log: Arc<Mutex<Vec<String>>>,
    bin: String,
    config: String,
    options: StartOptions,
}

impl GatewayProcess {
    /// Writes `config` to `<state>/pincer.toml` and starts `bin gateway --bind 127.0.0.1:0`.
    pub fn start(bin: &str, state_dir: &Path, config: &str) -> GatewayProcess {
        Self::start_with(bin, state_dir, config, &StartOptions::default())
    }

    /// [`GatewayProcess::start`] under a wrapper command, with extra environment or the config elsewhere.
    pub fn start_with(bin: &str, state_dir: &Path, config: &str, options: &StartOptions) -> GatewayProcess {
        std::fs::create_dir_all(state_dir).expect("state dir");
        let config_file = options.config_path.clone().unwrap_or_else(|| state_dir.join("pincer.toml"));
        std::fs::write(&config_file, config).expect("config");
        let mut cmd = match options.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(["gateway", "--bind", "127.0.0.1:0", "--state-dir"]).arg(state_dir);
        if options.config_path.is_some() {
            cmd.arg("--config").arg(&config_file);
        }
        if let Some(dir) = &options.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .env("PINCER_GATEWAY_TOKEN", TOKEN)
            .env("PINCER_LOG", "info")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("PINCER_MODEL")
            .envs(options.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pincer gateway");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            // The address comes with the first startup line; the start counts as done with the last
            // one (the model line), so every startup line is in the log when `start` returns.
            let mut addr = None;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ws://").nth(1) {
                    addr = Some(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
                let done = line.contains("model: ") || line.contains("no model provider configured");
                log2.lock().expect("log").push(line);
                if done {
                    if let Some(a) = addr.take() {
                        let _ = tx.send(a);
                    }
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| {
            panic!("the gateway did not start: {:?}", log.lock().expect("log"));
        });
        GatewayProcess {
            child,
            addr,
            state_dir: state_dir.to_path_buf(),
            log,
            bin: bin.to_owned(),
            config: config.to_owned(),
            options: options.clone(),
        }
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reaps the process.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILLs the process (when it still runs) and starts a new one on the same state dir, with
    /// the same config and options (on a new port).
    pub fn restart(&mut self) {
        self.kill9();
        let next = GatewayProcess::start_with(&self.bin, &self.state_dir, &self.config, &self.options);
        *self = next;
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        for _ in 0..200 {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        self.child.wait().expect("wait")
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client's WebSocket.
pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A protocol client. Events are buffered so tests can wait for them in any order.
pub struct Client {
    ws: Ws,
    next: u64,
    pub events: Vec<Value>,
    pub hello: Value,
}

impl Client {
    /// Connects and completes the handshake with `token`; returns the error payload on refusal.
    pub async fn connect_with(addr: &str, params: Value) -> Result<Client, Value> {
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(format!("ws://{addr}/"), None, true)
            .await
            .expect("ws connect");
        let challenge = next_frame(&mut ws).await.expect("challenge");
        assert_eq!(challenge["event"], "connect.challenge", "{challenge}");
        let frame = json!({"type": "req", "id": "c1", "method": "connect", "params": params});
        ws.send(Message::Text(frame.to_string().into())).await.expect("send connect");
        let res = next_frame(&mut ws).await.expect("connect response");
        if res["ok"] != true {
            return Err(res);
        }
        Ok(Client { ws, next: 1, events: Vec::new(), hello: res["payload"].clone() })
    }

    pub async fn connect(addr: &str) -> Client {
        Self::connect_with(addr, connect_params(TOKEN)).await.expect("connect accepted")
    }

    /// Connects with the test token without panicking: `Err` says why it did not work (the
    /// gateway is gone, refused, or too slow).
    pub async fn try_connect(addr: &str, timeout: Duration) -> Result<Client, String> {
        let attempt = async {
            let (mut ws, _) = tokio_tungstenite::connect_async_with_config(format!("ws://{addr}/"), None, true)
                .await
                .map_err(|e| format!("ws connect: {e}"))?;
            let challenge = next_frame(&mut ws).await.ok_or("no challenge")?;
            if challenge["event"] != "connect.challenge" {
                return Err(format!("not a challenge: {challenge}"));
            }
            let frame = json!({"type": "req", "id": "c1", "method": "connect", "params": connect_params(TOKEN)});
            ws.send(Message::Text(frame.to_string().into())).await.map_err(|e| format!("send connect: {e}"))?;
            let res = next_frame(&mut ws).await.ok_or("no connect response")?;
            if res["ok"] != true {
                return Err(format!("connect refused: {res}"));
            }
            Ok(Client { ws, next: 1, events: Vec::new(), hello: res["payload"].clone() })
        };
        tokio::time::timeout(timeout, attempt).await.unwrap_or_else(|_| Err("connect timed out".into()))
    }

    /// [`Client::request`] that reports a lost connection or a timeout as `Err` instead of panicking;
    /// `Ok` holds the response as `request` returns it.
    pub async fn try_request(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Result<Value, Value>, String> {
        self.next += 1;
        let id = format!("r{}", self.next);
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        self.ws.send(Message::Text(frame.to_string().into())).await.map_err(|e| format!("send: {e}"))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let f = tokio::time::timeout_at(deadline, next_frame(&mut self.ws))
                .await
                .map_err(|_| format!("no response to {method} within {timeout:?}"))?
                .ok_or("connection closed")?;
            if f["type"] == "res" && f["id"] == id.as_str() {
                return Ok(if f["ok"] == true { Ok(f["payload"].clone()) } else { Err(f["error"].clone()) });
            }
            if f["type"] == "event" {
                self.events.push(f);
            }
        }
    }

    /// [`Client::chat_end`] that reports a lost connection or a timeout as `Err`.
    pub async fn try_chat_end(&mut self, run_id: &str, timeout: Duration) -> Result<Value, String> {
        let is_end = |f: &Value| is_chat_end(f, run_id);
        if let Some(i) = self.events.iter().position(is_end) {
            return Ok(self.events.remove(i));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let f = tokio::time::timeout_at(deadline, next_frame(&mut self.ws))
                .await
                .map_err(|_| format!("no end of {run_id} within {timeout:?}"))?
                .ok_or("connection closed")?;
            if f["type"] == "event" && is_end(&f) {
                return Ok(f);
            }
            self.events.push(f);
        }
    }

    /// Every frame (buffered events first) until the server closes, in order, and the close code
    /// (`None` when the socket ended without a close frame or `timeout` passed).
    pub async fn frames_until_close(&mut self, timeout: Duration) -> (Vec<Value>, Option<u16>) {
        let mut out: Vec<Value> = std::mem::take(&mut self.events);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => out.extend(serde_json::from_str::<Value>(&t).ok()),
                Ok(Some(Ok(Message::Close(f)))) => return (out, f.map(|f| u16::from(f.code))),
                Ok(Some(Ok(_))) => continue,
                _ => return (out, None),
            }
        }
    }

    /// The WebSocket itself, for tests that control reading and writing frame by frame.
    pub fn into_ws(self) -> Ws {
        self.ws
    }

    /// Sends a raw text frame.
    pub async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::Text(text.to_owned().into())).await.expect("send");
    }

    /// The next response frame (events that arrive meanwhile are buffered).
    pub async fn response(&mut self) -> Value {
        loop {
            let f = next_frame(&mut self.ws).await.expect("frame");
            if f["type"] == "res" {
                return f;
            }
            self.events.push(f);
        }
    }

    /// Sends a request and returns `Ok(payload)` or `Err(error)`.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.try_request(method, params, Duration::from_secs(3600)).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits for an event frame matching `pred` (looking at buffered ones first); removes and returns it.
    pub async fn event(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        self.event_within(pred, Duration::from_secs(30)).await
    }

    /// [`Client::event`] with a given patience (a real model on a busy machine can be slow).
    pub async fn event_within(&mut self, pred: impl Fn(&Value) -> bool, patience: Duration) -> Value {
        if let Some(i) = self.events.iter().position(&pred) {
            return self.events.remove(i);
        }
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let f = tokio::time::timeout_at(deadline, next_frame(&mut self.ws))
                .await
                .unwrap_or_else(|_| panic!("event not seen within {patience:?}; buffered: {:?}", self.events))
                .expect("frame");
            if f["type"] == "event" && pred(&f) {
                return f;
            }
            self.events.push(f);
        }
    }

    /// Every event frame in arrival order (buffered ones first) up to and including the first that
    /// matches `pred`; the buffer is left empty. Panics when none matches within `patience`.
    pub async fn events_until(&mut self, pred: impl Fn(&Value) -> bool, patience: Duration) -> Vec<Value> {
        let mut out: Vec<Value> = std::mem::take(&mut self.events);
        if let Some(i) = out.iter().position(&pred) {
            self.events = out.split_off(i + 1);
            return out;
        }
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let f = tokio::time::timeout_at(deadline, next_frame(&mut self.ws))
                .await
                .unwrap_or_else(|_| panic!("event not seen within {patience:?}; so far: {out:#?}"))
                .expect("frame");
            if f["type"] != "event" {
                continue;
            }
            let done = pred(&f);
            out.push(f);
            if done {
                return out;
            }
        }
    }

    /// Waits for the `chat` event of `run_id` in one of the terminal states.
    pub async fn chat_end(&mut self, run_id: &str) -> Value {
        self.event(|f| is_chat_end(f, run_id)).await
    }

    /// Reads frames until the server closes; returns the close code.
    pub async fn closed(&mut self) -> Option<u16> {
        loop {
            match tokio::time::timeout(Duration::from_secs(20), self.ws.next()).await {
                Ok(Some(Ok(Message::Close(f)))) => return f.map(|f| u16::from(f.code)),
                Ok(Some(Ok(_))) => continue,
                _ => return None,
            }
        }
    }
}

/// A `chat` event of `run_id` in one of the terminal states.
pub fn is_chat_end(f: &Value, run_id: &str) -> bool {
    f["event"] == "chat"
        && f["payload"]["runId"] == run_id
        && matches!(f["payload"]["state"].as_str(), Some("final" | "aborted" | "error"))
}

/// Opens a socket, reads the challenge, sends `first` as the first frame and returns the answer.
pub async fn first_frame_answer(addr: &str, first: &str) -> Value {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/")).await.expect("ws connect");
    let _challenge = next_frame(&mut ws).await;
    ws.send(Message::Text(first.to_owned().into())).await.expect("send");
    next_frame(&mut ws).await.unwrap_or(Value::Null)
}

/// `connect` params as an OpenClaw `gateway-client` in `backend` mode sends them.
pub fn connect_params(token: &str) -> Value {
    json!({"minProtocol": 3, "maxProtocol": 4,
        "client": {"id": "gateway-client", "version": "1.0.0", "platform": "linux", "mode": "backend"},
        "role": "operator", "scopes": ["operator.admin", "operator.read", "operator.write"],
        "auth": {"token": token}})
}

async fn next_frame(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.next().await? {
            Ok(Message::Text(t)) => return serde_json::from_str(&t).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}
