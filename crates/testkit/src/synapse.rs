//! A throwaway Matrix homeserver for tests: Synapse (PyPI `matrix-synapse`, pinned in
//! `tests/synapse/requirements.txt`, installed by `scripts/test` into the venv named by
//! `PINCER_SYNAPSE`) on a free loopback port with a generated config (SQLite, no federation, no
//! TLS, registration closed but a shared secret set, rate limits out of the way), and a small
//! Matrix user client over plain HTTP ([`MatrixUser`]: create rooms, invite, send, read what a
//! room holds, with `m.replace` edits folded). [`Synapse::shared`] starts one homeserver per test
//! binary (a watchdog process stops it when the binary exits, however it exits); [`Synapse::start`]
//! gives a test its own, stopped on drop. Users are made with the shared-secret admin API
//! (`/_synapse/admin/v1/register`, an HMAC-SHA1 of the nonce and the user's fields).

use crate::{free_port, next_id};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const SHARED_SECRET: &str = "pincer-test-registration-secret";

/// A running homeserver.
pub struct Synapse {
    /// Its directory: `homeserver.yaml`, the SQLite database, `homeserver.log`.
    pub dir: PathBuf,
    pub port: u16,
    child: Mutex<Option<Child>>,
    owned: bool,
    /// How long it took from spawn until `/_matrix/client/versions` answered.
    pub started_in: Duration,
}

/// The Python of the venv with `matrix-synapse` (`PINCER_SYNAPSE` is the venv's directory).
pub fn python() -> PathBuf {
    let venv = std::env::var_os("PINCER_SYNAPSE").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "PINCER_SYNAPSE is not set: run scripts/test (it installs Synapse from tests/synapse/requirements.txt into \
             target/synapse-venv and exports PINCER_SYNAPSE), or set it to such a venv"
        )
    });
    let p = venv.join("bin/python");
    assert!(
        p.is_file(),
        "no Synapse venv at {} (PINCER_SYNAPSE): run scripts/test, which makes it from tests/synapse/requirements.txt",
        venv.display()
    );
    p
}

/// Rate limits raised far past what a test sends (Synapse's defaults throttle a few messages a second).
const RATE_LIMITS: &[&str] = &[
    "rc_message",
    "rc_registration",
    "rc_login:\n  address",
    "rc_login:\n  account",
    "rc_login:\n  failed_attempts",
    "rc_joins:\n  local",
    "rc_joins:\n  remote",
    "rc_joins_per_room",
    "rc_invites:\n  per_room",
    "rc_invites:\n  per_user",
    "rc_invites:\n  per_issuer",
    "rc_admin_redaction",
    "rc_presence:\n  per_user",
    "rc_room_creation",
    "rc_reports",
    "rc_delayed_event_mgmt",
];

fn rate_limits_yaml() -> String {
    // Nested keys share their parent: group them.
    let mut out = String::new();
    let mut parents: Vec<(&str, Vec<&str>)> = Vec::new();
    for k in RATE_LIMITS {
        match k.split_once(":\n  ") {
            Some((p, c)) => match parents.iter_mut().find(|(q, _)| *q == p) {
                Some((_, cs)) => cs.push(c),
                None => parents.push((p, vec![c])),
            },
            None => parents.push((k, vec![])),
        }
    }
    for (p, cs) in parents {
        if cs.is_empty() {
            out.push_str(&format!("{p}:\n  per_second: 10000\n  burst_count: 100000\n"));
        } else {
            out.push_str(&format!("{p}:\n"));
            for c in cs {
                out.push_str(&format!("  {c}:\n    per_second: 10000\n    burst_count: 100000\n"));
            }
        }
    }
    out
}

impl Synapse {
    /// The test binary's homeserver, started on first use.
    pub fn shared() -> &'static Synapse {
        static SHARED: OnceLock<Synapse> = OnceLock::new();
        SHARED.get_or_init(|| Synapse::init(false))
    }

    /// A homeserver of the caller's own, stopped (and removed) on drop, or by the watchdog if this
    /// process ends without dropping it.
    pub fn start() -> Synapse {
        Synapse::init(true)
    }

    fn init(owned: bool) -> Synapse {
        let python = python();
        let dir = std::env::temp_dir().join(format!("pincer-synapse-{}-{}", std::process::id(), next_id()));
        std::fs::create_dir_all(dir.join("media")).expect("synapse dir");
        let port = free_port();
        let d = dir.display();
        let config = format!(
            "server_name: localhost\n\
             public_baseurl: http://127.0.0.1:{port}/\n\
             report_stats: false\n\
             listeners:\n  - port: {port}\n    bind_addresses: ['127.0.0.1']\n    type: http\n    tls: false\n    \
             x_forwarded: false\n    resources:\n      - names: [client]\n        compress: false\n\
             database:\n  name: sqlite3\n  args:\n    database: {d}/homeserver.db\n\
             media_store_path: {d}/media\n\
             signing_key_path: {d}/signing.key\n\
             log_config: {d}/log.yaml\n\
             enable_registration: false\n\
             registration_shared_secret: \"{SHARED_SECRET}\"\n\
             macaroon_secret_key: \"pincer-test-macaroon\"\n\
             form_secret: \"pincer-test-form\"\n\
             federation_domain_whitelist: []\n\
             trusted_key_servers: []\n\
             suppress_key_server_warning: true\n\
             presence:\n  enabled: false\n\
             url_preview_enabled: false\n\
             {}",
            rate_limits_yaml()
        );
        let log = format!(
            "version: 1\nformatters:\n  f:\n    format: '%(asctime)s %(levelname)s %(name)s %(message)s'\n\
             handlers:\n  file:\n    class: logging.FileHandler\n    filename: {d}/homeserver.log\n    formatter: f\n\
             root:\n  level: WARNING\n  handlers: [file]\ndisable_existing_loggers: false\n"
        );
        std::fs::write(dir.join("homeserver.yaml"), config).expect("write homeserver.yaml");
        std::fs::write(dir.join("log.yaml"), log).expect("write log.yaml");
        let started = Instant::now();
        let out = Command::new(&python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(dir.join("homeserver.yaml"))
            .arg("--generate-keys")
            .stdin(Stdio::null())
            .output()
            .expect("run synapse --generate-keys");
        assert!(
            out.status.success(),
            "synapse --generate-keys failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = std::fs::File::create(dir.join("stderr.log")).expect("stderr.log");
        let child = Command::new(&python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(dir.join("homeserver.yaml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start synapse");
        let pid = child.id();
        let mut s = Synapse { dir, port, child: Mutex::new(Some(child)), owned, started_in: Duration::ZERO };
        s.watch_parent(pid);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if s.get_status("/_matrix/client/versions") == Some(200) {
                break;
            }
            if let Some(st) = s.child.lock().unwrap().as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("synapse exited ({st}) before answering:\n{}", s.logs());
            }
            assert!(Instant::now() < deadline, "synapse did not answer within 120 s:\n{}", s.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
        s.started_in = started.elapsed();
        s
    }

    /// Its stderr and log, for a failure's message.
    pub fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        format!("--- stderr\n{}\n--- homeserver.log\n{}", read("stderr.log"), read("homeserver.log"))
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The status of a plain GET (std only: used before any runtime exists).
    fn get_status(&self, path: &str) -> Option<u16> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).ok()?;
        let head = String::from_utf8_lossy(&buf);
        head.split_whitespace().nth(1)?.parse().ok()
    }

    /// A new user `@<name>:localhost` (a fresh name: `<prefix>-<pid>-<n>`), registered with the shared
    /// secret, with its access token.
    pub async fn register(&self, prefix: &str) -> MatrixUser {
        let name = format!("{prefix}-{}-{}", std::process::id(), next_id());
        let http = http_client();
        let url = format!("{}/_synapse/admin/v1/register", self.url());
        let nonce: Value = http.get(&url).send().await.expect("GET register nonce").json().await.expect("nonce");
        let nonce = nonce["nonce"].as_str().expect("nonce string").to_owned();
        let password = format!("pw-{name}");
        let mac = hmac_sha1_hex(
            SHARED_SECRET.as_bytes(),
            &[nonce.as_bytes(), name.as_bytes(), password.as_bytes(), b"notadmin"].join(&0u8),
        );
        let body = json!({"nonce": nonce, "username": name, "password": password, "admin": false, "mac": mac});
        let resp = http.post(&url).json(&body).send().await.expect("POST register");
        let status = resp.status();
        let v: Value = resp.json().await.expect("register answer");
        assert!(status.is_success(), "register {name}: {status} {v}");
        MatrixUser {
            base: self.url(),
            user_id: v["user_id"].as_str().expect("user_id").to_owned(),
            token: v["access_token"].as_str().expect("access_token").to_owned(),
            http,
        }
    }

    /// A process that kills the homeserver and removes its directory once this test binary has exited.
    fn watch_parent(&self, child: u32) {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; kill -9 {child} 2>/dev/null; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = self.dir.display(),
        );
        // Not waited for: it outlives this process on purpose (init reaps it).
        #[allow(clippy::zombie_processes)]
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the homeserver's watchdog");
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A reqwest client (reqwest is built without a TLS crypto provider: *ring* is installed first, as
/// the gateway does; only plain HTTP is spoken here).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// HMAC-SHA1 (RFC 2104), hex: what Synapse's shared-secret registration checks.
fn hmac_sha1_hex(key: &[u8], msg: &[u8]) -> String {
    use sha1::{Digest, Sha1};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..20].copy_from_slice(&Sha1::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha1::new().chain_update(pad(0x36)).chain_update(msg).finalize();
    let outer = Sha1::new().chain_update(pad(0x5c)).chain_update(inner).finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// A message event as a room holds it, with later `m.replace` edits folded in.
#[derive(Debug, Clone)]
pub struct RoomMessage {
    pub event_id: String,
    pub sender: String,
    /// The original event's `body`.
    pub body: String,
    /// The body after the last edit (`m.new_content.body`), or `body` when never edited.
    pub final_body: String,
    /// The last version's `formatted_body`, if any.
    pub final_formatted: Option<String>,
    /// How many edits replaced it.
    pub edits: usize,
    pub content: Value,
}

/// A Matrix user talking plain client-server HTTP.
#[derive(Clone)]
pub struct MatrixUser {
    pub base: String,
    pub user_id: String,
    pub token: String,
    http: reqwest::Client,
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl MatrixUser {
    /// A request to `/_matrix/client/v3<path>`; the answer's JSON, or `Err((status, body))`.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, (u16, Value)> {
        let mut req =
            self.http.request(method, format!("{}/_matrix/client/v3{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| (0, json!(e.to_string())))?;
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err((status, v))
        }
    }

    async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let what = format!("{method} {path}");
        self.call(method, path, body).await.unwrap_or_else(|(s, v)| panic!("{what} as {}: {s} {v}", self.user_id))
    }

    /// Logs in again with a password (a second device); the new token.
    pub async fn login(&self, password: &str) -> String {
        let user = self.user_id.trim_start_matches('@').split(':').next().unwrap_or_default();
        let v = self
            .ok(
                reqwest::Method::POST,
                "/login",
                Some(json!({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password})),
            )
            .await;
        v["access_token"].as_str().expect("access_token").to_owned()
    }

    /// Creates a room inviting `invite`: a direct chat (`is_direct`) or a private group room; with
    /// `encrypted`, the `m.room.encryption` state is set at creation. The room id.
    pub async fn create_room(&self, invite: &[&str], is_direct: bool, encrypted: bool) -> String {
        let mut body = json!({"invite": invite, "is_direct": is_direct, "preset": "private_chat"});
        if !is_direct {
            body["name"] = json!(format!("room of {}", self.user_id));
        }
        if encrypted {
            body["initial_state"] = json!([{"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]);
        }
        let v = self.ok(reqwest::Method::POST, "/createRoom", Some(body)).await;
        v["room_id"].as_str().expect("room_id").to_owned()
    }

    /// Invites `user` into `room`.
    pub async fn invite(&self, room: &str, user: &str) {
        self.ok(reqwest::Method::POST, &format!("/rooms/{}/invite", enc(room)), Some(json!({"user_id": user}))).await;
    }

    /// Joins `room` (after an invite).
    pub async fn join(&self, room: &str) {
        self.ok(reqwest::Method::POST, &format!("/join/{}", enc(room)), Some(json!({}))).await;
    }

    /// The room's joined members.
    pub async fn joined_members(&self, room: &str) -> Vec<String> {
        let v = self.ok(reqwest::Method::GET, &format!("/rooms/{}/joined_members", enc(room)), None).await;
        v["joined"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
    }

    /// The membership of `user` in `room` (`invite`, `join`, `leave`, …), if any.
    pub async fn membership(&self, room: &str, user: &str) -> Option<String> {
        let v = self
            .call(reqwest::Method::GET, &format!("/rooms/{}/state/m.room.member/{}", enc(room), enc(user)), None)
            .await
            .ok()?;
        v["membership"].as_str().map(str::to_owned)
    }

    /// Sends `text` as `m.text` with transaction id `txn` (a resend with the same id is the same event).
    /// The event id.
    pub async fn send_text_txn(&self, room: &str, text: &str, txn: &str) -> String {
        let v = self
            .ok(
                reqwest::Method::PUT,
                &format!("/rooms/{}/send/m.room.message/{}", enc(room), enc(txn)),
                Some(json!({"msgtype": "m.text", "body": text})),
            )
            .await;
        v["event_id"].as_str().expect("event_id").to_owned()
    }

    /// Sends `text` as `m.text` (a fresh transaction id). The event id.
    pub async fn send_text(&self, room: &str, text: &str) -> String {
        let txn = format!("t{}-{}", std::process::id(), next_id());
        self.send_text_txn(room, text, &txn).await
    }

    /// Sends an `m.room.message` with this content (a fresh transaction id). The event id.
    pub async fn send_content(&self, room: &str, content: Value) -> String {
        let txn = format!("t{}-{}", std::process::id(), next_id());
        let path = format!("/rooms/{}/send/m.room.message/{}", enc(room), enc(&txn));
        let v = self.ok(reqwest::Method::PUT, &path, Some(content)).await;
        v["event_id"].as_str().expect("event_id").to_owned()
    }

    /// Sends `text` mentioning `user` as Element does: the user's pill (a `matrix.to` link named
    /// `name`) before the text, and the user in `m.mentions`. The event id.
    pub async fn send_mention(&self, room: &str, user: &str, name: &str, text: &str) -> String {
        let content = json!({
            "msgtype": "m.text",
            "body": format!("{name}: {text}"),
            "format": "org.matrix.custom.html",
            "formatted_body": format!("<a href=\"https://matrix.to/#/{user}\">{name}</a>: {text}"),
            "m.mentions": {"user_ids": [user]},
        });
        self.send_content(room, content).await
    }

    /// Sets the user's display name.
    pub async fn set_display_name(&self, name: &str) {
        let path = format!("/profile/{}/displayname", enc(&self.user_id));
        self.ok(reqwest::Method::PUT, &path, Some(json!({"displayname": name}))).await;
    }

    /// Every `m.room.message` in `room`, oldest first, with edits folded into their originals (edits
    /// themselves are not listed; an edit counts only when sent by the original's sender).
    pub async fn messages(&self, room: &str) -> Vec<RoomMessage> {
        let mut events: Vec<Value> = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let mut path = format!("/rooms/{}/messages?dir=f&limit=500", enc(room));
            if let Some(f) = &from {
                path.push_str(&format!("&from={}", enc(f)));
            }
            let v = self.ok(reqwest::Method::GET, &path, None).await;
            let chunk = v["chunk"].as_array().cloned().unwrap_or_default();
            let end = v["end"].as_str().map(str::to_owned);
            let done = chunk.is_empty() || end.is_none() || end == from;
            events.extend(chunk);
            if done {
                break;
            }
            from = end;
        }
        let mut out: Vec<RoomMessage> = Vec::new();
        let mut edits: Vec<&Value> = Vec::new();
        for e in &events {
            if e["type"] != "m.room.message" {
                continue;
            }
            if e["content"]["m.relates_to"]["rel_type"] == "m.replace" {
                edits.push(e);
                continue;
            }
            let body = e["content"]["body"].as_str().unwrap_or_default().to_owned();
            out.push(RoomMessage {
                event_id: e["event_id"].as_str().unwrap_or_default().to_owned(),
                sender: e["sender"].as_str().unwrap_or_default().to_owned(),
                final_body: body.clone(),
                final_formatted: e["content"]["formatted_body"].as_str().map(str::to_owned),
                body,
                edits: 0,
                content: e["content"].clone(),
            });
        }
        // Edits apply in the room's order (the last one wins), as clients show them.
        for e in edits {
            let target = e["content"]["m.relates_to"]["event_id"].as_str().unwrap_or_default();
            if let Some(m) = out.iter_mut().find(|m| m.event_id == target && m.sender == e["sender"]) {
                let new = &e["content"]["m.new_content"];
                m.final_body = new["body"].as_str().unwrap_or_default().to_owned();
                m.final_formatted = new["formatted_body"].as_str().map(str::to_owned);
                m.edits += 1;
            }
        }
        out
    }

    /// Whether `room` has state event `kind` (e.g. `m.room.encryption`).
    pub async fn has_state(&self, room: &str, kind: &str) -> bool {
        self.call(reqwest::Method::GET, &format!("/rooms/{}/state/{}/", enc(room), enc(kind)), None).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hmac_sha1_matches_rfc_2202() {
        // RFC 2202, test case 2.
        assert_eq!(
            super::hmac_sha1_hex(b"Jefe", b"what do ya want for nothing?"),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
    }
}
