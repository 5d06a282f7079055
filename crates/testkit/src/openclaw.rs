//! OpenClaw's own CLI (openclaw@2026.9.6 on Node 24, installed by `scripts/test` into
//! `tests/openclaw-cli`; and 2026.5.28 as a writer of state dirs) as a client of a test gateway, in a network namespace with loopback
//! alone: OpenClaw makes outbound lookups at run time, so a test runs itself again inside a fresh
//! namespace (fake provider, gateway and CLI all on that loopback) and the outer test checks it passed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The installed CLI: (node, openclaw.mjs). Panics naming the fix when it is missing (never skips).
pub fn cli() -> (PathBuf, PathBuf) {
    let dir = crate::repo_root().join("tests/openclaw-cli");
    let node = dir.join("node/node_modules/.bin/node");
    let entry = dir.join("node_modules/openclaw/openclaw.mjs");
    assert!(
        node.exists() && entry.exists(),
        "OpenClaw's CLI is not installed ({} / {}): run scripts/test, or `npm ci` in tests/openclaw-cli/node and then, \
         with that node on PATH, in tests/openclaw-cli",
        node.display(),
        entry.display()
    );
    (node, entry)
}

/// Runs the calling test (`name`, its exact name) again inside a new network namespace with only
/// loopback up, and asserts it passed there. Returns true in that inner run (go on with the test),
/// false in the outer one (done).
pub fn in_loopback_namespace(name: &str) -> bool {
    if crate::netns::inside() {
        return true;
    }
    cli();
    // One OpenClaw test at a time: each runs Node programs that load a 2-core machine on their own
    // (the suite's other timing-sensitive tests suffer when four run at once).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    crate::netns::run_inside(name, &[])
}

/// Runs `openclaw <args>` against the gateway at `addr` with `token`, with its home and state in `home`.
pub fn run(home: &Path, addr: &str, token: &str, args: &[&str]) -> Output {
    let (node, entry) = cli();
    command(&node, &entry, home)
        .args(args)
        .env("OPENCLAW_GATEWAY_URL", format!("ws://{addr}"))
        .env("OPENCLAW_GATEWAY_TOKEN", token)
        .output()
        .expect("run openclaw")
}

/// OpenClaw 2026.5.28 (the JSONL-era transcript code, installed by `scripts/test` into
/// `tests/openclaw-528`): `openclaw <args>` on its own, its home and state in `home`.
pub fn run_2026_5_28(home: &Path, args: &[&str]) -> Output {
    let (node, _) = cli();
    let entry = crate::repo_root().join("tests/openclaw-528/node_modules/openclaw/openclaw.mjs");
    assert!(entry.exists(), "OpenClaw 2026.5.28 is not installed ({}): run scripts/test", entry.display());
    command(&node, &entry, home).args(args).output().expect("run openclaw 2026.5.28")
}

/// OpenClaw's config (`openclaw.json`, its `models.providers` shape, read alike by 2026.5.28 and
/// 2026.9.6) for the fake provider at `base_url` as `fake/fake-model`, with a window large enough
/// that its own runs do not compact.
pub fn fake_model_config(base_url: &str) -> serde_json::Value {
    serde_json::json!({
        "models": {"mode": "replace", "providers": {"fake": {"baseUrl": base_url, "apiKey": "test-key",
            "api": "openai-completions", "models": [{"id": "fake-model", "name": "Fake", "contextWindow": 1_000_000,
            "maxTokens": 4096, "input": ["text"], "reasoning": false,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}]}}},
        "agents": {"defaults": {"model": {"primary": "fake/fake-model"}}}
    })
}

/// `node <entry>` with a clean environment: `HOME` and the OpenClaw state under `home`.
pub fn command(node: &Path, entry: &Path, home: &Path) -> Command {
    std::fs::create_dir_all(home).expect("openclaw home");
    let mut c = Command::new(node);
    c.arg(entry)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("OPENCLAW_STATE_DIR", home.join(".openclaw"))
        .env("NO_COLOR", "1");
    c
}

/// OpenClaw 2026.9.6's own gateway (`openclaw gateway run`) on its state in `home`, on loopback
/// (inside the test's namespace), token `TOKEN`; stopped (and waited for) when dropped.
pub struct OwnGateway {
    child: std::process::Child,
    pub addr: String,
}

impl OwnGateway {
    pub const TOKEN: &'static str = "openclaw-own-token";

    /// Starts it on `port` and waits (up to 180 s) until `gateway call status` answers: first until
    /// the port takes a connection (it listens a few seconds into its boot), so that no CLI, a Node
    /// process of its own, competes with that boot for the CPU only to be refused.
    pub fn start(home: &Path, port: u16) -> OwnGateway {
        let (node, entry) = cli();
        let log = std::fs::File::create(home.join("openclaw-gateway.log")).expect("gateway log");
        let child = command(&node, &entry, home)
            .args(["gateway", "run", "--port", &port.to_string(), "--bind", "loopback", "--auth", "token"])
            .args(["--token", Self::TOKEN, "--allow-unconfigured"])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("run openclaw gateway");
        let gw = OwnGateway { child, addr: format!("127.0.0.1:{port}") };
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let listening = crate::probe::poll(left(), Duration::from_millis(100), || {
            std::net::TcpStream::connect(&gw.addr).ok().map(drop)
        });
        let up = listening.and_then(|()| {
            crate::probe::poll(left(), Duration::from_millis(500), || {
                run(home, &gw.addr, Self::TOKEN, &["gateway", "call", "status", "--json"])
                    .status
                    .success()
                    .then_some(())
            })
        });
        assert!(up.is_some(), "OpenClaw's gateway never answered; its log:\n{}", gw.log(home));
        gw
    }

    /// What it printed so far.
    pub fn log(&self, home: &Path) -> String {
        std::fs::read_to_string(home.join("openclaw-gateway.log")).unwrap_or_default()
    }

    /// `openclaw <args>` against it; panics with the output unless it succeeds.
    pub fn run_ok(&self, home: &Path, args: &[&str]) -> String {
        let out = run(home, &self.addr, Self::TOKEN, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "openclaw {args:?} exited {:?}\nstdout:\n{stdout}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `openclaw gateway call <method> --params <params> --json`, its JSON answer.
    pub fn call(&self, home: &Path, method: &str, params: serde_json::Value) -> serde_json::Value {
        let out = self.run_ok(home, &["gateway", "call", method, "--params", &params.to_string(), "--json"]);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{method}: not JSON ({e}):\n{out}"))
    }

    /// Stops it (SIGTERM, then waits for it to exit, so that its databases are closed).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        crate::probe::signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for OwnGateway {
    fn drop(&mut self) {
        self.halt();
    }
}

/// `openclaw tui` in a detached tmux session of its own (a private tmux server), driven by
/// `send-keys` and read by `capture-pane`, as a person at a terminal would use it.
pub struct Tui {
    socket: String,
}

impl Tui {
    /// Starts the TUI against the gateway at `addr` on `session`, in a 120×40 pane.
    pub fn start(home: &Path, addr: &str, token: &str, session: &str) -> Tui {
        let (node, entry) = cli();
        std::fs::create_dir_all(home).expect("openclaw home");
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tui = Tui { socket: format!("pincer-tui-{}-{n}", std::process::id()) };
        let path = std::env::var("PATH").unwrap_or_default();
        let q = |p: &Path| format!("'{}'", p.display());
        // The pane's program gets a clean environment, as `run` gives the CLI.
        let command = format!(
            "env -i PATH='{path}' HOME={} OPENCLAW_STATE_DIR={} TERM=xterm-256color NO_COLOR=1 {} {} tui \
             --url ws://{addr} --token '{token}' --session '{session}'",
            q(home),
            q(&home.join(".openclaw")),
            q(&node),
            q(&entry)
        );
        tui.tmux(&["new-session", "-d", "-s", "tui", "-x", "120", "-y", "40", &command]);
        tui
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux (Debian's tmux; scripts/test installs it)");
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (tmux key names such as `Enter` and `Escape` are pressed, not typed).
    pub fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "tui"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    /// What the pane shows now.
    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "tui"])
    }

    /// Waits until the pane shows `text`, and returns the screen; panics with the screen after 60 s.
    pub fn wait_for(&self, text: &str) -> String {
        self.wait_until(&format!("{text:?}"), |s| s.contains(text))
    }

    /// Waits until the screen satisfies `shows` (`what` names it), and returns the screen; panics
    /// with the screen after 60 s.
    pub fn wait_until(&self, what: &str, shows: impl Fn(&str) -> bool) -> String {
        let every = std::time::Duration::from_millis(100);
        crate::probe::poll(std::time::Duration::from_secs(60), every, || Some(self.screen()).filter(|s| shows(s)))
            .unwrap_or_else(|| panic!("the TUI never showed {what}; its screen:\n{}", self.screen()))
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}
